//! Programs shared by the integration tests: the canonical minimal examples of FACTS §1.6.
#![allow(dead_code, unused_imports)] // each test binary uses a subset

use anelm_mil::blob::BlobPolicy;
use anelm_mil::package::read_package;
use anelm_mil::text::to_artifacts;
use anelm_mil::{DType, Dialect, FunctionBuilder, Opset, Program, Result, TensorType, WeightData};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Deterministic small weights (multiples of 1/16 in [-0.375, 0.375], exact in fp16).
pub fn weights(n: usize, seed: usize) -> Arc<WeightData> {
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 7 + seed * 3) % 13) as f32 - 6.0) / 16.0)
        .collect();
    Arc::new(WeightData::f16_from_f32(&v))
}

pub fn dialect_opset(d: &Dialect) -> Opset {
    d.proven_opset()
}

fn program(dialect: Dialect, f: FunctionBuilder) -> Result<Program> {
    let mut p = Program::new(dialect);
    p.add_function(f.finish()?)?;
    Ok(p)
}

/// `y = conv1x1(x, w)`: x fp16 [1, 64, 1, 64], w [128, 64, 1, 1].
pub fn conv1x1(dialect: Dialect) -> Result<Program> {
    let mut f = FunctionBuilder::new("main", dialect.proven_opset());
    let x = f.input("x", TensorType::fp16([1, 64, 1, 64]))?;
    let w = f.weight("w", TensorType::fp16([128, 64, 1, 1]), weights(128 * 64, 1))?;
    let y = f.name_next("y").conv1x1(x, w)?;
    f.output(y)?;
    program(dialect, f)
}

/// Fused SwiGLU FFN: conv → sigmoid → mul → mul → conv (DESIGN, projection kernels).
pub fn swiglu_ffn(dialect: Dialect, dim: usize, hidden: usize, width: usize) -> Result<Program> {
    let mut f = FunctionBuilder::new("main", dialect.proven_opset());
    swiglu_body(&mut f, dim, hidden, width, None)?;
    program(dialect, f)
}

/// The FFN body into `f`; `shared` weights (gate, up, down) are reused when given.
pub fn swiglu_body(
    f: &mut FunctionBuilder,
    dim: usize,
    hidden: usize,
    width: usize,
    shared: Option<[Arc<WeightData>; 3]>,
) -> Result<()> {
    let [wg, wu, wd] = shared.unwrap_or_else(|| {
        [
            weights(hidden * dim, 2),
            weights(hidden * dim, 3),
            weights(dim * hidden, 4),
        ]
    });
    let x = f.input("x", TensorType::fp16([1, dim, 1, width]))?;
    let w1 = f.weight("w_gate", TensorType::fp16([hidden, dim, 1, 1]), wg)?;
    let w3 = f.weight("w_up", TensorType::fp16([hidden, dim, 1, 1]), wu)?;
    let w2 = f.weight("w_down", TensorType::fp16([dim, hidden, 1, 1]), wd)?;
    let h1 = f.name_next("h1").conv1x1(x, w1)?;
    let h3 = f.name_next("h3").conv1x1(x, w3)?;
    let sig = f.name_next("sig").sigmoid(h1)?;
    let silu = f.name_next("silu").mul(h1, sig)?;
    let gate = f.name_next("gate").mul(silu, h3)?;
    let y = f.name_next("y").conv1x1(gate, w2)?;
    f.output(y)
}

/// Two-input add with fp32 I/O and in-graph casts.
pub fn add_fp32_io(dialect: Dialect) -> Result<Program> {
    let mut f = FunctionBuilder::new("main", dialect.proven_opset());
    let a = f.input("a", TensorType::fp32([1, 64, 1, 64]))?;
    let b = f.input("b", TensorType::fp32([1, 64, 1, 64]))?;
    let a16 = f.name_next("a16").cast(a, DType::Fp16)?;
    let b16 = f.name_next("b16").cast(b, DType::Fp16)?;
    let s = f.name_next("sum16").add(a16, b16)?;
    let y = f.name_next("y").cast(s, DType::Fp32)?;
    f.output(y)?;
    program(dialect, f)
}

/// `<crate>/tests/golden/<name>`.
pub fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
        .join(name)
}

pub use anelm_testkit::{python, shared_dir, validate_mlpackage as validate, workspace_root};

/// Validates and checks the report: ok, no errors, and the expected spec version.
pub fn assert_valid(pkg: &Path, spec: i64) -> serde_json::Value {
    let (code, report) = validate(pkg);
    assert_eq!(
        code,
        0,
        "{} rejected: {:#}",
        pkg.display(),
        report["errors"]
    );
    assert_eq!(report["ok"], true);
    assert_eq!(
        report["warnings"],
        serde_json::json!([]),
        "{}",
        pkg.display()
    );
    assert_eq!(
        report["summary"]["specificationVersion"], spec,
        "{report:#}"
    );
    report
}

/// The package reads back into the same program (same text with the same weights).
pub fn assert_round_trip(p: &Program, pkg: &Path) {
    let back = read_package(pkg).unwrap();
    let policy = BlobPolicy::default();
    assert_eq!(
        to_artifacts(&back, &policy).unwrap().text,
        to_artifacts(p, &policy).unwrap().text
    );
    let w = |q: &Program| {
        q.weights()
            .into_iter()
            .map(|w| w.as_ref().clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(w(&back), w(p));
}

pub mod quant;
