//! Building functions op by op with type inference: a malformed program is an error at the
//! call that makes it malformed.
//!
//! ```
//! use anelm_mil::{FunctionBuilder, Opset, Program, TensorType, WeightData};
//! # fn main() -> anelm_mil::Result<()> {
//! let mut f = FunctionBuilder::new("main", Opset::Ios18);
//! let x = f.input("x", TensorType::fp16([1, 64, 1, 64]))?;
//! let w = f.weight("w", TensorType::fp16([128, 64, 1, 1]), WeightData::f16_from_f32(&vec![0.5; 128 * 64]))?;
//! let y = f.name_next("y").conv1x1(x, w)?;
//! f.output(y)?;
//! let program = Program::single(f.finish()?);
//! assert_eq!(program.functions[0].type_of(y).tensor(), &TensorType::fp16([1, 128, 1, 64]));
//! # Ok(()) }
//! ```
//!
//! Every scalar or vector parameter an op needs is bound to its own named `const` (FACTS §1.2:
//! no hardware-proven program passes inline literals), named `<output>_<param>`.

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Function, Operation, Opset, ValueDef, ValueId, ValueInfo};
use crate::literal::{Literal, WeightData};
use crate::ops::{self, Ctx};
use crate::types::{TensorType, ValueType};
use std::collections::HashSet;
use std::sync::Arc;

/// An operand given to [`FunctionBuilder::op`].
#[derive(Debug, Clone)]
pub enum Arg {
    /// An existing value.
    Value(ValueId),
    /// A tuple of values (`concat(values = (a, b))`).
    Tuple(Vec<ValueId>),
    /// A constant: the builder binds it to a named `const` op first.
    Const(Literal),
}

impl From<ValueId> for Arg {
    fn from(v: ValueId) -> Self {
        Arg::Value(v)
    }
}

impl From<Literal> for Arg {
    fn from(l: Literal) -> Self {
        Arg::Const(l)
    }
}

/// Padding of a convolution.
#[derive(Debug, Clone, PartialEq)]
pub enum Pad {
    Valid,
    Same,
    /// `[begin, end]` per spatial dim.
    Custom(Vec<i32>),
}

/// Parameters of [`FunctionBuilder::conv`]; the default is a 2-D stride-1 "valid" conv.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvParams {
    pub strides: Vec<i32>,
    pub dilations: Vec<i32>,
    pub pad: Pad,
    pub groups: i32,
    pub bias: Option<ValueId>,
}

impl Default for ConvParams {
    fn default() -> Self {
        ConvParams {
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pad: Pad::Valid,
            groups: 1,
            bias: None,
        }
    }
}

/// Builds one [`Function`].
#[derive(Debug)]
pub struct FunctionBuilder {
    func: Function,
    names: HashSet<String>,
    next_name: Option<String>,
    counter: usize,
}

/// What the output types of a pushed op are checked against.
pub(crate) enum Outputs {
    /// Inferred; names given.
    Infer(Vec<String>),
    /// Declared by the caller (the parser); checked against inference for known ops.
    Declared(Vec<(String, ValueType)>),
}

impl FunctionBuilder {
    pub fn new(name: impl Into<String>, opset: Opset) -> FunctionBuilder {
        FunctionBuilder {
            func: Function {
                name: name.into(),
                opset,
                values: Vec::new(),
                inputs: Vec::new(),
                ops: Vec::new(),
                outputs: Vec::new(),
            },
            names: HashSet::new(),
            next_name: None,
            counter: 0,
        }
    }

    pub fn opset(&self) -> Opset {
        self.func.opset
    }

    /// The function built so far (for looking at types while building).
    pub fn function(&self) -> &Function {
        &self.func
    }

    pub fn type_of(&self, v: ValueId) -> Result<&TensorType> {
        self.check_id(v)?;
        Ok(self.func.type_of(v).tensor())
    }

    fn check_id(&self, v: ValueId) -> Result<()> {
        if v.index() >= self.func.values.len() {
            return Err(MilError::invalid(format!(
                "value id {} does not belong to function {}",
                v.0, self.func.name
            )));
        }
        Ok(())
    }

