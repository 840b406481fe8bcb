//! Evaluation of constexpr-produced values by the ops' definitions, in f32: the dequantised
//! dense tensor a conv reads, exact for integer data and fp16 scales (one f32 rounding).

use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Function, Operation, ValueId};
use crate::literal::{BlobSource, Literal};
use crate::ops::norm_axis;
use crate::types::{TensorType, ValueType};

use super::infer::block_sizes;

fn invalid(msg: impl Into<String>) -> MilError {
    MilError::invalid(msg)
}

/// The value of `id` as f32, row-major: a `const` (loaded), or the output of a
/// `constexpr_affine_dequantize` / `constexpr_blockwise_shift_scale` / `constexpr_lut_to_dense`
/// op evaluated from its operands (recursively, so chained forms work).
///
/// Numerics: integer data, offsets and palette entries are exact in f32; `scale * (q - offset)`
/// is one f32 subtraction and one f32 multiplication. For the integer data GGUF holds and fp16
/// scales, `q - offset` is exact and the product has at most 19 significant bits, so the result
/// is exact and a later rounding to fp16 is the only rounding. (coremltools' numpy reference
/// computes the iOS18 op in the scale's dtype, which can round `q - offset` first when the
/// offset is fractional.)
pub fn dense_f32(f: &Function, id: ValueId) -> Result<Vec<f32>> {
    if id.index() >= f.values().len() {
        return Err(invalid(format!(
            "value id {} does not belong to function {}",
            id.0, f.name
        )));
    }
    let name = f.name_of(id);
    let op = f
        .producer(id)
        .ok_or_else(|| invalid(format!("{name} is a function input, not a constant")))?;
    let r = match op.op_type.as_str() {
        "const" => {
            let lit = op
                .attribute("val")
                .ok_or_else(|| invalid("const has no val"))?;
            literal_f32(lit)
        }
        "constexpr_affine_dequantize" => affine(f, op),
        "constexpr_blockwise_shift_scale" => blockwise(f, op),
        "constexpr_lut_to_dense" => lut(f, op),
        other => Err(invalid(format!(
            "{other} does not produce a compile-time constant"
        ))),
    };
    r.map_err(|e| e.context(format!("{name} ({})", op.op_type)))
}

fn literal_f32(lit: &Literal) -> Result<Vec<f32>> {
    lit.values_f32().ok_or_else(|| match lit {
        Literal::Blob {
            source: BlobSource::File { path, offset },
            ..
        } => invalid(format!(
            "blob {path} at offset {offset} is not loaded (resolve the program's blobs first)"
        )),
        _ => invalid(format!("{} is not a numeric constant", lit.ty())),
    })
}

/// Operand `p` of `op` however it is written: a literal binding, a bracket attribute, or a
/// value (a const or another constexpr output).
enum Operand<'a> {
    Literal(&'a Literal),
    Value(ValueId, &'a TensorType),
}

impl Operand<'_> {
    fn ty(&self) -> &TensorType {
        match self {
            Operand::Literal(l) => l.ty(),
            Operand::Value(_, t) => t,
        }
    }

    /// The operand's values; an fp16 intermediate (a constexpr output feeding another) is
    /// rounded to fp16 first, as its type says.
    fn f32s(&self, f: &Function) -> Result<Vec<f32>> {
        match self {
            Operand::Literal(l) => literal_f32(l),
            Operand::Value(id, t) => {
                let mut v = dense_f32(f, *id)?;
                if t.dtype == crate::DType::Fp16 {
                    crate::sim::numerics::round_in_place(&mut v);
                }
                Ok(v)
            }
        }
    }
}

fn operand<'a>(f: &'a Function, op: &'a Operation, p: &str) -> Result<Option<Operand<'a>>> {
    match op.input(p) {
        Some(Argument::Single(Binding::Literal(l))) => Ok(Some(Operand::Literal(l))),
        Some(Argument::Single(Binding::Value(id))) => match f.type_of(*id) {
            ValueType::Tensor(t) => Ok(Some(Operand::Value(*id, t))),
            ValueType::State(_) => Err(invalid(format!("operand {p} is a state"))),
        },
        Some(Argument::Tuple(_)) => Err(invalid(format!("operand {p} must not be a tuple"))),
        None => Ok(op.attribute(p).map(Operand::Literal)),
    }
}

