//! Batched generation: several generations, each over its own session with its own sampler,
//! stop strings and limits, advanced together — their decode tokens go through the executor as
//! one [`Executor::forward_batch`] step, which reads the weights once for all of them.
//!
//! A generation may join or leave between any two steps (the caller holds the list); each
//! step's events are queued on their generation ([`Generation::pop_event`]). Greedy outputs are
//! what each generation gives alone: the executor's batched rows equal its solo rows.

use std::time::Instant;

use anelm_model::{Executor, KvState};

use crate::error::Result;
use crate::generate::Generation;

/// Reusable buffers of batched steps.
#[derive(Default)]
pub struct Batch {
    rows: Vec<f32>,
    tokens: Vec<u32>,
    feeding: Vec<bool>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// One step of every generation in `gens` that has not finished: a prompt takes one
    /// prefill chunk (on its own), a decoding generation draws its next token, the tokens of
    /// all those that feed one going through the executor in one batched pass. Events queue on
    /// each generation. On an error no generation has drawn a token this step.
    pub fn step(
        &mut self,
        exec: &mut dyn Executor,
        gens: &mut [&mut Generation<'_>],
    ) -> Result<()> {
        let start = Instant::now();
        self.tokens.clear();
        self.feeding.clear();
        for g in gens.iter_mut() {
            let feed = g.batch_begin(exec, start)?;
            self.feeding.push(feed.is_some());
            self.tokens.extend(feed);
        }
        if !self.tokens.is_empty() {
            let mut states: Vec<&mut dyn KvState> = gens
                .iter_mut()
                .zip(&self.feeding)
                .filter(|(_, &f)| f)
                .map(|(g, _)| g.state_mut())
                .collect();
            exec.forward_batch(&mut states, &self.tokens, &mut self.rows)?;
        }
        let vocab = exec.vocab_size();
        let mut rows = self.rows.chunks_exact(vocab);
        let mut tokens = self.tokens.iter();
        for (g, &fed) in gens.iter_mut().zip(&self.feeding) {
            if fed {
                let row = rows.next().expect("a row per fed token");
                let token = *tokens.next().expect("a token per fed generation");
                g.batch_end(Some((token, row)));
            } else {
                g.batch_end(None);
            }
        }
        Ok(())
    }
}
