//! `anelm bench --json-schema S` (or `--grammar G`): greedy decoding held to the schema against
//! plain greedy decoding of the same prompt, runs alternating — medians of decode tok/s, their
//! ratio, the mask's own time per token, and whether every constrained reply validates as JSON.
//! The plain runs cannot end early (their stop tokens are banned), so both sides decode as many
//! tokens as the schema's reply takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anelm_constrain::Constrained;
use anelm_engine::{Constraint, Input, Message};
use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::bench_spec::{greedy, median, once_with};
use super::common::ModelArgs;
use super::constrain::ConstrainArgs;

/// The question asked when no prompt file is given: a reply of some length under most schemas.
const DEFAULT_PROMPT: &str =
    "Describe five famous cities: for each its name, country, population and a short note.";

#[derive(Serialize)]
struct Report {
    model: String,
    prompt_tokens: usize,
    generated_tokens: usize,
    repetitions: usize,
    plain_tok_s: f64,
    constrained_tok_s: f64,
    ratio: f64,
    mask_us_per_token: f64,
    all_valid_json: bool,
}

/// A constraint that counts the time its masks take.
struct Timed {
    inner: Constrained,
    nanos: Arc<AtomicU64>,
}

impl Constraint for Timed {
    fn mask(&mut self, logits: &mut [f32]) {
        let t = Instant::now();
        self.inner.mask(logits);
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn accept(&mut self, token: u32) {
        let t = Instant::now();
        self.inner.accept(token);
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn complete(&self) -> bool {
        self.inner.complete()
    }
}

pub fn run(
    model_args: &ModelArgs,
    constrain: &ConstrainArgs,
    prompt_file: Option<&std::path::Path>,
    gen: usize,
    repetitions: usize,
    json: bool,
) -> Result<()> {
    if gen == 0 || repetitions == 0 {
        bail!("a constrained benchmark needs -n > 0 and -r > 0");
    }
    let text = match prompt_file {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("--prompt-file {}", p.display()))?
        }
        None => DEFAULT_PROMPT.to_string(),
    };
    let loaded = model_args.load()?;
    let template = constrain
        .build(&loaded)?
        .context("the constrained benchmark needs --json-schema or --grammar")?;
    let messages = [Message::user(text.trim_end())];
    let input = Input::Messages(messages.to_vec());
    let prompt_tokens = anelm_engine::prompt::chat_ids(&loaded, &messages)?.len();
    let capacity = (prompt_tokens + gen + 1).min(loaded.model.max_positions());
    let mut exec = model_args.executor(&loaded, capacity)?;
    let nanos = Arc::new(AtomicU64::new(0));
    let constrained_run = |exec: &mut dyn anelm_model::Executor| {
        let timed = Timed {
            inner: template.fork(),
            nanos: nanos.clone(),
        };
        once_with(exec, &loaded, &input, capacity, greedy(gen), |g| {
            g.constrain(Box::new(timed));
            Ok(())
        })
    };
    // Warm-up, and the reply length the plain runs match.
    let (ids, _, _) = constrained_run(exec.as_mut())?;
    let length = ids.len();
    let tokenizer = loaded.tokenizer()?.clone();
    let mut plain_params = greedy(length);
    plain_params.sampling.logit_bias = loaded
        .stop_ids()
        .into_iter()
        .map(|id| (id, f32::NEG_INFINITY))
        .collect();
    nanos.store(0, Ordering::Relaxed);
    let (mut plain, mut held) = (Vec::new(), Vec::new());
    let mut all_valid = true;
    let mut constrained_tokens = 0;
    for _ in 0..repetitions {
        let (_, f, _) = once_with(
            exec.as_mut(),
            &loaded,
            &input,
            capacity,
            plain_params.clone(),
            |_| Ok(()),
        )?;
        plain.push(f.decode_tokens_per_second());
        let (ids, f, _) = constrained_run(exec.as_mut())?;
        constrained_tokens += f.usage.completion_tokens;
        held.push(f.decode_tokens_per_second());
        if constrain.json_schema.is_some() && f.reason == anelm_engine::FinishReason::Stop {
            let body: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&id| !tokenizer.is_special(id))
                .collect();
            let text = tokenizer.decode_lossy(&body);
            all_valid &= serde_json::from_str::<serde_json::Value>(&text).is_ok();
        }
    }
    let (p, c) = (median(plain), median(held));
    let report = Report {
        model: loaded.model.config.name.clone(),
        prompt_tokens,
        generated_tokens: length,
        repetitions,
        plain_tok_s: p,
        constrained_tok_s: c,
        ratio: c / p,
        mask_us_per_token: nanos.load(Ordering::Relaxed) as f64
            / 1e3
            / constrained_tokens.max(1) as f64,
        all_valid_json: all_valid,
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("| model | prompt | tokens | plain tok/s | constrained tok/s | ratio | mask µs/token | valid JSON |");
        println!("|---|---:|---:|---:|---:|---:|---:|---|");
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.3} | {:.0} | {} |",
            report.model,
            report.prompt_tokens,
            report.generated_tokens,
            report.plain_tok_s,
            report.constrained_tok_s,
            report.ratio,
            report.mask_us_per_token,
            if all_valid { "yes" } else { "NO" }
        );
    }
    if !all_valid {
        bail!("a constrained reply did not parse as JSON");
    }
    Ok(())
}
