//! Type inference of the constexpr weight ops, rule for rule as coremltools defines them
//! (`ops/defs/iOS16/constexpr_ops.py`, `ops/defs/iOS18/compression.py`), so that a program we
//! accept is one the validator's pymil rebuild accepts too.

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ops::{norm_axis, Ctx};
use crate::types::TensorType;

fn invalid(msg: impl Into<String>) -> MilError {
    MilError::invalid(msg)
}

/// Tensor operand `p`, which must be known at compile time (a const or a constexpr output).
fn const_tensor<'a>(c: &Ctx<'a>, p: &str) -> Result<Option<&'a TensorType>> {
    let t = c.opt_tensor(p)?;
    if t.is_some() && !c.is_compile_time(p)? {
        return Err(invalid(format!(
            "{p} must be a constant (a const or constexpr output), not a computed value"
        )));
    }
    Ok(t)
}

fn required<'a>(c: &Ctx<'a>, p: &str) -> Result<&'a TensorType> {
    const_tensor(c, p)?.ok_or_else(|| invalid(format!("missing parameter {p}")))
}

fn dtype_in(t: &TensorType, p: &str, allowed: &[DType]) -> Result<()> {
    if allowed.contains(&t.dtype) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    Err(invalid(format!(
        "{p} is {t}; its dtype must be one of {}",
        names.join(", ")
    )))
}

/// Block sizes `outer[i] / inner[i]` when `inner` has `outer`'s rank and every dim divides.
pub(crate) fn block_sizes(outer: &[usize], inner: &[usize], what: &str) -> Result<Vec<usize>> {
    if inner.len() != outer.len() {
        return Err(invalid(format!(
            "{what} has rank {}, needs rank {} like {outer:?}",
            inner.len(),
            outer.len()
        )));
    }
    outer
        .iter()
        .zip(inner)
        .enumerate()
        .map(|(i, (&o, &n))| {
            if n == 0 || o % n != 0 {
                Err(invalid(format!(
                    "{what} {inner:?}: dim {i} ({n}) does not divide {o} of {outer:?}"
                )))
            } else {
                Ok(o / n)
            }
        })
        .collect()
}

const FLOATS: &[DType] = &[DType::Fp16, DType::Fp32];

/// iOS16 `constexpr_affine_dequantize`: `scale * (quantized_data - zero_point)` with scale and
/// zero point scalars or vectors along `axis`; the result has scale's dtype.
pub(crate) fn infer_affine_dequantize(c: &Ctx) -> Result<Vec<TensorType>> {
    let q = required(c, "quantized_data")?;
    let zp = required(c, "zero_point")?;
    let scale = required(c, "scale")?;
    dtype_in(q, "quantized_data", &[DType::Uint8, DType::Int8])?;
    dtype_in(zp, "zero_point", &[DType::Uint8, DType::Int8, DType::Fp32])?;
    dtype_in(scale, "scale", FLOATS)?;
    let axis_t = required(c, "axis")?;
    if axis_t.dtype != DType::Int32 || !axis_t.is_scalar() {
        return Err(invalid(format!(
            "axis must be an int32 scalar, is {axis_t}"
        )));
    }
    let axis = c
        .opt_int("axis")?
        .ok_or_else(|| invalid("missing parameter axis"))?;
    let axis = norm_axis(axis, q.rank())?;
    for (p, t) in [("scale", scale), ("zero_point", zp)] {
        if t.rank() > 1 || (t.rank() == 1 && t.shape[0] != q.shape[axis]) {
            return Err(invalid(format!(
                "{p} must be a scalar or a vector of {} (dim {axis} of {q}), is {t}",
                q.shape[axis]
            )));
        }
    }
    Ok(vec![q.with_dtype(scale.dtype)])
}

