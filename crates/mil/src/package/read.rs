//! `CoreML.Specification.Model` → Program, for the subset [`super::write`] produces (round trips,
//! and inspecting packages made by others that stay inside it). Every op is type-checked again.

use super::proto as pb;
use crate::builder::{FunctionBuilder, Outputs};
use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Dialect, Function, Operation, Opset, Program, ValueId};
use crate::literal::{BlobSource, Elements, Literal};
use crate::types::{TensorType, ValueType};
use half::f16;
use std::collections::HashMap;

fn bad(msg: impl Into<String>) -> MilError {
    MilError::invalid(msg)
}

fn tensor_type(t: &pb::TensorType) -> Result<TensorType> {
    let dtype = DType::from_proto_code(t.data_type)
        .ok_or_else(|| bad(format!("unknown DataType {}", t.data_type)))?;
    let shape = t
        .dimensions
        .iter()
        .map(|d| match &d.dimension {
            Some(pb::dimension::Dimension::Constant(c)) => Ok(c.size as usize),
            _ => Err(bad("only static dimensions are supported")),
        })
        .collect::<Result<Vec<_>>>()?;
    if shape.len() as i64 != t.rank {
        return Err(bad(format!(
            "rank {} with {} dimensions",
            t.rank,
            shape.len()
        )));
    }
    let t = TensorType { dtype, shape };
    t.check_size()?;
    Ok(t)
}

fn value_type(t: Option<&pb::ValueType>) -> Result<ValueType> {
    match t.and_then(|t| t.r#type.as_ref()) {
        Some(pb::value_type::Type::TensorType(t)) => Ok(ValueType::Tensor(tensor_type(t)?)),
        Some(pb::value_type::Type::StateType(s)) => {
            match s.wrapped_type.as_deref().and_then(|w| w.r#type.as_ref()) {
                Some(pb::value_type::Type::TensorType(t)) => Ok(ValueType::State(tensor_type(t)?)),
                _ => Err(bad("state must wrap a tensor")),
            }
        }
        None => Err(bad("missing value type")),
    }
}

fn from_le<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    b.chunks_exact(N)
        .map(|c| f(c.try_into().unwrap_or([0; N])))
        .collect()
}

fn elements(dtype: DType, t: &pb::TensorValue) -> Result<Elements> {
    use pb::tensor_value::Value as V;
    Ok(match (dtype, &t.value) {
        (DType::Fp32, Some(V::Floats(v))) => Elements::F32(v.values.clone()),
        (DType::Fp64, Some(V::Doubles(v))) => Elements::F64(v.values.clone()),
        (DType::Int32, Some(V::Ints(v))) => Elements::I32(v.values.clone()),
        (DType::Int16, Some(V::Ints(v))) => {
            Elements::I16(v.values.iter().map(|&x| x as i16).collect())
        }
        (DType::Uint16, Some(V::Ints(v))) => {
            Elements::U16(v.values.iter().map(|&x| x as u16).collect())
        }
        (DType::Int64, Some(V::LongInts(v))) => Elements::I64(v.values.clone()),
        (DType::Uint64, Some(V::LongInts(v))) => {
            Elements::U64(v.values.iter().map(|&x| x as u64).collect())
        }
        (DType::Bool, Some(V::Bools(v))) => Elements::Bool(v.values.clone()),
        (DType::String, Some(V::Strings(v))) => Elements::Str(v.values.clone()),
        (DType::Fp16, Some(V::Bytes(v))) => Elements::F16(from_le(&v.values, f16::from_le_bytes)),
        (DType::Int8, Some(V::Bytes(v))) => {
            Elements::I8(v.values.iter().map(|&x| x as i8).collect())
        }
        (DType::Uint8, Some(V::Bytes(v))) => Elements::U8(v.values.clone()),
        (DType::Uint32, Some(V::Bytes(v))) => Elements::U32(from_le(&v.values, u32::from_le_bytes)),
        (d, _) => {
            return Err(bad(format!(
                "immediate value encoding does not fit dtype {d}"
            )))
        }
    })
}

fn literal(v: &pb::Value) -> Result<Literal> {
    let ty = match value_type(v.r#type.as_ref())? {
        ValueType::Tensor(t) => t,
        ValueType::State(_) => return Err(bad("a value cannot be a state")),
    };
    match &v.value {
        Some(pb::value::Value::ImmediateValue(iv)) => {
            let t = iv
                .tensor
                .as_ref()
                .ok_or_else(|| bad("only tensor immediate values are supported"))?;
            Literal::immediate(ty.clone(), elements(ty.dtype, t)?)
        }
        Some(pb::value::Value::BlobFileValue(b)) => Ok(Literal::Blob {
            ty,
            source: BlobSource::File {
                path: b.file_name.clone(),
                offset: b.offset,
            },
        }),
        None => Err(bad("value without content")),
    }
}

