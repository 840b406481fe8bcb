//! Program → `CoreML.Specification.Model` (an ML Program), encoded the way coremltools'
//! exporter does (COREML.md §5): every op carries a `name` attribute; `const` ops hold `val`;
//! iOS18+ `constexpr_*` ops take operands as inputs, older ones as attributes;
//! `coreml_update_state` becomes `write_state` + `read_state`.

use super::proto as pb;
use crate::blob::{blob_location, BlobLayout};
use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ir::{Argument, Binding, Function, Operation, Opset, Program};
use crate::literal::{Elements, Literal};
use crate::types::{TensorType, ValueType};
use std::collections::BTreeMap;

/// How the model description is laid out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PackageOptions {
    /// `specificationVersion`; by default the lowest that the functions' opsets and features
    /// need (multifunction and states need 9).
    pub spec_version: Option<i32>,
    /// The default function of a multifunction package (by default the first function).
    pub default_function: Option<String>,
    /// Describe functions in `description.functions` even for a single `main` function.
    pub force_multifunction: bool,
}

pub(crate) fn tensor_type(t: &TensorType) -> pb::TensorType {
    pb::TensorType {
        data_type: t.dtype.proto_code(),
        rank: t.rank() as i64,
        dimensions: t
            .shape
            .iter()
            .map(|&d| pb::Dimension {
                dimension: Some(pb::dimension::Dimension::Constant(pb::ConstantDimension {
                    size: d as u64,
                })),
            })
            .collect(),
    }
}

fn value_type(t: &ValueType) -> pb::ValueType {
    let inner = match t {
        ValueType::Tensor(t) => pb::value_type::Type::TensorType(tensor_type(t)),
        ValueType::State(t) => pb::value_type::Type::StateType(Box::new(pb::StateType {
            wrapped_type: Some(Box::new(pb::ValueType {
                r#type: Some(pb::value_type::Type::TensorType(tensor_type(t))),
            })),
        })),
    };
    pb::ValueType {
        r#type: Some(inner),
    }
}

fn named(name: &str, t: &ValueType) -> pb::NamedValueType {
    pb::NamedValueType {
        name: name.to_string(),
        r#type: Some(value_type(t)),
    }
}

fn le_bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Immediate tensor encoding per dtype (coremltools `backend/mil/helper.py`).
fn tensor_value(e: &Elements) -> pb::TensorValue {
    use pb::tensor_value::Value as V;
    let bytes = |values| V::Bytes(pb::RepeatedBytes { values });
    let v = match e {
        Elements::F32(v) => V::Floats(pb::RepeatedFloats { values: v.clone() }),
        Elements::F64(v) => V::Doubles(pb::RepeatedDoubles { values: v.clone() }),
        Elements::I32(v) => V::Ints(pb::RepeatedInts { values: v.clone() }),
        Elements::I16(v) => V::Ints(pb::RepeatedInts {
            values: v.iter().map(|&x| x as i32).collect(),
        }),
        Elements::U16(v) => V::Ints(pb::RepeatedInts {
            values: v.iter().map(|&x| x as i32).collect(),
        }),
        Elements::I64(v) => V::LongInts(pb::RepeatedLongInts { values: v.clone() }),
        Elements::U64(v) => V::LongInts(pb::RepeatedLongInts {
            values: v.iter().map(|&x| x as i64).collect(),
        }),
        Elements::Bool(v) => V::Bools(pb::RepeatedBools { values: v.clone() }),
        Elements::Str(v) => V::Strings(pb::RepeatedStrings { values: v.clone() }),
        Elements::F16(v) => bytes(le_bytes(v, |x| x.to_le_bytes())),
        Elements::I8(v) => bytes(le_bytes(v, |x| x.to_le_bytes())),
        Elements::U8(v) => bytes(v.clone()),
        Elements::U32(v) => bytes(le_bytes(v, |x| x.to_le_bytes())),
    };
    pb::TensorValue { value: Some(v) }
}

fn value(l: &Literal, layout: &BlobLayout) -> Result<pb::Value> {
    let ty = Some(value_type(&ValueType::Tensor(l.ty().clone())));
    let v = match l {
        Literal::Immediate { data, .. } => pb::value::Value::ImmediateValue(pb::ImmediateValue {
            tensor: Some(tensor_value(data)),
        }),
        Literal::Blob { .. } => {
            let (file_name, offset) = blob_location(l, layout)?;
            pb::value::Value::BlobFileValue(pb::BlobFileValue { file_name, offset })
        }
    };
    Ok(pb::Value {
        doc_string: String::new(),
        r#type: ty,
        value: Some(v),
    })
}

