//! Shape and type inference of every op in the table, grouped by op family (MIL's op
//! definitions, as coremltools states them).

use super::*;

pub(super) fn infer_const(c: &Ctx) -> Result<Vec<TensorType>> {
    Ok(vec![c.required_literal("val")?.ty().clone()])
}

pub(super) fn infer_unary(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    if x.dtype == DType::String {
        return Err(invalid("x must be numeric"));
    }
    Ok(vec![x.clone()])
}

pub(super) fn infer_unary_float(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    if !x.dtype.is_float() {
        return Err(invalid(format!("x must be a float tensor, is {x}")));
    }
    if let Some(mode) = c.opt_string("mode")? {
        const MODES: &[&str] = &["EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION"];
        if !MODES.contains(&mode) {
            return Err(invalid(format!("unknown gelu mode {mode:?}")));
        }
    }
    Ok(vec![x.clone()])
}

pub(super) fn infer_clip(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    for p in ["alpha", "beta"] {
        if let Some(t) = c.opt_tensor(p)? {
            same_dtype(x, t)?;
        }
    }
    Ok(vec![x.clone()])
}

fn binary_shape(c: &Ctx) -> Result<(DType, Vec<usize>)> {
    let x = c.tensor("x")?;
    let y = c.tensor("y")?;
    same_dtype(x, y)?;
    Ok((x.dtype, broadcast(&x.shape, &y.shape)?))
}

pub(super) fn infer_binary(c: &Ctx) -> Result<Vec<TensorType>> {
    let (d, s) = binary_shape(c)?;
    if matches!(d, DType::Bool | DType::String) {
        return Err(invalid(format!("arithmetic on {d}")));
    }
    Ok(vec![TensorType::new(d, s)])
}

pub(super) fn infer_compare(c: &Ctx) -> Result<Vec<TensorType>> {
    let (_, s) = binary_shape(c)?;
    Ok(vec![TensorType::new(DType::Bool, s)])
}

pub(super) fn infer_logical(c: &Ctx) -> Result<Vec<TensorType>> {
    let (d, s) = binary_shape(c)?;
    if d != DType::Bool {
        return Err(invalid("logical ops need bool operands"));
    }
    Ok(vec![TensorType::new(DType::Bool, s)])
}

pub(super) fn infer_logical_not(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    if x.dtype != DType::Bool {
        return Err(invalid("logical_not needs a bool operand"));
    }
    Ok(vec![x.clone()])
}

pub(super) fn infer_select(c: &Ctx) -> Result<Vec<TensorType>> {
    let cond = c.tensor("cond")?;
    let a = c.tensor("a")?;
    let b = c.tensor("b")?;
    if cond.dtype != DType::Bool {
        return Err(invalid(format!("cond must be bool, is {cond}")));
    }
    same_dtype(a, b)?;
    let s = broadcast(&broadcast(&cond.shape, &a.shape)?, &b.shape)?;
    Ok(vec![TensorType::new(a.dtype, s)])
}

pub(super) fn infer_softmax(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    norm_axis(c.int_or("axis", -1)?, x.rank())?;
    Ok(vec![x.clone()])
}

fn reduced_shape(shape: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keep) {
            (true, true) => Some(1),
            (true, false) => None,
            (false, _) => Some(d),
        })
        .collect()
}

