//! `anelm bench --lookup|--draft M --prompt-file F`: speculative decoding against plain decoding
//! on one chat prompt (the file's text as the user's message, e.g. a text and "summarise it"):
//! greedy runs alternating, medians of decode tok/s, their ratio, the acceptance — and a check
//! that the speculative output is the plain one, token for token.

use std::path::Path;

use anelm_engine::{
    Event, Finish, GenerateParams, Generation, Input, LoadedModel, Message, SamplingParams,
    Session, Speculation,
};
use anelm_model::Executor;
use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::common::ModelArgs;
use super::speculate::SpeculateArgs;

#[derive(Serialize)]
struct Report {
    model: String,
    prompt_file: String,
    prompt_tokens: usize,
    generated_tokens: usize,
    drafter: &'static str,
    k: usize,
    repetitions: usize,
    plain_tok_s: f64,
    speculative_tok_s: f64,
    ratio: f64,
    acceptance: f64,
    drafted: usize,
    accepted: usize,
    target_passes: usize,
    identical: bool,
}

/// One greedy generation in a fresh session, `attach` given the generation before it starts
/// (a drafter, a constraint): the tokens, the finish, and the speculation back.
pub(super) fn once_with(
    exec: &mut dyn Executor,
    loaded: &LoadedModel,
    input: &Input,
    capacity: usize,
    params: GenerateParams,
    attach: impl FnOnce(&mut Generation<'_>) -> Result<()>,
) -> Result<(Vec<u32>, Finish, Option<Speculation>)> {
    let mut session = Session::new(exec, capacity)?;
    let mut g = session.generate(loaded, input, params)?;
    attach(&mut g)?;
    let mut ids = Vec::new();
    loop {
        match g
            .next_event(exec)?
            .context("a generation ends with a finish")?
        {
            Event::Token { id, .. } => ids.push(id),
            Event::Text(_) => {}
            Event::Finish(f) => return Ok((ids, f, g.take_speculation())),
        }
    }
}

/// Greedy decoding of at most `gen` tokens.
pub(super) fn greedy(gen: usize) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: gen,
        ..GenerateParams::default()
    }
}

/// [`once_with`] greedy, speculating when `spec` is given.
fn once(
    exec: &mut dyn Executor,
    loaded: &LoadedModel,
    input: &Input,
    capacity: usize,
    gen: usize,
    spec: Option<Speculation>,
) -> Result<(Vec<u32>, Finish, Option<Speculation>)> {
    once_with(exec, loaded, input, capacity, greedy(gen), |g| {
        if let Some(s) = spec {
            g.speculate(s)?;
        }
        Ok(())
    })
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn run(
    model_args: &ModelArgs,
    speculate: &SpeculateArgs,
    prompt_file: &Path,
    gen: usize,
    repetitions: usize,
    json: bool,
) -> Result<()> {
    if gen == 0 || repetitions == 0 {
        bail!("a speculative benchmark needs -n > 0 and -r > 0");
    }
    let text = std::fs::read_to_string(prompt_file)
        .with_context(|| format!("--prompt-file {}", prompt_file.display()))?;
    let loaded = model_args.load()?;
    let input = Input::Messages(vec![Message::user(text.trim_end())]);
    let prompt_tokens =
        anelm_engine::prompt::chat_ids(&loaded, &[Message::user(text.trim_end())])?.len();
    let capacity = (prompt_tokens + gen + 1).min(loaded.model.max_positions());
    let mut exec = model_args.executor(&loaded, capacity)?;
    let mut spec = speculate
        .build(model_args, &loaded, capacity)?
        .context("the speculative benchmark needs --lookup or --draft")?;
    let drafter = spec.drafter.name();
    let k = spec.k;
    // Warm-up of both ways.
    let (want, _, _) = once(exec.as_mut(), &loaded, &input, capacity, gen, None)?;
    let mut identical = true;
    let (mut plain, mut fast) = (Vec::new(), Vec::new());
    let mut total = anelm_engine::SpecStats::default();
    for _ in 0..repetitions {
        let (_, f, _) = once(exec.as_mut(), &loaded, &input, capacity, gen, None)?;
        plain.push(f.decode_tokens_per_second());
        // Each run starts with a fresh estimate of the acceptance; a draft model stays loaded.
        let fresh = Speculation::new(spec.drafter, k)?;
        let (ids, finish, back) = once(exec.as_mut(), &loaded, &input, capacity, gen, Some(fresh))?;
        spec = back.context("the speculation comes back")?;
        identical &= ids == want;
        fast.push(finish.decode_tokens_per_second());
        total.drafted += finish.speculative.drafted;
        total.accepted += finish.speculative.accepted;
        total.target_passes += finish.speculative.target_passes;
    }
    let (p, s) = (median(plain), median(fast));
    let report = Report {
        model: loaded.model.config.name.clone(),
        prompt_file: prompt_file.display().to_string(),
        prompt_tokens,
        generated_tokens: want.len(),
        drafter,
        k,
        repetitions,
        plain_tok_s: p,
        speculative_tok_s: s,
        ratio: s / p,
        acceptance: total.acceptance(),
        drafted: total.drafted / repetitions,
        accepted: total.accepted / repetitions,
        target_passes: total.target_passes / repetitions,
        identical,
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("| model | prompt | tokens | drafter | k | plain tok/s | speculative tok/s | ratio | acceptance | passes | same output |");
        println!("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|");
        println!(
            "| {} | {} ({} tokens) | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.0} % | {} | {} |",
            report.model,
            report.prompt_file,
            report.prompt_tokens,
            report.generated_tokens,
            report.drafter,
            report.k,
            report.plain_tok_s,
            report.speculative_tok_s,
            report.ratio,
            100.0 * report.acceptance,
            report.target_passes,
            if identical { "yes" } else { "NO" }
        );
    }
    if !identical {
        bail!("the speculative output differs from the plain greedy output");
    }
    Ok(())
}
