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

mod infer;
#[cfg(test)]
mod tests;

use infer::*;

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
