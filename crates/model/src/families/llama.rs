//! Llama (SmolLM2, Llama 2/3) and Mistral: the plain pre-norm SwiGLU decoder. GGUF llama files
//! carry Q/K rows permuted for llama.cpp's adjacent-pair RoPE (ARCHITECTURES.md §5); Mistral
//! adds a sliding window on every layer.

use anelm_formats::{HfConfig, RopeParams};

use crate::decoder::{AttnKind, Naming, Recipe};
use crate::error::Result;
use crate::families::Ctx;
use crate::hparams::Hparams;
use crate::model::Family;
use crate::plan::RopePairing;

fn uniform_layers(hp: &Hparams, rope: RopeParams, window: Option<usize>) -> Vec<AttnKind> {
    let kind = AttnKind {
        window,
        rope,
        scale: (hp.head_dim as f32).powf(-0.5),
        softcap: None,
    };
    vec![kind; hp.n_layers]
}

pub(crate) fn gguf(ctx: &Ctx, hp: Hparams) -> Result<Recipe> {
    // Llama 3 files store the scaled frequencies as divisors in `rope_freqs.weight`.
    let freq_factors = ctx
        .loader
        .vector_opt("rope_freqs.weight", hp.rope_dims / 2)?;
    let mut rope = hp.rope.clone();
    if freq_factors.is_some() {
        rope.rope_type = "default".into();
    }
    Ok(Recipe {
        layers: uniform_layers(&hp, rope, None),
        pairing: RopePairing::Adjacent,
        freq_factors,
        ..Recipe::new(Family::Llama, hp, Naming::Gguf)
    })
}

pub(crate) fn hf(cfg: &HfConfig, hp: Hparams, family: Family) -> Result<Recipe> {
    let window = if family == Family::Mistral {
        cfg.usize_opt("sliding_window")?
    } else {
        None
    };
    Ok(Recipe {
        layers: uniform_layers(&hp, hp.rope.clone(), window),
        ..Recipe::new(family, hp, Naming::Hf { sandwich: false })
    })
}