fn name_attr(name: &str) -> BTreeMap<String, pb::Value> {
    let lit = Literal::string(name);
    let mut m = BTreeMap::new();
    // A string immediate never touches the blob layout.
    if let Ok(v) = value(&lit, &BlobLayout::default()) {
        m.insert("name".to_string(), v);
    }
    m
}

fn op_name(f: &Function, op: &Operation) -> String {
    op.name.clone().unwrap_or_else(|| {
        op.outputs
            .first()
            .map(|&o| f.name_of(o).to_string())
            .unwrap_or_default()
    })
}

fn name_binding(f: &Function, b: &Binding, layout: &BlobLayout) -> Result<pb::Binding> {
    let inner = match b {
        Binding::Value(id) => pb::binding::Binding::Name(f.name_of(*id).to_string()),
        Binding::Literal(l) => pb::binding::Binding::Value(value(l, layout)?),
    };
    Ok(pb::Binding {
        binding: Some(inner),
    })
}

fn operations(f: &Function, op: &Operation, layout: &BlobLayout) -> Result<Vec<pb::Operation>> {
    let outputs: Vec<pb::NamedValueType> = op
        .outputs
        .iter()
        .map(|&o| named(f.name_of(o), f.type_of(o)))
        .collect();
    let name = op_name(f, op);
    let mut attributes = name_attr(&name);
    let mut inputs = BTreeMap::new();
    if op.op_type == "coreml_update_state" {
        let arg = |p: &str| -> Result<pb::Argument> {
            let a = op
                .input(p)
                .ok_or_else(|| MilError::invalid(format!("{name}: missing {p}")))?;
            Ok(pb::Argument {
                arguments: a
                    .bindings()
                    .iter()
                    .map(|b| name_binding(f, b, layout))
                    .collect::<Result<_>>()?,
            })
        };
        let write = pb::Operation {
            r#type: "write_state".into(),
            inputs: BTreeMap::from([
                ("input".to_string(), arg("state")?),
                ("data".to_string(), arg("value")?),
            ]),
            outputs: Vec::new(),
            blocks: Vec::new(),
            attributes: name_attr(&format!("{name}_write_state")),
        };
        let read = pb::Operation {
            r#type: "read_state".into(),
            inputs: BTreeMap::from([("input".to_string(), arg("state")?)]),
            outputs,
            blocks: Vec::new(),
            attributes,
        };
        return Ok(vec![write, read]);
    }
    let constexpr = op.op_type.starts_with("constexpr_");
    for (k, l) in &op.attributes {
        if constexpr && f.opset >= Opset::Ios18 {
            // iOS18 constexpr ops take their operands as inputs (literal bindings).
            let b = name_binding(f, &Binding::Literal(l.clone()), layout)?;
            inputs.insert(k.clone(), pb::Argument { arguments: vec![b] });
        } else {
            attributes.insert(k.clone(), value(l, layout)?);
        }
    }
    for (k, a) in &op.inputs {
        if constexpr && f.opset < Opset::Ios18 {
            // Before iOS18 constexpr operands are attributes: inline the const they name.
            let lit = match a {
                Argument::Single(Binding::Literal(l)) => l,
                Argument::Single(Binding::Value(id)) => f.const_value(*id).ok_or_else(|| {
                    MilError::invalid(format!(
                        "{name}: operand {k} of a constexpr op must be a constant"
                    ))
                })?,
                Argument::Tuple(_) => {
                    return Err(MilError::invalid(format!("{name}: tuple operand {k}")))
                }
            };
            attributes.insert(k.clone(), value(lit, layout)?);
            continue;
        }
        let arguments = a
            .bindings()
            .iter()
            .map(|b| name_binding(f, b, layout))
            .collect::<Result<_>>()?;
        inputs.insert(k.clone(), pb::Argument { arguments });
    }
    Ok(vec![pb::Operation {
        r#type: op.op_type.clone(),
        inputs,
        outputs,
        blocks: Vec::new(),
        attributes,
    }])
}

fn function(f: &Function, layout: &BlobLayout) -> Result<pb::Function> {
    f.check_opset(f.opset)?;
    let opset = f.opset.coreml_name().to_string();
    let mut ops = Vec::with_capacity(f.ops().len());
    for op in f.ops() {
        ops.extend(
            operations(f, op, layout).map_err(|e| e.context(format!("function {}", f.name)))?,
        );
    }
    let block = pb::Block {
        inputs: Vec::new(),
        outputs: f
            .outputs()
            .iter()
            .map(|&o| f.name_of(o).to_string())
            .collect(),
        operations: ops,
        attributes: BTreeMap::new(),
    };
    Ok(pb::Function {
        inputs: f
            .inputs()
            .iter()
            .map(|&i| named(f.name_of(i), f.type_of(i)))
            .collect(),
        opset: opset.clone(),
        block_specializations: BTreeMap::from([(opset, block)]),
        attributes: BTreeMap::new(),
    })
}

