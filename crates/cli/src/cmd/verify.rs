//! `anelm verify`: prompts through the device path and through the CPU engine, the logits after
//! each prompt and along 16 greedy tokens compared (`--json` → `{"max_rel_err", "greedy_same",
//! "cache": {"compiled", "loaded", "units"}, "prompts"}`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anelm_ane::compare::{PromptCase, NEAR_TIE, ROUTE_NEAR_TIE};
use anelm_ane::lower::encode::summary;
use anelm_ane::verify::{verify, Reference};
use anelm_ane::LoweringOptions;
use anelm_engine::LoadedModel;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::common::{tokenizer, Device, ModelArgs, PromptArgs};

/// Prompts used when none are given (the kinds of the shared llama.cpp fixtures: a fact, code,
/// French, digits and symbols).
const DEFAULT_PROMPTS: [(&str, &str); 4] = [
    ("capital", "The capital of France is"),
    (
        "code",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    ),
    (
        "french",
        "La tour Eiffel, construite pour l'Exposition universelle de 1889, est",
    ),
    (
        "digits",
        "Order #12345678 shipped on 2024-03-15 at 09:41, total: $1,234.56",
    ),
];

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefArg {
    /// The CPU engine on the dequantised weights (f32 activations and KV cache: exact).
    CpuF32,
    /// The CPU engine as it runs the model (8-bit activations for quantised weights).
    Cpu,
}

#[derive(clap::Args)]
#[command(
    about = "Run prompts through the device path and the CPU engine and compare logits and greedy tokens"
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Prompts from a fixture file: llama.cpp's `*.prompts.json` (`prompts[].ids`) or an
    /// hf-tiny `reference.json` (`cases.*.input_ids`).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Greedy tokens decoded after each prompt (no end-of-text stop).
    #[arg(long, default_value_t = 16)]
    pub greedy: usize,
    /// What the device path is compared with.
    #[arg(long, value_enum, default_value_t = RefArg::CpuF32)]
    pub reference: RefArg,
    #[arg(long, default_value_t = 64)]
    pub width: usize,
    #[arg(long)]
    pub json: bool,
    /// Under --weights int8|int4: the largest relative logit error against the uncompressed
    /// model that the compression may cost; verify fails beyond it.
    #[arg(long, default_value_t = 0.1)]
    pub max_compression_error: f32,
    /// Accept a compression whose error exceeds --max-compression-error.
    #[arg(long)]
    pub force: bool,
}

fn ids_of(v: &Value, file: &Path, what: &str) -> Result<Vec<u32>> {
    let arr = v
        .as_array()
        .with_context(|| format!("{}: {what} is not a list of token ids", file.display()))?;
    arr.iter()
        .map(|i| {
            i.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .with_context(|| format!("{}: {what} holds {i}, not a token id", file.display()))
        })
        .collect()
}

/// The prompts of a fixture file.
fn fixture_prompts(file: &Path) -> Result<Vec<PromptCase>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("{}: cannot read", file.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    if let Some(ps) = v["prompts"].as_array() {
        return ps
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Ok(PromptCase {
                    name: p["name"]
                        .as_str()
                        .map_or_else(|| format!("prompt{i}"), str::to_string),
                    ids: ids_of(&p["ids"], file, "prompts[].ids")?,
                })
            })
            .collect();
    }
    if let Some(cases) = v["cases"].as_object() {
        return cases
            .iter()
            .map(|(name, c)| {
                Ok(PromptCase {
                    name: name.clone(),
                    ids: ids_of(&c["input_ids"], file, "cases.*.input_ids")?,
                })
            })
            .collect();
    }
    bail!(
        "{}: neither a llama.cpp prompts file (\"prompts\") nor an hf-tiny reference (\"cases\")",
        file.display()
    )
}

fn prompts(a: &Args, loaded: &LoadedModel) -> Result<Vec<PromptCase>> {
    let cases = match (
        &a.prompts,
        a.prompt.prompt.is_some() || a.prompt.ids.is_some(),
    ) {
        (Some(_), true) => bail!("give --prompts or --prompt/--ids, not both"),
        (Some(f), false) => fixture_prompts(f)?,
        (None, true) => vec![PromptCase {
            name: "prompt".into(),
            ids: a.prompt.ids(loaded)?,
        }],
        (None, false) => {
            let t = tokenizer(loaded)?;
            DEFAULT_PROMPTS
                .iter()
                .map(|(name, text)| {
                    Ok(PromptCase {
                        name: name.to_string(),
                        ids: t.encode(text, true, true)?,
                    })
                })
                .collect::<Result<_>>()?
        }
    };
    let vocab = loaded.model.config.vocab_size;
    for c in &cases {
        if c.ids.is_empty() {
            bail!("prompt {} is empty", c.name);
        }
        if let Some(bad) = c.ids.iter().find(|&&i| i as usize >= vocab) {
            bail!(
                "prompt {}: token id {bad} is outside the vocabulary (size {vocab})",
                c.name
            );
        }
        if c.ids.len() + a.greedy > loaded.model.max_positions() {
            bail!(
                "prompt {}: {} tokens + {} greedy exceed the context ({})",
                c.name,
                c.ids.len(),
                a.greedy,
                loaded.model.max_positions()
            );
        }
    }
    Ok(cases)
}

