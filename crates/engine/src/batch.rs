//! Batched generation: several generations, each over its own session with its own sampler,
//! stop strings and limits, advanced together — their decode tokens and prompt chunks go
//! through the executor as one [`Executor::forward_runs`] pass, which reads the weights once
//! for all of them.
//!
//! A generation may join or leave between any two steps (the caller holds the list); each
//! step's events are queued on their generation ([`Generation::pop_event`]). Greedy outputs are
//! what each generation gives alone: the executor's batched rows equal its solo rows.

use std::time::Instant;

use anelm_model::{Executor, KvState};

use crate::error::Result;
use crate::generate::{Feed, Generation};

/// Reusable buffers of batched steps.
#[derive(Default)]
pub struct Batch {
    rows: Vec<f32>,
    tokens: Vec<u32>,
    lens: Vec<usize>,
    feeds: Vec<Feed>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
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
        for g in gens.iter_mut() {
            let feed = g.batch_begin(exec, start)?;
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
            exec.forward_runs(&mut states, &self.lens, &self.tokens, &mut self.rows)?;
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
