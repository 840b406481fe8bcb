//! One file per model family: each maps its tensor names and quirks onto the LayerPlan. This file
//! is the registry: GGUF `general.architecture` and HF `model_type` → family loader.

mod gemma;
mod gpt2;
mod lfm2;
mod llama;
mod qwen;
mod qwen_moe;

use std::path::Path;

use anelm_formats::{Gguf, HfConfig};

use crate::decoder;
use crate::error::{ModelError, Result};
use crate::hparams::Hparams;
use crate::loader::TensorLoader;
use crate::model::{Family, Model, ModelSource};

/// What a family loader may need besides the hyperparameters.
pub(crate) struct Ctx {
    pub loader: TensorLoader,
}

const GGUF_ARCHS: &str =
    "llama, qwen2, qwen3, qwen2moe, qwen3moe, qwen3next, qwen35, qwen35moe, lfm2, gemma, gemma2, gemma3, gpt2";
const HF_TYPES: &str =
    "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, gpt2, qwen2_moe, qwen3_moe, qwen3_next, qwen3_5_text, qwen3_5_moe_text, lfm2";

/// The family of a GGUF `general.architecture` we run.
pub fn gguf_family(arch: &str) -> Option<Family> {
    Some(match arch {
        "llama" => Family::Llama,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        "qwen2moe" => Family::Qwen2Moe,
        "qwen3moe" => Family::Qwen3Moe,
        "qwen3next" => Family::Qwen3Next,
        "qwen35" => Family::Qwen35,
        "qwen35moe" => Family::Qwen35Moe,
        "lfm2" => Family::Lfm2,
        "gemma" => Family::Gemma,
        "gemma2" => Family::Gemma2,
        "gemma3" => Family::Gemma3,
        "gpt2" => Family::Gpt2,
        _ => return None,
    })
}

/// The family of a Hugging Face `model_type` we run.
pub fn hf_family(model_type: &str) -> Option<Family> {
    Some(match model_type {
        "llama" => Family::Llama,
        "mistral" => Family::Mistral,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        "gemma" => Family::Gemma,
        "gemma2" => Family::Gemma2,
        "gemma3_text" => Family::Gemma3,
        "gpt2" => Family::Gpt2,
        "qwen2_moe" => Family::Qwen2Moe,
        "qwen3_moe" => Family::Qwen3Moe,
        "qwen3_next" => Family::Qwen3Next,
        "qwen3_5_text" => Family::Qwen35,
        "qwen3_5_moe_text" => Family::Qwen35Moe,
        "lfm2" => Family::Lfm2,
        _ => return None,
    })
}

pub(crate) fn load_gguf(path: &Path) -> Result<Model> {
    from_gguf(path, Gguf::open(path)?)
}

/// Builds the model of a parsed GGUF file (`path` names it in errors).
pub(crate) fn from_gguf(path: &Path, gguf: Gguf) -> Result<Model> {
    let Gguf {
        metadata, tensors, ..
    } = gguf;
    let n_tensors = tensors.len();
    let arch = metadata.str("general.architecture")?.to_string();
    let name = metadata
        .str_opt("general.name")?
        .map(String::from)
        .unwrap_or_else(|| file_stem(path));
    let ctx = Ctx {
        loader: TensorLoader::new(tensors),
    };
    let hp = Hparams::from_gguf(&metadata, &arch, n_tensors)?;
    let family = gguf_family(&arch).ok_or_else(|| unsupported(path, &arch, GGUF_ARCHS))?;
    let recipe = match family {
        Family::Llama => llama::gguf(&ctx, hp)?,
        Family::Qwen2 | Family::Qwen3 => qwen::gguf(family, hp),
        Family::Qwen2Moe | Family::Qwen3Moe => {
            qwen_moe::gguf_moe(&metadata, &arch, &ctx.loader, hp, family)?
        }
        Family::Qwen3Next | Family::Qwen35 | Family::Qwen35Moe => {
            qwen_moe::gguf_hybrid(&metadata, &arch, &ctx.loader, hp, family)?
        }
        Family::Lfm2 => lfm2::gguf(&metadata, &arch, hp)?,
        Family::Gemma | Family::Gemma2 | Family::Gemma3 => {
            gemma::gguf(&metadata, &arch, family, hp)?
        }
        Family::Gpt2 => {
            let source = ModelSource::Gguf {
                path: path.to_path_buf(),
                metadata: Box::new(metadata),
            };
            return gpt2::load(&ctx.loader, hp, None, source, name);
        }
        _ => return Err(unsupported(path, &arch, GGUF_ARCHS)),
    };
    let source = ModelSource::Gguf {
        path: path.to_path_buf(),
        metadata: Box::new(metadata),
    };
    decoder::build(&ctx.loader, recipe, source, name)
}

pub(crate) fn load_hf(dir: &Path) -> Result<Model> {
    from_hf(dir, HfConfig::open(dir)?, || {
        Ok(anelm_formats::safetensors::open_dir(dir)?)
    })
}

/// Builds the model of a parsed config.json; `tensors` opens the weights once the family is known.
pub(crate) fn from_hf(
    dir: &Path,
    cfg: HfConfig,
    tensors: impl FnOnce() -> Result<anelm_formats::TensorStore>,
) -> Result<Model> {
    let model_type = cfg.model_type()?.to_string();
    let family =
        hf_family(&model_type).ok_or_else(|| unsupported(cfg.path(), &model_type, HF_TYPES))?;
    let loader = TensorLoader::new(tensors()?);
    let hp = Hparams::from_hf(&cfg, loader.n_tensors())?;
    let name = file_stem(dir);
    let source = ModelSource::HfDir {
        dir: dir.to_path_buf(),
    };
    let recipe = match family {
        Family::Llama | Family::Mistral => llama::hf(&cfg, hp, family)?,
        Family::Qwen2 | Family::Qwen3 => qwen::hf(&cfg, hp, family)?,
        Family::Gemma | Family::Gemma2 | Family::Gemma3 => gemma::hf(&cfg, family, hp)?,
        Family::Gpt2 => return gpt2::load(&loader, hp, Some(&cfg), source, name),
        Family::Qwen2Moe
        | Family::Qwen3Moe
        | Family::Qwen3Next
        | Family::Qwen35
        | Family::Qwen35Moe => qwen_moe::hf(&cfg, hp, family)?,
        Family::Lfm2 => lfm2::hf(&cfg, hp)?,
    };
    decoder::build(&loader, recipe, source, name)
}

fn unsupported(path: &Path, arch: &str, supported: &str) -> ModelError {
    if crate::encoder::is_encoder_arch(arch) {
        return ModelError::invalid(
            path,
            format!(
                "'{arch}' is an embedding (encoder) model: it does not generate text; \
                 `anelm embed` and `anelm serve` (/v1/embeddings) run it"
            ),
        );
    }
    ModelError::UnsupportedArch {
        path: path.to_path_buf(),
        arch: arch.to_string(),
        supported: supported.to_string(),
    }
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string()
}
