//! anelm-mil: the MIL IR every ANE program of anelm goes through.
pub mod blob;
pub mod builder;
pub mod dtype;
pub mod error;
pub mod ir;
pub mod literal;
pub mod ops;
pub mod package;
pub mod text;
pub mod types;

pub use builder::{Arg, ConvParams, FunctionBuilder, Pad};
pub use dtype::DType;
pub use error::{MilError, Result};
pub use ir::{Argument, Binding, Dialect, Function, Opset, Operation, Program, ValueDef, ValueId, ValueInfo};
pub use literal::{BlobSource, Elements, Literal, WeightData};
pub use types::{TensorType, ValueType};
