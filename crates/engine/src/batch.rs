//! Batched generation: several generations, each over its own session with its own sampler,
//! stop strings and limits, advanced together — their decode tokens and prompt chunks go
//! through the executor as one [`Executor::forward_runs`] pass, which reads the weights once
//! for all of them.
//!
//! A generation may join or leave between any two steps (the caller holds the list); each
//! step's events are queued on their generation ([`Generation::pop_event`]). Greedy outputs are
//! what each generation gives alone: the executor's batched rows equal its solo rows. A
//! speculative generation's verifying run joins the pass like a prompt chunk, so drafting and
//! batching compose: the weights are read once for every sequence's drafted tokens.
//!
//! A prompt beside decoding generations goes in chunks sized to a time budget per step (from
//! the rate of the steps before), so that a long prompt delays the others' next tokens by about
//! the budget, not by a full chunk deep in a long context (SmolLM2, a 2700-token prompt beside
//! three streams: gaps of 200–600 ms with 512-token chunks). Alone it takes full chunks.

use std::time::{Duration, Instant};

use anelm_model::{Executor, KvState, Run};

use crate::error::Result;
use crate::generate::{Feed, Generation};
use crate::session::PREFILL_CHUNK;
use crate::speculative::{Beside, PassTime};

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
    runs: Vec<Run>,
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
            runs: Vec::new(),
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
    /// draws its next token, a speculative one verifies its drafted tokens (and emits those
    /// kept and one of its own), a prompt takes its next prefill chunk, the tokens of all of
    /// them going through the executor as one pass of runs ([`Executor::forward_runs`]).
    /// Events queue on each generation. On an error of the pass no generation has drawn a
    /// token this step.
    pub fn step(
        &mut self,
        exec: &mut dyn Executor,
        gens: &mut [&mut Generation<'_>],
    ) -> Result<()> {
        let start = Instant::now();
        self.tokens.clear();
        self.runs.clear();
        self.feeds.clear();
        let chunk = self.chunk(gens);
        // The plain runs first, then the speculative generations, each weighing its drafted
        // tokens against the pass the runs before it make already.
        let mut feeds: Vec<Option<Feed>> = gens.iter().map(|_| None).collect();
        let mut beside = Beside::default();
        for drafting in [false, true] {
            for (g, f) in gens.iter_mut().zip(&mut feeds) {
                if g.drafting() != drafting {
                    continue;
                }
                let feed = g.batch_begin(start, chunk, beside)?;
                let (tokens, emitting) = match &feed {
                    Feed::Nothing => (0, false),
                    Feed::Token(_) => (1, true),
                    Feed::Prompt { chunk, step } => (chunk.len(), step.done),
                    Feed::Verify(run) => (run.len, true),
                };
                beside.tokens += tokens;
                beside.emitting += usize::from(emitting);
                *f = Some(feed);
            }
        }
        for (g, feed) in gens.iter().zip(feeds) {
            let feed = feed.expect("every generation was asked for its feed");
            match &feed {
                Feed::Nothing => {}
                Feed::Token(t) => {
                    self.tokens.push(*t);
                    self.runs.push(Run::last(1));
                }
                Feed::Prompt { chunk, step } => {
                    self.tokens
                        .extend_from_slice(g.prompt_tokens(chunk.clone()));
                    self.runs.push(Run {
                        len: chunk.len(),
                        logits: usize::from(step.done),
                    });
                }
                Feed::Verify(run) => {
                    self.tokens.extend_from_slice(g.verify_tokens());
                    self.runs.push(*run);
                }
            }
            self.feeds.push(feed);
        }
        let prompt = self.feeds.iter().any(|f| matches!(f, Feed::Prompt { .. }));
        let mut secs = 0.0;
        if !self.tokens.is_empty() {
            let mut states: Vec<&mut dyn KvState> = gens
                .iter_mut()
                .zip(&self.feeds)
                .filter(|(_, f)| !matches!(f, Feed::Nothing))
                .map(|(g, _)| g.state_mut())
                .collect();
            let pass = Instant::now();
            exec.forward_runs(&mut states, &self.runs, &self.tokens, &mut self.rows)?;
            secs = pass.elapsed().as_secs_f64();
            if prompt && secs > 0.0 {
                let now = self.tokens.len() as f64 / secs;
                self.rate = Some(self.rate.map_or(now, |r| 0.5 * r + 0.5 * now));
            }
        }
        // What speculative generations learn their pass costs from: passes of decode and
        // verifying runs (a prompt's chunk costs what prefill costs, not what drafting adds).
        let pass = PassTime {
            secs,
            tokens: self.tokens.len(),
            timed: !prompt,
        };
        let vocab = exec.vocab_size();
        let mut result = Ok(());
        let mut rest: &mut [f32] = &mut self.rows;
        let mut rows = |n: usize| {
            let (these, tail) = std::mem::take(&mut rest).split_at_mut(n * vocab);
            rest = tail;
            these
        };
        for (g, feed) in gens.iter_mut().zip(self.feeds.drain(..)) {
            match feed {
                Feed::Nothing => g.batch_end(None),
                Feed::Token(token) => g.batch_end(Some((token, rows(1)))),
                Feed::Prompt { chunk, step } => {
                    let row = rows(usize::from(step.done));
                    g.batch_end_prompt(chunk, step, row);
                }
                Feed::Verify(run) => {
                    let these = rows(run.logits);
                    let judged = g.batch_judge(exec, these, pass);
                    // The others' steps complete; the first error is reported after them.
                    if result.is_ok() {
                        result = judged;
                    }
                }
            }
        }
        result
    }
}
