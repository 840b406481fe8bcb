//! What the ANE programs compute: in every layer softmax attention (without an output gate) and
//! a dense FFN, or (projection strategy) a mixture of experts routed on the host. Gated DeltaNet
//! layers run on the CPU engine only; the ways into the ANE path refuse them here with one clear
//! error.

use anelm_model::plan::{Activation, Attention, Ffn, Layer, Mixer, Moe};
use anelm_model::Model;

use crate::error::{AneError, Result};

pub(crate) fn unsupported(layer: usize, what: &str) -> AneError {
    AneError::Unsupported(format!(
        "layer {layer}: {what} is not lowered to ANE programs yet; run this model with --device cpu"
    ))
}

/// Ok when every layer of `model` is one the projection strategy expresses (the fused strategy
/// also refuses mixtures: [`dense_ffn`]).
pub fn ensure_lowerable(model: &Model) -> Result<()> {
    for (i, l) in model.layers.iter().enumerate() {
        attention(l, i)?;
    }
    Ok(())
}

/// The refusal of a mixture of experts in the fused strategy.
pub(crate) fn moe_in_fused(index: usize) -> AneError {
    AneError::Unsupported(format!(
        "layer {index}: a mixture-of-experts FFN is not lowered to fused chunks yet; \
         use --strategy projection (experts routed on the host) or --device cpu"
    ))
}

/// The attention of layer `index`.
pub fn attention(l: &Layer, index: usize) -> Result<&Attention> {
    match &l.mixer {
        Mixer::Attention(a) if a.output_gate.is_none() => Ok(a),
        Mixer::Attention(_) => Err(unsupported(index, "output-gated attention")),
        Mixer::DeltaNet(_) => Err(unsupported(index, "a gated DeltaNet mixer")),
        Mixer::ShortConv(_) => Err(unsupported(index, "a short convolution (LFM2)")),
    }
}

/// The activation of layer `index`'s dense FFN.
pub fn ffn_activation(l: &Layer, index: usize) -> Result<Activation> {
    match &l.ffn {
        Ffn::Gated { act, .. } | Ffn::Plain { act, .. } => Ok(*act),
        Ffn::Moe(_) => Err(moe_in_fused(index)),
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
