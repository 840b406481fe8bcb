//! The probe cases for the open hardware questions (FACTS §8), one small program each: binding
//! order with several inputs and outputs of unequal surface sizes, fp32 I/O, a single column,
//! two functions sharing one weight at widths 64 and 1, and a state read and written in place.

use std::collections::HashMap;
use std::sync::Arc;

use anelm_mil::{DType, FunctionBuilder, Program, TensorType, WeightData};

use super::{Case, CaseReport, Verdict};
use crate::dialect::MilDialect;
use crate::error::Result;
use crate::unit::CompileUnit;

fn weight(rows: usize, cols: usize, seed: usize) -> Arc<WeightData> {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7 + seed * 13) % 23) as f32 / 23.0 - 0.5)
        .collect();
    Arc::new(WeightData::f16_from_f32(&v))
}

fn case(name: &str, question: &str, unit: CompileUnit) -> Case {
    Case {
        name: name.into(),
        question: question.into(),
        form: None,
        op_type: None,
        unit,
        integer_inputs: HashMap::new(),
        positive: false,
    }
}

fn program(dialect: MilDialect, functions: Vec<anelm_mil::Function>) -> Result<Program> {
    let mut p = Program::new(dialect.mil());
    for f in functions {
        p.add_function(f)?;
    }
    Ok(p)
}

/// Three inputs of 64, 32 and 1 channels; two outputs of 48 and 32 channels, each a different
/// function of the inputs, so a swapped binding or a wrong surface size shows in the numbers.
fn several(d: MilDialect) -> Result<Case> {
    let mut f = FunctionBuilder::new("main", d.opset());
    let x = f.input("x", TensorType::fp16([1, 64, 1, 64]))?;
    let y = f.input("y", TensorType::fp16([1, 32, 1, 64]))?;
    let s = f.input("s", TensorType::fp16([1, 1, 1, 64]))?;
    let w = f.weight("w", TensorType::fp16([48, 64, 1, 1]), weight(48, 64, 1))?;
    let c = f.conv1x1(x, w)?;
    let a = f.name_next("a").mul(c, s)?;
    let ys = f.binary_scalar("mul", y, 0.5)?;
    let b = f.name_next("b").add(ys, s)?;
    f.output(a)?;
    f.output(b)?;
    let unit = CompileUnit::new("probe_io_several", program(d, vec![f.finish()?])?)?;
    Ok(case(
        "io.several",
        "are several inputs and outputs of unequal surface sizes bound in declaration order",
        unit,
    ))
}

/// fp32 input and output, cast to and from fp16 inside.
fn fp32(d: MilDialect) -> Result<Case> {
    let mut f = FunctionBuilder::new("main", d.opset());
    let x = f.input("x", TensorType::new(DType::Fp32, [1, 16, 1, 64]))?;
    let h = f.cast(x, DType::Fp16)?;
    let w = f.weight("w", TensorType::fp16([16, 16, 1, 1]), weight(16, 16, 2))?;
    let c = f.conv1x1(h, w)?;
    let y = f.name_next("y").cast(c, DType::Fp32)?;
    f.output(y)?;
    let unit = CompileUnit::new("probe_io_fp32", program(d, vec![f.finish()?])?)?;
    Ok(case(
        "io.fp32",
        "does the device take fp32 inputs and outputs",
        unit,
    ))
}

/// One column (the decode shape), alone.
fn width1(d: MilDialect) -> Result<Case> {
    let mut f = FunctionBuilder::new("main", d.opset());
    let x = f.input("x", TensorType::fp16([1, 64, 1, 1]))?;
    let w = f.weight("w", TensorType::fp16([64, 64, 1, 1]), weight(64, 64, 3))?;
    let y = f.name_next("y").conv1x1(x, w)?;
    f.output(y)?;
    let unit = CompileUnit::new("probe_io_width1", program(d, vec![f.finish()?])?)?;
    Ok(case(
        "io.width1",
        "does a program of one column (W=1) run and bind its 64-byte-padded rows",
        unit,
    ))
}

/// Functions `prefill` (W=64) and `decode` (W=1) over one weight blob.
fn shared(d: MilDialect) -> Result<Case> {
    let w = weight(64, 64, 4);
    let mut fs = Vec::new();
    for (name, width) in [("prefill", 64), ("decode", 1)] {
        let mut f = FunctionBuilder::new(name, d.opset());
        let x = f.input("x", TensorType::fp16([1, 64, 1, width]))?;
        let wv = f.weight("w", TensorType::fp16([64, 64, 1, 1]), w.clone())?;
        let y = f.name_next("y").conv1x1(x, wv)?;
        let y = f.name_next("z").sigmoid(y)?;
        f.output(y)?;
        fs.push(f.finish()?);
    }
    let unit = CompileUnit::new("probe_functions_shared", program(d, fs)?)?;
    Ok(case(
        "functions.shared_weights",
        "do two functions of one program (W=64 and W=1) share a weight and both run",
        unit,
    ))
}

const STATE_QUESTION: &str =
    "is a state read, updated and written in place (the fused chunks' KV cache)";

/// A state read, added to and written back (Core ML states, iOS18).
fn state(d: MilDialect) -> Result<Case> {
    let mut f = FunctionBuilder::new("main", d.opset());
    let x = f.input("x", TensorType::fp16([1, 32, 1, 8]))?;
    let s = f.state_input("kv", TensorType::fp16([1, 32, 1, 8]))?;
    let r = f.read_state(s)?;
    let n = f.add(r, x)?;
    let u = f.update_state(s, n)?;
    let y = f.name_next("y").binary_scalar("mul", u, 2.0)?;
    f.output(y)?;
    let unit = CompileUnit::new("probe_state", program(d, vec![f.finish()?])?)?;
    Ok(case("state.update", STATE_QUESTION, unit))
}

/// The question cases of `dialect`, and the reports of the ones it cannot have (skipped).
pub fn cases(d: MilDialect) -> Result<(Vec<Case>, Vec<CaseReport>)> {
    let mut cases = vec![several(d)?, fp32(d)?, width1(d)?, shared(d)?];
    let mut skipped = Vec::new();
    if d.has_states_and_multifunction() {
        cases.push(state(d)?);
    } else {
        skipped.push(CaseReport {
            name: "state.update".into(),
            question: STATE_QUESTION.into(),
            dialect: d,
            form: None,
            op_type: None,
            verdict: Verdict::Skip {
                reason: format!("dialect {d} (ios16) has no states"),
            },
            seconds: 0.0,
        });
    }
    Ok((cases, skipped))
}