    fn claim_name(&mut self, name: &str) -> Result<()> {
        if !is_identifier(name) {
            return Err(MilError::invalid(format!(
                "{name:?} is not a MIL identifier ([A-Za-z_][A-Za-z0-9_@]*)"
            )));
        }
        if !self.names.insert(name.to_string()) {
            return Err(MilError::invalid(format!(
                "name {name} is already defined in function {}",
                self.func.name
            )));
        }
        Ok(())
    }

    fn fresh_name(&mut self, base: &str) -> String {
        loop {
            let n = format!("{base}_{}", self.counter);
            self.counter += 1;
            if !self.names.contains(&n) {
                return n;
            }
        }
    }

    fn add_value(&mut self, name: String, ty: ValueType, def: ValueDef) -> ValueId {
        let id = ValueId(self.func.values.len() as u32);
        self.func.values.push(ValueInfo { name, ty, def });
        id
    }

    /// Declares a function input.
    pub fn input(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        self.add_input(name, ValueType::Tensor(ty))
    }

    /// Declares a state input (iOS18 stateful models: KV cache), read with [`Self::read_state`].
    pub fn state_input(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        self.add_input(name, ValueType::State(ty))
    }

    pub(crate) fn add_input(&mut self, name: &str, ty: ValueType) -> Result<ValueId> {
        ty.tensor().check_size()?;
        if !self.func.ops.is_empty() {
            return Err(MilError::invalid(format!(
                "input {name} declared after the first operation"
            )));
        }
        self.claim_name(name)?;
        let idx = self.func.inputs.len();
        let id = self.add_value(name.to_string(), ty, ValueDef::Input(idx));
        self.func.inputs.push(id);
        Ok(id)
    }

    /// Sets the SSA name of the next op's (first) output.
    pub fn name_next(&mut self, name: &str) -> &mut Self {
        self.next_name = Some(name.to_string());
        self
    }

    /// Renames a value (references are by id, so uses follow).
    pub fn rename(&mut self, v: ValueId, name: &str) -> Result<()> {
        self.check_id(v)?;
        self.claim_name(name)?;
        let old = std::mem::replace(&mut self.func.values[v.index()].name, name.to_string());
        self.names.remove(&old);
        if let ValueDef::Op { op, output: 0 } = self.func.values[v.index()].def {
            let o = &mut self.func.ops[op];
            if o.name.as_deref() == Some(old.as_str()) {
                o.name = Some(name.to_string());
            }
        }
        Ok(())
    }

    /// A named `const` holding `lit` (inline or blob-backed).
    pub fn constant(&mut self, name: &str, lit: Literal) -> Result<ValueId> {
        let op = Operation {
            op_type: "const".into(),
            inputs: Vec::new(),
            attributes: vec![("val".into(), lit)],
            name: Some(name.to_string()),
            outputs: Vec::new(),
        };
        Ok(self.push(op, Outputs::Infer(vec![name.to_string()]))?[0])
    }

    /// A blob-backed weight const. Pass the same `Arc` to several functions to share one blob.
    pub fn weight(
        &mut self,
        name: &str,
        ty: TensorType,
        data: impl Into<Arc<WeightData>>,
    ) -> Result<ValueId> {
        let lit =
            Literal::weight(ty, data.into()).map_err(|e| e.context(format!("weight {name}")))?;
        self.constant(name, lit)
    }

    /// A scalar const of a float dtype (e.g. the dtype of the tensor it scales).
    pub fn scalar(&mut self, name: &str, dtype: DType, v: f32) -> Result<ValueId> {
        self.constant(name, Literal::float(dtype, v)?)
    }

    /// Adds an operation from named operands; constants are bound to named consts first.
    /// Operands are stored sorted by parameter name (the order Apple's tools print). On error
    /// the function is left exactly as before the call.
    pub fn op(&mut self, op_type: &str, args: Vec<(&str, Arg)>) -> Result<Vec<ValueId>> {
        self.atomically(|b| b.op_inner(op_type, args))
    }

