//! The op table: for every op we type-check, its parameters, the opset that introduced it and
//! its shape/type inference — one row per op. Semantics follow the MIL op definitions
//! (coremltools `converters/mil/mil/ops/defs/iOS1x`), which is also what
//! `validate_mlpackage.py` re-runs on every package we write.

use crate::constexpr::{infer_affine_dequantize, infer_blockwise_shift_scale, infer_lut_to_dense};
use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Operation, Opset, ValueDef, ValueInfo};
use crate::literal::Literal;
use crate::types::{TensorType, ValueType};

/// One parameter of an op: its name and whether it may be omitted.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub required: bool,
}

const fn req(name: &'static str) -> Param {
    Param {
        name,
        required: true,
    }
}

const fn opt(name: &'static str) -> Param {
    Param {
        name,
        required: false,
    }
}

/// The definition of one op.
pub struct OpDef {
    pub name: &'static str,
    /// The first opset that has this op (Core ML's validator rejects it earlier).
    pub since: Opset,
    pub params: &'static [Param],
    /// Output types from the operand types and constant operands.
    pub infer: fn(&Ctx) -> Result<Vec<TensorType>>,
}

/// Looks an op up by name.
pub fn lookup(name: &str) -> Option<&'static OpDef> {
    OPS.iter().find(|d| d.name == name)
}

/// Every op in the table.
pub fn all_ops() -> &'static [OpDef] {
    OPS
}

/// What inference sees: the function's values and ops so far, and the op being typed.
pub struct Ctx<'a> {
    pub values: &'a [ValueInfo],
    pub ops: &'a [Operation],
    pub op: &'a Operation,
}

