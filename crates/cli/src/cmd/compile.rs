//! `anelm compile`: lower a model and write every program of the projection strategy — per
//! kernel a directory with `model.mil` and its weight blobs (what the private ANE path compiles),
//! or one multifunction Core ML package with a function per kernel.

use std::path::PathBuf;

use anelm_ane::lower::{build_unit, projection_kernels};
use anelm_ane::LoweringOptions;
use anelm_mil::blob::BlobPolicy;
use anelm_mil::lint::{lint, Severity};
use anelm_mil::package::{write_package, PackageOptions};
use anelm_mil::{Dialect, Program};
use anyhow::{Context, Result};

use super::common::ModelArgs;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `OUT/<kernel>/model.mil` + `weights/*.bin`, one directory per kernel.
    Mil,
    /// `OUT/<model>.mlpackage`, one function per kernel.
    Mlpackage,
}

#[derive(clap::Args)]
#[command(
    about = "Lower a model to ANE programs and write them (MIL text + weight blobs, or a Core ML package)"
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The directory to write into (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Mil)]
    pub format: Format,
    /// Columns (tokens) of every kernel's activations.
    #[arg(long, default_value_t = 64)]
    pub width: usize,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.model.load()?;
    let m = &loaded.model;
    let opts = LoweringOptions {
        width: a.width,
        ..LoweringOptions::default()
    };
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("{}: cannot create", a.out.display()))?;
    let mut package = Program::new(Dialect::a());
    let (mut total, mut warnings) = (0u64, 0usize);
    println!(
        "{:<14} {:>7} {:>9} {:>10}  cache key",
        "kernel", "inputs", "outputs", "weights MB"
    );
    for spec in projection_kernels(m, &opts) {
        let lowered = build_unit(m, &spec, &opts)?;
        let unit = lowered.unit;
        let findings = lint(&unit.program);
        for f in findings.iter().filter(|f| f.severity >= Severity::Warning) {
            eprintln!("{}: {f}", spec.name);
            warnings += 1;
        }
        let outputs: usize = spec.outputs.iter().map(|p| p.channels).sum();
        println!(
            "{:<14} {:>7} {:>9} {:>10.2}  {}",
            spec.name,
            spec.input.channels,
            outputs,
            unit.weight_bytes() as f64 / 1e6,
            &unit.cache_key()[..16]
        );
        total += unit.weight_bytes();
        match a.format {
            Format::Mil => unit.write_mil_dir(&a.out.join(&spec.name))?,
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
    if a.format == Format::Mlpackage {
        let stem = m
            .source
            .path()
            .file_stem()
            .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned());
        let path = a.out.join(format!("{stem}.mlpackage"));
        crate::models::with_spinner(&format!("writing {}", path.display()), || {
            write_package(
                &package,
                &path,
                &PackageOptions::default(),
                &BlobPolicy::default(),
            )
        })?;
        println!("wrote {}", path.display());
    }
    println!(
        "{:.1} MB of fp16 weights, width {}; {warnings} lint warnings",
        total as f64 / 1e6,
        opts.width
    );
    Ok(())
}
