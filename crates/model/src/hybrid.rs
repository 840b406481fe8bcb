//! Loading the non-dense parts of a layer from Hugging Face checkpoints: mixture-of-experts FFNs
//! (Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE), gated DeltaNet mixers and the output-gated
//! attention of Qwen3-Next / Qwen3.5 (ARCHITECTURES.md §3, §4).

use crate::decoder::Naming;
use crate::error::{ModelError, Result};
use crate::loader::TensorLoader;
use crate::plan::Activation;
use crate::plan::{
    DeltaNet, GatedMlp, KeyHeadMap, Linear, Moe, Norm, NormKind, SharedExpert, ShortConv,
};

/// Mixture-of-experts settings of a model.
pub(crate) struct MoeSpec {
    pub n_experts: usize,
    pub top_k: usize,
    pub norm_top_k: bool,
    pub expert_ffn: usize,
    /// Hidden width of the shared expert, when there is one.
    pub shared_ffn: Option<usize>,
    /// Which layers use the mixture (the others have a dense MLP).
    pub layers: Vec<bool>,
}

/// How the DeltaNet input projections are stored.
#[derive(Clone, Copy)]
pub(crate) enum DeltaNetLayout {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    GroupedQkvz,
    /// Qwen3.5: `in_proj_qkv` (flat q | k | v), `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Separate,
    /// llama.cpp's GGUF: `attn_qkv` (flat), `attn_gate` (z), `ssm_ba` (Qwen3-Next, grouped as in
    /// HF) or `ssm_beta` + `ssm_alpha` (Qwen3.5), `ssm_a` already `-exp(A_log)`. `tiled`: the
    /// converter reordered the value heads to ggml's tiled order (Qwen3.5 with `n_v > n_k`).
    Gguf { tiled: bool },
}

/// LFM2's short convolutions.
pub(crate) struct ShortConvSpec {
    pub kernel: usize,
    /// Which layers are short convolutions (the others attention).
    pub layers: Vec<bool>,
}

pub(crate) struct DeltaNetSpec {
    pub n_k: usize,
    pub n_v: usize,
    pub dk: usize,
    pub dv: usize,
    pub kernel: usize,
    pub layout: DeltaNetLayout,
    /// Which layers are linear attention (the others are gated full attention).
    pub layers: Vec<bool>,
}

fn hf_mlp(l: &TensorLoader, base: &str, ffn: usize, hidden: usize) -> Result<GatedMlp> {
    let lin = |n: &str, o: usize, i: usize| l.linear(&format!("{base}.{n}.weight"), o, i, None);
    Ok(GatedMlp {
        gate: lin("gate_proj", ffn, hidden)?,
        up: lin("up_proj", ffn, hidden)?,
        down: lin("down_proj", hidden, ffn)?,
    })
}

/// The mixture of layer `i`: transformers names one tensor per expert
/// (`mlp.experts.E.gate_proj`), llama.cpp merges them into `[n_expert, rows, cols]` tensors
/// (`ffn_gate_exps`) and names the shared expert `*_shexp`, its gate `ffn_gate_inp_shexp`.
pub(crate) fn moe(
    l: &TensorLoader,
    i: usize,
    s: &MoeSpec,
    act: Activation,
    hidden: usize,
    naming: Naming,
) -> Result<Moe> {
    if s.top_k == 0 || s.top_k > s.n_experts {
        return Err(ModelError::invalid(
            l.path(),
            format!("top-{} of {} experts", s.top_k, s.n_experts),
        ));
    }
    let (router, experts, shared_mlp, shared_gate) = match naming {
        Naming::Hf { .. } | Naming::Lfm2 => {
            let base = format!("model.layers.{i}.mlp");
            let experts = (0..s.n_experts)
                .map(|e| hf_mlp(l, &format!("{base}.experts.{e}"), s.expert_ffn, hidden))
                .collect::<Result<Vec<_>>>()?;
            let shared = match s.shared_ffn {
                Some(f) => Some(hf_mlp(l, &format!("{base}.shared_expert"), f, hidden)?),
                None => None,
            };
            let router = l.matrix(&format!("{base}.gate.weight"), s.n_experts, hidden)?;
            (
                router,
                experts,
                shared,
                format!("{base}.shared_expert_gate.weight"),
            )
        }
        Naming::Gguf => {
            let b = format!("blk.{i}");
            let stack = |n: &str, rows: usize, cols: usize| {
                l.stacked(&format!("{b}.{n}.weight"), s.n_experts, rows, cols)
            };
            let f = s.expert_ffn;
            // `--fuse-gate-up-exps` files hold per expert `gate (f) | up (f)` rows in one tensor.
            let (gates, ups) = if l.has(&format!("{b}.ffn_gate_up_exps.weight")) {
                stack("ffn_gate_up_exps", 2 * f, hidden)?
                    .into_iter()
                    .map(|w| {
                        let gate = w.slice_rows(&format!("{}.gate", w.name), 0, f);
                        let up = w.slice_rows(&format!("{}.up", w.name), f, f);
                        (gate, up)
                    })
                    .unzip()
            } else {
                (
                    stack("ffn_gate_exps", f, hidden)?,
                    stack("ffn_up_exps", f, hidden)?,
                )
            };
            let downs: Vec<_> = stack("ffn_down_exps", hidden, f)?;
            let linear = |weight| Linear { weight, bias: None };
            let experts = gates
                .into_iter()
                .zip(ups)
                .zip(downs)
                .map(|((g, u), d)| GatedMlp {
                    gate: linear(g),
                    up: linear(u),
                    down: linear(d),
                })
                .collect();
            let shared = match s.shared_ffn {
                Some(f) => {
                    let lin = |n: &str, o: usize, i: usize| {
                        l.linear(&format!("{b}.{n}.weight"), o, i, None)
                    };
                    Some(GatedMlp {
                        gate: lin("ffn_gate_shexp", f, hidden)?,
                        up: lin("ffn_up_shexp", f, hidden)?,
                        down: lin("ffn_down_shexp", hidden, f)?,
                    })
                }
                None => None,
            };
            let router = l.matrix(&format!("{b}.ffn_gate_inp.weight"), s.n_experts, hidden)?;
            (
                router,
                experts,
                shared,
                format!("{b}.ffn_gate_inp_shexp.weight"),
            )
        }
    };
    let shared = match shared_mlp {
        Some(mlp) => Some(SharedExpert {
            mlp,
            gate: if l.has(&shared_gate) {
                Some(l.matrix(&shared_gate, 1, hidden)?)
            } else {
                None
            },
        }),
        None => None,
    };
    Ok(Moe {
        act,
        router,
        experts,
        top_k: s.top_k,
        norm_top_k: s.norm_top_k,
        shared,
    })
}