    /// Runs `build`; if it fails, every value, op and name it added is removed again, so a
    /// failed call leaves the function exactly as before.
    pub(crate) fn atomically<T>(
        &mut self,
        build: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let mark = (self.func.values.len(), self.func.ops.len(), self.counter);
        let r = build(self);
        if r.is_err() {
            for v in self.func.values.drain(mark.0..) {
                self.names.remove(&v.name);
            }
            self.func.ops.truncate(mark.1);
            self.counter = mark.2;
            self.next_name = None;
        }
        r
    }

    fn op_inner(&mut self, op_type: &str, args: Vec<(&str, Arg)>) -> Result<Vec<ValueId>> {
        let base = self.next_name.take();
        let def = ops::lookup(op_type)
            .ok_or_else(|| MilError::invalid(format!("unknown op {op_type}")))?;
        // The output name is fixed first so const names can derive from it.
        let first = match base {
            Some(n) => n,
            None => self.fresh_name(op_type),
        };
        if self.names.contains(&first) || !is_identifier(&first) {
            return Err(MilError::invalid(format!(
                "name {first:?} is taken or not an identifier"
            )));
        }
        let mut inputs = Vec::with_capacity(args.len());
        for (param, arg) in args {
            let a = match arg {
                Arg::Value(v) => {
                    self.check_id(v)?;
                    Argument::Single(Binding::Value(v))
                }
                Arg::Tuple(vs) => {
                    for &v in &vs {
                        self.check_id(v)?;
                    }
                    Argument::Tuple(vs.into_iter().map(Binding::Value).collect())
                }
                Arg::Const(lit) => {
                    let cname = self.unique_from(&format!("{first}_{param}"));
                    Argument::Single(Binding::Value(self.constant(&cname, lit)?))
                }
            };
            inputs.push((param.to_string(), a));
        }
        inputs.sort_by(|a, b| a.0.cmp(&b.0));
        let probe = Operation {
            op_type: op_type.into(),
            inputs,
            attributes: Vec::new(),
            name: None,
            outputs: Vec::new(),
        };
        // Names of extra outputs (split) follow the first: y, y_1, y_2 ...
        let n_out = self.infer(def, &probe)?.len();
        let mut names = vec![first.clone()];
        for i in 1..n_out {
            names.push(self.unique_from(&format!("{first}_{i}")));
        }
        let op = Operation {
            name: Some(first),
            ..probe
        };
        self.push(op, Outputs::Infer(names))
    }

    pub(crate) fn unique_from(&mut self, base: &str) -> String {
        if self.names.contains(base) {
            self.fresh_name(base)
        } else {
            base.to_string()
        }
    }

    /// [`Self::op`] for single-output ops.
    pub fn op1(&mut self, op_type: &str, args: Vec<(&str, Arg)>) -> Result<ValueId> {
        let outs = self.op(op_type, args)?;
        match outs.as_slice() {
            [v] => Ok(*v),
            _ => Err(MilError::invalid(format!(
                "{op_type} has {} outputs, expected one",
                outs.len()
            ))),
        }
    }

    fn infer(&self, def: &ops::OpDef, op: &Operation) -> Result<Vec<TensorType>> {
        if def.since > self.func.opset {
            return Err(MilError::invalid(format!(
                "{} needs opset {} or newer, function {} targets {}",
                def.name,
                def.since.ios_name(),
                self.func.name,
                self.func.opset.ios_name()
            )));
        }
        ops::check_params(def, op).map_err(|e| e.context(def.name))?;
        let ctx = Ctx {
            values: &self.func.values,
            ops: &self.func.ops,
            op,
        };
        (def.infer)(&ctx).map_err(|e| e.context(def.name))
    }

