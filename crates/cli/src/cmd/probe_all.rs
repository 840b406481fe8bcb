//! `anelm probe --all`: the probe suite ([`anelm_ane::probe`]) on a device, in each dialect —
//! the open hardware questions and one case per op form the lowering emits for `--model` —
//! as one JSON report; what failed is remembered for this machine (`$ANELM_PROGRAMS/probe.json`)
//! so that `--mil-dialect auto` and the lowering's alternatives follow the hardware's answers.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anelm_ane::device::{CoreMlDevice, PrivateAneDevice};
use anelm_ane::dialect::{probe_path, MilDialect, ProbeMemory, Verdict as DialectVerdict};
use anelm_ane::lower::fused::{build_chunk, fused_plan, KvForm};
use anelm_ane::lower::{build_unit, projection_kernels};
use anelm_ane::probe::{self, questions, CaseReport, Verdict};
use anelm_ane::{CompileUnit, Device, LoweringOptions, SimDevice};
use anelm_model::Model;
use anyhow::{bail, Context, Result};
use serde_json::json;

use super::common::{machine_key_for, Device as DeviceArg, Driver};
use crate::models;

/// `--mil-dialect` of `probe --all`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialects {
    A,
    B,
    /// Both, A first.
    All,
}

/// What `probe --all` takes.
pub struct Options<'a> {
    pub device: DeviceArg,
    pub driver: Driver,
    pub dialects: Dialects,
    pub model: Option<&'a str>,
    pub json: bool,
    pub out: Option<PathBuf>,
}

/// The programs the lowering emits for `model` in `dialect`, both strategies (the fused chunks
/// with the KV cache as inputs: the census of state ops is the question case's).
fn lowered(model: &Model, dialect: MilDialect) -> Result<Vec<CompileUnit>> {
    let opts = LoweringOptions {
        dialect,
        ..LoweringOptions::default()
    };
    let mut units = Vec::new();
    for spec in projection_kernels(model, &opts)? {
        units.push(build_unit(model, &spec, &opts)?.unit);
    }
    let plan = fused_plan(model, &opts)?;
    for i in 0..plan.chunks.len() {
        units.push(build_chunk(model, &plan, i, KvForm::Inputs)?);
    }
    Ok(units)
}

fn run_all<D: Device>(
    device: &mut D,
    dialect: MilDialect,
    model: &Model,
    reports: &mut Vec<CaseReport>,
) -> Result<()> {
    let (cases, skipped) = questions::cases(dialect)?;
    reports.extend(skipped);
    let units = models::with_spinner(&format!("lowering the census (dialect {dialect})"), || {
        lowered(model, dialect)
    })?;
    let (census, cant) = probe::census_cases(&units, dialect);
    drop(units);
    reports.extend(cant);
    let all: Vec<_> = cases.iter().chain(&census).collect();
    let n = all.len();
    // A line that counts on a terminal; quiet in logs (a compile can take minutes: it shows
    // which case is compiling).
    let tty = std::io::stderr().is_terminal();
    for (i, case) in all.into_iter().enumerate() {
        if tty {
            eprint!("\r\x1b[2K[{}/{n}] dialect {dialect}: {}", i + 1, case.name);
        }
        reports.push(probe::run(device, case, dialect));
    }
    if tty {
        eprint!("\r\x1b[2K");
    }
    Ok(())
}

