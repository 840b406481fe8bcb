//! What the ANE programs compute. Projection strategy: every mixer (softmax attention with or
//! without an output gate, gated DeltaNet, LFM2's short conv) as an input and an output
//! projection with the recurrence, conv and gating on the host, dense FFNs and host-routed
//! experts. Fused strategy: every mixer in the graph (the DeltaNet one token per evaluation),
//! dense FFNs and mixtures held dense.

use anelm_model::plan::{Activation, Attention, Ffn, Layer, Linear, Mixer, Moe};
use anelm_model::Model;

use crate::error::{AneError, Result};

pub(crate) fn unsupported(layer: usize, what: &str) -> AneError {
    AneError::Unsupported(format!(
        "layer {layer}: {what} is not lowered to ANE programs yet; run this model with --device cpu"
    ))
}

/// Ok when every layer of `model` is one the projection strategy expresses: every mixer and
/// FFN the LayerPlan has (the match is exhaustive, so a new mixer must say how it lowers).
pub fn ensure_lowerable(model: &Model) -> Result<()> {
    for l in &model.layers {
        match &l.mixer {
            Mixer::Attention(_) | Mixer::DeltaNet(_) | Mixer::ShortConv(_) => {}
        }
    }
    Ok(())
}

/// Ok when the fused strategy expresses every layer of `model` (mixtures of many experts it
/// refuses when it segments the model). The match is exhaustive: a new mixer must say.
pub fn ensure_fusable(model: &Model) -> Result<()> {
    for l in &model.layers {
        match &l.mixer {
            Mixer::Attention(_) | Mixer::DeltaNet(_) | Mixer::ShortConv(_) => {}
        }
    }
    Ok(())
}

/// The refusal of a mixture of experts too large to hold densely in a fused chunk.
pub(crate) fn moe_in_fused(index: usize, why: &str) -> AneError {
    AneError::Unsupported(format!(
        "layer {index}: {why}, too many to run densely in a fused chunk; \
         use --strategy projection (experts routed on the host) or --device cpu"
    ))
}

/// The softmax attention of layer `index` (of a fused chunk, which builds the other mixers
/// on their own).
pub fn attention(l: &Layer, index: usize) -> Result<&Attention> {
    match &l.mixer {
        Mixer::Attention(a) => Ok(a),
        Mixer::DeltaNet(_) => Err(unsupported(index, "a gated DeltaNet as attention")),
        Mixer::ShortConv(_) => Err(unsupported(index, "a short convolution as attention")),
    }
}

/// The linears of layer `l`'s mixer input kernel, stacked in this order (rows of its result):
/// attention `q | k | v (| gate)`, DeltaNet `qkv | z | b | a`, short conv `B | C | x`.
pub fn mixer_inputs(l: &Layer) -> Vec<&Linear> {
    match &l.mixer {
        Mixer::Attention(a) => {
            let mut v = vec![&a.q, &a.k, &a.v];
            v.extend(a.output_gate.as_ref());
            v
        }
        Mixer::DeltaNet(d) => vec![&d.qkv, &d.z, &d.b, &d.a],
        Mixer::ShortConv(c) => vec![&c.in_proj],
    }
}

/// The output projection of layer `l`'s mixer.
pub fn mixer_output(l: &Layer) -> &Linear {
    match &l.mixer {
        Mixer::Attention(a) => &a.o,
        Mixer::DeltaNet(d) => &d.out,
        Mixer::ShortConv(c) => &c.out,
    }
}

/// The activation of layer `index`'s FFN (of every expert, for a mixture).
pub fn ffn_activation(l: &Layer, _index: usize) -> Result<Activation> {
    match &l.ffn {
        Ffn::Gated { act, .. } | Ffn::Plain { act, .. } => Ok(*act),
        Ffn::Moe(m) => Ok(m.act),
    }
}

/// The mixture of experts of layer `index` (for its router and expert kernels).
pub fn mixture(l: &Layer, index: usize) -> Result<&Moe> {
    match &l.ffn {
        Ffn::Moe(m) => Ok(m),
        _ => Err(AneError::Unsupported(format!(
            "layer {index}: expert kernels for a dense FFN"
        ))),
    }
}