impl<'a> Ctx<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> MilError {
        MilError::invalid(msg.to_string())
    }

    /// The single binding of `p` (inputs first, then bracket attributes).
    fn single(&self, p: &str) -> Result<Option<SingleArg<'a>>> {
        if let Some(a) = self.op.input(p) {
            return match a {
                Argument::Single(Binding::Value(id)) => {
                    Ok(Some(SingleArg::Value(&self.values[id.index()])))
                }
                Argument::Single(Binding::Literal(l)) => Ok(Some(SingleArg::Literal(l))),
                Argument::Tuple(_) => Err(self.err(format!("parameter {p} must not be a tuple"))),
            };
        }
        Ok(self.op.attribute(p).map(SingleArg::Literal))
    }

    /// Type of tensor operand `p`, if given.
    pub fn opt_tensor(&self, p: &str) -> Result<Option<&'a TensorType>> {
        match self.single(p)? {
            None => Ok(None),
            Some(SingleArg::Literal(l)) => Ok(Some(l.ty())),
            Some(SingleArg::Value(v)) => match &v.ty {
                ValueType::Tensor(t) => Ok(Some(t)),
                ValueType::State(_) => Err(self.err(format!(
                    "parameter {p}: {} is a state; read it with read_state first",
                    v.name
                ))),
            },
        }
    }

    pub fn tensor(&self, p: &str) -> Result<&'a TensorType> {
        self.opt_tensor(p)?
            .ok_or_else(|| self.err(format!("missing parameter {p}")))
    }

    /// The wrapped tensor type of state operand `p`.
    pub fn state(&self, p: &str) -> Result<&'a TensorType> {
        match self.single(p)? {
            Some(SingleArg::Value(ValueInfo {
                ty: ValueType::State(t),
                ..
            })) => Ok(t),
            Some(_) => Err(self.err(format!("parameter {p} must be a state input"))),
            None => Err(self.err(format!("missing parameter {p}"))),
        }
    }

    /// Types of a tuple operand (`values = (a, b, c)`); a single binding counts as a 1-tuple.
    pub fn tuple(&self, p: &str) -> Result<Vec<&'a TensorType>> {
        let a = self
            .op
            .input(p)
            .ok_or_else(|| self.err(format!("missing parameter {p}")))?;
        a.bindings()
            .iter()
            .map(|b| match b {
                Binding::Literal(l) => Ok(l.ty()),
                Binding::Value(id) => match &self.values[id.index()].ty {
                    ValueType::Tensor(t) => Ok(t),
                    ValueType::State(_) => {
                        Err(self.err(format!("parameter {p}: states are not tensors")))
                    }
                },
            })
            .collect()
    }

    /// The constant value of operand `p`: a literal, or a value produced by `const`.
    pub fn literal(&self, p: &str) -> Result<Option<&'a Literal>> {
        match self.single(p)? {
            None => Ok(None),
            Some(SingleArg::Literal(l)) => Ok(Some(l)),
            Some(SingleArg::Value(v)) => match v.def {
                ValueDef::Op { op, .. } if self.ops[op].is_const() => {
                    Ok(self.ops[op].attribute("val"))
                }
                _ => Err(self.err(format!(
                    "parameter {p} must be a constant, {} is computed",
                    v.name
                ))),
            },
        }
    }

    /// Whether operand `p` is a constant (absent counts as constant: defaults are static).
    pub fn is_const(&self, p: &str) -> Result<bool> {
        match self.single(p)? {
            Some(SingleArg::Value(v)) => {
                Ok(matches!(v.def, ValueDef::Op { op, .. } if self.ops[op].is_const()))
            }
            _ => Ok(true),
        }
    }

    /// Whether operand `p` is known at compile time: a literal, or a value made by `const` or
    /// by a `constexpr_*` op (what the constexpr ops accept as operands).
    pub fn is_compile_time(&self, p: &str) -> Result<bool> {
        match self.single(p)? {
            Some(SingleArg::Value(v)) => Ok(matches!(v.def, ValueDef::Op { op, .. }
                if self.ops[op].is_const() || self.ops[op].op_type.starts_with("constexpr_"))),
            _ => Ok(true),
        }
    }

    fn required_literal(&self, p: &str) -> Result<&'a Literal> {
        self.literal(p)?
            .ok_or_else(|| self.err(format!("missing parameter {p}")))
    }

    pub fn opt_ints(&self, p: &str) -> Result<Option<Vec<i64>>> {
        match self.literal(p)? {
            None => Ok(None),
            Some(l) => l.to_i64s().map(Some).ok_or_else(|| {
                self.err(format!(
                    "parameter {p} must be an integer constant, is {}",
                    l.ty()
                ))
            }),
        }
    }

    pub fn ints(&self, p: &str) -> Result<Vec<i64>> {
        self.opt_ints(p)?
            .ok_or_else(|| self.err(format!("missing parameter {p}")))
    }

    pub fn opt_int(&self, p: &str) -> Result<Option<i64>> {
        match self.opt_ints(p)? {
            None => Ok(None),
            Some(v) if v.len() == 1 => Ok(Some(v[0])),
            Some(_) => Err(self.err(format!("parameter {p} must be a single integer"))),
        }
    }

    pub fn int_or(&self, p: &str, default: i64) -> Result<i64> {
        Ok(self.opt_int(p)?.unwrap_or(default))
    }

    pub fn bool_or(&self, p: &str, default: bool) -> Result<bool> {
        match self.literal(p)? {
            None => Ok(default),
            Some(l) => l
                .to_bool()
                .ok_or_else(|| self.err(format!("parameter {p} must be a bool constant"))),
        }
    }

    pub fn opt_bools(&self, p: &str) -> Result<Option<Vec<bool>>> {
        match self.literal(p)? {
            None => Ok(None),
            Some(l) => match l.elements() {
                Some(crate::literal::Elements::Bool(v)) => Ok(Some(v.clone())),
                _ => Err(self.err(format!("parameter {p} must be a bool tensor constant"))),
            },
        }
    }

    pub fn opt_string(&self, p: &str) -> Result<Option<&'a str>> {
        match self.literal(p)? {
            None => Ok(None),
            Some(l) => l
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(format!("parameter {p} must be a string constant"))),
        }
    }

    pub fn string(&self, p: &str) -> Result<&'a str> {
        self.opt_string(p)?
            .ok_or_else(|| self.err(format!("missing parameter {p}")))
    }
}

enum SingleArg<'a> {
    Value(&'a ValueInfo),
    Literal(&'a Literal),
}

/// Checks that every given operand is a parameter of `def` and every required one is given.
pub fn check_params(def: &OpDef, op: &Operation) -> Result<()> {
    let given = op
        .inputs
        .iter()
        .map(|(k, _)| k.as_str())
        .chain(op.attributes.iter().map(|(k, _)| k.as_str()));
    for k in given {
        if !def.params.iter().any(|p| p.name == k) {
            let known: Vec<_> = def.params.iter().map(|p| p.name).collect();
            return Err(MilError::invalid(format!(
                "unknown parameter {k} (known: {})",
                known.join(", ")
            )));
        }
    }
    for p in def.params.iter().filter(|p| p.required) {
        if op.input(p.name).is_none() && op.attribute(p.name).is_none() {
            return Err(MilError::invalid(format!("missing parameter {}", p.name)));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// shape helpers

fn invalid(msg: impl Into<String>) -> MilError {
    MilError::invalid(msg)
}

/// Normalizes a possibly negative axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(invalid(format!("axis {axis} out of range for rank {rank}")));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out: Vec<usize> = axes
        .iter()
        .map(|&a| norm_axis(a, rank))
        .collect::<Result<_>>()?;
    let n = out.len();
    out.sort_unstable();
    out.dedup();
    if out.len() != n {
        return Err(invalid(format!("repeated axis in {axes:?}")));
    }
    Ok(out)
}

/// Numpy-style broadcast of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(invalid(format!("shapes {a:?} and {b:?} do not broadcast"))),
        };
    }
    Ok(out)
}

