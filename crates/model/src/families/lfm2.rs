//! LFM2 (Liquid AI; transformers `lfm2`): gated short convolutions on most layers, GQA attention
//! with q/k RMSNorms on the others (`layer_types`, or `full_attn_idxs`), SwiGLU FFNs whose width
//! transformers derives from `intermediate_size`, plain `w` RMSNorms, the final norm named
//! `embedding_norm`, tied head.

use anelm_formats::{HfConfig, MetaValue, Metadata};

use crate::decoder::{Naming, Recipe};
use crate::error::{ModelError, Result};
use crate::hparams::{per_layer_counts, Hparams};
use crate::hybrid::ShortConvSpec;
use crate::model::Family;

pub(crate) fn hf(cfg: &HfConfig, mut hp: Hparams) -> Result<Recipe> {
    let layers: Vec<bool> = match cfg.layer_types(hp.n_layers)? {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "conv" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(ModelError::invalid(
                    cfg.path(),
                    format!("layer_types: unknown layer type '{other}' (conv, full_attention)"),
                )),
            })
            .collect::<Result<_>>()?,
        None => {
            let full: Vec<usize> = match cfg.get("full_attn_idxs") {
                Some(v) if !v.is_null() => v
                    .as_array()
                    .and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect())
                    .ok_or_else(|| {
                        ModelError::invalid(cfg.path(), "full_attn_idxs must be a list of layers")
                    })?,
                _ => (0..hp.n_layers).collect(),
            };
            (0..hp.n_layers).map(|i| !full.contains(&i)).collect()
        }
    };
    hp.ffn = ffn_width(cfg, hp.ffn)?;
    let kernel = cfg.positive_opt("conv_L_cache")?.unwrap_or(3);
    Ok(Recipe {
        short_conv: Some(ShortConvSpec { kernel, layers }),
        ..Recipe::new(Family::Lfm2, hp, Naming::Lfm2)
    })
}

/// transformers' `Lfm2MLP` width: with `block_auto_adjust_ff_dim`, `int(2 · ff / 3)`, then with a
/// `block_ffn_dim_multiplier`, `int(multiplier · ff)` rounded up to `block_multiple_of`.
fn ffn_width(cfg: &HfConfig, ff: usize) -> Result<usize> {
    if !cfg.bool_opt("block_auto_adjust_ff_dim")?.unwrap_or(true) {
        return Ok(ff);
    }
    let mut ff = 2 * ff / 3;
    if let Some(m) = cfg.f64_opt("block_ffn_dim_multiplier")? {
        let multiple = cfg.positive_opt("block_multiple_of")?.unwrap_or(256);
        ff = (m * ff as f64) as usize;
        ff = ff.div_ceil(multiple) * multiple;
    }
    Ok(ff)
}

/// LFM2 from llama.cpp's GGUF (`lfm2`): `attention.head_count_kv` per layer, 0 marking the short
/// convolutions; the converter already wrote the FFN width it derives; `shortconv.l_cache`; the
/// final norm `token_embd_norm`.
pub(crate) fn gguf(meta: &Metadata, arch: &str, hp: Hparams) -> Result<Recipe> {
    let key = format!("{arch}.attention.head_count_kv");
    let layers = match meta.get(&key) {
        Some(MetaValue::Array(a)) => {
            let counts = per_layer_counts(meta, &key, a)?;
            if counts.len() != hp.n_layers {
                return Err(ModelError::invalid(
                    meta.path(),
                    format!(
                        "'{key}' has {} entries for {} layers",
                        counts.len(),
                        hp.n_layers
                    ),
                ));
            }
            counts.iter().map(|&n| n == 0).collect()
        }
        _ => vec![false; hp.n_layers],
    };
    let kernel = meta
        .positive_opt(&format!("{arch}.shortconv.l_cache"))?
        .unwrap_or(3);
    Ok(Recipe {
        short_conv: Some(ShortConvSpec { kernel, layers }),
        final_norm: Some("token_embd_norm.weight"),
        ..Recipe::new(Family::Lfm2, hp, Naming::Gguf)
    })
}
