//! `anelm check`: every program of the ANE path run on the simulator and compared with the CPU
//! computing the same thing in f32 on the same weights — once with a prompt (prefill), once with
//! the next token (decode). Projection kernels get the very same input; fused chunks run on the
//! device path's own input and are compared at the layer they end with (the last, by logits).

use std::collections::BTreeMap;

use anelm_ane::check::{check_chunks, check_kernels, KernelCheck};
use anelm_ane::{LoweringOptions, SimDevice};
use anelm_engine::LoadedModel;
use anyhow::{bail, Result};
use serde_json::json;

use super::common::{tokenizer, Device, ModelArgs, PromptArgs};
use super::compile::Strategy;

#[derive(clap::Args)]
#[command(
    about = "Run each ANE kernel on the simulator and compare it with the CPU (f32) on the same weights and inputs"
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Largest relative error accepted (max |diff| over the CPU's largest |value|); default
    /// 5e-3 for projection kernels, 2e-2 for fused chunks (their errors add up over layers).
    #[arg(long)]
    pub tolerance: Option<f32>,
    /// Columns (tokens) of every kernel's activations.
    #[arg(long, default_value_t = 64)]
    pub width: usize,
    #[arg(long)]
    pub json: bool,
}

/// The prompt of the ANE diagnostics: `--prompt`/`--ids`, else a short sentence (or, without a
/// tokenizer, the ids 1..=8).
pub fn prompt_or_default(p: &PromptArgs, loaded: &LoadedModel) -> Result<Vec<u32>> {
    if p.prompt.is_some() || p.ids.is_some() {
        return p.ids(loaded);
    }
    let vocab = loaded.model.config.vocab_size as u32;
    match tokenizer(loaded) {
        Ok(t) => Ok(t.encode("The capital of France is", true, true)?),
        Err(_) => Ok((1..=8).map(|i| i % vocab).collect()),
    }
}

/// The simulator for the diagnostics (`--device cpu`, the default, also means the simulator:
/// the point is the device path).
pub fn diagnostic_device(d: Device) -> Result<SimDevice> {
    match d {
        Device::Cpu | Device::Sim => Ok(SimDevice::new()),
        Device::Ane => {
            bail!("--device ane: the ANE drivers are not wired into the diagnostics yet")
        }
    }
}

/// Per kernel, the worst of its evaluations.
fn worst_per_kernel(checks: &[KernelCheck]) -> Vec<&KernelCheck> {
    let mut worst: BTreeMap<&str, &KernelCheck> = BTreeMap::new();
    for c in checks {
        let e = worst.entry(&c.kernel).or_insert(c);
        if c.rel_err > e.rel_err {
            *e = c;
        }
    }
    let mut v: Vec<_> = worst.into_values().collect();
    v.sort_by_key(|c| checks.iter().position(|d| d.kernel == c.kernel));
    v
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.model.load()?;
    let prompt = prompt_or_default(&a.prompt, &loaded)?;
    let opts = a.model.lowering(LoweringOptions {
        width: a.width,
        dialect: a.model.dialect(),
        ..LoweringOptions::default()
    })?;
    let checks =
        crate::models::with_spinner("compiling and checking every program", || -> Result<_> {
            let device = diagnostic_device(a.model.device)?;
            Ok(match a.model.strategy {
                Strategy::Projection => check_kernels(&loaded.model, device, &opts, &prompt)?,
                Strategy::Fused => {
                    let opts = LoweringOptions {
                        context: (prompt.len() + 1).next_multiple_of(64),
                        ..opts
                    };
                    check_chunks(&loaded.model, device, &opts, &prompt)?
                }
            })
        })?;
    let rows = worst_per_kernel(&checks);
    let worst = rows.iter().map(|c| c.rel_err).fold(0f32, f32::max);
    let tolerance = a.tolerance.unwrap_or(match a.model.strategy {
        Strategy::Projection => 5e-3,
        Strategy::Fused => 2e-2,
    });
    let pass = worst <= tolerance;
    if a.json {
        let kernels: Vec<_> = checks.iter().map(|c| json!({"kernel": c.kernel, "tokens": c.tokens, "max_abs_diff": c.max_abs_diff, "rel_err": c.rel_err})).collect();
        println!(
            "{}",
            json!({"kernels": kernels, "max_rel_err": worst, "tolerance": tolerance, "pass": pass})
        );
    } else {
        println!(
            "{:<14} {:>6} {:>12} {:>10}",
            "kernel", "tokens", "max |diff|", "rel err"
        );
        for c in &rows {
            println!(
                "{:<14} {:>6} {:>12.5} {:>10.2e}",
                c.kernel, c.tokens, c.max_abs_diff, c.rel_err
            );
        }
        println!(
            "worst relative error {worst:.2e} (tolerance {:.0e}): {}",
            tolerance,
            if pass { "ok" } else { "FAILED" }
        );
    }
    if !pass {
        bail!(
            "a kernel is off by {worst:.2e} relative, more than {:.0e}",
            tolerance
        );
    }
    Ok(())
}
