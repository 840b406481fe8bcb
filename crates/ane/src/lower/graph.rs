//! Graph pieces both strategies build from: a conv with its scale-back and bias, per-column
//! normalisation of a conv's input (fp16 range), activations from ops that compile.

use std::sync::Arc;

use anelm_mil::{DType, FunctionBuilder, TensorType, ValueId, WeightData};
use anelm_model::plan::Activation;

use super::encode::Encoded;
use crate::error::Result;

/// `gelu_tanh(g) = 0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³))) = g · sigmoid(g (A + B g²))`:
/// sigmoid compiles where gelu does not (FACTS §1.5), and `g²` overflows fp16 only beyond
/// |g| = 256, where the sigmoid saturates correctly anyway (g³ would overflow beyond 40).
const GELU_A: f32 = 1.595_769; // 2 √(2/π)
const GELU_B: f32 = 0.071_354_82; // 2 √(2/π) · 0.044715

/// The bound partial sums are kept under (half the 2^15 at which the ANE returns 0).
pub const PARTIAL_TARGET: f32 = 16384.0;

/// `y = x Wᵀ` as a 1×1 conv over `w` (fp16 or blockwise, [`Encoded::emit`]), multiplied by
/// `back` (per column) and plus `bias` (fp16, one value per row); the output value is named
/// `name`.
pub fn linear(
    f: &mut FunctionBuilder,
    name: &str,
    x: ValueId,
    back: Option<ValueId>,
    w: &Encoded,
    bias: Option<Arc<WeightData>>,
) -> Result<ValueId> {
    let wt = w.emit(f, &format!("{name}_w"))?;
    let mut y = f.name_next(&format!("{name}_conv")).conv1x1(x, wt)?;
    if let Some(d) = back {
        y = f.name_next(&format!("{name}_back")).mul(y, d)?;
    }
    if let Some(b) = bias {
        let bt = f.weight(&format!("{name}_b"), TensorType::fp16([1, w.rows, 1, 1]), b)?;
        y = f.name_next(&format!("{name}_biased")).add(y, bt)?;
    }
    f.rename(y, name)?;
    Ok(y)
}

/// `x` brought, per slice along the other axes, to a largest magnitude over `axes` of
/// `2^14 / l1` — so that a conv or matmul over it whose weight rows have L1 norms ≤ `l1` keeps
/// every partial sum ≤ 2^14 and its products far above the flush threshold — and the factor
/// that undoes it, times `out_scale`. The factor is an fp16 quotient: two roundings.
pub fn normalize(
    f: &mut FunctionBuilder,
    name: &str,
    x: ValueId,
    axes: &[i32],
    l1: f32,
    out_scale: f32,
    alts: &super::Alternatives,
) -> Result<(ValueId, ValueId)> {
    let target = (PARTIAL_TARGET / l1.max(f32::MIN_POSITIVE)).min(32768.0);
    let a = alts.abs(f, &format!("{name}_abs"), x)?;
    let m = f
        .name_next(&format!("{name}_max"))
        .reduce("reduce_max", a, axes, true)?;
    // The floor keeps an all-zero slice finite (its factor ≤ 2^15).
    let m = f
        .name_next(&format!("{name}_maxf"))
        .binary_scalar("add", m, target / 32768.0)?;
    let c = f.scalar(&format!("{name}_target"), DType::Fp16, target)?;
    let scale = f.name_next(&format!("{name}_scale")).real_div(c, m)?;
    let back =
        f.name_next(&format!("{name}_unscale"))
            .binary_scalar("mul", m, out_scale / target)?;
    let xs = f.name_next(&format!("{name}_in")).mul(x, scale)?;
    Ok((xs, back))
}

pub fn activate(
    f: &mut FunctionBuilder,
    act: Activation,
    g: ValueId,
    name: &str,
) -> Result<ValueId> {
    Ok(match act {
        Activation::Silu => {
            let s = f.name_next(&format!("{name}_sig")).sigmoid(g)?;
            f.name_next(name).mul(g, s)?
        }
        Activation::GeluTanh => {
            let g2 = f.name_next(&format!("{name}_sq")).mul(g, g)?;
            let t = f
                .name_next(&format!("{name}_b"))
                .binary_scalar("mul", g2, GELU_B)?;
            let t = f
                .name_next(&format!("{name}_ab"))
                .binary_scalar("add", t, GELU_A)?;
            let z = f.name_next(&format!("{name}_z")).mul(t, g)?;
            let s = f.name_next(&format!("{name}_sig")).sigmoid(z)?;
            f.name_next(name).mul(g, s)?
        }
    })
}
