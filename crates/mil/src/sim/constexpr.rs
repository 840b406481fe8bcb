//! Compile-time weight ops (`constexpr_blockwise_shift_scale`, `constexpr_affine_dequantize`),
//! evaluated once when a program is prepared: each weight by the op's definition in f32 (exact
//! for integers times fp16 scales), then rounded once to fp16 — the simulator models the ANE as
//! reading decompressed fp16 weights (how the hardware decompresses is unverified).

use half::f16;

use crate::error::{MilError, Result};
use crate::ir::{Function, ValueDef, ValueId};
use crate::literal::Literal;

/// A constexpr result: its shape and fp16 values.
pub struct Dense {
    pub shape: Vec<usize>,
    pub values: Vec<f16>,
}

/// The op producing `id`, when it is a constexpr op.
pub fn producer(f: &Function, id: ValueId) -> Option<&crate::ir::Operation> {
    match f.value(id).def {
        ValueDef::Op { op, .. } => {
            let o = &f.ops()[op];
            o.op_type.starts_with("constexpr_").then_some(o)
        }
        _ => None,
    }
}

/// A constant operand's shape and values as f32 (a literal, or another constexpr's result).
fn operand(
    f: &Function,
    op: &crate::ir::Operation,
    p: &str,
) -> Result<Option<(Vec<usize>, Vec<f32>)>> {
    if let Some(id) = op.value_input(p) {
        if producer(f, id).is_some() {
            let (shape, v) = dense_f32(f, id)?;
            return Ok(Some((shape, v)));
        }
    }
    let Some(lit) = f.operand_literal(op, p) else {
        return if op.input(p).is_some() || op.attribute(p).is_some() {
            Err(MilError::invalid(format!(
                "{}: operand {p} must be a constant",
                op.op_type
            )))
        } else {
            Ok(None)
        };
    };
    let values = literal_f32(lit, p)?;
    Ok(Some((lit.ty().shape.clone(), values)))
}

fn literal_f32(lit: &Literal, p: &str) -> Result<Vec<f32>> {
    lit.values_f32()
        .ok_or_else(|| MilError::invalid(format!("operand {p} has no loaded data")))
}

fn required(f: &Function, op: &crate::ir::Operation, p: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    operand(f, op, p)?.ok_or_else(|| MilError::invalid(format!("{}: missing {p}", op.op_type)))
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// For each element of `shape`, the index of its block in a tensor of `block_shape` (each dim
/// dividing `shape`'s).
fn block_index(shape: &[usize], block_shape: &[usize]) -> Result<impl Fn(usize) -> usize> {
    if block_shape.len() != shape.len()
        || shape
            .iter()
            .zip(block_shape)
            .any(|(&d, &b)| b == 0 || d % b != 0)
    {
        return Err(MilError::invalid(format!(
            "scale shape {block_shape:?} does not divide data shape {shape:?}"
        )));
    }
    let (ds, bs) = (strides(shape), strides(block_shape));
    // Elements per block along each dim.
    let size: Vec<usize> = shape
        .iter()
        .zip(block_shape)
        .map(|(&d, &b)| d / b)
        .collect();
    let dims = shape.to_vec();
    Ok(move |i: usize| {
        (0..dims.len())
            .map(|k| ((i / ds[k]) % dims[k]) / size[k] * bs[k])
            .sum()
    })
}

/// The value `id` (produced by a constexpr op) by the op's definition, in f32.
pub fn dense_f32(f: &Function, id: ValueId) -> Result<(Vec<usize>, Vec<f32>)> {
    let op = producer(f, id)
        .ok_or_else(|| MilError::invalid(format!("{} is not a constexpr result", f.name_of(id))))?;
    let fail = |e: MilError| e.context(format!("{} ({})", f.name_of(id), op.op_type));
    match op.op_type.as_str() {
        "constexpr_blockwise_shift_scale" => {
            let (shape, data) = required(f, op, "data").map_err(fail)?;
            let (sshape, scale) = required(f, op, "scale").map_err(fail)?;
            let offset = operand(f, op, "offset").map_err(fail)?;
            let at = block_index(&shape, &sshape).map_err(fail)?;
            let off = offset.as_ref().map(|(_, o)| o.as_slice());
            let value = |q: f32, b: usize| scale[b] * (q - off.map_or(0.0, |o| o[b]));
            let out = match (shape.as_slice(), sshape.as_slice()) {
                // A conv weight [rows, cols, 1, 1] in row blocks: no index arithmetic per weight.
                (&[rows, cols, 1, 1], &[sr, sc, 1, 1]) if rows == sr && sc > 0 => {
                    let block = cols / sc;
                    (data.chunks(block).enumerate())
                        .flat_map(|(b, qs)| qs.iter().map(move |&q| value(q, b)))
                        .collect()
                }
                _ => (data.iter().enumerate())
                    .map(|(i, &q)| value(q, at(i)))
                    .collect(),
            };
            Ok((shape, out))
        }
        "constexpr_affine_dequantize" => {
            let (shape, data) = required(f, op, "quantized_data").map_err(fail)?;
            let (_, zp) = required(f, op, "zero_point").map_err(fail)?;
            let (_, scale) = required(f, op, "scale").map_err(fail)?;
            let axis = f
                .operand_literal(op, "axis")
                .and_then(|l| l.to_i64s())
                .and_then(|v| v.first().copied())
                .unwrap_or(0);
            let axis = crate::ops::norm_axis(axis, shape.len()).map_err(fail)?;
            let st = strides(&shape);
            let per = |v: &[f32], i: usize| {
                if v.len() == 1 {
                    v[0]
                } else {
                    v[(i / st[axis]) % shape[axis]]
                }
            };
            Ok((
                shape.clone(),
                data.iter()
                    .enumerate()
                    .map(|(i, &q)| (q - per(&zp, i)) * per(&scale, i))
                    .collect(),
            ))
        }
        other => Err(MilError::invalid(format!(
            "{other} is not supported by the simulator"
        ))),
    }
}

/// The value `id` as the simulator holds a weight: the definition's f32 values rounded once
/// to fp16.
pub fn dense(f: &Function, id: ValueId) -> Result<Dense> {
    let (shape, v) = dense_f32(f, id)?;
    Ok(Dense {
        shape,
        values: v.into_iter().map(f16::from_f32).collect(),
    })
}
