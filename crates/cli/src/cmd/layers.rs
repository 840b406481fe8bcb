//! `anelm layers`: the hidden state after each layer through the device's kernels and through
//! the f32 reference (the same CPU-side code with exact projections), for bisecting a layer
//! that goes wrong.

use anelm_ane::check::compare_layers;
use anelm_ane::LoweringOptions;
use anyhow::{bail, Result};
use serde_json::json;

use super::check::{diagnostic_device, prompt_or_default};
use super::common::{ModelArgs, PromptArgs};

#[derive(clap::Args)]
#[command(
    about = "Compare the hidden state after each layer, simulator vs f32 reference (bisecting a bad layer)"
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// The last layer to compare (default: every layer).
    #[arg(long)]
    pub upto: Option<usize>,
    #[arg(long, default_value_t = 64)]
    pub width: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.model.load()?;
    let prompt = prompt_or_default(&a.prompt, &loaded)?;
    let n = loaded.model.n_layers();
    if n == 0 {
        bail!("{} has no layers", loaded.model.source.path().display());
    }
    // The fused strategy hands on every layer's output but the last (which leaves as logits).
    let last = if a.model.strategy == super::compile::Strategy::Fused {
        n - 1
    } else {
        n
    };
    if last == 0 {
        bail!(
            "a one-layer model has no layer output to compare under the fused strategy; use check"
        );
    }
    let upto = a.upto.unwrap_or(last - 1);
    if upto >= last {
        bail!(
            "--upto {upto}: the model has {n} layers, comparable here up to {}",
            last - 1
        );
    }
    let opts = a.model.lowering(LoweringOptions {
        width: a.width,
        ..LoweringOptions::default()
    })?;
    let rows = crate::models::with_spinner("compiling and running both paths", || -> Result<_> {
        Ok(compare_layers(
            &loaded.model,
            diagnostic_device(a.model.device)?,
            a.model.strategy.into(),
            &LoweringOptions {
                context: prompt.len().next_multiple_of(64),
                ..opts
            },
            &prompt,
            upto,
        )?)
    })?;
    if a.json {
        let layers: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(l, (d, r))| json!({"layer": l, "max_abs_diff": d, "rel_err": r}))
            .collect();
        println!("{}", json!({"tokens": prompt.len(), "layers": layers}));
    } else {
        println!(
            "{:>5} {:>12} {:>10}   ({} tokens)",
            "layer",
            "max |diff|",
            "rel err",
            prompt.len()
        );
        for (l, (d, r)) in rows.iter().enumerate() {
            println!("{l:>5} {d:>12.5} {r:>10.2e}");
        }
    }
    Ok(())
}
