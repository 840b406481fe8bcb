//! A chunk's weights as constants (fp16 or blockwise), prepared once and shared by its two functions: the
//! stacked QKV and gate/up matrices, biases, norm weights with the residual shift folded in,
//! and GGUF llama's Q/K rows reordered for half-split RoPE.

use std::ops::Range;
use std::sync::Arc;

use anelm_mil::WeightData;
use anelm_model::plan::{Attention, Ffn, Layer, Mixer, Norm, NormKind, RopePairing, ShortConv};
use anelm_model::Weight;

use super::super::encode::{Encoded, WeightTarget};
use super::super::weights::{bias_data, linear_biases, stacked, stacked_bias};
use super::deltanet::DeltaNetConsts;
use super::moe::MoeConsts;
use crate::error::Result;
use crate::support::attention;

/// A norm's weight (and bias) as constants of `shape`, times `scale`.
pub(super) struct NormConst {
    pub(super) kind: NormKind,
    pub(super) eps: f32,
    pub(super) weight: Arc<WeightData>,
    pub(super) bias: Option<Arc<WeightData>>,
}

impl NormConst {
    /// `n` with its weight (and bias) times `scale`, reordered by `order`, for an input held
    /// times `input_scale` (eps scales with the input's square: the norm stays exact).
    pub(super) fn new(
        n: &Norm,
        scale: f32,
        input_scale: f32,
        order: Option<&[usize]>,
    ) -> NormConst {
        let pick = |v: &[f32]| -> Vec<f32> {
            match order {
                Some(o) => o.iter().map(|&i| v[i] * scale).collect(),
                None => v.iter().map(|x| x * scale).collect(),
            }
        };
        NormConst {
            kind: n.kind,
            eps: n.eps * input_scale * input_scale,
            weight: Arc::new(WeightData::f16_from_f32(&pick(&n.weight))),
            bias: n
                .bias
                .as_ref()
                .map(|b| Arc::new(WeightData::f16_from_f32(&pick(b)))),
        }
    }
}

/// A linear's weights (in the policy's encoding) shared by both functions.
pub(super) struct LinearConst {
    pub(super) w: Encoded,
    pub(super) bias: Option<Arc<WeightData>>,
    /// The largest row L1 norm of the weights.
    pub(super) l1: f32,
}

impl LinearConst {
    pub(super) fn new(
        ws: &[&Weight],
        bias: Option<Vec<f32>>,
        policy: WeightTarget,
    ) -> Result<LinearConst> {
        Ok(Self::of(stacked(ws, policy)?, bias))
    }

    pub(super) fn of(w: Encoded, bias: Option<Vec<f32>>) -> LinearConst {
        LinearConst {
            l1: w.max_row_l1(),
            w,
            bias: bias_data(bias),
        }
    }
}

pub(super) struct LayerConsts {
    pub(super) attn_norm: NormConst,
    /// The mixer's input projection: attention's stacked QKV, a short conv's `B | C | x`.
    pub(super) qkv: LinearConst,
    pub(super) q_norm: Option<NormConst>,
    pub(super) k_norm: Option<NormConst>,
    /// The mixer's output projection.
    pub(super) o: LinearConst,
    /// A short conv's taps (its projections are `qkv` and `o`).
    pub(super) short_conv: Option<ShortConvConsts>,
    /// A gated DeltaNet's conv, gates and norm (its projections are `qkv` and `o`).
    pub(super) delta_net: Option<DeltaNetConsts>,
    pub(super) post_attn_norm: Option<NormConst>,
    pub(super) ffn_norm: NormConst,
    pub(super) ffn: FfnConsts,
    pub(super) post_ffn_norm: Option<NormConst>,
}

pub(super) enum FfnConsts {
    Dense {
        /// Gate (if gated) and up, stacked: one normalised input for both.
        gate_up: LinearConst,
        gated: bool,
        down: LinearConst,
    },
    /// Every expert dense in the program ([`super::moe`]).
    Moe(MoeConsts),
}

impl LayerConsts {
    /// Every matrix of the layer, in program order.
    pub(super) fn linears(&self) -> Vec<&LinearConst> {
        let mut v = vec![&self.qkv, &self.o];
        match &self.ffn {
            FfnConsts::Dense { gate_up, down, .. } => v.extend([gate_up, down]),
            FfnConsts::Moe(m) => v.extend(m.linears()),
        }
        v
    }
}