fn array_type(t: &TensorType, what: &str) -> Result<pb::ArrayFeatureType> {
    use pb::array_data_type as a;
    let data_type = match t.dtype {
        DType::Fp16 => a::FLOAT16,
        DType::Fp32 => a::FLOAT32,
        DType::Fp64 => a::DOUBLE,
        DType::Int32 => a::INT32,
        DType::Int8 => a::INT8,
        d => {
            return Err(MilError::invalid(format!(
                "{what}: Core ML multiarrays cannot be {d}"
            )))
        }
    };
    Ok(pb::ArrayFeatureType {
        shape: t.shape.iter().map(|&d| d as i64).collect(),
        data_type,
    })
}

fn feature(name: &str, t: &ValueType) -> Result<pb::FeatureDescription> {
    let ty = match t {
        ValueType::Tensor(t) => pb::feature_type::Type::MultiArrayType(array_type(t, name)?),
        ValueType::State(t) => pb::feature_type::Type::StateType(pb::StateFeatureType {
            array_type: Some(array_type(t, name)?),
        }),
    };
    Ok(pb::FeatureDescription {
        name: name.to_string(),
        short_description: String::new(),
        r#type: Some(pb::FeatureType {
            r#type: Some(ty),
            is_optional: false,
        }),
    })
}

fn describe(f: &Function) -> Result<pb::FunctionDescription> {
    let mut d = pb::FunctionDescription {
        name: f.name.clone(),
        ..Default::default()
    };
    for &i in f.inputs() {
        let fd = feature(f.name_of(i), f.type_of(i))?;
        if f.type_of(i).is_state() {
            d.state.push(fd);
        } else {
            d.input.push(fd);
        }
    }
    for &o in f.outputs() {
        d.output.push(feature(f.name_of(o), f.type_of(o))?);
    }
    Ok(d)
}

/// Builds the model protobuf; blob-backed consts reference `layout`.
pub fn model_proto(
    program: &Program,
    layout: &BlobLayout,
    opts: &PackageOptions,
) -> Result<pb::Model> {
    let first = program
        .functions
        .first()
        .ok_or_else(|| MilError::invalid("program has no functions"))?;
    let multi = opts.force_multifunction || program.functions.len() > 1 || first.name != "main";
    let stateful = program
        .functions
        .iter()
        .any(|f| f.inputs().iter().any(|&i| f.type_of(i).is_state()));
    let mut needed = program
        .functions
        .iter()
        .map(|f| f.opset.spec_version())
        .max()
        .unwrap_or(7)
        .max(7);
    if multi || stateful {
        needed = needed.max(9);
    }
    // INT8 multiarray I/O arrived with iOS26 (COREML.md §3, ArrayDataType INT8 spec >= 10).
    let int8_io = program.functions.iter().any(|f| {
        f.inputs()
            .iter()
            .chain(f.outputs())
            .any(|&v| !f.type_of(v).is_state() && f.type_of(v).tensor().dtype == DType::Int8)
    });
    if int8_io {
        needed = needed.max(10);
    }
    let spec = opts.spec_version.unwrap_or(needed);
    if spec < needed {
        return Err(MilError::invalid(format!(
            "specificationVersion {spec} is too old; this program needs {needed}"
        )));
    }
    let mut functions = BTreeMap::new();
    for f in &program.functions {
        functions.insert(f.name.clone(), function(f, layout)?);
    }
    let mut description = pb::ModelDescription::default();
    if multi {
        for f in &program.functions {
            description.functions.push(describe(f)?);
        }
        let default = opts
            .default_function
            .clone()
            .unwrap_or_else(|| first.name.clone());
        if program.function(&default).is_none() {
            return Err(MilError::invalid(format!(
                "default function {default} is not in the program"
            )));
        }
        description.default_function_name = default;
    } else {
        let d = describe(first)?;
        description.input = d.input;
        description.output = d.output;
        description.state = d.state;
    }
    Ok(pb::Model {
        specification_version: spec,
        description: Some(description),
        ml_program: Some(pb::Program {
            version: 1,
            functions,
            doc_string: String::new(),
            attributes: BTreeMap::new(),
        }),
    })
}
