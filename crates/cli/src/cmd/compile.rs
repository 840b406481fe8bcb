//! `anelm compile`: lower a model and write every program. Projection strategy: per kernel a
//! directory with `model.mil` and its weight blobs (what the private ANE path compiles), or one
//! multifunction Core ML package with a function per kernel. Fused strategy: per chunk a
//! directory whose `model.mil` holds the prefill and decode functions (procedures) over one set
//! of weights, or per chunk a stateful multifunction package (the KV cache as Core ML states;
//! in dialect B, which has neither, one package per kernel or per chunk function).

use std::path::{Path, PathBuf};

use anelm_ane::lower::encode::summary;
use anelm_ane::lower::fused::{build_chunk, fused_plan, KvForm};
use anelm_ane::lower::{build_unit, projection_kernels};
use anelm_ane::unit::coreml_packages;
use anelm_ane::{CompileUnit, LoweringOptions};
use anelm_mil::blob::BlobPolicy;
use anelm_mil::lint::{lint_with, Chip, LintConfig, Severity};
use anelm_mil::package::{write_package, PackageOptions};
use anelm_mil::Program;
use anelm_model::Model;
use anyhow::{Context, Result};

use super::common::ModelArgs;

/// How the ANE path lowers a model.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Per layer a QKV, an O and an FFN kernel; norms, RoPE and attention on the CPU.
    Projection,
    /// Whole layers per program (chunks), the KV cache resident on the device.
    Fused,
}

impl From<Strategy> for anelm_ane::Strategy {
    fn from(s: Strategy) -> Self {
        match s {
            Strategy::Projection => anelm_ane::Strategy::Projection,
            Strategy::Fused => anelm_ane::Strategy::Fused,
        }
    }
}

/// The model compiled for the simulator under `strategy` (what `--device sim` runs).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `OUT/<program>/model.mil` + `weights/*.bin`, one directory per program.
    Mil,
    /// Core ML packages: `OUT/<model>.mlpackage` (projection), `OUT/<model>_<chunk>.mlpackage`
    /// (fused); in dialect B `OUT/<model>_<kernel>.mlpackage` and
    /// `OUT/<model>_<chunk>_{prefill,decode}.mlpackage`.
    Mlpackage,
}

#[derive(clap::Args)]
#[command(
    about = "Lower a model to ANE programs and write them (MIL text + weight blobs, or Core ML packages)"
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The directory to write into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Mil)]
    pub format: Format,
    /// Columns (tokens) of every activation (the prefill width of fused chunks).
    #[arg(long, default_value_t = 64)]
    pub width: usize,
    /// Fused strategy: KV-cache positions every chunk holds.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Print the weights' report as JSON (every tensor: its encoding, bytes and error) after the
    /// table.
    #[arg(long)]
    pub json: bool,
}

/// Prints one program's line and its lint warnings; returns the warnings. (Padded I/O rows are
/// not one: every binding marshals with the row stride the device gives.)
fn report(unit: &CompileUnit, layers: Option<usize>, what: &str) -> usize {
    // Rules the sources settle by chip follow this machine's (the conservative reading off a Mac).
    let chip = anelm_macos::machine_info()
        .ok()
        .and_then(|m| m.chip)
        .map_or(Chip::Unknown, |b| Chip::from_brand(&b));
    let cfg = LintConfig {
        layers,
        ..LintConfig::for_chip(chip)
    };
    let findings: Vec<_> = lint_with(&unit.program, &cfg)
        .into_iter()
        .filter(|f| f.severity >= Severity::Warning && f.rule != "io-row-padding")
        .collect();
    for f in &findings {
        eprintln!("{}: {f}", unit.name);
    }
    println!(
        "{:<14} {:<24} {:>10.2}  {}",
        unit.name,
        what,
        unit.weight_bytes() as f64 / 1e6,
        &unit.cache_key()[..16]
    );
    findings.len()
}

fn stem(m: &Model) -> String {
    m.source
        .path()
        .file_stem()
        .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
}