fn same_dtype(a: &TensorType, b: &TensorType) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(invalid(format!(
            "operand dtypes differ: {} vs {}",
            a.dtype, b.dtype
        )));
    }
    Ok(())
}

fn usize_of(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} must be non-negative, got {v}")))
}

// ---------------------------------------------------------------------------------------------
// inference functions, grouped by op family

fn infer_const(c: &Ctx) -> Result<Vec<TensorType>> {
    Ok(vec![c.required_literal("val")?.ty().clone()])
}

fn infer_unary(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    if x.dtype == DType::String {
        return Err(invalid("x must be numeric"));
    }
    Ok(vec![x.clone()])
}

fn infer_unary_float(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_clip(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_binary(c: &Ctx) -> Result<Vec<TensorType>> {
    let (d, s) = binary_shape(c)?;
    if matches!(d, DType::Bool | DType::String) {
        return Err(invalid(format!("arithmetic on {d}")));
    }
    Ok(vec![TensorType::new(d, s)])
}

fn infer_compare(c: &Ctx) -> Result<Vec<TensorType>> {
    let (_, s) = binary_shape(c)?;
    Ok(vec![TensorType::new(DType::Bool, s)])
}

fn infer_logical(c: &Ctx) -> Result<Vec<TensorType>> {
    let (d, s) = binary_shape(c)?;
    if d != DType::Bool {
        return Err(invalid("logical ops need bool operands"));
    }
    Ok(vec![TensorType::new(DType::Bool, s)])
}

fn infer_logical_not(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    if x.dtype != DType::Bool {
        return Err(invalid("logical_not needs a bool operand"));
    }
    Ok(vec![x.clone()])
}

fn infer_select(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_softmax(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_reduce(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let axes = match c.opt_ints("axes")? {
        Some(a) => norm_axes(&a, x.rank())?,
        None => (0..x.rank()).collect(),
    };
    let keep = c.bool_or("keep_dims", false)?;
    Ok(vec![x.with_shape(reduced_shape(&x.shape, &axes, keep))])
}

fn infer_arg_reduce(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_conv(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_matmul(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_linear(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_layer_norm(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_reshape(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_transpose(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_concat(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_split(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_slice_by_size(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_slice_by_index(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    Ok(vec![x.with_shape(index_slice_shape(c, x)?)])
}

fn infer_slice_update(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_cast(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("x")?;
    let name = c.string("dtype")?;
    let d = DType::from_name(name).ok_or_else(|| invalid(format!("unknown dtype {name:?}")))?;
    Ok(vec![x.with_dtype(d)])
}

fn infer_gather(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_expand_dims(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_squeeze(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_tile(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_quantize(c: &Ctx) -> Result<Vec<TensorType>> {
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

fn infer_dequantize(c: &Ctx) -> Result<Vec<TensorType>> {
    let x = c.tensor("input")?;
    let scale = c.tensor("scale")?;
    if !matches!(x.dtype, DType::Int8 | DType::Uint8) {
        return Err(invalid(format!("input must be int8/uint8, is {x}")));
    }
    Ok(vec![x.with_dtype(scale.dtype)])
}

fn infer_read_state(c: &Ctx) -> Result<Vec<TensorType>> {
    Ok(vec![c.state("input")?.clone()])
}

fn infer_update_state(c: &Ctx) -> Result<Vec<TensorType>> {
    let s = c.state("state")?;
    let v = c.tensor("value")?;
    if s != v {
        return Err(invalid(format!("value {v} does not match state {s}")));
    }
    Ok(vec![v.clone()])
}

fn infer_sdpa(c: &Ctx) -> Result<Vec<TensorType>> {
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

// ---------------------------------------------------------------------------------------------
// the table

const X: &[Param] = &[req("x")];
const X_EPS: &[Param] = &[req("x"), opt("epsilon")];
const XY: &[Param] = &[req("x"), req("y")];
const REDUCE: &[Param] = &[req("x"), opt("axes"), opt("keep_dims")];
const ARG_REDUCE: &[Param] = &[req("x"), opt("axis"), opt("keep_dims"), opt("output_dtype")];
const SLICE_INDEX: &[Param] = &[
    req("x"),
    req("begin"),
    req("end"),
    opt("stride"),
    opt("begin_mask"),
    opt("end_mask"),
    opt("squeeze_mask"),
];
const SLICE_UPDATE: &[Param] = &[
    req("x"),
    req("update"),
    req("begin"),
    req("end"),
    opt("stride"),
    opt("begin_mask"),
    opt("end_mask"),
    opt("squeeze_mask"),
];

macro_rules! op {
    ($name:literal, $since:ident, $params:expr, $infer:ident) => {
        OpDef {
            name: $name,
            since: Opset::$since,
            params: $params,
            infer: $infer,
        }
    };
}

static OPS: &[OpDef] = &[
    op!("const", Ios15, &[req("val")], infer_const),
    // elementwise unary
    op!("abs", Ios15, X, infer_unary),
    op!("ceil", Ios15, X, infer_unary),
    op!("floor", Ios15, X, infer_unary),
    op!("round", Ios15, X, infer_unary),
    op!("sign", Ios15, X, infer_unary),
    op!("square", Ios15, X, infer_unary),
    op!("identity", Ios15, X, infer_unary),
    op!("relu", Ios15, X, infer_unary),
    op!("relu6", Ios15, X, infer_unary_float),
    op!("sigmoid", Ios15, X, infer_unary_float),
    op!("silu", Ios15, X, infer_unary_float),
    op!("tanh", Ios15, X, infer_unary_float),
    op!("exp", Ios15, X, infer_unary_float),
    op!("exp2", Ios15, X, infer_unary_float),
    op!("sqrt", Ios15, X, infer_unary_float),
    op!("sin", Ios15, X, infer_unary_float),
    op!("cos", Ios15, X, infer_unary_float),
    op!("erf", Ios15, X, infer_unary_float),
    op!("softplus", Ios15, X, infer_unary_float),
    op!("log", Ios15, X_EPS, infer_unary_float),
    op!("rsqrt", Ios15, X_EPS, infer_unary_float),
    op!("inverse", Ios15, X_EPS, infer_unary_float),
    op!("gelu", Ios15, &[req("x"), opt("mode")], infer_unary_float),
    op!(
        "leaky_relu",
        Ios15,
        &[req("x"), opt("alpha")],
        infer_unary_float
    ),
    op!(
        "clip",
        Ios15,
        &[req("x"), req("alpha"), req("beta")],
        infer_clip
    ),
    op!("softmax", Ios15, &[req("x"), opt("axis")], infer_softmax),
    // elementwise binary
    op!("add", Ios15, XY, infer_binary),
    op!("sub", Ios15, XY, infer_binary),
    op!("mul", Ios15, XY, infer_binary),
    op!("real_div", Ios15, XY, infer_binary),
    op!("floor_div", Ios15, XY, infer_binary),
    op!("mod", Ios15, XY, infer_binary),
    op!("pow", Ios15, XY, infer_binary),
    op!("maximum", Ios15, XY, infer_binary),
    op!("minimum", Ios15, XY, infer_binary),
    op!("equal", Ios15, XY, infer_compare),
    op!("not_equal", Ios15, XY, infer_compare),
    op!("greater", Ios15, XY, infer_compare),
    op!("greater_equal", Ios15, XY, infer_compare),
    op!("less", Ios15, XY, infer_compare),
    op!("less_equal", Ios15, XY, infer_compare),
    op!("logical_and", Ios15, XY, infer_logical),
    op!("logical_or", Ios15, XY, infer_logical),
    op!("logical_xor", Ios15, XY, infer_logical),
    op!("logical_not", Ios15, X, infer_logical_not),
    op!(
        "select",
        Ios15,
        &[req("cond"), req("a"), req("b")],
        infer_select
    ),
    // reductions
    op!("reduce_sum", Ios15, REDUCE, infer_reduce),
    op!("reduce_mean", Ios15, REDUCE, infer_reduce),
    op!("reduce_max", Ios15, REDUCE, infer_reduce),
    op!("reduce_min", Ios15, REDUCE, infer_reduce),
    op!("reduce_prod", Ios15, REDUCE, infer_reduce),
    op!("reduce_argmax", Ios15, ARG_REDUCE, infer_arg_reduce),
    op!("reduce_argmin", Ios15, ARG_REDUCE, infer_arg_reduce),
    // linear algebra and normalization
    op!(
        "conv",
        Ios15,
        &[
            req("x"),
            req("weight"),
            opt("bias"),
            opt("strides"),
            opt("pad_type"),
            opt("pad"),
            opt("dilations"),
            opt("groups")
        ],
        infer_conv
    ),
    op!(
        "matmul",
        Ios15,
        &[req("x"), req("y"), opt("transpose_x"), opt("transpose_y")],
        infer_matmul
    ),
    op!(
        "linear",
        Ios15,
        &[req("x"), req("weight"), opt("bias")],
        infer_linear
    ),
    op!(
        "layer_norm",
        Ios15,
        &[
            req("x"),
            opt("axes"),
            opt("gamma"),
            opt("beta"),
            opt("epsilon")
        ],
        infer_layer_norm
    ),
    op!(
        "scaled_dot_product_attention",
        Ios18,
        &[req("query"), req("key"), req("value"), opt("attn_mask")],
        infer_sdpa
    ),
    // shape manipulation
    op!("reshape", Ios15, &[req("x"), req("shape")], infer_reshape),
    op!(
        "transpose",
        Ios15,
        &[req("x"), req("perm")],
        infer_transpose
    ),
    op!(
        "concat",
        Ios15,
        &[req("values"), req("axis"), opt("interleave")],
        infer_concat
    ),
    op!(
        "split",
        Ios15,
        &[req("x"), opt("num_splits"), opt("split_sizes"), req("axis")],
        infer_split
    ),
    op!(
        "slice_by_size",
        Ios15,
        &[req("x"), req("begin"), req("size")],
        infer_slice_by_size
    ),
    op!("slice_by_index", Ios15, SLICE_INDEX, infer_slice_by_index),
    op!("slice_update", Ios18, SLICE_UPDATE, infer_slice_update),
    op!(
        "expand_dims",
        Ios15,
        &[req("x"), req("axes")],
        infer_expand_dims
    ),
    op!("squeeze", Ios15, &[req("x"), opt("axes")], infer_squeeze),
    op!("tile", Ios15, &[req("x"), req("reps")], infer_tile),
    op!("cast", Ios15, &[req("x"), req("dtype")], infer_cast),
    op!(
        "gather",
        Ios15,
        &[
            req("x"),
            req("indices"),
            opt("axis"),
            opt("batch_dims"),
            opt("validate_indices")
        ],
        infer_gather
    ),
    // quantization
    op!(
        "constexpr_affine_dequantize",
        Ios16,
        &[
            req("quantized_data"),
            req("zero_point"),
            req("scale"),
            req("axis")
        ],
        infer_affine_dequantize
    ),
    op!(
        "constexpr_blockwise_shift_scale",
        Ios18,
        &[req("data"), req("scale"), opt("offset")],
        infer_blockwise_shift_scale
    ),
    op!(
        "constexpr_lut_to_dense",
        Ios18,
        &[req("indices"), req("lut"), opt("vector_axis")],
        infer_lut_to_dense
    ),
    op!(
        "quantize",
        Ios17,
        &[
            req("input"),
            opt("zero_point"),
            req("scale"),
            opt("axis"),
            req("output_dtype")
        ],
        infer_quantize
    ),
    op!(
        "dequantize",
        Ios17,
        &[req("input"), opt("zero_point"), req("scale"), opt("axis")],
        infer_dequantize
    ),
    // state
    op!("read_state", Ios18, &[req("input")], infer_read_state),
    op!(
        "coreml_update_state",
        Ios18,
        &[req("state"), req("value")],
        infer_update_state
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_unique_names() {
        let mut names: Vec<_> = OPS.iter().map(|d| d.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(
            broadcast(&[1, 64, 1, 8], &[1, 1, 1, 8]).unwrap(),
            vec![1, 64, 1, 8]
        );
        assert_eq!(broadcast(&[1, 64, 1, 8], &[]).unwrap(), vec![1, 64, 1, 8]);
        assert_eq!(broadcast(&[4, 1], &[3]).unwrap(), vec![4, 3]);
        assert!(broadcast(&[2, 3], &[4]).is_err());
    }

    #[test]
    fn axis_normalisation() {
        assert_eq!(norm_axis(-1, 4).unwrap(), 3);
        assert!(norm_axis(4, 4).is_err());
        assert!(norm_axes(&[1, -3], 4).is_err());
    }
}