/// Rows `order` of the tensor `name` (`[rows, cols]`) as a linear layer.
fn rows_of(
    l: &TensorLoader,
    name: &str,
    rows: usize,
    cols: usize,
    order: &[usize],
) -> Result<Linear> {
    let w = l.matrix(name, rows, cols)?;
    let mut picked = Vec::with_capacity(order.len() * w.row_bytes());
    for &r in order {
        picked.extend_from_slice(w.row(r));
    }
    Ok(Linear {
        weight: crate::Weight::from_bytes(name, w.dtype, order.len(), cols, picked),
        bias: None,
    })
}

pub(crate) fn deltanet(
    l: &TensorLoader,
    i: usize,
    s: &DeltaNetSpec,
    hidden: usize,
    eps: f32,
) -> Result<DeltaNet> {
    let base = match s.layout {
        DeltaNetLayout::Gguf { .. } => format!("blk.{i}"),
        _ => format!("model.layers.{i}.linear_attn"),
    };
    let (nk, nv, dk, dv) = (s.n_k, s.n_v, s.dk, s.dv);
    if nk == 0 || nv % nk != 0 {
        return Err(ModelError::invalid(
            l.path(),
            format!("{nv} value heads cannot share {nk} key heads"),
        ));
    }
    let r = nv / nk;
    let (key_dim, value_dim) = (nk * dk, nv * dv);
    let channels = 2 * key_dim + value_dim;
    let (qkv, z, b, a) = match s.layout {
        DeltaNetLayout::Separate => {
            let lin = |n: &str, o: usize| l.linear(&format!("{base}.{n}.weight"), o, hidden, None);
            (
                lin("in_proj_qkv", channels)?,
                lin("in_proj_z", value_dim)?,
                lin("in_proj_b", nv)?,
                lin("in_proj_a", nv)?,
            )
        }
        DeltaNetLayout::Gguf { .. } => {
            let lin = |n: &str, o: usize| l.linear(&format!("{base}.{n}.weight"), o, hidden, None);
            let ba = format!("{base}.ssm_ba.weight");
            let (b, a) = if l.has(&ba) {
                let (b_rows, a_rows) = grouped_ba_rows(nk, r);
                (
                    rows_of(l, &ba, 2 * nv, hidden, &b_rows)?,
                    rows_of(l, &ba, 2 * nv, hidden, &a_rows)?,
                )
            } else {
                (lin("ssm_beta", nv)?, lin("ssm_alpha", nv)?)
            };
            (
                lin("attn_qkv", channels)?,
                lin("attn_gate", value_dim)?,
                b,
                a,
            )
        }
        DeltaNetLayout::GroupedQkvz => {
            // Each key group g holds q (dk) | k (dk) | v (r·dv) | z (r·dv); gather them flat.
            let group = 2 * dk + 2 * r * dv;
            let pick = |off: usize, len: usize| {
                (0..nk).flat_map(move |g| g * group + off..g * group + off + len)
            };
            let qkv_rows: Vec<usize> = pick(0, dk)
                .chain(pick(dk, dk))
                .chain(pick(2 * dk, r * dv))
                .collect();
            let z_rows: Vec<usize> = pick(2 * dk + r * dv, r * dv).collect();
            let name = format!("{base}.in_proj_qkvz.weight");
            let rows = nk * group;
            let ba = format!("{base}.in_proj_ba.weight");
            let (b_rows, a_rows) = grouped_ba_rows(nk, r);
            (
                rows_of(l, &name, rows, hidden, &qkv_rows)?,
                rows_of(l, &name, rows, hidden, &z_rows)?,
                rows_of(l, &ba, 2 * nv, hidden, &b_rows)?,
                rows_of(l, &ba, 2 * nv, hidden, &a_rows)?,
            )
        }
    };
    let gguf = matches!(s.layout, DeltaNetLayout::Gguf { .. });
    let name = |hf: &str, gg: &str| format!("{base}.{}", if gguf { gg } else { hf });
    let conv_name = name("conv1d.weight", "ssm_conv1d.weight");
    let conv_t = l.require(&conv_name)?;
    if conv_t.n_elems() != channels * s.kernel {
        return Err(ModelError::shape(
            conv_t.file,
            &conv_name,
            format!(
                "shape {:?}, expected [{channels}, 1, {}]",
                conv_t.shape, s.kernel
            ),
        ));
    }
    let conv = conv_t.to_f32()?;
    let neg_a = if gguf {
        l.vector(&name("", "ssm_a"), nv)?
    } else {
        l.vector(&name("A_log", ""), nv)?
            .into_iter()
            .map(|x| -x.exp())
            .collect()
    };
    Ok(DeltaNet {
        n_k_heads: nk,
        n_v_heads: nv,
        k_dim: dk,
        v_dim: dv,
        conv_kernel: s.kernel,
        key_head_of: match s.layout {
            DeltaNetLayout::Gguf { tiled: true } => KeyHeadMap::Tiled,
            _ => KeyHeadMap::Grouped,
        },
        qkv,
        z,
        b,
        a,
        conv,
        neg_a,
        dt_bias: l.vector(&name("dt_bias", "ssm_dt.bias"), nv)?,
        norm: Norm {
            kind: NormKind::Rms,
            eps,
            weight: l.vector(&name("norm.weight", "ssm_norm.weight"), dv)?,
            bias: None,
        },
        out: l.linear(
            &name("out_proj.weight", "ssm_out.weight"),
            hidden,
            value_dim,
            None,
        )?,
    })
}