pub(super) fn infer_reduce(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let axes = match c.opt_ints("axes")? {
        Some(a) => norm_axes(&a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    let keep = c.bool_or("keep_dims", false)?;
    Ok(vec![x.with_shape(reduced_shape(&x.shape, &axes, keep))])
}

pub(super) fn infer_arg_reduce(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let axis = norm_axis(c.int_or("axis", -1)?, x.rank())?;
    let keep = c.bool_or("keep_dims", false)?;
    let dtype = match c.opt_string("output_dtype")? {
        None => DType::Int32,
        Some(s) => DType::from_name(s).ok_or_else(|| invalid(format!("unknown dtype {s:?}")))?,
    };
    Ok(vec![TensorType::new(
        dtype,
        reduced_shape(&x.shape, &[axis], keep),
    )])
}

pub(super) fn infer_conv(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let w = c.tensor("weight")?;
    if x.rank() < 3 || w.rank() != x.rank() {
        return Err(invalid(format!(
            "conv needs x [N, Cin, *spatial] and weight of the same rank, got {x} and {w}"
        )));
    }
    let spatial = x.rank() - 2;
    let groups = usize_of(c.int_or("groups", 1)?, "groups")?;
    if groups == 0 || x.shape[1] != w.shape[1] * groups {
        return Err(invalid(format!(
            "x has {} input channels, weight {w} with groups={groups} expects {}",
            x.shape[1],
            w.shape[1] * groups
        )));
    }
    let cout = w.shape[0];
    if cout % groups != 0 {
        return Err(invalid(format!(
            "output channels {cout} not divisible by groups {groups}"
        )));
    }
    if let Some(b) = c.opt_tensor("bias")? {
        if b.shape != [cout] {
            return Err(invalid(format!("bias must be [{cout}], is {b}")));
        }
    }
    let list = |p: &str| -> Result<Vec<i64>> {
        let v = c.opt_ints(p)?.unwrap_or_else(|| vec![1; spatial]);
        if v.len() != spatial || v.iter().any(|&s| s < 1) {
            return Err(invalid(format!(
                "{p} must be {spatial} positive integers, got {v:?}"
            )));
        }
        Ok(v)
    };
    let strides = list("strides")?;
    let dilations = list("dilations")?;
    let pad_type = c.opt_string("pad_type")?.unwrap_or("valid");
    let pads: Vec<i64> = match pad_type {
        "valid" | "same" | "same_lower" => vec![0; 2 * spatial],
        "custom" => {
            let p = c.opt_ints("pad")?.unwrap_or_else(|| vec![0; 2 * spatial]);
            if p.len() != 2 * spatial || p.iter().any(|&v| v < 0) {
                return Err(invalid(format!(
                    "pad must be {} non-negative integers, got {p:?}",
                    2 * spatial
                )));
            }
            p
        }
        other => return Err(invalid(format!("unknown pad_type {other:?}"))),
    };
    if let Some(p) = c.opt_ints("pad")? {
        if p.len() != 2 * spatial {
            return Err(invalid(format!(
                "pad must have {} entries, got {p:?}",
                2 * spatial
            )));
        }
    }
    let mut out = vec![x.shape[0], cout];
    for i in 0..spatial {
        let input = x.shape[2 + i] as i64;
        let k = w.shape[2 + i] as i64;
        let n = if pad_type.starts_with("same") {
            (input + strides[i] - 1) / strides[i]
        } else {
            let eff = dilations[i] * (k - 1) + 1;
            let padded = input + pads[2 * i] + pads[2 * i + 1];
            if padded < eff {
                return Err(invalid(format!(
                    "kernel {k} (dilated {eff}) larger than padded input {padded}"
                )));
            }
            (padded - eff) / strides[i] + 1
        };
        out.push(n as usize);
    }
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_matmul(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let y = c.tensor("y")?;
    same_dtype(x, y)?;
    if x.rank() == 0 || y.rank() == 0 {
        return Err(invalid("matmul operands must have rank >= 1"));
    }
    let mut xs = x.shape.clone();
    let mut ys = y.shape.clone();
    let x_vec = xs.len() == 1;
    let y_vec = ys.len() == 1;
    if x_vec {
        xs.insert(0, 1);
    } else if c.bool_or("transpose_x", false)? {
        let n = xs.len();
        xs.swap(n - 1, n - 2);
    }
    if y_vec {
        ys.push(1);
    } else if c.bool_or("transpose_y", false)? {
        let n = ys.len();
        ys.swap(n - 1, n - 2);
    }
    let (m, k) = (xs[xs.len() - 2], xs[xs.len() - 1]);
    let (k2, n) = (ys[ys.len() - 2], ys[ys.len() - 1]);
    if k != k2 {
        return Err(invalid(format!(
            "inner dimensions differ: {x} x {y} (after transposes {k} vs {k2})"
        )));
    }
    let mut out = broadcast(&xs[..xs.len() - 2], &ys[..ys.len() - 2])?;
    if !x_vec {
        out.push(m);
    }
    if !y_vec {
        out.push(n);
    }
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_linear(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let w = c.tensor("weight")?;
    same_dtype(x, w)?;
    if x.rank() == 0 || w.rank() != 2 || w.shape[1] != x.shape[x.rank() - 1] {
        return Err(invalid(format!(
            "linear needs x [..., D] and weight [O, D], got {x} and {w}"
        )));
    }
    if let Some(b) = c.opt_tensor("bias")? {
        if b.shape != [w.shape[0]] {
            return Err(invalid(format!("bias must be [{}], is {b}", w.shape[0])));
        }
    }
    let mut s = x.shape.clone();
    *s.last_mut().unwrap_or(&mut 0) = w.shape[0];
    Ok(vec![x.with_shape(s)])
}

pub(super) fn infer_layer_norm(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let axes = match c.opt_ints("axes")? {
        Some(a) => norm_axes(&a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    let want: Vec<usize> = axes.iter().map(|&a| x.shape[a]).collect();
    for p in ["gamma", "beta"] {
        if let Some(t) = c.opt_tensor(p)? {
            same_dtype(x, t)?;
            if t.shape != want {
                return Err(invalid(format!(
                    "{p} must have shape {want:?} (the normalized axes), is {t}"
                )));
            }
        }
    }
    Ok(vec![x.clone()])
}

pub(super) fn infer_reshape(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let spec = c.ints("shape")?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            0 => out.push(
                *x.shape
                    .get(i)
                    .ok_or_else(|| invalid(format!("shape entry 0 at {i} has no input dim")))?,
            ),
            d if d > 0 => out.push(d as usize),
            _ => return Err(invalid(format!("bad reshape target {spec:?}"))),
        }
    }
    let known: usize = out.iter().fold(1usize, |n, &d| n.saturating_mul(d));
    if let Some(i) = infer_at {
        if known == 0 || x.numel() % known != 0 {
            return Err(invalid(format!(
                "cannot infer -1 reshaping {x} to {spec:?}"
            )));
        }
        out[i] = x.numel() / known;
    }
    if x.with_shape(out.clone()).numel() != x.numel() {
        return Err(invalid(format!(
            "cannot reshape {x} ({} elements) to {out:?}",
            x.numel()
        )));
    }
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_transpose(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let perm = c.ints("perm")?;
    let axes: Vec<usize> = perm
        .iter()
        .map(|&a| norm_axis(a, x.rank()))
        .collect::<Result<_>>()?;
    let mut seen = axes.clone();
    seen.sort_unstable();
    if seen != (0..x.rank()).collect::<Vec<_>>() {
        return Err(invalid(format!(
            "perm {perm:?} is not a permutation of rank {}",
            x.rank()
        )));
    }
    Ok(vec![
        x.with_shape(axes.iter().map(|&a| x.shape[a]).collect())
    ])
}

pub(super) fn infer_concat(c: &Ctx) -> Result<Vec<TensorType>> {
    let vals = c.tuple("values")?;
    let first = vals.first().ok_or_else(|| invalid("concat of no values"))?;
    let axis = norm_axis(c.ints("axis").and_then(|v| one(&v, "axis"))?, first.rank())?;
    c.bool_or("interleave", false)?;
    let mut out = first.shape.clone();
    for v in &vals[1..] {
        same_dtype(first, v)?;
        if v.rank() != first.rank()
            || v.shape
                .iter()
                .enumerate()
                .any(|(i, &d)| i != axis && d != first.shape[i])
        {
            return Err(invalid(format!(
                "cannot concat {first} and {v} on axis {axis}"
            )));
        }
        out[axis] += v.shape[axis];
    }
    Ok(vec![first.with_shape(out)])
}

fn one(v: &[i64], what: &str) -> Result<i64> {
    match v {
        [x] => Ok(*x),
        _ => Err(invalid(format!("{what} must be a single integer"))),
    }
}

pub(super) fn infer_split(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let axis = norm_axis(c.ints("axis").and_then(|v| one(&v, "axis"))?, x.rank())?;
    let dim = x.shape[axis];
    let sizes: Vec<usize> = match (c.opt_ints("split_sizes")?, c.opt_int("num_splits")?) {
        (Some(s), _) => s
            .iter()
            .map(|&v| usize_of(v, "split size"))
            .collect::<Result<_>>()?,
        (None, Some(n)) => {
            let n = usize_of(n, "num_splits")?;
            if n == 0 || dim % n != 0 {
                return Err(invalid(format!(
                    "dimension {dim} does not split into {n} equal parts"
                )));
            }
            vec![dim / n; n]
        }
        (None, None) => return Err(invalid("split needs num_splits or split_sizes")),
    };
    if sizes.iter().sum::<usize>() != dim {
        return Err(invalid(format!(
            "split sizes {sizes:?} do not sum to {dim}"
        )));
    }
    Ok(sizes
        .into_iter()
        .map(|s| {
            let mut shape = x.shape.clone();
            shape[axis] = s;
            x.with_shape(shape)
        })
        .collect())
}

pub(super) fn infer_slice_by_size(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let size = c.ints("size")?;
    if size.len() != x.rank() {
        return Err(invalid(format!("size needs {} entries", x.rank())));
    }
    if !c.is_const("begin")? {
        // A runtime begin (e.g. the decode position): only the size fixes the shape.
        let b = c.tensor("begin")?;
        if b.dtype != DType::Int32 || b.shape != [x.rank()] {
            return Err(invalid(format!(
                "begin must be int32 [{}], is {b}",
                x.rank()
            )));
        }
        let out = size
            .iter()
            .zip(&x.shape)
            .map(|(&s, &d)| match usize::try_from(s) {
                Ok(s) if s <= d => Ok(s),
                _ => Err(invalid(format!(
                    "size {size:?} invalid for {x} with a runtime begin"
                ))),
            });
        return Ok(vec![x.with_shape(out.collect::<Result<_>>()?)]);
    }
    let begin = c.ints("begin")?;
    if begin.len() != x.rank() {
        return Err(invalid(format!("begin needs {} entries", x.rank())));
    }
    let mut out = Vec::with_capacity(x.rank());
    for i in 0..x.rank() {
        let d = x.shape[i] as i64;
        let b = if begin[i] < 0 { begin[i] + d } else { begin[i] };
        let s = if size[i] == -1 { d - b } else { size[i] };
        if b < 0 || s < 0 || b + s > d {
            return Err(invalid(format!(
                "slice begin {begin:?} size {size:?} out of bounds of {x}"
            )));
        }
        out.push(s as usize);
    }
    Ok(vec![x.with_shape(out)])
}

/// The shape selected by slice_by_index / slice_by_update operands.
fn index_slice_shape(c: &Ctx, x: &TensorType) -> Result<Vec<usize>> {
    let r = x.rank();
    let begin = c.ints("begin")?;
    let end = c.ints("end")?;
    let stride = c.opt_ints("stride")?.unwrap_or_else(|| vec![1; r]);
    let bmask = c.opt_bools("begin_mask")?.unwrap_or_else(|| vec![false; r]);
    let emask = c.opt_bools("end_mask")?.unwrap_or_else(|| vec![false; r]);
    let squeeze = c
        .opt_bools("squeeze_mask")?
        .unwrap_or_else(|| vec![false; r]);
    if [
        begin.len(),
        end.len(),
        stride.len(),
        bmask.len(),
        emask.len(),
        squeeze.len(),
    ]
    .iter()
    .any(|&n| n != r)
    {
        return Err(invalid(format!("slice operands need {r} entries each")));
    }
    let mut out = Vec::new();
    for i in 0..r {
        let d = x.shape[i] as i64;
        let s = stride[i];
        if s == 0 {
            return Err(invalid("slice stride 0"));
        }
        let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v + d } else { v };
        let len = if s > 0 {
            let b = if bmask[i] {
                0
            } else {
                clamp(norm(begin[i]), 0, d)
            };
            let e = if emask[i] {
                d
            } else {
                clamp(norm(end[i]), 0, d)
            };
            if e > b {
                (e - b + s - 1) / s
            } else {
                0
            }
        } else {
            let b = if bmask[i] {
                d - 1
            } else {
                clamp(norm(begin[i]), -1, d - 1)
            };
            let e = if emask[i] {
                -1
            } else {
                clamp(norm(end[i]), -1, d - 1)
            };
            if b > e {
                (b - e + (-s) - 1) / (-s)
            } else {
                0
            }
        };
        if squeeze[i] {
            if len != 1 {
                return Err(invalid(format!("squeeze_mask on axis {i} of length {len}")));
            }
        } else {
            out.push(len as usize);
        }
    }
    Ok(out)
}

pub(super) fn infer_slice_by_index(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    Ok(vec![x.with_shape(index_slice_shape(c, x)?)])
}

pub(super) fn infer_slice_update(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let u = c.tensor("update")?;
    same_dtype(x, u)?;
    if !c.is_const("begin")? || !c.is_const("end")? {
        // Runtime bounds (the KV-cache write position): the update keeps x's rank.
        for p in ["begin", "end"] {
            let t = c.tensor(p)?;
            if t.dtype != DType::Int32 || t.shape != [x.rank()] {
                return Err(invalid(format!("{p} must be int32 [{}], is {t}", x.rank())));
            }
        }
        if u.rank() != x.rank() || u.shape.iter().zip(&x.shape).any(|(a, b)| a > b) {
            return Err(invalid(format!("update {u} does not fit in {x}")));
        }
        return Ok(vec![x.clone()]);
    }
    let sel = index_slice_shape(c, x)?;
    if sel != u.shape {
        return Err(invalid(format!(
            "update {u} does not match the selected slice {sel:?}"
        )));
    }
    Ok(vec![x.clone()])
}

pub(super) fn infer_cast(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let name = c.string("dtype")?;
    let d = DType::from_name(name).ok_or_else(|| invalid(format!("unknown dtype {name:?}")))?;
    Ok(vec![x.with_dtype(d)])
}

pub(super) fn infer_gather(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let idx = c.tensor("indices")?;
    if !idx.dtype.is_int() {
        return Err(invalid(format!("indices must be integers, are {idx}")));
    }
    let axis = norm_axis(c.int_or("axis", 0)?, x.rank())?;
    let batch = usize_of(c.int_or("batch_dims", 0)?, "batch_dims")?;
    if batch > axis || batch > idx.rank() || idx.shape[..batch] != x.shape[..batch] {
        return Err(invalid(format!(
            "batch_dims {batch} inconsistent with {x} and {idx}"
        )));
    }
    c.bool_or("validate_indices", false)?;
    let mut out = x.shape[..axis].to_vec();
    out.extend_from_slice(&idx.shape[batch..]);
    out.extend_from_slice(&x.shape[axis + 1..]);
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_expand_dims(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let axes = c.ints("axes")?;
    let rank = x.rank() + axes.len();
    let axes = norm_axes(&axes, rank)?;
    let mut rest = x.shape.iter();
    let out = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                *rest.next().unwrap_or(&1)
            }
        })
        .collect();
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_squeeze(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let out = match c.opt_ints("axes")? {
        Some(a) => {
            let axes = norm_axes(&a, x.rank())?;
            if let Some(&bad) = axes.iter().find(|&&i| x.shape[i] != 1) {
                return Err(invalid(format!("cannot squeeze axis {bad} of {x}")));
            }
            reduced_shape(&x.shape, &axes, false)
        }
        None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
    };
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_tile(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let reps = c.ints("reps")?;
    if reps.len() != x.rank() {
        return Err(invalid(format!("reps needs {} entries", x.rank())));
    }
    let out = x
        .shape
        .iter()
        .zip(&reps)
        .map(|(&d, &r)| {
            usize_of(r, "reps")?
                .checked_mul(d)
                .ok_or_else(|| invalid("tile result too large"))
        })
        .collect::<Result<_>>()?;
    Ok(vec![x.with_shape(out)])
}

pub(super) fn infer_quantize(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("input")?;
    let scale = c.tensor("scale")?;
    same_dtype(x, scale)?;
    let name = c.string("output_dtype")?;
    let d = match name {
        "int8" => DType::Int8,
        "uint8" => DType::Uint8,
        other => {
            return Err(invalid(format!(
                "output_dtype must be int8 or uint8, got {other:?}"
            )))
        }
    };
    if let Some(zp) = c.opt_tensor("zero_point")? {
        if zp.dtype != d {
            return Err(invalid(format!("zero_point must be {d}, is {zp}")));
        }
    }
    Ok(vec![x.with_dtype(d)])
}

pub(super) fn infer_dequantize(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("input")?;
    let scale = c.tensor("scale")?;
    if !matches!(x.dtype, DType::Int8 | DType::Uint8) {
        return Err(invalid(format!("input must be int8/uint8, is {x}")));
    }
    Ok(vec![x.with_dtype(scale.dtype)])
}

pub(super) fn infer_read_state(c: &Ctx) -> Result<Vec<TensorType>> {
    Ok(vec![c.state("input")?.clone()])
}

pub(super) fn infer_update_state(c: &Ctx) -> Result<Vec<TensorType>> {
    let s = c.state("state")?;
    let v = c.tensor("value")?;
    if s != v {
        return Err(invalid(format!("value {v} does not match state {s}")));
    }
    Ok(vec![v.clone()])
}

pub(super) fn infer_sdpa(c: &Ctx) -> Result<Vec<TensorType>> {
    let q = c.tensor("query")?;
    let k = c.tensor("key")?;
    let v = c.tensor("value")?;
    same_dtype(q, k)?;
    same_dtype(q, v)?;
    let r = q.rank();
    if r < 3 || k.rank() != r || v.rank() != r {
        return Err(invalid(format!(
            "query/key/value must share a rank >= 3, got {q}, {k}, {v}"
        )));
    }
    if q.shape[r - 1] != k.shape[r - 1] || k.shape[r - 2] != v.shape[r - 2] {
        return Err(invalid(format!(
            "inconsistent attention shapes {q}, {k}, {v}"
        )));
    }
    let batch = broadcast(&q.shape[..r - 2], &k.shape[..r - 2])?;
    let mut out = broadcast(&batch, &v.shape[..r - 2])?;
    out.push(q.shape[r - 2]);
    out.push(v.shape[r - 1]);
    if let Some(m) = c.opt_tensor("attn_mask")? {
        broadcast(&m.shape, &[q.shape[r - 2], k.shape[r - 2]])?;
    }
    Ok(vec![q.with_shape(out)])
}
