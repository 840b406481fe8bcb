//! Compressed weights in the simulator: a constexpr output is dequantised by its definition
//! ([`crate::constexpr::dense_f32`]) once, when the function is prepared, never per run.
//!
//! Model: the f32 result is rounded once to fp16 and the fp16 compute reads that, i.e. the ANE
//! is taken to read decompressed fp16 weights. Unverified on hardware: the ANE may dequantise
//! in another precision or at another point.

use half::f16;

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Function, ValueId};

use super::linalg::ConvWeights;
use super::tensor::Tensor;

/// The value of `id` (a const or constexpr output) as a tensor of its declared dtype: fp16
/// rounded once from the f32 evaluation, fp32 as evaluated, int8/uint8 palettes as int32.
pub(super) fn constexpr_tensor(f: &Function, id: ValueId) -> Result<Tensor> {
    let ty = f.type_of(id).tensor();
    let v = crate::constexpr::dense_f32(f, id)?;
    match ty.dtype {
        DType::Fp16 => Tensor::fp16(ty.shape.clone(), v),
        DType::Fp32 => Tensor::float(DType::Fp32, ty.shape.clone(), v),
        d if d.is_int() => {
            Tensor::int32(ty.shape.clone(), v.into_iter().map(|x| x as i32).collect())
        }
        d => Err(MilError::invalid(format!(
            "{}: a {d} constant is not a simulator tensor",
            f.name_of(id)
        ))),
    }
}

/// The `[cout, cin, 1, 1]` weights of a conv from a const (fp16 blobs taken as is) or from a
/// constexpr output (rounded once to fp16).
pub(super) fn conv_weights(f: &Function, id: ValueId) -> Result<ConvWeights> {
    if let Some(lit) = f.const_value(id) {
        return ConvWeights::from_literal(lit);
    }
    let is_constexpr = f
        .producer(id)
        .is_some_and(|op| crate::constexpr::is_evaluated(&op.op_type));
    if !is_constexpr {
        return Err(MilError::invalid(
            "conv weight is not a constant (the ANE silently ignores runtime conv weights; use matmul)",
        ));
    }
    let ty = f.type_of(id).tensor();
    let (cout, cin) = ConvWeights::dims(ty.dtype, &ty.shape)?;
    let values = crate::constexpr::dense_f32(f, id)?
        .into_iter()
        .map(f16::from_f32)
        .collect();
    Ok(ConvWeights { cout, cin, values })
}