/// Runs the suite; the report goes to stdout (and `--out`).
pub fn run(o: Options) -> Result<()> {
    let t = Instant::now();
    let path = models::resolve(o.model)?;
    let loaded = models::with_spinner(&format!("loading {}", path.display()), || {
        anelm_engine::LoadedModel::load(&path)
    })?;
    let dialects: Vec<MilDialect> = match o.dialects {
        Dialects::A => vec![MilDialect::A],
        Dialects::B => vec![MilDialect::B],
        Dialects::All => MilDialect::ALL.to_vec(),
    };
    let mut reports = Vec::new();
    let device_name = match (o.device, o.driver) {
        (DeviceArg::Sim, _) => "sim",
        (DeviceArg::Ane, Driver::Private) => "ane-private",
        (DeviceArg::Ane, Driver::Coreml) => "ane-coreml",
        (DeviceArg::Cpu, _) => bail!("probe --all runs programs on --device ane or sim, not cpu"),
    };
    for &d in &dialects {
        let m = &loaded.model;
        match (o.device, o.driver) {
            (DeviceArg::Ane, Driver::Private) => {
                let mut dev = PrivateAneDevice::open(anelm_macos::LoadOptions::default())
                    .context("anelm probe --all --driver private")?;
                run_all(&mut dev, d, m, &mut reports)?
            }
            (DeviceArg::Ane, Driver::Coreml) => {
                let mut dev = CoreMlDevice::open().context("anelm probe --all --driver coreml")?;
                run_all(&mut dev, d, m, &mut reports)?
            }
            _ => {
                let mut dev = SimDevice::from_env().map_err(anyhow::Error::msg)?;
                run_all(&mut dev, d, m, &mut reports)?
            }
        }
    }
    // Remember this machine's answers.
    let key = machine_key_for(o.device);
    let memory_path = probe_path(&models::programs_dir());
    let mut remembered = None;
    if let Some(key) = &key {
        let mut memory = ProbeMemory::load(&memory_path).map_err(anyhow::Error::msg)?;
        for &d in &dialects {
            let of: Vec<CaseReport> = reports.iter().filter(|r| r.dialect == d).cloned().collect();
            // A dialect is accepted when its simplest program (one conv at W=1) passes.
            let basic = of.iter().find(|r| r.name == "io.width1");
            let verdict = match basic.map(|r| &r.verdict) {
                Some(Verdict::Pass { .. }) => Some(DialectVerdict::Accepted),
                Some(Verdict::Fail { .. }) => Some(DialectVerdict::Rejected),
                _ => None,
            };
            if let Some(v) = verdict {
                memory.record(key, d, v);
            }
            memory.set_forms(key, d, probe::form_verdicts(&of));
        }
        memory.save(&memory_path).map_err(anyhow::Error::msg)?;
        remembered = Some(memory_path.clone());
    }
    let count = |v: &str| reports.iter().filter(|r| r.verdict.name() == v).count();
    let (pass, fail, skip) = (count("pass"), count("fail"), count("skip"));
    let report = json!({
        "device": device_name,
        "model": path,
        "machine": key,
        "dialects": dialects.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "pass": pass,
        "fail": fail,
        "skip": skip,
        "tolerance": probe::TOLERANCE,
        "failed_ops": dialects.iter().map(|&d| {
            let of: Vec<CaseReport> = reports.iter().filter(|r| r.dialect == d).cloned().collect();
            (d.name().to_string(), json!(probe::failed_ops(&of)))
        }).collect::<serde_json::Map<_, _>>(),
        "remembered_in": remembered,
        "seconds": t.elapsed().as_secs_f64(),
        "cases": reports.iter().map(CaseReport::to_json).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(out) = &o.out {
        std::fs::write(out, format!("{text}\n"))
            .with_context(|| format!("{}: cannot write", out.display()))?;
    }
    if o.json {
        println!("{text}");
    } else {
        for r in &reports {
            let detail = match &r.verdict {
                Verdict::Pass { rel_err } => format!("rel err {rel_err:.1e}"),
                Verdict::Fail { stage, reason, .. } => format!("{stage}: {reason}"),
                Verdict::Skip { reason } => reason.clone(),
            };
            println!(
                "{:4} {} {:<28} {detail}",
                r.verdict.name().to_uppercase(),
                r.dialect,
                r.name
            );
        }
        println!(
            "{pass} passed, {fail} failed, {skip} skipped on {device_name} ({:.1} s){}",
            t.elapsed().as_secs_f64(),
            remembered.as_ref().map_or(String::new(), |p| format!(
                "; remembered in {}",
                p.display()
            ))
        );
    }
    Ok(())
}
