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

#[cfg(test)]
mod tests;
mod typed;

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
}

/// `[A-Za-z_][A-Za-z0-9_@]*` (MIL.proto identifiers).
pub fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '@')
}
