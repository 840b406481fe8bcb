//! Fuzz entry points for model loading: a GGUF file or a config.json through the whole loader
//! (hyperparameters, family recipe, tensor checks). Called by `fuzz/` and the corpus replay tests.

use std::path::Path;

use anelm_formats::{safetensors, Gguf, HfConfig};

use crate::families;

/// A GGUF file held in memory, loaded as a model (an encoder when its architecture is one).
pub fn gguf_model(data: &[u8]) {
    let path = Path::new("fuzz.gguf");
    if let Ok(g) = Gguf::from_bytes(path, data) {
        let arch = g.metadata.str_opt("general.architecture").ok().flatten();
        if arch.is_some_and(crate::encoder::is_encoder_arch) {
            let _ = crate::encoder::from_gguf(path, g);
        } else {
            let _ = families::from_gguf(path, g);
        }
    }
}

/// Layers a fuzzed config.json may declare: the stand-in weights hold this many (empty) tensors.
pub const MAX_FUZZ_LAYERS: usize = 256;

/// A safetensors file of [`MAX_FUZZ_LAYERS`] empty f32 tensors, so the layer-count bound admits
/// small configs and the loader fails only at its first real tensor look-up.
fn stand_in_weights() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let entries: Vec<String> = (0..MAX_FUZZ_LAYERS)
            .map(|i| format!(r#""t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#))
            .collect();
        let header = format!("{{{}}}", entries.join(","));
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b
    })
}

/// A config.json loaded as a model over stand-in weights of empty tensors: everything before the
/// first tensor look-up (family, hyperparameters, layer kinds, RoPE, MoE and DeltaNet specs).
pub fn hf_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let dir = Path::new("fuzz-model");
    if let Ok(cfg) = HfConfig::parse(&dir.join("config.json"), text) {
        let weights = || {
            Ok(safetensors::from_bytes(
                &dir.join("model.safetensors"),
                stand_in_weights(),
            )?)
        };
        let encoder = cfg.model_type().is_ok_and(crate::encoder::is_encoder_arch);
        if encoder {
            let _ = crate::encoder::from_hf(dir, cfg, weights);
        } else {
            let _ = families::from_hf(dir, cfg, weights);
        }
    }
}
