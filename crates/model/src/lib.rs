//! anelm's model description. A model file (GGUF or a Hugging Face directory) becomes a
//! [`Model`]: a [`ModelConfig`], and a LayerPlan — one [`plan::Layer`] per block, each naming
//! its mixer, FFN, norms and RoPE with the weights they use. Executors dispatch on the plan.

mod decoder;
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
pub use exec::{check_batch, checked_state, ExecError, Executor, KvState, Logits, OwnedState};
pub use model::{Family, Model, ModelConfig, ModelSource};
pub use weight::Weight;

/// Loads a model: a GGUF file, or a Hugging Face directory (config.json + safetensors).
pub fn load(path: &Path) -> Result<Model> {
    if path.is_dir() {
        families::load_hf(path)
    } else {
        families::load_gguf(path)
    }
}
