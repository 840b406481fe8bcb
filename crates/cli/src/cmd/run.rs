//! `anelm run`: generate a continuation of a prompt (or, with `--chat`, the answer to it as a
//! user message), streamed as it is produced. Greedy unless `--temp` is given.

use std::io::Write;

use anelm_engine::prompt::chat_ids;
use anelm_engine::{Event, GenerateParams, Input, Message, SamplingParams, Session, TokenLogprob};
use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::common::{FallbackArgs, ModelArgs, PromptArgs, TemplateKwargsArgs};
use super::constrain::ConstrainArgs;
use super::speculate::SpeculateArgs;

/// The sampling flags, shared by `run` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy [run: 0, chat: 0.8].
    #[arg(long, allow_negative_numbers = true)]
    pub temp: Option<f32>,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this probability mass (1: all).
    #[arg(long, default_value_t = SamplingParams::default().top_p, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Keep tokens at least this fraction as likely as the most likely one (0: all).
    #[arg(long, default_value_t = SamplingParams::default().min_p, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty over the last --repeat-last-n tokens, as llama.cpp applies it (1: off).
    #[arg(long, default_value_t = SamplingParams::default().repeat_penalty, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over (0: off).
    #[arg(long, default_value_t = SamplingParams::default().repeat_last_n)]
    pub repeat_last_n: usize,
    /// OpenAI presence penalty: subtracted from every token generated so far.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted per occurrence of a generated token.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Add BIAS to token ID's logit: `--logit-bias 42=-1.5`, `--logit-bias 42=-inf` bans it (repeatable).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_bias, allow_hyphen_values = true)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampler (default: from the clock; printed with -v and in --json).
    #[arg(long)]
    pub seed: Option<u64>,
}

fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected ID=BIAS"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("'{id}' is not a token id"))?;
    let bias = match bias.trim() {
        "-inf" => f32::NEG_INFINITY,
        b => b
            .parse()
            .map_err(|_| format!("'{b}' is not a number (or -inf)"))?,
    };
    Ok((id, bias))
}

impl SamplingArgs {
    pub fn params(&self, default_temp: f32) -> SamplingParams {
        SamplingParams {
            temperature: self.temp.unwrap_or(default_temp),
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub fallback: FallbackArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Send --prompt as a user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// With --json: each token's log-probability and this many alternatives.
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub speculate: SpeculateArgs,
    #[command(flatten)]
    pub constrain: ConstrainArgs,
    #[command(flatten)]
    pub template_kwargs: TemplateKwargsArgs,
}

#[derive(Serialize)]
struct RunJson {
    prompt_ids: Vec<u32>,
    ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
    seed: u64,
    usage: UsageJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<LogprobJson>>,
    /// Device evaluations per decoded token (--device sim|ane; not with speculative decoding,
    /// whose passes verify several tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatches_per_token: Option<usize>,
    /// With --draft or --lookup: what was drafted and kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    speculative: Option<SpecJson>,
}

#[derive(Serialize)]
struct SpecJson {
    drafted: usize,
    accepted: usize,
    target_passes: usize,
}

#[derive(Serialize)]
struct UsageJson {
    prompt_tokens: usize,
    completion_tokens: usize,
    decode_tokens_per_second: f64,
}

#[derive(Serialize)]
struct LogprobJson {
    id: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
}

pub fn run(a: Args) -> Result<()> {
    let mut loaded = a.model.load()?;
    a.template_kwargs.apply(&mut loaded);
    let prompt = if a.chat {
        let text = a
            .prompt
            .prompt
            .as_deref()
            .context("--chat needs a --prompt")?;
        if a.prompt.ids.is_some() {
            bail!("--chat takes --prompt, not --ids");
        }
        chat_ids(&loaded, &[Message::user(text)])?
    } else {
        a.prompt.ids(&loaded)?
    };
    let capacity = (prompt.len() + a.max_tokens).min(loaded.model.max_positions());
    let (mut exec, dispatches_per_token) =
        a.model
            .executor_with_fallback(&loaded, capacity, a.fallback.resolve(a.model.device))?;
    if let Some(n) = dispatches_per_token {
        tracing::info!("{n} device dispatches per decoded token");
    }
    let mut session = Session::new(exec.as_ref(), capacity)?;
    if a.constrain.enabled() && a.speculate.enabled() {
        anyhow::bail!("a constrained reply decodes one token at a time: drop --draft/--lookup");
    }
    let constraint = a.constrain.build(&loaded)?;
    let speculation = a.speculate.build(&a.model, &loaded, capacity)?;
    let params = GenerateParams {
        sampling: a.sampling.params(0.0),
        max_tokens: a.max_tokens,
        stop: a.stop.clone(),
        logprobs: a.logprobs.filter(|_| a.json),
        ..GenerateParams::default()
    };
    let mut stdout = std::io::stdout().lock();
    let (mut ids, mut text, mut logprobs) = (Vec::new(), String::new(), Vec::new());
    let stream_text = !a.json && loaded.tokenizer.is_some();
    let mut generation = session.generate(&loaded, &Input::Ids(prompt.clone()), params)?;
    if let Some(s) = speculation {
        generation.speculate(s)?;
    }
    if let Some(c) = constraint {
        generation.constrain(Box::new(c));
    }
    let finish = loop {
        match generation
            .next_event(exec.as_mut())?
            .expect("a generation ends with a finish")
        {
            Event::Token { id, logprob } => {
                ids.push(id);
                if let Some(TokenLogprob { logprob, top }) = logprob {
                    logprobs.push(LogprobJson { id, logprob, top });
                }
            }
            Event::Text(delta) => {
                text.push_str(&delta);
                if stream_text {
                    let _ = stdout.write_all(delta.as_bytes());
                    let _ = stdout.flush();
                }
            }
            Event::Finish(f) => break f,
        }
    };
    super::speculate::report(&finish.speculative);
    tracing::info!(
        reason = finish.reason.as_str(),
        seed = finish.seed,
        prompt_tokens = finish.usage.prompt_tokens,
        completion_tokens = finish.usage.completion_tokens,
        "{:.1} tok/s",
        finish.decode_tokens_per_second()
    );
    if a.json {
        let out = RunJson {
            prompt_ids: prompt,
            ids,
            text,
            finish_reason: finish.reason.openai(),
            seed: finish.seed,
            usage: UsageJson {
                prompt_tokens: finish.usage.prompt_tokens,
                completion_tokens: finish.usage.completion_tokens,
                decode_tokens_per_second: finish.decode_tokens_per_second(),
            },
            logprobs: a.logprobs.map(|_| logprobs),
            dispatches_per_token: dispatches_per_token.filter(|_| !a.speculate.enabled()),
            speculative: a.speculate.enabled().then_some(SpecJson {
                drafted: finish.speculative.drafted,
                accepted: finish.speculative.accepted,
                target_passes: finish.speculative.target_passes,
            }),
        };
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else if stream_text {
        writeln!(stdout)?;
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(stdout, "{}", list.join(","))?;
    }
    Ok(())
}