/// The short convolution of layer `i` (transformers: `conv.in_proj`, `conv.conv`,
/// `conv.out_proj`; llama.cpp: `shortconv.in_proj`, `shortconv.conv`, `shortconv.out_proj`).
pub(crate) fn short_conv(
    l: &TensorLoader,
    i: usize,
    s: &ShortConvSpec,
    hidden: usize,
    naming: Naming,
) -> Result<ShortConv> {
    let base = match naming {
        Naming::Gguf => format!("blk.{i}.shortconv"),
        _ => format!("model.layers.{i}.conv"),
    };
    let conv_name = format!("{base}.conv.weight");
    let t = l.require(&conv_name)?;
    if t.n_elems() != hidden * s.kernel {
        return Err(ModelError::shape(
            t.file,
            &conv_name,
            format!("shape {:?}, expected [{hidden}, 1, {}]", t.shape, s.kernel),
        ));
    }
    let lin = |n: &str, o: usize| {
        l.linear(
            &format!("{base}.{n}.weight"),
            o,
            hidden,
            Some(&format!("{base}.{n}.bias")),
        )
    };
    Ok(ShortConv {
        kernel: s.kernel,
        in_proj: lin("in_proj", 3 * hidden)?,
        conv: t.to_f32()?,
        conv_bias: l.vector_opt(&format!("{base}.conv.bias"), hidden)?,
        out: lin("out_proj", hidden)?,
    })
}

/// Rows of `b` and `a` in an `in_proj_ba` that holds, per key group, `b (r) | a (r)`.
fn grouped_ba_rows(nk: usize, r: usize) -> (Vec<usize>, Vec<usize>) {
    let b = (0..nk).flat_map(|g| g * 2 * r..g * 2 * r + r).collect();
    let a = (0..nk)
        .flat_map(|g| g * 2 * r + r..g * 2 * r + 2 * r)
        .collect();
    (b, a)
}

/// Splits a gated `q_proj` (`[n_heads · 2 · hd, hidden]`, per head `query (hd) | gate (hd)`)
/// into the query and the gate.
pub(crate) fn gated_query(
    l: &TensorLoader,
    name: &str,
    n_heads: usize,
    hd: usize,
    hidden: usize,
) -> Result<(Linear, Linear)> {
    let rows = n_heads * 2 * hd;
    let q_rows: Vec<usize> = (0..n_heads)
        .flat_map(|h| h * 2 * hd..h * 2 * hd + hd)
        .collect();
    let g_rows: Vec<usize> = (0..n_heads)
        .flat_map(|h| h * 2 * hd + hd..h * 2 * hd + 2 * hd)
        .collect();
    Ok((
        rows_of(l, name, rows, hidden, &q_rows)?,
        rows_of(l, name, rows, hidden, &g_rows)?,
    ))
}
