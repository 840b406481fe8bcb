//! Gemma 1, 2 and 3 (text). Shared: embedding × sqrt(hidden), `(1 + w)` RMSNorms (GGUF stores
//! `1 + w`, HF stores `w`), GeGLU with tanh GELU, tied head. Gemma 2 adds sandwich norms,
//! alternating sliding layers and soft-caps; Gemma 3 adds q/k norms, a 5:1 sliding pattern and
//! two RoPE bases (ARCHITECTURES.md §2, §5).

use anelm_formats::{HfConfig, Metadata, RopeParams};

use crate::decoder::{AttnKind, Naming, Recipe};
use crate::error::{ModelError, Result};
use crate::hparams::Hparams;
use crate::model::Family;
use crate::plan::Activation;

fn recipe(family: Family, hp: Hparams, naming: Naming, layers: Vec<AttnKind>) -> Recipe {
    Recipe {
        embed_scale: Some((hp.hidden as f32).sqrt()),
        norm_plus_one: matches!(naming, Naming::Hf { .. }),
        sandwich: family != Family::Gemma,
        act: Activation::GeluTanh,
        layers,
        ..Recipe::new(family, hp, naming)
    }
}

/// llama.cpp's attention scale for Gemma GGUF files, which store none: `1/sqrt(key_length)`, but
/// `1/sqrt(hidden/heads)` for the 27B models (46 layers in Gemma 2, 62 in Gemma 3).
fn gguf_scale(hp: &Hparams, big_model_layers: usize) -> f32 {
    let d = if hp.n_layers == big_model_layers {
        hp.hidden / hp.n_heads
    } else {
        hp.head_dim
    };
    (d as f32).powf(-0.5)
}

pub(crate) fn gguf(meta: &Metadata, arch: &str, family: Family, hp: Hparams) -> Result<Recipe> {
    let layers = match family {
        Family::Gemma => {
            let scale = (hp.head_dim as f32).powf(-0.5);
            vec![
                AttnKind {
                    window: None,
                    rope: hp.rope.clone(),
                    scale,
                    softcap: None
                };
                hp.n_layers
            ]
        }
        Family::Gemma2 => {
            let scale = gguf_scale(&hp, 46);
            (0..hp.n_layers)
                .map(|i| AttnKind {
                    window: if i % 2 == 0 { hp.sliding_window } else { None },
                    rope: hp.rope.clone(),
                    scale,
                    softcap: hp.attn_softcap,
                })
                .collect()
        }
        _ => {
            let scale = gguf_scale(&hp, 62);
            let sliding = gguf_sliding_layers(meta, arch, hp.n_layers)?;
            let local = RopeParams {
                theta: meta
                    .f32_opt(&format!("{arch}.rope.freq_base_swa"))?
                    .unwrap_or(10_000.0) as f64,
                ..Default::default()
            };
            sliding
                .into_iter()
                .map(|s| AttnKind {
                    window: if s { hp.sliding_window } else { None },
                    rope: if s { local.clone() } else { hp.rope.clone() },
                    scale,
                    softcap: None,
                })
                .collect()
        }
    };
    Ok(recipe(family, hp, Naming::Gguf, layers))
}

/// Which layers slide: `<arch>.attention.sliding_window_pattern` as a per-layer bool array or a
/// period (the last layer of each period is global), defaulting to period 6 as llama.cpp does.
fn gguf_sliding_layers(meta: &Metadata, arch: &str, n_layers: usize) -> Result<Vec<bool>> {
    let key = format!("{arch}.attention.sliding_window_pattern");
    let period = match meta.get(&key) {
        Some(v) if v.as_array().is_some() => {
            let bools: Option<Vec<bool>> = v
                .as_array()
                .unwrap_or_default()
                .iter()
                .map(|b| b.as_bool())
                .collect();
            return match bools {
                Some(b) if b.len() == n_layers => Ok(b),
                _ => Err(ModelError::invalid(
                    meta.path(),
                    format!("{key} must hold {n_layers} bools"),
                )),
            };
        }
        Some(_) => meta.usize(&key)?,
        None => 6,
    };
    Ok((0..n_layers)
        .map(|i| period == 0 || i % period < period - 1)
        .collect())
}

pub(crate) fn hf(cfg: &HfConfig, family: Family, hp: Hparams) -> Result<Recipe> {
    let scale = match family {
        Family::Gemma => (hp.head_dim as f32).powf(-0.5),
        _ => (cfg
            .f64_opt("query_pre_attn_scalar")?
            .unwrap_or(hp.head_dim as f64) as f32)
            .powf(-0.5),
    };
    let types: Vec<String> = match cfg.layer_types(hp.n_layers)? {
        Some(t) => t,
        None => {
            let period = match family {
                Family::Gemma => 0,
                Family::Gemma2 => 2,
                _ => cfg.usize_opt("sliding_window_pattern")?.unwrap_or(6),
            };
            (0..hp.n_layers)
                .map(|i| {
                    if period > 0 && (i + 1) % period != 0 {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                    .to_string()
                })
                .collect()
        }
    };
    let layers = types
        .iter()
        .map(|t| {
            let sliding = t == "sliding_attention";
            Ok(AttnKind {
                window: if sliding { hp.sliding_window } else { None },
                rope: cfg.rope(Some(t))?,
                scale,
                softcap: if family == Family::Gemma2 {
                    hp.attn_softcap
                } else {
                    None
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(recipe(
        family,
        hp,
        Naming::Hf {
            sandwich: family != Family::Gemma,
        },
        layers,
    ))
}
