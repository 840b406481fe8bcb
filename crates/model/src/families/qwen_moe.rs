//! The Qwen mixture-of-experts and hybrid families from Hugging Face checkpoints: Qwen2-MoE
//! (shared expert, raw top-k weights), Qwen3-MoE (renormalised top-k, q/k norms), Qwen3-Next and
//! Qwen3.5 (dense or MoE): gated DeltaNet layers interleaved with output-gated full attention,
//! partial RoPE, `(1 + w)` norms (ARCHITECTURES.md §3–4).

use anelm_formats::{HfConfig, Metadata};

use crate::decoder::{Naming, Recipe, Role};
use crate::error::{ModelError, Result};
use crate::hparams::Hparams;
use crate::hybrid::{DeltaNetLayout, DeltaNetSpec, MoeSpec};
use crate::loader::TensorLoader;
use crate::model::Family;

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
    let windows = if hybrid {
        vec![None; hp.n_layers]
    } else {
        moe_windows(cfg, &layer_types, family)?
    };
    let mut recipe = Recipe {
        norm_plus_one: hybrid,
        moe,
        deltanet,
        gated_attention: hybrid,
        ..Recipe::new(family, hp, Naming::Hf { sandwich: false })
    };
    for (kind, window) in recipe.layers.iter_mut().zip(windows) {
        kind.window = window;
    }
    Ok(recipe)
}

/// Sliding windows as transformers (5.24) applies them to the mixtures, and only with
/// `use_sliding_window`: Qwen2-MoE on its `sliding_attention` layers (a config without
/// `layer_types` gets transformers' rule: even layers below `max_window_layers`), Qwen3-MoE on
/// every layer. A window of 0 or none is no window.
fn moe_windows(
    cfg: &HfConfig,
    layer_types: &[String],
    family: Family,
) -> Result<Vec<Option<usize>>> {
    let n = layer_types.len();
    let window = if cfg.bool_opt("use_sliding_window")?.unwrap_or(false) {
        cfg.usize_opt("sliding_window")?.filter(|&w| w > 0)
    } else {
        None
    };
    let Some(w) = window else {
        return Ok(vec![None; n]);
    };
    if family != Family::Qwen2Moe {
        return Ok(vec![Some(w); n]);
    }
    Ok(match cfg.strings_opt("layer_types")? {
        Some(_) => (layer_types.iter())
            .map(|t| (t == "sliding_attention").then_some(w))
            .collect(),
        None => {
            let below = cfg.usize_opt("max_window_layers")?.unwrap_or(28);
            (0..n)
                .map(|i| (i % 2 == 0 && i < below).then_some(w))
                .collect()
        }
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

/// Qwen2-MoE and Qwen3-MoE from llama.cpp's GGUF (`qwen2moe`, `qwen3moe`): the dense recipe of
/// Qwen2/Qwen3 with the mixture from `{arch}.expert_*` keys. A layer is a mixture where its router
/// `blk.N.ffn_gate_inp` is stored (llama.cpp keeps no `mlp_only_layers`); the top-k weights are
/// renormalised as llama.cpp does: never for qwen2moe, always for the later families, unless the
/// file says
/// `{arch}.expert_weights_norm`.
pub(crate) fn gguf_moe(
    meta: &Metadata,
    arch: &str,
    l: &TensorLoader,
    hp: Hparams,
    family: Family,
) -> Result<Recipe> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_experts = meta.positive(&k("expert_count"))?;
    let layers: Vec<bool> = (0..hp.n_layers)
        .map(|i| l.has(&format!("blk.{i}.ffn_gate_inp.weight")))
        .collect();
    let shared = meta
        .usize_opt(&k("expert_shared_feed_forward_length"))?
        .filter(|&f| f > 0);
    let norm_top_k = meta
        .bool_opt(&k("expert_weights_norm"))?
        .unwrap_or(family != Family::Qwen2Moe);
    let moe = MoeSpec {
        n_experts,
        top_k: meta.positive(&k("expert_used_count"))?,
        norm_top_k,
        expert_ffn: meta.positive(&k("expert_feed_forward_length"))?,
        shared_ffn: shared,
        layers,
    };
    Ok(Recipe {
        moe: Some(moe),
        ..super::qwen::gguf(family, hp)
    })
}

/// Qwen3-Next and Qwen3.5 (dense or MoE) from llama.cpp's GGUF (`qwen3next`, `qwen35`,
/// `qwen35moe`). The converter has already added 1 to the `(1 + w)` norms (not the DeltaNet's
/// gated norm), stored `-exp(A_log)`, flattened Qwen3-Next's grouped `q|k|v|z` and, for Qwen3.5,
/// tiled the value heads; it names the FFN pre-norm `post_attention_norm`. Multi-token-prediction
/// blocks (`nextn_predict_layers`) are counted in `block_count` but are not decoder layers.
pub(crate) fn gguf_hybrid(
    meta: &Metadata,
    arch: &str,
    l: &TensorLoader,
    mut hp: Hparams,
    family: Family,
) -> Result<Recipe> {
    let k = |s: &str| format!("{arch}.{s}");
    if let Some(n) = meta.usize_opt(&k("nextn_predict_layers"))? {
        hp.n_layers = hp
            .n_layers
            .checked_sub(n)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                ModelError::invalid(
                    meta.path(),
                    format!(
                        "{}: {n} of {} blocks",
                        k("nextn_predict_layers"),
                        hp.n_layers
                    ),
                )
            })?;
    }
    let layers: Vec<bool> = match meta.array_opt(&k("attention.recurrent_layers"))? {
        Some(a) => {
            if a.len() < hp.n_layers {
                return Err(ModelError::invalid(
                    meta.path(),
                    format!(
                        "{} has {} entries for {} layers",
                        k("attention.recurrent_layers"),
                        a.len(),
                        hp.n_layers
                    ),
                ));
            }
            a[..hp.n_layers]
                .iter()
                .map(|v| v.as_i64().map(|x| x != 0))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    ModelError::invalid(
                        meta.path(),
                        format!("{} must hold booleans", k("attention.recurrent_layers")),
                    )
                })?
        }
        None => {
            let interval = meta
                .positive_opt(&k("full_attention_interval"))?
                .unwrap_or(4);
            (0..hp.n_layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    let n_v = meta.positive(&k("ssm.time_step_rank"))?;
    let inner = meta.positive(&k("ssm.inner_size"))?;
    if inner % n_v != 0 {
        return Err(ModelError::invalid(
            meta.path(),
            format!(
                "{}: {inner} is not a multiple of {n_v} value heads",
                k("ssm.inner_size")
            ),
        ));
    }
    let deltanet = DeltaNetSpec {
        n_k: meta.positive(&k("ssm.group_count"))?,
        n_v,
        dk: meta.positive(&k("ssm.state_size"))?,
        dv: inner / n_v,
        kernel: meta.positive(&k("ssm.conv_kernel"))?,
        layout: DeltaNetLayout::Gguf {
            tiled: family != Family::Qwen3Next,
        },
        layers,
    };
    let moe = if family == Family::Qwen35 {
        None
    } else {
        let mut r = gguf_moe(meta, arch, l, hp.clone(), family)?;
        r.moe.take()
    };
    Ok(Recipe {
        moe,
        deltanet: Some(deltanet),
        gated_attention: true,
        ffn_norm: Role::PostAttnNorm,
        ..Recipe::new(family, hp, Naming::Gguf)
    })
}