fn binding(b: &pb::Binding, scope: &HashMap<String, ValueId>) -> Result<Binding> {
    match &b.binding {
        Some(pb::binding::Binding::Name(n)) => scope
            .get(n)
            .map(|&id| Binding::Value(id))
            .ok_or_else(|| bad(format!("{n} is not defined"))),
        Some(pb::binding::Binding::Value(v)) => Ok(Binding::Literal(literal(v)?)),
        None => Err(bad("empty binding")),
    }
}

fn function(fname: &str, f: &pb::Function, tuple_params: &[(&str, &str)]) -> Result<Function> {
    let opset = Opset::from_coreml_name(&f.opset)
        .ok_or_else(|| bad(format!("unknown opset {}", f.opset)))?;
    let block = f
        .block_specializations
        .get(&f.opset)
        .ok_or_else(|| bad(format!("no block for opset {}", f.opset)))?;
    let mut b = FunctionBuilder::new(fname, opset);
    let mut scope = HashMap::new();
    for i in &f.inputs {
        let id = b.add_input(&i.name, value_type(i.r#type.as_ref())?)?;
        scope.insert(i.name.clone(), id);
    }
    let mut ops = block.operations.iter().peekable();
    while let Some(op) = ops.next() {
        let mut name = None;
        let mut attributes = Vec::new();
        for (k, v) in &op.attributes {
            if k == "name" {
                name = Some(
                    literal(v)?
                        .as_str()
                        .ok_or_else(|| bad("name attribute must be a string"))?
                        .to_string(),
                );
            } else {
                attributes.push((k.clone(), literal(v)?));
            }
        }
        let mut inputs = Vec::new();
        for (k, a) in &op.inputs {
            let bs = a
                .arguments
                .iter()
                .map(|x| binding(x, &scope))
                .collect::<Result<Vec<_>>>()?;
            let tuple = tuple_params.contains(&(op.r#type.as_str(), k.as_str()));
            let arg = match (tuple, bs.len()) {
                (false, 1) => {
                    Argument::Single(bs.into_iter().next().ok_or_else(|| bad("empty argument"))?)
                }
                _ => Argument::Tuple(bs),
            };
            inputs.push((k.clone(), arg));
        }
        let mut op_type = op.r#type.clone();
        let mut outputs = op.outputs.clone();
        if op_type == "write_state" {
            // write_state + read_state of the same state is coremltools' coreml_update_state.
            let next = ops.next_if(|n| {
                n.r#type == "read_state" && n.inputs.get("input") == op.inputs.get("input")
            });
            let read =
                next.ok_or_else(|| bad("write_state without its read_state is not supported"))?;
            let rename = |k: &str| if k == "input" { "state" } else { "value" };
            inputs = inputs
                .into_iter()
                .map(|(k, a)| (rename(&k).to_string(), a))
                .collect();
            inputs.sort_by(|a, b| a.0.cmp(&b.0));
            op_type = "coreml_update_state".into();
            outputs = read.outputs.clone();
            name = read
                .attributes
                .get("name")
                .map(literal)
                .transpose()?
                .and_then(|l| l.as_str().map(str::to_string));
        }
        let declared = outputs
            .iter()
            .map(|o| Ok((o.name.clone(), value_type(o.r#type.as_ref())?)))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<String> = declared.iter().map(|(n, _)| n.clone()).collect();
        let ids = b
            .push(
                Operation {
                    op_type,
                    inputs,
                    attributes,
                    name,
                    outputs: Vec::new(),
                },
                Outputs::Declared(declared),
            )
            .map_err(|e| e.context(format!("function {fname}")))?;
        for (n, id) in names.into_iter().zip(ids) {
            scope.insert(n, id);
        }
    }
    for o in &block.outputs {
        let id = *scope
            .get(o)
            .ok_or_else(|| bad(format!("output {o} is not defined")))?;
        b.output(id)?;
    }
    b.finish()
}

/// Converts a decoded model back into a Program (blob references left unloaded).
pub fn program_from_model(model: &pb::Model) -> Result<Program> {
    let prog = model
        .ml_program
        .as_ref()
        .ok_or_else(|| bad("model is not an ML Program"))?;
    if prog.version != 1 {
        return Err(bad(format!(
            "Program.version {} (expected 1)",
            prog.version
        )));
    }
    // Function order: the description's, else the map's.
    let desc = model.description.clone().unwrap_or_default();
    let mut order: Vec<String> = desc.functions.iter().map(|f| f.name.clone()).collect();
    for k in prog.functions.keys() {
        if !order.contains(k) {
            order.push(k.clone());
        }
    }
    let tuple_params = [("concat", "values")];
    let mut functions = Vec::new();
    for name in order {
        let f = prog
            .functions
            .get(&name)
            .ok_or_else(|| bad(format!("described function {name} is missing")))?;
        functions.push(function(&name, f, &tuple_params)?);
    }
    let dialect = if functions.iter().all(|f| f.opset <= Opset::Ios16) {
        Dialect::b()
    } else {
        Dialect::a()
    };
    let mut p = Program::new(dialect);
    for f in functions {
        p.add_function(f)?;
    }
    Ok(p)
}
