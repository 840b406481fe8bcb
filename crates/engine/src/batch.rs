//! Batched generation: several generations, each over its own session with its own sampler,
//! stop strings and limits, advanced together — their decode tokens and prompt chunks go
//! through the executor as one [`Executor::forward_runs`] pass, which reads the weights once
//! for all of them.
//!
//! A generation may join or leave between any two steps (the caller holds the list); each
//! step's events are queued on their generation ([`Generation::pop_event`]). Greedy outputs are
//! what each generation gives alone: the executor's batched rows equal its solo rows.
//!
//! A prompt beside decoding generations goes in chunks sized to a time budget per step (from
//! the rate of the steps before), so that a long prompt delays the others' next tokens by about
//! the budget, not by a full chunk deep in a long context (SmolLM2, a 2700-token prompt beside
//! three streams: gaps of 200–600 ms with 512-token chunks). Alone it takes full chunks.

use std::time::{Duration, Instant};

use anelm_model::{Executor, KvState};

use crate::error::Result;
use crate::generate::{Feed, Generation};
use crate::session::PREFILL_CHUNK;

/// What a step carrying prompt chunks may take while other generations wait for their next
/// token, by default.
pub const STEP_BUDGET: Duration = Duration::from_millis(100);

/// The fewest prompt tokens a step carries for a prompt: below it each chunk's pass over the
/// weights would cost more than its tokens.
pub const MIN_CHUNK: usize = 64;

/// Reusable buffers of batched steps, and the pace of the steps that carried prompt chunks.
pub struct Batch {
    rows: Vec<f32>,
    tokens: Vec<u32>,
    lens: Vec<usize>,
    feeds: Vec<Feed>,
    budget: Duration,
    /// Rows a second of the steps that carried prompt chunks (a decayed mean).
    rate: Option<f64>,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::with_step_budget(STEP_BUDGET)
    }
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Batched steps whose prompt chunks, beside decoding generations, aim at `budget` a step.
    pub fn with_step_budget(budget: Duration) -> Batch {
        Batch {
            rows: Vec::new(),
            tokens: Vec::new(),
            lens: Vec::new(),
            feeds: Vec::new(),
            budget,
            rate: None,
        }
    }

    /// The most tokens each prompt of this step takes: a full chunk unless others are decoding,
    /// then its share of what the budget allows at the measured pace (the fewest until a pace
    /// is known).
    fn chunk(&self, gens: &[&mut Generation<'_>]) -> usize {
        let prompts = gens.iter().filter(|g| g.prefilling()).count();
        let waiting = gens.iter().any(|g| !g.prefilling() && !g.is_finished());
        match (waiting, self.rate) {
            (false, _) => PREFILL_CHUNK,
            (true, None) => MIN_CHUNK,
            (true, Some(rate)) => {
                let tokens = rate * self.budget.as_secs_f64() / prompts.max(1) as f64;
                (tokens as usize).clamp(MIN_CHUNK, PREFILL_CHUNK)
            }
        }
    }

    /// One step of every generation in `gens` that has not finished: a decoding generation
    /// draws its next token, a prompt takes its next prefill chunk, the tokens of all of them
    /// going through the executor as one pass of runs ([`Executor::forward_runs`]). Events
    /// queue on each generation. On an error no generation has drawn a token this step.
    pub fn step(
        &mut self,
        exec: &mut dyn Executor,
        gens: &mut [&mut Generation<'_>],
    ) -> Result<()> {
        let start = Instant::now();
        self.tokens.clear();
        self.lens.clear();
        self.feeds.clear();
        let chunk = self.chunk(gens);
        for g in gens.iter_mut() {
            let feed = g.batch_begin(exec, start, chunk)?;
            match &feed {
                Feed::Nothing => {}
                Feed::Token(t) => {
                    self.tokens.push(*t);
                    self.lens.push(1);
                }
                Feed::Prompt { chunk, .. } => {
                    self.tokens
                        .extend_from_slice(g.prompt_tokens(chunk.clone()));
                    self.lens.push(chunk.len());
                }
            }
            self.feeds.push(feed);
        }
        if !self.tokens.is_empty() {
            let mut states: Vec<&mut dyn KvState> = gens
                .iter_mut()
                .zip(&self.feeds)
                .filter(|(_, f)| !matches!(f, Feed::Nothing))
                .map(|(g, _)| g.state_mut())
                .collect();
            let pass = Instant::now();
            exec.forward_runs(&mut states, &self.lens, &self.tokens, &mut self.rows)?;
            let secs = pass.elapsed().as_secs_f64();
            let prompt = self.feeds.iter().any(|f| matches!(f, Feed::Prompt { .. }));
            if prompt && secs > 0.0 {
                let now = self.tokens.len() as f64 / secs;
                self.rate = Some(self.rate.map_or(now, |r| 0.5 * r + 0.5 * now));
            }
        }
        let vocab = exec.vocab_size();
        let mut rows = self.rows.chunks_exact(vocab);
        for (g, feed) in gens.iter_mut().zip(self.feeds.drain(..)) {
            match feed {
                Feed::Nothing => g.batch_end(None),
                Feed::Token(token) => {
                    let row = rows.next().expect("a row per fed run");
                    g.batch_end(Some((token, row)));
                }
                Feed::Prompt { chunk, step } => {
                    let row = rows.next().expect("a row per fed run");
                    g.batch_end_prompt(chunk, step, row);
                }
            }
        }
        Ok(())
    }
}
