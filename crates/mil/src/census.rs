//! The op census: every distinct form of op a set of functions uses, and each form as a
//! standalone probe function — the op with its constant operands, fed from `[1, C, 1, W]` inputs.
//!
//! A hardware probe built from the census asks about exactly the forms the lowering emits, and a
//! form the lowering starts to emit joins the census by itself. A form is the op type, the rank
//! and dtype of each variable operand, the values of small constant parameters (axes, transpose
//! flags) and the form of each weight (a plain const or the constexpr op that decompresses it).

use std::collections::{BTreeMap, HashMap};

use crate::builder::{FunctionBuilder, Outputs};
use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Function, Operation, ValueId};
use crate::types::{TensorType, ValueType};

/// One op form, with where it first occurs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Form {
    /// `conv(weight=constexpr_blockwise_shift_scale:int4, x=r4:fp16; groups=1)`.
    pub key: String,
    pub op_type: String,
    /// How many ops of the functions have this form.
    pub count: usize,
    /// The first occurrence: index into the functions given, index of the op.
    pub function: usize,
    pub op: usize,
}

/// Parameters whose constant value is part of the form (they change what the hardware runs).
const FORM_PARAMS: &[&str] = &[
    "axis",
    "axes",
    "transpose_x",
    "transpose_y",
    "keep_dims",
    "interleave",
    "groups",
    "perm",
    "pad_type",
    "mode",
    "alpha",
];

fn is_constexpr(op: &Operation) -> bool {
    op.op_type.starts_with("constexpr_")
}

fn rank_dtype(t: &ValueType) -> String {
    match t {
        ValueType::Tensor(t) => format!("r{}:{}", t.rank(), t.dtype.name()),
        ValueType::State(t) => format!("state r{}:{}", t.rank(), t.dtype.name()),
    }
}

/// The form of one binding of `op`'s parameter `param`.
fn binding_form(f: &Function, param: &str, b: &Binding) -> String {
    match b {
        Binding::Literal(l) => literal_form(param, l),
        Binding::Value(id) => match f.producer(*id) {
            Some(p) if p.is_const() => match p.attribute("val") {
                Some(l) => literal_form(param, l),
                None => "const".into(),
            },
            Some(p) if is_constexpr(p) => {
                // The decompressing op and its stored data type.
                let data = ["data", "quantized_data", "indices"]
                    .iter()
                    .find_map(|k| f.operand_literal(p, k))
                    .map(|l| l.ty().dtype.name().to_string())
                    .unwrap_or_default();
                format!("{}:{data}", p.op_type)
            }
            _ => rank_dtype(f.type_of(*id)),
        },
    }
}

fn literal_form(param: &str, l: &crate::Literal) -> String {
    let t = l.ty();
    if FORM_PARAMS.contains(&param) && t.numel() <= 8 {
        if let Some(b) = l.to_bool() {
            return b.to_string();
        }
        if let Some(v) = l.to_i64s() {
            return format!("{v:?}");
        }
        if let Some(s) = l.as_str() {
            return s.to_string();
        }
    }
    format!("const r{}:{}", t.rank(), t.dtype.name())
}

/// The form of `op` in `f`; None for consts and constexpr ops (they are part of their
/// consumers' forms).
pub fn form_key(f: &Function, op: &Operation) -> Option<String> {
    if op.is_const() || is_constexpr(op) {
        return None;
    }
    let mut parts = Vec::new();
    for (param, arg) in &op.inputs {
        let forms: Vec<String> = arg
            .bindings()
            .iter()
            .map(|b| binding_form(f, param, b))
            .collect();
        let form = match arg {
            Argument::Single(_) => forms.join(""),
            Argument::Tuple(_) => {
                let mut distinct = forms.clone();
                distinct.dedup();
                format!("({})", distinct.join(","))
            }
        };
        parts.push(format!("{param}={form}"));
    }
    let outs: Vec<String> = op
        .outputs
        .iter()
        .map(|&o| rank_dtype(f.type_of(o)))
        .collect();
    Some(format!(
        "{}({}) -> {}",
        op.op_type,
        parts.join(", "),
        outs.join(",")
    ))
}