pub fn run(a: Args) -> Result<()> {
    if a.model.device == Device::Cpu {
        bail!("verify compares a device path with the CPU engine: give --device sim or ane");
    }
    let started = Instant::now();
    let loaded = a.model.load()?;
    let cases = prompts(&a, &loaded)?;
    // Fused chunks attend over their whole cache: hold just what the longest prompt needs.
    let longest = cases
        .iter()
        .map(|c| c.ids.len() + a.greedy)
        .max()
        .unwrap_or(0);
    let opts = LoweringOptions {
        width: a.width,
        context: longest.next_multiple_of(64).max(64),
        ..LoweringOptions::default()
    };
    let t = Instant::now();
    let mut exec = a.model.device_path(loaded.model.clone(), &opts)?;
    let strategy = exec.strategy();
    let compile_seconds = t.elapsed().as_secs_f64();
    let reference = match a.reference {
        RefArg::CpuF32 => Reference::CpuF32,
        RefArg::Cpu => Reference::Cpu,
    };
    let report = verify(
        &loaded.model,
        exec.as_mut(),
        &cases,
        a.greedy,
        reference,
        a.model.threads,
        a.model.weight_target()?,
    )?;
    let refused = report
        .uncompressed_rel_err()
        .filter(|&e| e > a.max_compression_error && !a.force);
    // Tokens the device ran: twice for a prompt whose reference routers had near-ties it was
    // run again with.
    let tokens: usize = (cases.iter().zip(&report.prompts))
        .map(|(c, p)| {
            let runs = 1 + usize::from(p.forced_routes.is_some());
            runs * (c.ids.len() + a.greedy.saturating_sub(1))
        })
        .sum();
    let dispatches = exec.dispatches();
    if a.json {
        let prompts: Vec<_> = report
            .prompts
            .iter()
            .map(|p| json!({"name": p.name, "n_prompt": p.n_prompt, "rel_err": p.max_rel_err, "max_abs_diff": p.max_abs_diff, "rel_err_clear_of_router_ties": p.max_rel_err_clear, "router_choices_forced": p.forced_routes, "router_tie": p.router_tie.map(|t| json!({"position": t.position, "gap": t.gap})), "greedy_same": p.greedy_same(), "first_difference": p.divergence.map(|d| json!({"step": d.step, "reference_gap": d.reference_gap, "after_router_tie": d.after_router_tie})), "greedy_reference": p.greedy_reference, "greedy_device": p.greedy_device}))
            .collect();
        let out = json!({
            "model": loaded.model.config.name,
            "device": a.model.device_name(),
            "reference": reference.name(),
            "max_rel_err": report.max_rel_err(),
            "max_rel_err_clear_of_router_ties": report.max_rel_err_clear(),
            "max_abs_diff": report.max_abs_diff(),
            "greedy_same": report.greedy_same(),
            "greedy_same_but_near_ties": report.same_but_near_ties(),
            "settle_ties": !a.model.no_settle_ties,
            "n_greedy": a.greedy,
            "strategy": strategy.name(),
            "mil_dialect": a.model.dialect().name(),
            "programs": exec.programs(),
            "cache": exec.cache_report().to_json(),
            "dispatches": dispatches,
            "dispatches_per_token": exec.dispatches_per_token(),
            "prefill_width": exec.prefill_width(),
            "route_redos": exec.route_redos(),
            "seconds": {"total": started.elapsed().as_secs_f64(), "compile": compile_seconds, "device": report.device_seconds, "reference": report.reference_seconds},
            "tokens": tokens,
            "prompts": prompts,
            "weights": weight_json(&a.model.weights, &report, &exec.weight_reports()),
            "compression_refused": refused.is_some(),
        });
        println!("{out}");
    } else {
        println!(
            "{:<14} {:>6} {:>10} {:>11}  greedy",
            "prompt", "tokens", "rel err", "max |diff|"
        );
        for p in &report.prompts {
            println!(
                "{:<14} {:>6} {:>10.2e} {:>11.4}  {}",
                p.name,
                p.n_prompt,
                p.max_rel_err,
                p.max_abs_diff,
                match p.divergence {
                    None => "same".to_string(),
                    Some(d) if d.reference_gap >= NEAR_TIE && d.after_router_tie => format!(
                        "differ from step {} on, after a router near-tie (reference top-2 gap {:.1e})",
                        d.step, d.reference_gap
                    ),
                    Some(d) if p.same_but_near_ties() => format!(
                        "differ from step {} on, a near-tie (reference top-2 gap {:.1e})",
                        d.step, d.reference_gap
                    ),
                    Some(d) => format!(
                        "DIFFERENT from step {} (reference top-2 gap {:.1e})",
                        d.step, d.reference_gap
                    ),
                }
            );
        }
        for p in &report.prompts {
            if p.max_rel_err <= p.max_rel_err_clear {
                continue;
            }
            match (p.forced_routes, p.router_tie) {
                (Some(n), _) => println!(
                    "{}: the reference's routers have {n} near-tied choices (gap < {:.0e}; either choice is right there); with them forced on the device, rel err {:.2e}",
                    p.name, ROUTE_NEAR_TIE, p.max_rel_err_clear
                ),
                (None, Some(t)) => println!(
                    "{}: the reference's expert choice at position {} is a near-tie (router gap {:.1e} < {:.0e}): either choice is right; the steps it reaches are judged apart, away from them rel err {:.2e}",
                    p.name, t.position, t.gap, ROUTE_NEAR_TIE, p.max_rel_err_clear
                ),
                (None, None) => {}
            }
        }
        if a.model.no_settle_ties {
            println!("near-tied top logits: the device's own (--no-settle-ties)");
        }
        println!(
            "max relative error {:.2e} vs {}; greedy tokens {}; {} strategy: {} programs ({} compiled, {} from the cache) ready in {compile_seconds:.1} s, {} dispatches per decoded token, {dispatches} in all for {tokens} tokens (prefill passes of up to {} tokens{}); device {:.1} s, reference {:.1} s",
            report.max_rel_err(),
            reference.name(),
            if report.greedy_same() {
                "all the same"
            } else if report.same_but_near_ties() {
                "differ only after near-ties"
            } else {
                "DIFFER"
            },
            strategy.name(),
            exec.programs(),
            exec.cache_report().compiled(),
            exec.cache_report().loaded(),
            exec.dispatches_per_token(),
            exec.prefill_width(),
            match exec.route_redos() {
                0 => String::new(),
                r => format!("; {r} repeated to settle router near-ties"),
            },
            report.device_seconds,
            report.reference_seconds
        );
        let t = summary::totals(&exec.weight_reports());
        println!(
            "weights --weights {}: {:.1} MB held ({:.3}x fp16), largest weight error {:.1e} of the tensor's largest{}",
            a.model.weights,
            t.bytes as f64 / 1e6,
            t.ratio(),
            t.max_rel_err,
            match report.uncompressed_rel_err() {
                Some(e) => format!("; against the uncompressed model: max relative error {e:.2e}"),
                None => String::new(),
            }
        );
    }
    if let Some(e) = refused {
        bail!(
            "--weights {}: the compression moves logits by {e:.2e} relative to the uncompressed model, more than --max-compression-error {}; refused (--force accepts it)",
            a.model.weights,
            a.max_compression_error
        );
    }
    Ok(())
}

/// The weight policy's figures: bytes, error of the weights, error against the uncompressed
/// model (compressing policies).
fn weight_json(
    policy: &anelm_ane::lower::WeightPolicy,
    report: &anelm_ane::verify::VerifyReport,
    reports: &[anelm_ane::lower::TensorReport],
) -> serde_json::Value {
    let t = summary::totals(reports);
    json!({
        "policy": policy.to_string(),
        "bytes": t.bytes,
        "fp16_bytes": t.fp16_bytes,
        "ratio_to_fp16": t.ratio(),
        "tensors": t.tensors,
        "exact_tensors": t.exact,
        "max_weight_rel_err": t.max_rel_err,
        "kept_fp16": reports.iter().filter(|r| r.kept_fp16.is_some()).map(|r| json!({"tensor": r.name, "reason": r.kept_fp16})).collect::<Vec<_>>(),
        "uncompressed_max_rel_err": report.uncompressed_rel_err(),
        "uncompressed_greedy_same": report.uncompressed.as_ref().map(|ps| ps.iter().all(|p| p.greedy_same())),
    })
}