fn write(program: &Program, path: &Path) -> Result<()> {
    crate::models::with_spinner(&format!("writing {}", path.display()), || {
        write_package(
            program,
            path,
            &PackageOptions::default(),
            &BlobPolicy::default(),
        )
    })?;
    println!("wrote {}", path.display());
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.model.load()?;
    let m = &loaded.model;
    let opts = a.model.lowering(LoweringOptions {
        width: a.width,
        context: a.context,
        ..LoweringOptions::default()
    })?;
    // Dialect B (ios16, spec 7) has no multifunction packages and no states (COREML.md §7-8):
    // one package per kernel / per chunk function, the KV cache as inputs and outputs.
    let multifunction = opts.dialect.has_states_and_multifunction();
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("{}: cannot create", a.out.display()))?;
    let (mut total, mut warnings) = (0u64, 0usize);
    let mut reports = Vec::new();
    println!(
        "{:<14} {:<24} {:>10}  cache key",
        "program", "computes", "weights MB"
    );
    match a.model.strategy {
        Strategy::Projection => {
            let mut package = Program::new(opts.dialect.mil());
            let specs = projection_kernels(m, &opts)?;
            let n = specs.len();
            for spec in specs {
                let unit = build_unit(m, &spec, &opts)?.unit;
                let outputs: usize = spec.outputs.iter().map(|p| p.channels).sum();
                warnings += report(
                    &unit,
                    None,
                    &format!("{} -> {outputs}", spec.input.channels),
                );
                total += unit.weight_bytes();
                reports.extend(unit.weight_reports.iter().cloned());
                match a.format {
                    Format::Mil => unit.write_mil_dir(&a.out.join(&spec.name))?,
                    Format::Mlpackage if !multifunction => write(
                        &unit.program,
                        &a.out.join(format!("{}_{}.mlpackage", stem(m), spec.name)),
                    )?,
                    Format::Mlpackage => {
                        let mut f = unit
                            .program
                            .functions
                            .into_iter()
                            .next()
                            .context("a lowered program has a function")?;
                        f.name = spec.name.clone();
                        package.add_function(f)?;
                    }
                }
            }
            if a.format == Format::Mlpackage && multifunction {
                write(&package, &a.out.join(format!("{}.mlpackage", stem(m))))?;
            }
            println!("{n} kernels: {n} dispatches per token");
        }
        Strategy::Fused => {
            let plan = fused_plan(m, &opts)?;
            let form = if a.format == Format::Mil || !multifunction {
                KvForm::Inputs
            } else {
                KvForm::States
            };
            for (i, spec) in plan.chunks.iter().enumerate() {
                let unit = build_chunk(m, &plan, i, form)?;
                let what = spec.describe();
                warnings += report(&unit, Some(spec.layers.len()), &what);
                total += unit.weight_bytes();
                reports.extend(unit.weight_reports.iter().cloned());
                match a.format {
                    Format::Mil => unit.write_mil_dir(&a.out.join(&spec.name))?,
                    Format::Mlpackage => {
                        for (function, program) in coreml_packages(&unit.program) {
                            let suffix = function.map_or(String::new(), |f| format!("_{f}"));
                            let file = format!("{}_{}{suffix}.mlpackage", stem(m), spec.name);
                            write(&program, &a.out.join(file))?;
                        }
                    }
                }
            }
            println!(
                "{} chunks (at most {} layers and {:.1} GB each): {} dispatches per token; context {}, prefill width {}",
                plan.chunks.len(),
                opts.chunk_layers,
                opts.chunk_bytes as f64 / 1e9,
                plan.dispatches_per_token(),
                plan.context,
                plan.width
            );
        }
    }
    print!(
        "\nweights (--weights {}):\n{}",
        opts.weights,
        summary::table(&reports)
    );
    let t = summary::totals(&reports);
    if a.json {
        let tensors: Vec<_> = reports
            .iter()
            .map(|r| serde_json::json!({"name": r.name, "file_type": r.source, "encoding": r.encoding, "weights": r.weights, "bytes": r.bytes, "exact": r.exact, "max_abs_err": r.max_abs_err, "max_abs": r.max_abs, "kept_fp16": r.kept_fp16}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"policy": opts.weights.to_string(), "weight_bytes": t.bytes, "fp16_bytes": t.fp16_bytes, "ratio_to_fp16": t.ratio(), "weight_file_bytes": total, "tensors": tensors})
        );
    }
    println!(
        "{:.1} MB of weight files ({:.1} MB of matrices, {:.3}x their fp16 {:.1} MB; read once per decoded token); {warnings} lint warnings",
        total as f64 / 1e6,
        t.bytes as f64 / 1e6,
        t.ratio(),
        t.fp16_bytes as f64 / 1e6
    );
    Ok(())
}
