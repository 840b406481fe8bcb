//! The protobuf messages of a Core ML ML Program model that we write and read, declared by hand
//! for prost (no protoc): field numbers from coremltools `mlmodel/format/{Model,FeatureTypes,MIL}.proto`
//! (COREML.md §3). Maps are `BTreeMap`s so the encoding is deterministic.
//!
//! Messages and fields we never produce (classic neural networks, images, flexible shapes,
//! list/tuple/dict values) are left out; `validate_mlpackage.py` flags any field number we get
//! wrong as an unknown field.

use std::collections::BTreeMap;

// ---------------------------------------------------------------- Model.proto / FeatureTypes.proto

#[derive(Clone, PartialEq, prost::Message)]
pub struct Model {
    #[prost(int32, tag = "1")]
    pub specification_version: i32,
    #[prost(message, optional, tag = "2")]
    pub description: Option<ModelDescription>,
    #[prost(message, optional, tag = "502")]
    pub ml_program: Option<Program>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelDescription {
    #[prost(message, repeated, tag = "1")]
    pub input: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "10")]
    pub output: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "13")]
    pub state: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "20")]
    pub functions: Vec<FunctionDescription>,
    #[prost(string, tag = "21")]
    pub default_function_name: String,
    #[prost(message, optional, tag = "100")]
    pub metadata: Option<Metadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    #[prost(string, tag = "1")]
    pub short_description: String,
    #[prost(string, tag = "2")]
    pub version_string: String,
    #[prost(string, tag = "3")]
    pub author: String,
    #[prost(string, tag = "4")]
    pub license: String,
    #[prost(btree_map = "string, string", tag = "100")]
    pub user_defined: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionDescription {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub input: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "3")]
    pub output: Vec<FeatureDescription>,
    #[prost(message, repeated, tag = "6")]
    pub state: Vec<FeatureDescription>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FeatureDescription {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub short_description: String,
    #[prost(message, optional, tag = "3")]
    pub r#type: Option<FeatureType>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FeatureType {
    #[prost(oneof = "feature_type::Type", tags = "5, 8")]
    pub r#type: Option<feature_type::Type>,
    #[prost(bool, tag = "1000")]
    pub is_optional: bool,
}

pub mod feature_type {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "5")]
        MultiArrayType(super::ArrayFeatureType),
        #[prost(message, tag = "8")]
        StateType(super::StateFeatureType),
    }
}

