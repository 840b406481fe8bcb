//! anelm-mil: the MIL IR every ANE program of anelm goes through.
//!
//! One in-memory [`Program`] (functions of typed SSA values and operations with named
//! arguments; constants inline or in weight blobs) is
//! - built op by op with shape/type inference by [`FunctionBuilder`] (a malformed program is an
//!   error at the call that makes it),
//! - printed as MIL text for the private in-memory path ([`text`]; dialects A `program(1.3)`/ios18
//!   and B `program(1.0)`/ios16, FACTS §1) together with its weight blob files ([`blob`],
//!   storage v2, FACTS §2),
//! - parsed back from text ([`text::parse_program`]; print → parse → print is a fixed point),
//! - written as a Core ML `.mlpackage` ([`package`], COREML.md) and read back,
//! - linted against what public sources report failing on ANE hardware ([`lint`]),
//! - given compressed weights (int8/int4 blockwise, palettes, affine) by the constexpr ops of
//!   [`constexpr`], which also evaluates them by definition ([`constexpr::dense_f32`]),
//! - walked by the simulator: [`Function::ops`], [`Operation::inputs`], [`Function::const_value`],
//!   [`Literal::weight_data`] / [`WeightData::to_f32`] — and executed with the ANE's fp16
//!   numerics by [`sim::Simulator`].
//!
//! One program, both back ends:
//!
//! ```
//! use anelm_mil::blob::BlobPolicy;
//! use anelm_mil::package::{write_package, PackageOptions};
//! use anelm_mil::{FunctionBuilder, Opset, Program, TensorType, WeightData};
//! # fn main() -> anelm_mil::Result<()> {
//! let mut f = FunctionBuilder::new("main", Opset::Ios18);
//! let x = f.input("x", TensorType::fp16([1, 64, 1, 64]))?;
//! let w = f.weight("w", TensorType::fp16([64, 64, 1, 1]), WeightData::f16_from_f32(&[0.25; 64 * 64]))?;
//! let y = f.name_next("y").conv1x1(x, w)?;
//! f.output(y)?;
//! let program = Program::single(f.finish()?);
//!
//! // (a) private path: MIL text + blob files (one per matrix here)
//! let art = anelm_mil::text::to_artifacts(&program, &BlobPolicy::PerTensor)?;
//! assert!(art.text.contains("offset = uint64(64)"));
//! let (key, bytes) = (art.layout.files()[0].mil_path(), art.layout.files()[0].to_bytes());
//! assert_eq!((key.as_str(), bytes.len()), ("@model_path/weights/w.bin", 128 + 64 * 64 * 2));
//!
//! // (b) Core ML package
//! let dir = std::env::temp_dir().join(format!("anelm-mil-doc-{}", std::process::id()));
//! write_package(&program, &dir.join("conv.mlpackage"), &PackageOptions::default(), &BlobPolicy::default())?;
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```
//!
//! Entry points for the CLI (`anelm mil print FILE`, `anelm mil check FILE`):
//! - [`print_text`]: parse MIL text and print it in canonical form;
//! - [`check_text`]: parse and lint; a parse error is an `Err` carrying line and column
//!   ([`MilError::Parse`]), lint findings are advice.
//!
//! ```
//! let src = "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 4]> x) {\n        tensor<fp16, [1, 4]> y = gelu(x=x);\n    } -> (y);\n}\n";
//! let canonical = anelm_mil::print_text(src).unwrap();
//! assert!(canonical.contains("y = gelu(x = x);"));
//! let findings = anelm_mil::check_text(src).unwrap();
//! assert!(findings.iter().any(|f| f.rule == "gelu"));
//! assert!(matches!(anelm_mil::check_text("program(1.3) {"), Err(anelm_mil::MilError::Parse { .. })));
//! ```

pub mod blob;
pub mod builder;
pub mod census;
pub mod constexpr;
pub mod dtype;
pub mod error;
pub mod fuzz;
pub mod ir;
pub mod lint;
pub mod literal;
pub mod ops;
pub mod package;
pub mod sim;
pub mod text;
pub mod types;

pub use builder::{Arg, ConvParams, FunctionBuilder, Pad};
pub use dtype::DType;
pub use error::{MilError, Result};
pub use ir::{
    Argument, Binding, Dialect, Function, Operation, Opset, Program, StoredWeight, ValueDef,
    ValueId, ValueInfo,
};
pub use lint::{LintConfig, LintFinding, Severity};
pub use literal::{BlobSource, Elements, Literal, WeightData};
pub use types::{TensorType, ValueType};

/// Parses MIL text and prints it again in canonical form (same dialect, 4-space indentation,
/// `param = ref` spacing, sorted attributes). `BLOBFILE` references are kept as written.
pub fn print_text(src: &str) -> Result<String> {
    let program = text::parse_program(src)?;
    text::print_program(&program, &blob::BlobLayout::default())
}

/// Parses MIL text and lints it. A text that does not parse or type-check is an `Err` with its
/// line and column; otherwise every lint finding is returned (possibly none).
pub fn check_text(src: &str) -> Result<Vec<LintFinding>> {
    let program = text::parse_program(src)?;
    Ok(lint::lint(&program))
}
