//! Qwen2 (biases on q, k, v) and Qwen3 (per-head q/k RMSNorm, separate head_dim). Both use
//! rotate-half RoPE in GGUF and HF alike; the biases and q/k norms are picked up when present.

use anelm_formats::HfConfig;

use crate::decoder::{AttnKind, Naming, Recipe};
use crate::error::Result;
use crate::hparams::Hparams;
use crate::model::Family;

fn recipe(family: Family, hp: Hparams, naming: Naming, windows: Vec<Option<usize>>) -> Recipe {
    let scale = (hp.head_dim as f32).powf(-0.5);
    let layers = windows
        .into_iter()
        .map(|window| AttnKind {
            window,
            rope: hp.rope.clone(),
            scale,
            softcap: None,
        })
        .collect();
    Recipe {
        layers,
        ..Recipe::new(family, hp, naming)
    }
}

pub(crate) fn gguf(family: Family, hp: Hparams) -> Recipe {
    let windows = vec![None; hp.n_layers];
    recipe(family, hp, Naming::Gguf, windows)
}

pub(crate) fn hf(cfg: &HfConfig, hp: Hparams, family: Family) -> Result<Recipe> {
    // Sliding windows apply only when enabled, and then per `layer_types` (transformers 5) or
    // from layer `max_window_layers` on (4.x).
    let window = if cfg.bool_opt("use_sliding_window")?.unwrap_or(false) {
        cfg.usize_opt("sliding_window")?
    } else {
        None
    };
    let windows = match cfg.strings_opt("layer_types")? {
        Some(types) => types
            .iter()
            .map(|t| {
                if *t == "sliding_attention" {
                    window
                } else {
                    None
                }
            })
            .collect(),
        None => {
            let from = cfg.usize_opt("max_window_layers")?.unwrap_or(0);
            (0..hp.n_layers)
                .map(|i| if i >= from { window } else { None })
                .collect()
        }
    };
    Ok(recipe(family, hp, Naming::Hf { sandwich: false }, windows))
}