fn required<'a>(f: &'a Function, op: &'a Operation, p: &str) -> Result<Operand<'a>> {
    operand(f, op, p)?.ok_or_else(|| invalid(format!("missing operand {p}")))
}

/// One integer operand (`axis`, `vector_axis`), however it is written.
fn int_operand(f: &Function, op: &Operation, p: &str) -> Result<Option<i64>> {
    let Some(o) = operand(f, op, p)? else {
        return Ok(None);
    };
    match o.f32s(f)?.as_slice() {
        [v] => Ok(Some(*v as i64)),
        _ => Err(invalid(format!("operand {p} must be one integer"))),
    }
}

fn checked_len(v: &[f32], t: &TensorType, p: &str) -> Result<()> {
    if v.len() != t.numel() {
        return Err(invalid(format!(
            "operand {p} holds {} values, its type {t} needs {}",
            v.len(),
            t.numel()
        )));
    }
    Ok(())
}

fn blockwise(f: &Function, op: &Operation) -> Result<Vec<f32>> {
    let (data, scale) = (required(f, op, "data")?, required(f, op, "scale")?);
    let shape = data.ty().shape.clone();
    let sshape = scale.ty().shape.clone();
    let mut out = data.f32s(f)?;
    checked_len(&out, data.ty(), "data")?;
    let s = scale.f32s(f)?;
    checked_len(&s, scale.ty(), "scale")?;
    let o = match operand(f, op, "offset")? {
        Some(off) => {
            let v = off.f32s(f)?;
            if off.ty().shape != sshape {
                return Err(invalid("offset must have scale's shape"));
            }
            checked_len(&v, off.ty(), "offset")?;
            Some(v)
        }
        None => None,
    };
    shift_scale(&mut out, &shape, &sshape, &s, o.as_deref())?;
    Ok(out)
}

fn affine(f: &Function, op: &Operation) -> Result<Vec<f32>> {
    let data = required(f, op, "quantized_data")?;
    let shape = data.ty().shape.clone();
    let axis = int_operand(f, op, "axis")?.ok_or_else(|| invalid("missing operand axis"))?;
    let axis = norm_axis(axis, shape.len())?;
    let n = shape[axis];
    // Scalars broadcast to the axis length when the other parameter is a vector.
    let param = |p: &str| -> Result<Vec<f32>> {
        let o = required(f, op, p)?;
        let v = o.f32s(f)?;
        checked_len(&v, o.ty(), p)?;
        match v.len() {
            1 => Ok(v),
            m if m == n && o.ty().rank() == 1 => Ok(v),
            _ => Err(invalid(format!(
                "{p} must be a scalar or a vector of {n}, is {}",
                o.ty()
            ))),
        }
    };
    let (mut s, mut z) = (param("scale")?, param("zero_point")?);
    let mut sshape = vec![1; shape.len()];
    if s.len() > 1 || z.len() > 1 {
        sshape[axis] = n;
        for v in [&mut s, &mut z] {
            if v.len() == 1 {
                *v = vec![v[0]; n];
            }
        }
    }
    let mut out = data.f32s(f)?;
    checked_len(&out, data.ty(), "quantized_data")?;
    shift_scale(&mut out, &shape, &sshape, &s, Some(&z))?;
    Ok(out)
}

