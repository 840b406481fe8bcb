//! `probe --all`: tiny programs, each run on a device and on the simulator with the same inputs.
//! They settle what is still open about the hardware (FACTS §8) and whether each op form the
//! lowering emits compiles and computes there — the census cases come from the lowering itself.
//!
//! Every case ends as a [`Verdict`]: passed (with its error against the simulator), failed (the
//! stage and the device's reason, and the files it saved) or skipped (why). What failed is
//! remembered per machine ([`crate::dialect::ProbeMemory`]) and the lowering takes its
//! alternatives for those ops ([`crate::lower::Alternatives`]).

use std::collections::HashMap;
use std::time::Instant;

use anelm_mil::census;
use serde_json::{json, Value};

use crate::device::{Device, DeviceError, SimDevice};
use crate::dialect::MilDialect;
use crate::planar::{gather, scatter};
use crate::unit::CompileUnit;

pub mod questions;

/// Largest error against the simulator, relative to the largest simulated magnitude, that
/// passes: fp16 arithmetic rounds differently in places, but a wrong binding or layout is off
/// by the values' own size.
pub const TOLERANCE: f64 = 2e-2;

/// One probe program and what it asks.
#[derive(Debug)]
pub struct Case {
    /// `io.several`, `census.abs.0`, ...
    pub name: String,
    pub question: String,
    /// The census form it checks (None for the question cases).
    pub form: Option<String>,
    /// The op type of the census form.
    pub op_type: Option<String>,
    pub unit: CompileUnit,
    /// Per function, per input: fed with small non-negative integers (the op casts it).
    pub integer_inputs: HashMap<String, Vec<bool>>,
    /// Fed with values in [0.5, 1.5) (ops defined for positive inputs only).
    pub positive: bool,
}

/// How a case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Pass {
        rel_err: f64,
    },
    Fail {
        stage: String,
        reason: String,
        files: Vec<std::path::PathBuf>,
    },
    Skip {
        reason: String,
    },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Pass { .. } => "pass",
            Verdict::Fail { .. } => "fail",
            Verdict::Skip { .. } => "skip",
        }
    }
}

/// A case's outcome.
#[derive(Clone, Debug)]
pub struct CaseReport {
    pub name: String,
    pub question: String,
    pub dialect: MilDialect,
    pub form: Option<String>,
    pub op_type: Option<String>,
    pub verdict: Verdict,
    pub seconds: f64,
}

impl CaseReport {
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "question": self.question,
            "dialect": self.dialect.name(),
            "form": self.form,
            "op_type": self.op_type,
            "result": self.verdict.name(),
            "seconds": self.seconds,
        });
        match &self.verdict {
            Verdict::Pass { rel_err } => v["rel_err"] = json!(rel_err),
            Verdict::Fail {
                stage,
                reason,
                files,
            } => {
                v["stage"] = json!(stage);
                v["reason"] = json!(reason);
                v["files"] = json!(files);
            }
            Verdict::Skip { reason } => v["reason"] = json!(reason),
        }
        v
    }
}

/// The census of `units` (every op form of every function) as cases, and the forms that cannot
/// stand alone as skipped reports.
pub fn census_cases(units: &[CompileUnit], dialect: MilDialect) -> (Vec<Case>, Vec<CaseReport>) {
    let functions: Vec<&anelm_mil::Function> =
        units.iter().flat_map(|u| &u.program.functions).collect();
    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    let mut per_op: HashMap<String, usize> = HashMap::new();
    for form in census::forms(&functions) {
        let n = per_op.entry(form.op_type.clone()).or_default();
        let name = format!("census.{}.{n}", form.op_type);
        *n += 1;
        let question = format!(
            "does {} compile and compute as the simulator does ({} use{} in the lowering)",
            form.op_type,
            form.count,
            if form.count == 1 { "" } else { "s" }
        );
        let unit_name = name.replace('.', "_");
        let built = census::extract(functions[form.function], form.op, "main")
            .map_err(|e| e.to_string())
            .and_then(|e| {
                let mut p = anelm_mil::Program::new(dialect.mil());
                p.add_function(e.function).map_err(|e| e.to_string())?;
                let unit = CompileUnit::new(&unit_name, p).map_err(|e| e.to_string())?;
                Ok((unit, e.integer_inputs))
            });
        match built {
            Ok((unit, ints)) => cases.push(Case {
                name,
                question,
                op_type: Some(form.op_type.clone()),
                positive: POSITIVE_OPS.contains(&form.op_type.as_str()),
                form: Some(form.key),
                integer_inputs: HashMap::from([("main".to_string(), ints)]),
                unit,
            }),
            Err(reason) => skipped.push(CaseReport {
                name,
                question,
                dialect,
                op_type: Some(form.op_type),
                form: Some(form.key),
                verdict: Verdict::Skip {
                    reason: format!("cannot stand alone: {reason}"),
                },
                seconds: 0.0,
            }),
        }
    }
    (cases, skipped)
}

/// How the private driver says the process has used its compiles (`anelm_macos::MacError`).
const BUDGET_EXHAUSTED: &str = "compile budget exhausted";

/// Ops whose inputs must be positive to be defined.
const POSITIVE_OPS: &[&str] = &["rsqrt", "sqrt", "log", "inverse", "real_div", "pow"];

/// Deterministic values for input `index` of `function` of case `case`.
fn input_values(case: &Case, function: &str, index: usize, n: usize) -> Vec<f32> {
    let ints = case
        .integer_inputs
        .get(function)
        .and_then(|v| v.get(index).copied())
        .unwrap_or(false);
    let mut s: u64 = case
        .name
        .bytes()
        .chain(function.bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            if ints {
                (u * 2.0).floor()
            } else if case.positive {
                0.5 + u
            } else {
                2.0 * u - 1.0
            }
        })
        .collect()
}

