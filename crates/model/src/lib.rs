//! anelm's model description. A model file (GGUF or a Hugging Face directory) becomes a
//! [`Model`]: a [`ModelConfig`], and a LayerPlan — one [`plan::Layer`] per block, each naming
//! its mixer, FFN, norms and RoPE with the weights they use. Executors dispatch on the plan.

mod decoder;
pub mod encoder;
pub mod error;
pub mod exec;
mod families;
pub mod fuzz;
mod hparams;
mod hybrid;
mod loader;
pub mod model;
pub mod plan;
pub mod weight;

use std::path::Path;

pub use error::{ModelError, Result};
pub use exec::{
    argmax, check_batch, check_runs, checked_state, forward_each, ExecError, Executor, KvState,
    Logits, OwnedState, RouteChoice, Run, ROUTE_NEAR_TIE,
};
pub use families::{gguf_family, hf_family};
pub use model::{Family, Model, ModelConfig, ModelSource};
pub use weight::Weight;

/// Loads a model: a GGUF file, or a Hugging Face directory (config.json + safetensors).
/// Where a model's tokenizer and chat template come from, without its weights: a GGUF file's
/// metadata (a vocabulary-only GGUF is enough) or a Hugging Face directory.
pub fn open_source(path: &Path) -> Result<ModelSource> {
    if path.is_dir() {
        return Ok(ModelSource::HfDir {
            dir: path.to_path_buf(),
        });
    }
    let gguf = anelm_formats::Gguf::open(path)?;
    Ok(ModelSource::Gguf {
        path: path.to_path_buf(),
        metadata: Box::new(gguf.metadata),
    })
}

/// The architecture a source declares: GGUF `general.architecture`, HF `model_type`.
pub fn architecture_of(source: &ModelSource) -> Option<String> {
    match source {
        ModelSource::Gguf { metadata, .. } => metadata
            .str_opt("general.architecture")
            .ok()
            .flatten()
            .map(String::from),
        ModelSource::HfDir { dir } => anelm_formats::HfConfig::open(dir)
            .ok()?
            .model_type()
            .ok()
            .map(String::from),
    }
}

/// The family a source names, if we run it.
pub fn family_of(source: &ModelSource) -> Option<Family> {
    let arch = architecture_of(source)?;
    match source {
        ModelSource::Gguf { .. } => gguf_family(&arch),
        ModelSource::HfDir { .. } => hf_family(&arch),
    }
}

pub fn load(path: &Path) -> Result<Model> {
    if path.is_dir() {
        families::load_hf(path)
    } else {
        families::load_gguf(path)
    }
}