    /// Appends a fully formed operation (outputs filled in here), type-checking it.
    pub(crate) fn push(&mut self, mut op: Operation, outputs: Outputs) -> Result<Vec<ValueId>> {
        let typed: Vec<(String, ValueType)> = match (ops::lookup(&op.op_type), outputs) {
            (Some(def), Outputs::Infer(names)) => {
                let tys = self.infer(def, &op)?;
                if tys.len() != names.len() {
                    return Err(MilError::invalid(format!(
                        "{} produces {} outputs, {} named",
                        op.op_type,
                        tys.len(),
                        names.len()
                    )));
                }
                names
                    .into_iter()
                    .zip(tys.into_iter().map(ValueType::Tensor))
                    .collect()
            }
            (Some(def), Outputs::Declared(decl)) => {
                let tys = self.infer(def, &op)?;
                if tys.len() != decl.len() {
                    return Err(MilError::invalid(format!(
                        "{} produces {} outputs, {} declared",
                        op.op_type,
                        tys.len(),
                        decl.len()
                    )));
                }
                for ((n, d), t) in decl.iter().zip(&tys) {
                    if d.as_tensor() != Some(t) {
                        return Err(MilError::invalid(format!(
                            "{n}: declared type {d}, {} gives {t}",
                            op.op_type
                        )));
                    }
                }
                decl
            }
            (None, Outputs::Declared(decl)) => decl,
            (None, Outputs::Infer(_)) => {
                return Err(MilError::invalid(format!("unknown op {}", op.op_type)))
            }
        };
        for (name, ty) in &typed {
            ty.tensor().check_size().map_err(|e| e.context(name))?;
        }
        for (name, _) in &typed {
            self.claim_name(name)?;
        }
        let op_index = self.func.ops.len();
        let ids: Vec<ValueId> = typed
            .into_iter()
            .enumerate()
            .map(|(i, (name, ty))| {
                self.add_value(
                    name,
                    ty,
                    ValueDef::Op {
                        op: op_index,
                        output: i,
                    },
                )
            })
            .collect();
        op.outputs = ids.clone();
        self.func.ops.push(op);
        Ok(ids)
    }

    /// Marks `v` as a function output (in order).
    pub fn output(&mut self, v: ValueId) -> Result<()> {
        self.check_id(v)?;
        if self.func.outputs.contains(&v) {
            return Err(MilError::invalid(format!(
                "{} is already an output",
                self.func.name_of(v)
            )));
        }
        if self.func.type_of(v).is_state() {
            return Err(MilError::invalid(format!(
                "state {} cannot be an output",
                self.func.name_of(v)
            )));
        }
        self.func.outputs.push(v);
        Ok(())
    }

    /// Finishes the function; it needs at least one output.
    pub fn finish(self) -> Result<Function> {
        if self.func.outputs.is_empty() {
            return Err(MilError::invalid(format!(
                "function {} has no outputs",
                self.func.name
            )));
        }
        Ok(self.func)
    }

    // -----------------------------------------------------------------------------------------
    // typed helpers (what the lowering uses)

    /// A 1×1 convolution with the exact parameter consts of hardware-proven programs
    /// (FACTS §1.4: `pad_type="valid"`, `strides=[1,1]`, `pad=[0,0,0,0]`, `dilations=[1,1]`, `groups=1`).
    pub fn conv1x1(&mut self, x: ValueId, weight: ValueId) -> Result<ValueId> {
        let w = self.type_of(weight)?;
        if w.rank() != 4 || w.shape[2] != 1 || w.shape[3] != 1 {
            return Err(MilError::invalid(format!(
                "conv1x1 weight must be [Cout, Cin, 1, 1], is {w}"
            )));
        }
        self.conv(x, weight, &ConvParams::default())
    }

    /// A general convolution; every parameter is emitted as a named const.
    pub fn conv(&mut self, x: ValueId, weight: ValueId, p: &ConvParams) -> Result<ValueId> {
        let spatial = p.strides.len();
        let (pad_type, pad) = match &p.pad {
            Pad::Valid => ("valid", vec![0; 2 * spatial]),
            Pad::Same => ("same", vec![0; 2 * spatial]),
            Pad::Custom(v) => ("custom", v.clone()),
        };
        let mut args = vec![
            ("x", Arg::Value(x)),
            ("weight", Arg::Value(weight)),
            ("strides", Literal::i32s(p.strides.clone()).into()),
            ("pad_type", Literal::string(pad_type).into()),
            ("pad", Literal::i32s(pad).into()),
            ("dilations", Literal::i32s(p.dilations.clone()).into()),
            ("groups", Literal::i32(p.groups).into()),
        ];
        if let Some(b) = p.bias {
            args.push(("bias", Arg::Value(b)));
        }
        self.op1("conv", args)
    }