/// iOS18 `constexpr_blockwise_shift_scale`: `scale * (data - offset)` per block, the block
/// sizes implied by `data.shape / scale.shape`; the result has scale's dtype.
pub(crate) fn infer_blockwise_shift_scale(c: &Ctx) -> Result<Vec<TensorType>> {
    const SRC: &[DType] = &[
        DType::Int4,
        DType::Uint4,
        DType::Int8,
        DType::Uint8,
        DType::Fp16,
        DType::Fp32,
    ];
    let data = required(c, "data")?;
    let scale = required(c, "scale")?;
    dtype_in(data, "data", SRC)?;
    dtype_in(scale, "scale", FLOATS)?;
    if data.rank() < 1 {
        return Err(invalid("data must have rank >= 1, is a scalar"));
    }
    block_sizes(&data.shape, &scale.shape, "scale")?;
    if let Some(off) = const_tensor(c, "offset")? {
        dtype_in(off, "offset", SRC)?;
        if off.shape != scale.shape {
            return Err(invalid(format!(
                "offset {off} must have scale's shape {:?}",
                scale.shape
            )));
        }
        if !off.dtype.is_float() && off.dtype != data.dtype {
            return Err(invalid(format!(
                "an integer offset must have data's dtype {}, is {off}",
                data.dtype
            )));
        }
    }
    Ok(vec![data.with_dtype(scale.dtype)])
}

/// iOS18 `constexpr_lut_to_dense`: `lut[group(i)][indices[i]]`, `lut` of shape
/// `[groups per indices dim..., 2^bits, vector_size]`; vectors fill `vector_axis`.
pub(crate) fn infer_lut_to_dense(c: &Ctx) -> Result<Vec<TensorType>> {
    let idx = required(c, "indices")?;
    let lut = required(c, "lut")?;
    let bits = index_bits(idx.dtype).ok_or_else(|| {
        invalid(format!(
            "indices is {idx}; its dtype must be one of uint1, uint2, uint3, uint4, uint6, uint8"
        ))
    })?;
    dtype_in(
        lut,
        "lut",
        &[DType::Int8, DType::Uint8, DType::Fp16, DType::Fp32],
    )?;
    let k = idx.rank();
    if k < 1 {
        return Err(invalid("indices must have rank >= 1, is a scalar"));
    }
    if lut.rank() != k + 2 {
        return Err(invalid(format!(
            "lut {lut} must have rank {} (indices rank + 2: groups..., palette, vector)",
            k + 2
        )));
    }
    block_sizes(&idx.shape, &lut.shape[..k], "lut's group dims")?;
    let palette = lut.shape[k];
    if palette != 1 << bits {
        return Err(invalid(format!(
            "lut {lut} has {palette} entries per palette; {} indices need {}",
            idx.dtype,
            1u32 << bits
        )));
    }
    let vector = lut.shape[k + 1];
    let mut out = idx.shape.clone();
    match const_tensor(c, "vector_axis")? {
        Some(t) => {
            if t.dtype != DType::Int32 || !t.is_scalar() {
                return Err(invalid(format!(
                    "vector_axis must be an int32 scalar, is {t}"
                )));
            }
            let a = c
                .opt_int("vector_axis")?
                .ok_or_else(|| invalid("vector_axis must be a constant"))?;
            let a = norm_axis(a, k)?;
            out[a] = out[a]
                .checked_mul(vector)
                .ok_or_else(|| invalid("lut_to_dense result too large"))?;
        }
        None if vector > 1 => {
            return Err(invalid(format!(
                "lut {lut} holds vectors of {vector}; vector_axis must be given"
            )))
        }
        None => {}
    }
    Ok(vec![TensorType::new(lut.dtype, out)])
}

/// Bits per index of a palette index dtype.
pub(crate) fn index_bits(d: DType) -> Option<u32> {
    matches!(
        d,
        DType::Uint1 | DType::Uint2 | DType::Uint3 | DType::Uint4 | DType::Uint6 | DType::Uint8
    )
    .then(|| d.bits())
}
