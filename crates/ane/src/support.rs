//! What the ANE programs compute: in every layer softmax attention (without an output gate) and
//! a dense FFN. Mixtures of experts and gated DeltaNet layers run on the CPU engine only; the
//! ways into the ANE path refuse them here with one clear error.

use anelm_model::plan::{Activation, Attention, Ffn, Layer, Mixer};
use anelm_model::Model;

use crate::error::{AneError, Result};

pub(crate) fn unsupported(layer: usize, what: &str) -> AneError {
    AneError::Unsupported(format!(
        "layer {layer}: {what} is not lowered to ANE programs yet; run this model with --device cpu"
    ))
}

/// Ok when every layer of `model` is one the lowering expresses.
pub fn ensure_lowerable(model: &Model) -> Result<()> {
    for (i, l) in model.layers.iter().enumerate() {
        attention(l, i)?;
        ffn_activation(l, i)?;
    }
    Ok(())
}

/// The attention of layer `index`.
pub fn attention(l: &Layer, index: usize) -> Result<&Attention> {
    match &l.mixer {
        Mixer::Attention(a) if a.output_gate.is_none() => Ok(a),
        Mixer::Attention(_) => Err(unsupported(index, "output-gated attention")),
        Mixer::DeltaNet(_) => Err(unsupported(index, "a gated DeltaNet mixer")),
    }
}

/// The activation of layer `index`'s dense FFN.
pub fn ffn_activation(l: &Layer, index: usize) -> Result<Activation> {
    match &l.ffn {
        Ffn::Gated { act, .. } | Ffn::Plain { act, .. } => Ok(*act),
        Ffn::Moe(_) => Err(unsupported(index, "a mixture-of-experts FFN")),
    }
}