/// Row order that turns GGUF llama's adjacent-pair RoPE layout back into half-split (undoing
/// llama.cpp's permutation of Q/K rows per head, ARCHITECTURES.md §5), for `heads` heads.
pub(super) fn half_split_order(heads: usize, head_dim: usize, dims: usize) -> Vec<usize> {
    let half = dims / 2;
    (0..heads)
        .flat_map(|h| {
            (0..head_dim).map(move |r| {
                h * head_dim
                    + if r < half {
                        2 * r
                    } else if r < dims {
                        2 * (r - half) + 1
                    } else {
                        r
                    }
            })
        })
        .collect()
}

/// The mixer's input projection, QK-norms and output projection.
type MixerParts = (
    LinearConst,
    Option<NormConst>,
    Option<NormConst>,
    LinearConst,
    Option<ShortConvConsts>,
);

/// Softmax attention's stacked QKV, QK-norms and O.
fn attention_consts(
    a: &Attention,
    o_bias: Option<Vec<f32>>,
    policy: WeightTarget,
) -> Result<MixerParts> {
    // Adjacent pairs become half-split pairs by permuting Q/K rows (and their biases and
    // QK-norm weights); the attention scores are unchanged.
    let orders = match &a.rope {
        Some(r) if r.pairing == RopePairing::Adjacent => Some((
            half_split_order(a.n_heads, a.head_dim, r.dims),
            half_split_order(a.n_kv_heads, a.head_dim, r.dims),
            half_split_order(1, a.head_dim, r.dims),
        )),
        _ => None,
    };
    let permuted = orders
        .as_ref()
        .map(|(qo, ko, _)| (a.q.weight.permute_rows(qo), a.k.weight.permute_rows(ko)));
    let (qw, kw) = match &permuted {
        Some((q, k)) => (q, k),
        None => (&a.q.weight, &a.k.weight),
    };
    let perm_bias = |b: &Option<Vec<f32>>, o: Option<&Vec<usize>>| match (b, o) {
        (Some(b), Some(o)) => Some(o.iter().map(|&i| b[i]).collect::<Vec<f32>>()),
        (b, _) => b.clone(),
    };
    let (qb, kb) = (
        perm_bias(&a.q.bias, orders.as_ref().map(|o| &o.0)),
        perm_bias(&a.k.bias, orders.as_ref().map(|o| &o.1)),
    );
    let (qd, kvd) = (a.q.out_features(), a.k.out_features());
    // The output gate's rows follow q's order (one per query element).
    let gate_perm = match (&a.output_gate, &orders) {
        (Some(g), Some((qo, _, _))) => Some(g.weight.permute_rows(qo)),
        _ => None,
    };
    let gate = (gate_perm.as_ref()).or(a.output_gate.as_ref().map(|g| &g.weight));
    let mut ws = vec![qw, kw, &a.v.weight];
    ws.extend(gate);
    let mut biases = vec![
        (qb.as_deref(), qd),
        (kb.as_deref(), kvd),
        (a.v.bias.as_deref(), kvd),
    ];
    let gb =
        (a.output_gate.as_ref()).and_then(|g| perm_bias(&g.bias, orders.as_ref().map(|o| &o.0)));
    if a.output_gate.is_some() {
        biases.push((gb.as_deref(), qd));
    }
    let qkv = LinearConst::new(&ws, stacked_bias(&biases), policy)?;
    let head_order = orders.as_ref().map(|o| o.2.as_slice());
    let norm = |n: &Option<Norm>| n.as_ref().map(|n| NormConst::new(n, 1.0, 1.0, head_order));
    Ok((
        qkv,
        norm(&a.q_norm),
        norm(&a.k_norm),
        LinearConst::new(&[&a.o.weight], o_bias, policy)?,
        None,
    ))
}

/// LFM2's short conv: its taps (and bias) as `[1, h, 1, 1]` constants.
pub(super) struct ShortConvConsts {
    /// Tap `j` multiplies the input `kernel - 1 - j` tokens back.
    pub(super) taps: Vec<Arc<WeightData>>,
    pub(super) bias: Option<Arc<WeightData>>,
}

impl ShortConvConsts {
    fn new(c: &ShortConv) -> ShortConvConsts {
        let k = c.kernel;
        let h = c.conv.len() / k;
        ShortConvConsts {
            taps: (0..k)
                .map(|j| {
                    let tap: Vec<f32> = (0..h).map(|ch| c.conv[ch * k + j]).collect();
                    Arc::new(WeightData::f16_from_f32(&tap))
                })
                .collect(),
            bias: c
                .conv_bias
                .as_ref()
                .map(|b| Arc::new(WeightData::f16_from_f32(b))),
        }
    }
}