/// `x = scale[b] * (x - offset[b])` in place, `b` the block of `x` (`shape / sshape` per dim).
fn shift_scale(
    x: &mut [f32],
    shape: &[usize],
    sshape: &[usize],
    scale: &[f32],
    offset: Option<&[f32]>,
) -> Result<()> {
    let blocks = block_sizes(shape, sshape, "scale")?;
    let r = shape.len();
    if r == 0 || x.is_empty() {
        return Ok(());
    }
    let last = shape[r - 1];
    let (bl, nb) = (blocks[r - 1], sshape[r - 1]);
    let sstrides = crate::sim::strides(sshape);
    let mut coord = vec![0usize; r - 1];
    for row in x.chunks_exact_mut(last) {
        let base: usize = (0..r - 1).map(|d| coord[d] / blocks[d] * sstrides[d]).sum();
        for (jb, chunk) in row.chunks_exact_mut(bl).enumerate().take(nb) {
            let s = scale[base + jb];
            match offset {
                Some(o) => {
                    let o = o[base + jb];
                    chunk.iter_mut().for_each(|v| *v = s * (*v - o));
                }
                None => chunk.iter_mut().for_each(|v| *v *= s),
            }
        }
        advance(&mut coord, &shape[..r - 1]);
    }
    Ok(())
}

/// Row-major odometer step over `shape`.
fn advance(coord: &mut [usize], shape: &[usize]) {
    for d in (0..coord.len()).rev() {
        coord[d] += 1;
        if coord[d] < shape[d] {
            return;
        }
        coord[d] = 0;
    }
}

fn lut(f: &Function, op: &Operation) -> Result<Vec<f32>> {
    let idx_op = required(f, op, "indices")?;
    let lut_op = required(f, op, "lut")?;
    let ishape = idx_op.ty().shape.clone();
    let lshape = lut_op.ty().shape.clone();
    let k = ishape.len();
    if lshape.len() != k + 2 || k == 0 {
        return Err(invalid("lut must have rank(indices) + 2"));
    }
    let (palette, vs) = (lshape[k], lshape[k + 1]);
    let indices = index_values(f, &idx_op)?;
    if indices.len() != idx_op.ty().numel() {
        return Err(invalid("indices do not match their type"));
    }
    if let Some(&bad) = indices.iter().find(|&&i| i as usize >= palette) {
        return Err(invalid(format!(
            "index {bad} out of range of {palette} palette entries"
        )));
    }
    let table = lut_op.f32s(f)?;
    checked_len(&table, lut_op.ty(), "lut")?;
    let axis = match int_operand(f, op, "vector_axis")? {
        Some(a) => norm_axis(a, k)?,
        None if vs == 1 => k - 1,
        None => return Err(invalid("vector_axis must be given for vector palettes")),
    };
    let blocks = block_sizes(&ishape, &lshape[..k], "lut's group dims")?;
    let gstrides = crate::sim::strides(&lshape[..k]);
    let mut oshape = ishape.clone();
    oshape[axis] *= vs;
    let ostrides = crate::sim::strides(&oshape);
    let mut out = vec![0f32; oshape.iter().product()];
    let last = ishape[k - 1];
    let mut coord = vec![0usize; k - 1];
    for ids in indices.chunks_exact(last) {
        let gbase: usize = (0..k - 1).map(|d| coord[d] / blocks[d] * gstrides[d]).sum();
        let obase: usize = (0..k - 1)
            .map(|d| coord[d] * (if d == axis { vs } else { 1 }) * ostrides[d])
            .sum();
        for (j, &i) in ids.iter().enumerate() {
            let g = gbase + j / blocks[k - 1];
            let entry = &table[(g * palette + i as usize) * vs..][..vs];
            if axis == k - 1 {
                out[obase + j * vs..][..vs].copy_from_slice(entry);
            } else {
                for (v, &e) in entry.iter().enumerate() {
                    out[obase + j + v * ostrides[axis]] = e;
                }
            }
        }
        advance(&mut coord, &ishape[..k - 1]);
    }
    Ok(out)
}

/// Palette indices (at most 8 bits), decoded straight from their blob without an f32 copy.
fn index_values(f: &Function, o: &Operand) -> Result<Vec<u8>> {
    let lit = match o {
        Operand::Literal(l) => Some(*l),
        Operand::Value(id, _) => f.const_value(*id),
    };
    if let Some(d) = lit.and_then(|l| l.weight_data()) {
        return d
            .map_ints(|v| v as u8)
            .ok_or_else(|| invalid(format!("indices are {}, not integers", d.dtype())));
    }
    Ok(o.f32s(f)?.into_iter().map(|v| v as u8).collect())
}