    pub fn matmul(
        &mut self,
        x: ValueId,
        y: ValueId,
        transpose_x: bool,
        transpose_y: bool,
    ) -> Result<ValueId> {
        self.op1(
            "matmul",
            vec![
                ("x", x.into()),
                ("y", y.into()),
                ("transpose_x", Literal::bool(transpose_x).into()),
                ("transpose_y", Literal::bool(transpose_y).into()),
            ],
        )
    }

    pub fn linear(
        &mut self,
        x: ValueId,
        weight: ValueId,
        bias: Option<ValueId>,
    ) -> Result<ValueId> {
        let mut args = vec![("x", x.into()), ("weight", weight.into())];
        if let Some(b) = bias {
            args.push(("bias", b.into()));
        }
        self.op1("linear", args)
    }

    /// Any two-operand elementwise op (`add`, `mul`, `greater`, ...).
    pub fn binary(&mut self, op_type: &str, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op1(op_type, vec![("x", x.into()), ("y", y.into())])
    }

    pub fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("add", x, y)
    }

    pub fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("sub", x, y)
    }

    pub fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("mul", x, y)
    }

    pub fn real_div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("real_div", x, y)
    }

    pub fn pow(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("pow", x, y)
    }

    pub fn maximum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("maximum", x, y)
    }

    pub fn minimum(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("minimum", x, y)
    }

    pub fn greater(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("greater", x, y)
    }

    pub fn less(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary("less", x, y)
    }

    /// `op_type(x, y = c)` with `c` a scalar const of x's dtype (e.g. `mul` by 1/N, `pow` by -0.5).
    pub fn binary_scalar(&mut self, op_type: &str, x: ValueId, c: f32) -> Result<ValueId> {
        let d = self.type_of(x)?.dtype;
        self.op1(
            op_type,
            vec![("x", x.into()), ("y", Literal::float(d, c)?.into())],
        )
    }

    pub fn select(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op1(
            "select",
            vec![("cond", cond.into()), ("a", a.into()), ("b", b.into())],
        )
    }

    /// Any one-operand op (`sigmoid`, `tanh`, `exp`, `sqrt`, `relu`, `silu`, `identity`, `gelu`, `rsqrt`, ...).
    pub fn unary(&mut self, op_type: &str, x: ValueId) -> Result<ValueId> {
        self.op1(op_type, vec![("x", x.into())])
    }

    pub fn sigmoid(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("sigmoid", x)
    }

    pub fn silu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("silu", x)
    }

    pub fn tanh(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("tanh", x)
    }

    pub fn exp(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("exp", x)
    }

    pub fn sqrt(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("sqrt", x)
    }

    pub fn relu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("relu", x)
    }

    pub fn identity(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary("identity", x)
    }

    pub fn softmax(&mut self, x: ValueId, axis: i32) -> Result<ValueId> {
        self.op1(
            "softmax",
            vec![("x", x.into()), ("axis", Literal::i32(axis).into())],
        )
    }

    /// `reduce_sum` / `reduce_max` / `reduce_mean` / ... over `axes`.
    pub fn reduce(
        &mut self,
        op_type: &str,
        x: ValueId,
        axes: &[i32],
        keep_dims: bool,
    ) -> Result<ValueId> {
        self.op1(
            op_type,
            vec![
                ("x", x.into()),
                ("axes", Literal::i32s(axes.to_vec()).into()),
                ("keep_dims", Literal::bool(keep_dims).into()),
            ],
        )
    }

    /// `reduce_argmax` (int32 indices) along `axis`.
    pub fn argmax(&mut self, x: ValueId, axis: i32, keep_dims: bool) -> Result<ValueId> {
        self.op1(
            "reduce_argmax",
            vec![
                ("x", x.into()),
                ("axis", Literal::i32(axis).into()),
                ("keep_dims", Literal::bool(keep_dims).into()),
            ],
        )
    }

    pub fn layer_norm(
        &mut self,
        x: ValueId,
        axes: &[i32],
        gamma: Option<ValueId>,
        beta: Option<ValueId>,
        epsilon: f32,
    ) -> Result<ValueId> {
        let d = self.type_of(x)?.dtype;
        let mut args = vec![
            ("x", x.into()),
            ("axes", Literal::i32s(axes.to_vec()).into()),
            ("epsilon", Literal::float(d, epsilon)?.into()),
        ];
        if let Some(g) = gamma {
            args.push(("gamma", g.into()));
        }
        if let Some(b) = beta {
            args.push(("beta", b.into()));
        }
        self.op1("layer_norm", args)
    }

    pub fn reshape(&mut self, x: ValueId, shape: &[i32]) -> Result<ValueId> {
        self.op1(
            "reshape",
            vec![
                ("x", x.into()),
                ("shape", Literal::i32s(shape.to_vec()).into()),
            ],
        )
    }

    pub fn transpose(&mut self, x: ValueId, perm: &[i32]) -> Result<ValueId> {
        self.op1(
            "transpose",
            vec![
                ("x", x.into()),
                ("perm", Literal::i32s(perm.to_vec()).into()),
            ],
        )
    }

    pub fn concat(&mut self, values: &[ValueId], axis: i32) -> Result<ValueId> {
        self.op1(
            "concat",
            vec![
                ("values", Arg::Tuple(values.to_vec())),
                ("axis", Literal::i32(axis).into()),
                ("interleave", Literal::bool(false).into()),
            ],
        )
    }

    /// Splits `x` into `num_splits` equal parts along `axis`.
    pub fn split(&mut self, x: ValueId, axis: i32, num_splits: i32) -> Result<Vec<ValueId>> {
        self.op(
            "split",
            vec![
                ("x", x.into()),
                ("axis", Literal::i32(axis).into()),
                ("num_splits", Literal::i32(num_splits).into()),
            ],
        )
    }

    /// Splits `x` into parts of the given sizes along `axis`.
    pub fn split_sizes(&mut self, x: ValueId, axis: i32, sizes: &[i32]) -> Result<Vec<ValueId>> {
        self.op(
            "split",
            vec![
                ("x", x.into()),
                ("axis", Literal::i32(axis).into()),
                ("split_sizes", Literal::i32s(sizes.to_vec()).into()),
            ],
        )
    }

    pub fn slice_by_size(&mut self, x: ValueId, begin: &[i32], size: &[i32]) -> Result<ValueId> {
        self.op1(
            "slice_by_size",
            vec![
                ("x", x.into()),
                ("begin", Literal::i32s(begin.to_vec()).into()),
                ("size", Literal::i32s(size.to_vec()).into()),
            ],
        )
    }

    pub fn slice_by_index(&mut self, x: ValueId, begin: &[i32], end: &[i32]) -> Result<ValueId> {
        self.op1(
            "slice_by_index",
            vec![
                ("x", x.into()),
                ("begin", Literal::i32s(begin.to_vec()).into()),
                ("end", Literal::i32s(end.to_vec()).into()),
            ],
        )
    }

    /// Writes `update` into `x[begin..end]` (the KV-cache append).
    pub fn slice_update(
        &mut self,
        x: ValueId,
        update: ValueId,
        begin: &[i32],
        end: &[i32],
    ) -> Result<ValueId> {
        self.op1(
            "slice_update",
            vec![
                ("x", x.into()),
                ("update", update.into()),
                ("begin", Literal::i32s(begin.to_vec()).into()),
                ("end", Literal::i32s(end.to_vec()).into()),
            ],
        )
    }

    /// `slice_by_size` with a runtime `begin` (int32 `[rank]`, e.g. a position input).
    pub fn slice_by_size_at(
        &mut self,
        x: ValueId,
        begin: ValueId,
        size: &[i32],
    ) -> Result<ValueId> {
        self.op1(
            "slice_by_size",
            vec![
                ("x", x.into()),
                ("begin", begin.into()),
                ("size", Literal::i32s(size.to_vec()).into()),
            ],
        )
    }

    /// `slice_update` with runtime `begin`/`end` (int32 `[rank]`): the KV-cache write at the
    /// current position.
    pub fn slice_update_at(
        &mut self,
        x: ValueId,
        update: ValueId,
        begin: ValueId,
        end: ValueId,
    ) -> Result<ValueId> {
        self.op1(
            "slice_update",
            vec![
                ("x", x.into()),
                ("update", update.into()),
                ("begin", begin.into()),
                ("end", end.into()),
            ],
        )
    }

    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        self.op1(
            "cast",
            vec![
                ("x", x.into()),
                ("dtype", Literal::string(dtype.name()).into()),
            ],
        )
    }

    /// Rows of `x` selected by integer `indices` along `axis` (embedding lookup).
    pub fn gather(&mut self, x: ValueId, indices: ValueId, axis: i32) -> Result<ValueId> {
        self.op1(
            "gather",
            vec![
                ("x", x.into()),
                ("indices", indices.into()),
                ("axis", Literal::i32(axis).into()),
            ],
        )
    }

    pub fn expand_dims(&mut self, x: ValueId, axes: &[i32]) -> Result<ValueId> {
        self.op1(
            "expand_dims",
            vec![
                ("x", x.into()),
                ("axes", Literal::i32s(axes.to_vec()).into()),
            ],
        )
    }

    pub fn squeeze(&mut self, x: ValueId, axes: &[i32]) -> Result<ValueId> {
        self.op1(
            "squeeze",
            vec![
                ("x", x.into()),
                ("axes", Literal::i32s(axes.to_vec()).into()),
            ],
        )
    }

    pub fn tile(&mut self, x: ValueId, reps: &[i32]) -> Result<ValueId> {
        self.op1(
            "tile",
            vec![
                ("x", x.into()),
                ("reps", Literal::i32s(reps.to_vec()).into()),
            ],
        )
    }

    /// Activation quantization to int8/uint8 with a scalar scale.
    pub fn quantize(&mut self, x: ValueId, scale: f32, output: DType) -> Result<ValueId> {
        let d = self.type_of(x)?.dtype;
        self.op1(
            "quantize",
            vec![
                ("input", x.into()),
                ("scale", Literal::float(d, scale)?.into()),
                ("output_dtype", Literal::string(output.name()).into()),
            ],
        )
    }

    /// Dequantization of int8/uint8 activations to `dtype` with a scalar scale.
    pub fn dequantize(&mut self, x: ValueId, scale: f32, dtype: DType) -> Result<ValueId> {
        self.op1(
            "dequantize",
            vec![
                ("input", x.into()),
                ("scale", Literal::float(dtype, scale)?.into()),
            ],
        )
    }

    pub fn read_state(&mut self, state: ValueId) -> Result<ValueId> {
        self.op1("read_state", vec![("input", state.into())])
    }

    /// Writes `value` into `state`; returns the written value (coremltools' `coreml_update_state`).
    pub fn update_state(&mut self, state: ValueId, value: ValueId) -> Result<ValueId> {
        self.op1(
            "coreml_update_state",
            vec![("state", state.into()), ("value", value.into())],
        )
    }

    pub fn scaled_dot_product_attention(
        &mut self,
        query: ValueId,
        key: ValueId,
        value: ValueId,
        attn_mask: Option<ValueId>,
    ) -> Result<ValueId> {
        let mut args = vec![
            ("query", query.into()),
            ("key", key.into()),
            ("value", value.into()),
        ];
        if let Some(m) = attn_mask {
            args.push(("attn_mask", m.into()));
        }
        self.op1("scaled_dot_product_attention", args)
    }
}