/// Every op form of `functions`, sorted by key.
pub fn forms(functions: &[&Function]) -> Vec<Form> {
    let mut by_key: BTreeMap<String, Form> = BTreeMap::new();
    for (fi, f) in functions.iter().enumerate() {
        for (oi, op) in f.ops().iter().enumerate() {
            let Some(key) = form_key(f, op) else { continue };
            by_key
                .entry(key.clone())
                .and_modify(|e| e.count += 1)
                .or_insert(Form {
                    key,
                    op_type: op.op_type.clone(),
                    count: 1,
                    function: fi,
                    op: oi,
                });
        }
    }
    by_key.into_values().collect()
}

/// A census form as a function of its own.
#[derive(Clone, Debug)]
pub struct Extracted {
    /// Inputs and outputs are all `[1, C, 1, W]` fp16 or fp32.
    pub function: Function,
    /// Per input: whether the op reads it as integers or bools (cast from the input), so a
    /// probe feeds small non-negative integers there.
    pub integer_inputs: Vec<bool>,
}

/// Whether `t` can be a function input or output as it is (`[1, C, 1, W]`, fp16 or fp32).
fn io_ready(t: &TensorType) -> bool {
    t.rank() == 4
        && t.shape[0] == 1
        && t.shape[2] == 1
        && matches!(t.dtype, DType::Fp16 | DType::Fp32)
}

/// The `[1, C, 1, W]` shape a tensor of `shape` travels in: W its last dimension.
fn io_shape(shape: &[usize]) -> [usize; 4] {
    let w = shape.last().copied().unwrap_or(1).max(1);
    let n: usize = shape.iter().product();
    [1, n.div_ceil(w).max(1), 1, w]
}

fn to_i32s(shape: &[usize]) -> Vec<i32> {
    shape.iter().map(|&d| d as i32).collect()
}

/// Op `op` of `f` as a function named `name`: its constant and constexpr operands copied, every
/// other operand a function input (reshaped, or cast from fp16, where the op takes another shape
/// or type), every output a function output (likewise brought to `[1, C, 1, fp16|fp32 W]`).
/// Ops reading states cannot stand alone and are an error.
pub fn extract(f: &Function, op: usize, name: &str) -> Result<Extracted> {
    let op = f
        .ops()
        .get(op)
        .ok_or_else(|| MilError::invalid(format!("{}: no op {op}", f.name)))?;
    let mut b = FunctionBuilder::new(name, f.opset);
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    // The variable operands, in order of first use.
    let mut variables: Vec<ValueId> = Vec::new();
    let mut constants: Vec<usize> = Vec::new();
    for (_, arg) in &op.inputs {
        for binding in arg.bindings() {
            if let Binding::Value(id) = binding {
                collect(f, *id, &mut variables, &mut constants)?;
            }
        }
    }
    let mut integer_inputs = Vec::new();
    let mut casts = Vec::new();
    for (i, &v) in variables.iter().enumerate() {
        let t = match f.type_of(v) {
            ValueType::Tensor(t) => t.clone(),
            ValueType::State(_) => {
                return Err(MilError::invalid(format!(
                    "{} reads state {}: states are probed by a stateful case",
                    op.op_type,
                    f.name_of(v)
                )))
            }
        };
        if io_ready(&t) {
            map.insert(v, b.input(&format!("in{i}"), t)?);
            integer_inputs.push(false);
        } else {
            let float = matches!(t.dtype, DType::Fp16 | DType::Fp32);
            let io_dtype = if float { t.dtype } else { DType::Fp16 };
            let x = b.input(
                &format!("in{i}"),
                TensorType::new(io_dtype, io_shape(&t.shape)),
            )?;
            casts.push((v, x, t));
            integer_inputs.push(!float);
        }
    }
    for (v, x, t) in casts {
        let mut y = x;
        if !matches!(t.dtype, DType::Fp16 | DType::Fp32) {
            y = b.cast(y, t.dtype)?;
        }
        if b.type_of(y)?.shape != t.shape {
            y = b.reshape(y, &to_i32s(&t.shape))?;
        }
        map.insert(v, y);
    }
    constants.sort_unstable();
    constants.dedup();
    for &c in &constants {
        copy_op(&mut b, f, &f.ops()[c], &mut map)?;
    }
    let outs = copy_op(&mut b, f, op, &mut map)?;
    for o in outs {
        let t = b.type_of(o)?.clone();
        let mut y = o;
        if !io_ready(&t) {
            if !matches!(t.dtype, DType::Fp16 | DType::Fp32) {
                y = b.cast(y, DType::Fp16)?;
            }
            if b.type_of(y)?.shape.as_slice() != io_shape(&t.shape) {
                y = b.reshape(y, &to_i32s(&io_shape(&t.shape)))?;
            }
        }
        b.output(y)?;
    }
    Ok(Extracted {
        function: b.finish()?,
        integer_inputs,
    })
}