/// `ArrayFeatureType.ArrayDataType` values (FeatureTypes.proto).
pub mod array_data_type {
    pub const FLOAT32: i32 = 0x10020;
    pub const DOUBLE: i32 = 0x10040;
    pub const FLOAT16: i32 = 0x10010;
    pub const INT32: i32 = 0x20020;
    pub const INT8: i32 = 0x20008;
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayFeatureType {
    #[prost(int64, repeated, tag = "1")]
    pub shape: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StateFeatureType {
    #[prost(message, optional, tag = "1")]
    pub array_type: Option<ArrayFeatureType>,
}

// ---------------------------------------------------------------- MIL.proto (CoreML.Specification.MILSpec)

#[derive(Clone, PartialEq, prost::Message)]
pub struct Program {
    #[prost(int64, tag = "1")]
    pub version: i64,
    #[prost(btree_map = "string, message", tag = "2")]
    pub functions: BTreeMap<String, Function>,
    #[prost(string, tag = "3")]
    pub doc_string: String,
    #[prost(btree_map = "string, message", tag = "4")]
    pub attributes: BTreeMap<String, Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(message, repeated, tag = "1")]
    pub inputs: Vec<NamedValueType>,
    #[prost(string, tag = "2")]
    pub opset: String,
    #[prost(btree_map = "string, message", tag = "3")]
    pub block_specializations: BTreeMap<String, Block>,
    #[prost(btree_map = "string, message", tag = "4")]
    pub attributes: BTreeMap<String, Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Block {
    #[prost(message, repeated, tag = "1")]
    pub inputs: Vec<NamedValueType>,
    #[prost(string, repeated, tag = "2")]
    pub outputs: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    pub operations: Vec<Operation>,
    #[prost(btree_map = "string, message", tag = "4")]
    pub attributes: BTreeMap<String, Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Operation {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(btree_map = "string, message", tag = "2")]
    pub inputs: BTreeMap<String, Argument>,
    #[prost(message, repeated, tag = "3")]
    pub outputs: Vec<NamedValueType>,
    #[prost(message, repeated, tag = "4")]
    pub blocks: Vec<Block>,
    #[prost(btree_map = "string, message", tag = "5")]
    pub attributes: BTreeMap<String, Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Argument {
    #[prost(message, repeated, tag = "1")]
    pub arguments: Vec<Binding>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Binding {
    #[prost(oneof = "binding::Binding", tags = "1, 2")]
    pub binding: Option<binding::Binding>,
}

pub mod binding {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Binding {
        #[prost(string, tag = "1")]
        Name(String),
        #[prost(message, tag = "2")]
        Value(super::Value),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedValueType {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<ValueType>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(oneof = "value_type::Type", tags = "1, 5")]
    pub r#type: Option<value_type::Type>,
}

pub mod value_type {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        TensorType(super::TensorType),
        #[prost(message, tag = "5")]
        StateType(Box<super::StateType>),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorType {
    #[prost(int32, tag = "1")]
    pub data_type: i32,
    #[prost(int64, tag = "2")]
    pub rank: i64,
    #[prost(message, repeated, tag = "3")]
    pub dimensions: Vec<Dimension>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    #[prost(oneof = "dimension::Dimension", tags = "1, 2")]
    pub dimension: Option<dimension::Dimension>,
}

pub mod dimension {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Dimension {
        #[prost(message, tag = "1")]
        Constant(super::ConstantDimension),
        #[prost(message, tag = "2")]
        Unknown(super::UnknownDimension),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConstantDimension {
    #[prost(uint64, tag = "1")]
    pub size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnknownDimension {
    #[prost(bool, tag = "1")]
    pub variadic: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StateType {
    #[prost(message, optional, boxed, tag = "1")]
    pub wrapped_type: Option<Box<ValueType>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub doc_string: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<ValueType>,
    #[prost(oneof = "value::Value", tags = "3, 5")]
    pub value: Option<value::Value>,
}

pub mod value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "3")]
        ImmediateValue(super::ImmediateValue),
        #[prost(message, tag = "5")]
        BlobFileValue(super::BlobFileValue),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImmediateValue {
    #[prost(message, optional, tag = "1")]
    pub tensor: Option<TensorValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BlobFileValue {
    #[prost(string, tag = "1")]
    pub file_name: String,
    #[prost(uint64, tag = "2")]
    pub offset: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorValue {
    #[prost(oneof = "tensor_value::Value", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub value: Option<tensor_value::Value>,
}

pub mod tensor_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        Floats(super::RepeatedFloats),
        #[prost(message, tag = "2")]
        Ints(super::RepeatedInts),
        #[prost(message, tag = "3")]
        Bools(super::RepeatedBools),
        #[prost(message, tag = "4")]
        Strings(super::RepeatedStrings),
        #[prost(message, tag = "5")]
        LongInts(super::RepeatedLongInts),
        #[prost(message, tag = "6")]
        Doubles(super::RepeatedDoubles),
        #[prost(message, tag = "7")]
        Bytes(super::RepeatedBytes),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedFloats {
    #[prost(float, repeated, tag = "1")]
    pub values: Vec<f32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedDoubles {
    #[prost(double, repeated, tag = "1")]
    pub values: Vec<f64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedInts {
    #[prost(int32, repeated, tag = "1")]
    pub values: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedLongInts {
    #[prost(int64, repeated, tag = "1")]
    pub values: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedBools {
    #[prost(bool, repeated, tag = "1")]
    pub values: Vec<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedStrings {
    #[prost(string, repeated, tag = "1")]
    pub values: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepeatedBytes {
    #[prost(bytes = "vec", tag = "1")]
    pub values: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn blob_value_matches_the_coremltools_test_vector() {
        // COREML.md §3: fp16[16] const value pointing at blob offset 64.
        let v = Value {
            doc_string: String::new(),
            r#type: Some(ValueType {
                r#type: Some(value_type::Type::TensorType(TensorType {
                    data_type: 10,
                    rank: 1,
                    dimensions: vec![Dimension {
                        dimension: Some(dimension::Dimension::Constant(ConstantDimension {
                            size: 16,
                        })),
                    }],
                })),
            }),
            value: Some(value::Value::BlobFileValue(BlobFileValue {
                file_name: "@model_path/weights/weight.bin".into(),
                offset: 64,
            })),
        };
        let mut want = vec![
            0x12, 0x0c, 0x0a, 0x0a, 0x08, 0x0a, 0x10, 0x01, 0x1a, 0x04, 0x0a, 0x02, 0x08, 0x10,
        ];
        want.extend_from_slice(&[0x2a, 0x22, 0x0a, 0x1e]);
        want.extend_from_slice(b"@model_path/weights/weight.bin");
        want.extend_from_slice(&[0x10, 0x40]);
        assert_eq!(v.encode_to_vec(), want);
        assert_eq!(Value::decode(want.as_slice()).unwrap(), v);
    }
}
