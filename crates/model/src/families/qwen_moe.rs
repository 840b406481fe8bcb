//! The Qwen mixture-of-experts and hybrid families from Hugging Face checkpoints: Qwen2-MoE
//! (shared expert, raw top-k weights), Qwen3-MoE (renormalised top-k, q/k norms), Qwen3-Next and
//! Qwen3.5 (dense or MoE): gated DeltaNet layers interleaved with output-gated full attention,
//! partial RoPE, `(1 + w)` norms (ARCHITECTURES.md §3–4).

use anelm_formats::HfConfig;

use crate::decoder::{AttnKind, Naming, Recipe};
use crate::error::{ModelError, Result};
use crate::hparams::Hparams;
use crate::hybrid::{DeltaNetLayout, DeltaNetSpec, MoeSpec};
use crate::model::Family;
use crate::plan::{Activation, RopePairing};

pub(crate) fn hf(cfg: &HfConfig, hp: Hparams, family: Family) -> Result<Recipe> {
    let hybrid = matches!(
        family,
        Family::Qwen3Next | Family::Qwen35 | Family::Qwen35Moe
    );
    let layer_types: Vec<String> = match cfg.layer_types(hp.n_layers)? {
        Some(t) => t,
        None => {
            let interval = if hybrid {
                cfg.usize_opt("full_attention_interval")?.unwrap_or(4)
            } else {
                1
            };
            (0..hp.n_layers)
                .map(|i| {
                    if (i + 1) % interval.max(1) == 0 {
                        "full_attention"
                    } else {
                        "linear_attention"
                    }
                    .to_string()
                })
                .collect()
        }
    };
    let deltanet = if hybrid {
        Some(DeltaNetSpec {
            n_k: cfg.usize("linear_num_key_heads")?,
            n_v: cfg.usize("linear_num_value_heads")?,
            dk: cfg.usize("linear_key_head_dim")?,
            dv: cfg.usize("linear_value_head_dim")?,
            kernel: cfg.usize_opt("linear_conv_kernel_dim")?.unwrap_or(4),
            layout: if family == Family::Qwen3Next {
                DeltaNetLayout::GroupedQkvz
            } else {
                DeltaNetLayout::Separate
            },
            layers: layer_types
                .iter()
                .map(|t| t == "linear_attention")
                .collect(),
        })
    } else {
        None
    };
    let moe = moe_spec(cfg, &hp, family)?;
    let scale = (hp.head_dim as f32).powf(-0.5);
    let layers = vec![
        AttnKind {
            window: None,
            rope: hp.rope.clone(),
            scale,
            softcap: None
        };
        hp.n_layers
    ];
    Ok(Recipe {
        family,
        hp,
        naming: Naming::Hf { sandwich: false },
        norm_plus_one: hybrid,
        sandwich: false,
        act: Activation::Silu,
        embed_scale: None,
        pairing: RopePairing::HalfSplit,
        freq_factors: None,
        layers,
        moe,
        deltanet,
        gated_attention: hybrid,
    })
}

/// Which layers are MoE: `i ∉ mlp_only_layers`, experts present, `(i + 1) % decoder_sparse_step == 0`.
fn moe_spec(cfg: &HfConfig, hp: &Hparams, family: Family) -> Result<Option<MoeSpec>> {
    if family == Family::Qwen35 {
        return Ok(None);
    }
    let n_experts = match cfg.usize_opt("num_experts")? {
        Some(n) => n,
        None => cfg.usize_opt("num_local_experts")?.unwrap_or(0),
    };
    if n_experts == 0 {
        return Ok(None);
    }
    let step = cfg.usize_opt("decoder_sparse_step")?.unwrap_or(1).max(1);
    let mlp_only: Vec<usize> = match cfg.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect())
            .ok_or_else(|| {
                ModelError::invalid(
                    cfg.path(),
                    "mlp_only_layers must be a list of layer indices",
                )
            })?,
    };
    let shared = cfg
        .usize_opt("shared_expert_intermediate_size")?
        .filter(|&s| s > 0);
    Ok(Some(MoeSpec {
        n_experts,
        top_k: cfg.usize("num_experts_per_tok")?,
        // Qwen2-MoE releases keep the raw probabilities; the later families renormalise.
        norm_top_k: cfg
            .bool_opt("norm_topk_prob")?
            .unwrap_or(family != Family::Qwen2Moe),
        expert_ffn: cfg.usize("moe_intermediate_size")?,
        shared_ffn: shared,
        layers: (0..hp.n_layers)
            .map(|i| !mlp_only.contains(&i) && (i + 1) % step == 0)
            .collect(),
    }))
}