/// `[A-Za-z_][A-Za-z0-9_@]*` (MIL.proto identifiers).
pub fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '@')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fb() -> FunctionBuilder {
        FunctionBuilder::new("main", Opset::Ios18)
    }

    #[test]
    fn conv1x1_infers_output_and_binds_named_consts() {
        let mut f = fb();
        let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
        let w = f
            .weight(
                "w",
                TensorType::fp16([128, 64, 1, 1]),
                WeightData::f16_from_f32(&[0.0; 128 * 64]),
            )
            .unwrap();
        let y = f.name_next("y").conv1x1(x, w).unwrap();
        assert_eq!(f.type_of(y).unwrap(), &TensorType::fp16([1, 128, 1, 32]));
        let func = f.function();
        let conv = func.producer(y).unwrap();
        let names: Vec<_> = conv.inputs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "dilations",
                "groups",
                "pad",
                "pad_type",
                "strides",
                "weight",
                "x"
            ]
        );
        let Argument::Single(Binding::Value(pt)) = conv.input("pad_type").unwrap() else {
            panic!()
        };
        assert_eq!(func.name_of(*pt), "y_pad_type");
        assert_eq!(func.const_value(*pt).unwrap().as_str(), Some("valid"));
    }

    #[test]
    fn malformed_ops_are_errors() {
        let mut f = fb();
        let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
        let w = f
            .weight(
                "w",
                TensorType::fp16([128, 32, 1, 1]),
                WeightData::f16_from_f32(&[0.0; 128 * 32]),
            )
            .unwrap();
        let e = f.conv1x1(x, w).unwrap_err().to_string();
        assert!(e.contains("input channels"), "{e}");
        let y = f.input("y2", TensorType::fp32([1, 64, 1, 32]));
        assert!(y.is_err(), "inputs after ops are rejected");
        let z = f.reshape(x, &[1, 3, -1]).unwrap_err().to_string();
        assert!(z.contains("reshape"), "{z}");
        assert!(f.op1("no_such_op", vec![]).is_err());
        let before = (f.function().values().len(), f.function().ops().len());
        assert!(f.softmax(x, 4).is_err());
        assert_eq!(
            (f.function().values().len(), f.function().ops().len()),
            before,
            "failed calls leave no consts behind"
        );
        let y = f.softmax(x, 3).unwrap();
        assert_eq!(
            f.function().name_of(y),
            "softmax_0",
            "and no gaps in the names"
        );
    }

    #[test]
    fn names_are_unique_and_checked() {
        let mut f = fb();
        let x = f.input("x", TensorType::fp16([1, 4])).unwrap();
        assert!(f.input("x", TensorType::fp16([1, 4])).is_err());
        assert!(f.name_next("x").relu(x).is_err());
        assert!(f.name_next("bad name").relu(x).is_err());
        let a = f.relu(x).unwrap();
        let b = f.relu(x).unwrap();
        assert_ne!(f.function().name_of(a), f.function().name_of(b));
        f.rename(b, "out").unwrap();
        assert_eq!(
            f.function().producer(b).unwrap().name.as_deref(),
            Some("out")
        );
    }

    #[test]
    fn opset_gates_newer_ops() {
        let mut f = FunctionBuilder::new("main", Opset::Ios16);
        let s = f.input("x", TensorType::fp16([1, 4])).unwrap();
        let e = f
            .op1("slice_update", vec![("x", s.into()), ("update", s.into())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ios18"), "{e}");
    }

    #[test]
    fn split_names_extra_outputs() {
        let mut f = fb();
        let x = f.input("x", TensorType::fp16([1, 6, 1, 4])).unwrap();
        let parts = f.name_next("p").split(x, 1, 3).unwrap();
        let names: Vec<_> = parts
            .iter()
            .map(|&p| f.function().name_of(p).to_string())
            .collect();
        assert_eq!(names, ["p", "p_1", "p_2"]);
        assert_eq!(f.type_of(parts[2]).unwrap().shape, vec![1, 2, 1, 4]);
    }

    #[test]
    fn state_round_trip_types() {
        let mut f = fb();
        let k = f
            .state_input("k_cache", TensorType::fp16([1, 8, 1, 16]))
            .unwrap();
        let x = f.input("x", TensorType::fp16([1, 8, 1, 16])).unwrap();
        assert!(f.relu(k).is_err(), "a state is not a tensor operand");
        let r = f.read_state(k).unwrap();
        let s = f.add(r, x).unwrap();
        let u = f.update_state(k, s).unwrap();
        assert!(f.output(k).is_err());
        f.output(u).unwrap();
        f.finish().unwrap();
    }
}