/// Sorts the values `id` depends on into variables (anything not computable at compile time)
/// and constant-producing ops (consts, constexpr ops and what they read).
fn collect(
    f: &Function,
    id: ValueId,
    variables: &mut Vec<ValueId>,
    constants: &mut Vec<usize>,
) -> Result<()> {
    let def = f.value(id).def;
    match def {
        crate::ir::ValueDef::Op { op, .. } if f.ops()[op].is_const() => constants.push(op),
        crate::ir::ValueDef::Op { op, .. } if is_constexpr(&f.ops()[op]) => {
            constants.push(op);
            for (_, arg) in &f.ops()[op].inputs {
                for binding in arg.bindings() {
                    if let Binding::Value(v) = binding {
                        collect(f, *v, variables, constants)?;
                    }
                }
            }
        }
        _ => {
            if !variables.contains(&id) {
                variables.push(id);
            }
        }
    }
    Ok(())
}

/// Appends a copy of `op` (its operands through `map`) to `b`; returns its new outputs.
fn copy_op(
    b: &mut FunctionBuilder,
    f: &Function,
    op: &Operation,
    map: &mut HashMap<ValueId, ValueId>,
) -> Result<Vec<ValueId>> {
    let remap = |bd: &Binding| -> Result<Binding> {
        Ok(match bd {
            Binding::Value(v) => Binding::Value(*map.get(v).ok_or_else(|| {
                MilError::invalid(format!(
                    "{}: operand {} not copied",
                    op.op_type,
                    f.name_of(*v)
                ))
            })?),
            Binding::Literal(l) => Binding::Literal(l.clone()),
        })
    };
    let mut inputs = Vec::with_capacity(op.inputs.len());
    for (param, arg) in &op.inputs {
        let a = match arg {
            Argument::Single(bd) => Argument::Single(remap(bd)?),
            Argument::Tuple(bs) => Argument::Tuple(bs.iter().map(remap).collect::<Result<_>>()?),
        };
        inputs.push((param.clone(), a));
    }
    let declared: Vec<(String, ValueType)> = op
        .outputs
        .iter()
        .map(|&o| (f.name_of(o).to_string(), f.type_of(o).clone()))
        .collect();
    let copy = Operation {
        op_type: op.op_type.clone(),
        inputs,
        attributes: op.attributes.clone(),
        name: op.name.clone(),
        outputs: Vec::new(),
    };
    let new = b.push(copy, Outputs::Declared(declared))?;
    for (&old, &n) in op.outputs.iter().zip(&new) {
        map.insert(old, n);
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Opset, WeightData};

    /// rmsnorm-like: abs, reduce_max over channels, a rank-3 matmul with transpose_x.
    fn sample() -> Function {
        let mut b = FunctionBuilder::new("main", Opset::Ios18);
        let x = b.input("x", TensorType::fp16([1, 8, 1, 4])).unwrap();
        let a = b.unary("abs", x).unwrap();
        let m = b.reduce("reduce_max", a, &[1], true).unwrap();
        let a2 = b.unary("abs", m).unwrap();
        let w = b
            .weight(
                "w",
                TensorType::fp16([6, 8, 1, 1]),
                WeightData::f16_from_f32(&[0.25; 48]),
            )
            .unwrap();
        let y = b.conv1x1(x, w).unwrap();
        let r = b.reshape(y, &[1, 6, 4]).unwrap();
        let mm = b.matmul(r, r, true, false).unwrap();
        b.output(a2).unwrap();
        b.output(mm).unwrap();
        b.finish().unwrap()
    }

    #[test]
    fn forms_are_distinct_by_shape_and_parameters() {
        let f = sample();
        let fs = forms(&[&f]);
        let keys: Vec<&str> = fs.iter().map(|f| f.key.as_str()).collect();
        let abs: Vec<_> = fs.iter().filter(|f| f.op_type == "abs").collect();
        assert_eq!(abs.len(), 1, "{keys:#?}");
        assert_eq!(abs[0].count, 2, "same rank and dtype: one form");
        let mm = fs.iter().find(|f| f.op_type == "matmul").unwrap();
        assert!(mm.key.contains("transpose_x=true"), "{}", mm.key);
        assert!(mm.key.contains("x=r3:fp16"), "{}", mm.key);
        let conv = fs.iter().find(|f| f.op_type == "conv").unwrap();
        assert!(conv.key.contains("weight=const r4:fp16"), "{}", conv.key);
        let red = fs.iter().find(|f| f.op_type == "reduce_max").unwrap();
        assert!(
            red.key.contains("axes=[1]") && red.key.contains("keep_dims=true"),
            "{}",
            red.key
        );
        assert!(keys.iter().all(|k| !k.starts_with("const")));
    }

    #[test]
    fn every_form_extracts_to_a_function_with_planar_io() {
        let f = sample();
        for form in forms(&[&f]) {
            let e = extract(&f, form.op, "probe").unwrap_or_else(|e| panic!("{}: {e}", form.key));
            let g = &e.function;
            for &v in g.inputs().iter().chain(g.outputs()) {
                assert!(
                    io_ready(g.type_of(v).tensor()),
                    "{}: {}",
                    form.key,
                    g.type_of(v)
                );
            }
            // The op itself is in the probe, in the same form.
            let again = forms(&[g]);
            assert!(
                again.iter().any(|x| x.key == form.key),
                "{} not in {:#?}",
                form.key,
                again
            );
        }
    }

    #[test]
    fn constexpr_weights_are_part_of_the_consumer_form() {
        let mut b = FunctionBuilder::new("main", Opset::Ios18);
        let x = b.input("x", TensorType::fp16([1, 32, 1, 4])).unwrap();
        let data = WeightData::int4(&[1i8; 2 * 32]).unwrap();
        let w = b
            .blockwise_weight(
                "w",
                TensorType::fp16([2, 32, 1, 1]),
                data.into(),
                WeightData::f16_from_f32(&[0.5, 0.25]).into(),
                None,
                &[2, 1, 1, 1],
            )
            .unwrap();
        let y = b.conv1x1(x, w).unwrap();
        b.output(y).unwrap();
        let f = b.finish().unwrap();
        let fs = forms(&[&f]);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0]
                .key
                .contains("weight=constexpr_blockwise_shift_scale:int4"),
            "{}",
            fs[0].key
        );
        let e = extract(&f, fs[0].op, "p").unwrap();
        assert!(e
            .function
            .ops()
            .iter()
            .any(|o| o.op_type == "constexpr_blockwise_shift_scale"));
    }

    #[test]
    fn a_state_operand_is_an_error_naming_it() {
        let mut b = FunctionBuilder::new("main", Opset::Ios18);
        let s = b.state_input("k", TensorType::fp16([1, 4, 1, 8])).unwrap();
        let r = b.read_state(s).unwrap();
        let y = b.unary("abs", r).unwrap();
        b.output(y).unwrap();
        let f = b.finish().unwrap();
        let read = f
            .ops()
            .iter()
            .position(|o| o.op_type == "read_state")
            .unwrap();
        let e = extract(&f, read, "p").unwrap_err().to_string();
        assert!(e.contains("state k"), "{e}");
    }
}