/// Per function (by name), its outputs.
type Outputs = Vec<(String, Vec<Vec<f32>>)>;

/// Every function's outputs on `device` for the case's inputs.
fn outputs_on<D: Device>(device: &mut D, case: &Case) -> Result<Outputs, DeviceError> {
    let kernel = device.compile(&case.unit)?;
    let mut out = Vec::new();
    for f in &case.unit.program.functions {
        let io = device
            .io(&kernel, &f.name)
            .ok_or_else(|| {
                DeviceError::new(
                    device.name(),
                    crate::device::Stage::Bind,
                    &case.unit.name,
                    format!("no function {}", f.name),
                )
            })?
            .clone();
        let mut binding = device.bind(&kernel, &f.name)?;
        let width = io.inputs.iter().map(|l| l.width).max().unwrap_or(1);
        for (i, l) in io.inputs.iter().enumerate() {
            let v = input_values(case, &f.name, i, l.channels * l.width);
            // Token-major rows for scatter.
            let mut rows = vec![0f32; v.len()];
            for c in 0..l.channels {
                for t in 0..l.width {
                    rows[t * l.channels + c] = v[c * l.width + t];
                }
            }
            let ones = vec![1f32; l.width];
            device.write_input(&mut binding, i, |b| {
                b.fill(0);
                scatter(l, &rows, l.width, &ones, b)
            });
        }
        device.evaluate(&kernel, &mut binding, width)?;
        let mut outs = Vec::new();
        for (i, l) in io.outputs.iter().enumerate() {
            let mut v = vec![0f32; l.channels * l.width];
            device.read_output(&binding, i, |b| {
                gather(l, b, 0..l.width, &mut v, l.channels, 0)
            });
            outs.push(v);
        }
        out.push((f.name.clone(), outs));
    }
    Ok(out)
}

/// Largest |a - b| over the largest |b|; NaN where exactly one side is NaN.
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let mut max_d = 0f64;
    let mut max_w = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        if g.is_nan() != w.is_nan() {
            return f64::NAN;
        }
        if g.is_nan() || (g.is_infinite() && g == w) {
            continue;
        }
        max_d = max_d.max(f64::from(g - w).abs());
        max_w = max_w.max(f64::from(w).abs());
    }
    max_d / max_w.max(f64::MIN_POSITIVE)
}

/// Runs `case` on `device` and on the simulator; the verdict compares them.
pub fn run<D: Device>(device: &mut D, case: &Case, dialect: MilDialect) -> CaseReport {
    let t = Instant::now();
    let verdict = match outputs_on(&mut SimDevice::new(), case) {
        // Still asked of the device: whether it compiles and runs is half the answer.
        Err(sim) => match outputs_on(device, case) {
            Err(e) => Verdict::Fail {
                stage: e.stage.to_string(),
                reason: e.message.clone(),
                files: e.files.clone(),
            },
            Ok(_) => Verdict::Skip {
                reason: format!(
                    "ran on {}, not compared: the simulator cannot run it ({})",
                    device.name(),
                    sim.message
                ),
            },
        },
        Ok(want) => match outputs_on(device, case) {
            // Not an answer about the program: the process ran out of compiles.
            Err(e) if e.message.contains(BUDGET_EXHAUSTED) => Verdict::Skip {
                reason: format!("not asked: {}", e.message),
            },
            Err(e) => Verdict::Fail {
                stage: e.stage.to_string(),
                reason: e.message.clone(),
                files: e.files.clone(),
            },
            Ok(got) => {
                let mut worst = 0f64;
                for ((_, g), (_, w)) in got.iter().zip(&want) {
                    for (g, w) in g.iter().zip(w) {
                        let e = rel_err(g, w);
                        worst = if e.is_nan() { e } else { worst.max(e) };
                    }
                }
                if worst <= TOLERANCE {
                    Verdict::Pass { rel_err: worst }
                } else {
                    Verdict::Fail {
                        stage: "comparing".into(),
                        reason: format!(
                            "outputs differ from the simulator's by {worst:.3e} of their \
                             largest value (tolerance {TOLERANCE})"
                        ),
                        files: Vec::new(),
                    }
                }
            }
        },
    };
    CaseReport {
        name: case.name.clone(),
        question: case.question.clone(),
        dialect,
        form: case.form.clone(),
        op_type: case.op_type.clone(),
        verdict,
        seconds: t.elapsed().as_secs_f64(),
    }
}

/// Every census form the reports judged (skipped ones are not), and whether it passed: what
/// [`crate::dialect::ProbeMemory::set_forms`] remembers.
pub fn form_verdicts(reports: &[CaseReport]) -> Vec<(String, bool)> {
    reports
        .iter()
        .filter_map(|r| {
            let pass = match r.verdict {
                Verdict::Pass { .. } => true,
                Verdict::Fail { .. } => false,
                Verdict::Skip { .. } => return None,
            };
            Some((r.form.clone()?, pass))
        })
        .collect()
}

/// The op types with a failed census case: what [`crate::lower::Alternatives`] avoids.
pub fn failed_ops(reports: &[CaseReport]) -> Vec<String> {
    let mut ops: Vec<String> = reports
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Fail { .. }))
        .filter_map(|r| r.op_type.clone())
        .collect();
    ops.sort();
    ops.dedup();
    ops
}

#[cfg(test)]
mod tests;
