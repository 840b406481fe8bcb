//! Loading the non-dense parts of a layer from Hugging Face checkpoints: mixture-of-experts FFNs
//! (Qwen2-MoE, Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE), gated DeltaNet mixers and the output-gated
//! attention of Qwen3-Next / Qwen3.5 (ARCHITECTURES.md §3, §4).

use crate::error::{ModelError, Result};
use crate::loader::TensorLoader;
use crate::plan::Activation;
use crate::plan::{DeltaNet, GatedMlp, KeyHeadMap, Linear, Moe, Norm, NormKind, SharedExpert};

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

pub(crate) fn moe(
    l: &TensorLoader,
    i: usize,
    s: &MoeSpec,
    act: Activation,
    hidden: usize,
) -> Result<Moe> {
    let base = format!("model.layers.{i}.mlp");
    let experts = (0..s.n_experts)
        .map(|e| hf_mlp(l, &format!("{base}.experts.{e}"), s.expert_ffn, hidden))
        .collect::<Result<Vec<_>>>()?;
    let shared = match s.shared_ffn {
        Some(f) => {
            let gate_name = format!("{base}.shared_expert_gate.weight");
            let gate = if l.has(&gate_name) {
                Some(l.matrix(&gate_name, 1, hidden)?)
            } else {
                None
            };
            Some(SharedExpert {
                mlp: hf_mlp(l, &format!("{base}.shared_expert"), f, hidden)?,
                gate,
            })
        }
        None => None,
    };
    if s.top_k == 0 || s.top_k > s.n_experts {
        return Err(ModelError::invalid(
            l.path(),
            format!("top-{} of {} experts", s.top_k, s.n_experts),
        ));
    }
    Ok(Moe {
        act,
        router: l.matrix(&format!("{base}.gate.weight"), s.n_experts, hidden)?,
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
    let base = format!("model.layers.{i}.linear_attn");
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
            let b_rows: Vec<usize> = (0..nk).flat_map(|g| g * 2 * r..g * 2 * r + r).collect();
            let a_rows: Vec<usize> = (0..nk)
                .flat_map(|g| g * 2 * r + r..g * 2 * r + 2 * r)
                .collect();
            (
                rows_of(l, &name, rows, hidden, &qkv_rows)?,
                rows_of(l, &name, rows, hidden, &z_rows)?,
                rows_of(l, &ba, 2 * nv, hidden, &b_rows)?,
                rows_of(l, &ba, 2 * nv, hidden, &a_rows)?,
            )
        }
    };
    let conv_name = format!("{base}.conv1d.weight");
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
    let neg_a = l
        .vector(&format!("{base}.A_log"), nv)?
        .into_iter()
        .map(|x| -x.exp())
        .collect();
    Ok(DeltaNet {
        n_k_heads: nk,
        n_v_heads: nv,
        k_dim: dk,
        v_dim: dv,
        conv_kernel: s.kernel,
        key_head_of: KeyHeadMap::Grouped,
        qkv,
        z,
        b,
        a,
        conv,
        neg_a,
        dt_bias: l.vector(&format!("{base}.dt_bias"), nv)?,
        norm: Norm {
            kind: NormKind::Rms,
            eps,
            weight: l.vector(&format!("{base}.norm.weight"), dv)?,
            bias: None,
        },
        out: l.linear(&format!("{base}.out_proj.weight"), hidden, value_dim, None)?,
    })
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