impl LayerConsts {
    /// Layer `index`'s weights; of a mixture, the experts `experts` only (all when None).
    pub(super) fn new(
        l: &Layer,
        index: usize,
        shift: f32,
        policy: WeightTarget,
        experts: Option<Range<usize>>,
    ) -> Result<LayerConsts> {
        // Layer outputs join the residual stream scaled by 2^-shift: through the sandwich norm
        // when there is one, else through the projection.
        let out_scale = |post: &Option<Norm>| if post.is_some() { 1.0 } else { shift };
        let scaled_bias =
            |b: &Option<Vec<f32>>, s: f32| b.as_ref().map(|b| b.iter().map(|v| v * s).collect());
        let d_scale = out_scale(&l.post_ffn_norm);
        let o_scale = out_scale(&l.post_attn_norm);
        let (qkv, q_norm, k_norm, o, short_conv) = match &l.mixer {
            Mixer::ShortConv(c) => (
                LinearConst::new(&[&c.in_proj.weight], linear_biases(&[&c.in_proj]), policy)?,
                None,
                None,
                LinearConst::new(&[&c.out.weight], scaled_bias(&c.out.bias, o_scale), policy)?,
                Some(ShortConvConsts::new(c)),
            ),
            Mixer::DeltaNet(d) => {
                let ins = [&d.qkv, &d.z, &d.b, &d.a];
                (
                    LinearConst::new(&ins.map(|l| &l.weight), linear_biases(&ins), policy)?,
                    None,
                    None,
                    LinearConst::new(&[&d.out.weight], scaled_bias(&d.out.bias, o_scale), policy)?,
                    None,
                )
            }
            _ => {
                let a = attention(l, index)?;
                attention_consts(a, scaled_bias(&a.o.bias, o_scale), policy)?
            }
        };
        let ffn = match &l.ffn {
            Ffn::Gated { gate, up, down, .. } => FfnConsts::Dense {
                gate_up: LinearConst::new(
                    &[&gate.weight, &up.weight],
                    linear_biases(&[gate, up]),
                    policy,
                )?,
                gated: true,
                down: LinearConst::new(&[&down.weight], scaled_bias(&down.bias, d_scale), policy)?,
            },
            Ffn::Plain { up, down, .. } => FfnConsts::Dense {
                gate_up: LinearConst::new(&[&up.weight], linear_biases(&[up]), policy)?,
                gated: false,
                down: LinearConst::new(&[&down.weight], scaled_bias(&down.bias, d_scale), policy)?,
            },
            Ffn::Moe(m) => FfnConsts::Moe(MoeConsts::new(
                m,
                index,
                policy,
                experts.unwrap_or(0..m.experts.len()),
            )?),
        };
        Ok(LayerConsts {
            attn_norm: NormConst::new(&l.attn_norm, 1.0, shift, None),
            qkv,
            q_norm,
            k_norm,
            o,
            short_conv,
            delta_net: match &l.mixer {
                Mixer::DeltaNet(d) => Some(DeltaNetConsts::new(d)),
                _ => None,
            },
            post_attn_norm: l
                .post_attn_norm
                .as_ref()
                .map(|n| NormConst::new(n, shift, 1.0, None)),
            ffn_norm: NormConst::new(&l.ffn_norm, 1.0, shift, None),
            ffn,
            post_ffn_norm: l
                .post_ffn_norm
                .as_ref()
                .map(|n| NormConst::new(n, shift, 1.0, None)),
        })
    }
}

/// The rest of a mixture that an earlier chunk began: its norm (of the pre-FFN residual, which
/// comes in as an input) and more of its experts.
pub(super) struct ResumeConsts {
    pub(super) ffn_norm: NormConst,
    /// [`FfnConsts::Moe`], of the slice's experts.
    pub(super) ffn: FfnConsts,
}

impl ResumeConsts {
    pub(super) fn new(
        l: &Layer,
        index: usize,
        shift: f32,
        policy: WeightTarget,
        experts: Range<usize>,
    ) -> Result<ResumeConsts> {
        let Ffn::Moe(m) = &l.ffn else {
            return Err(crate::error::AneError::Unsupported(format!(
                "layer {index}: only a mixture's experts can be split across chunks"
            )));
        };
        Ok(ResumeConsts {
            ffn_norm: NormConst::new(&l.ffn_norm, 1.0, shift, None),
            ffn: FfnConsts::Moe(MoeConsts::new(m, index, policy, experts)?),
        })
    }

    pub(super) fn linears(&self) -> Vec<&LinearConst> {
        match &self.ffn {
            FfnConsts::Moe(m) => m.linears(),
            FfnConsts::Dense { gate_up, down, .. } => vec![gate_up, down],
        }
    }
}
