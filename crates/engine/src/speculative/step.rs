//! One speculative decode step of a [`Generation`]: draft, verify every drafted token in one
//! target pass, emit the kept prefix and the target's own next token, and roll the session back
//! to what was kept.

use std::time::Instant;

use anelm_model::{Executor, Logits};

use super::accept::{judge, Verdict};
use super::drafter::sync;
use crate::error::Result;
use crate::generate::Generation;
use crate::sampler::logprobs;

impl Generation<'_> {
    /// Feeds `feed` (the newest token) with a drafted continuation and emits what is kept.
    pub(crate) fn speculative_step(&mut self, exec: &mut dyn Executor, feed: u32) -> Result<()> {
        if !self.room() {
            return Ok(());
        }
        let Some(mut spec) = self.speculation.take() else {
            unreachable!("a speculative step needs a drafter");
        };
        let result = self.verify(exec, feed, &mut spec);
        self.speculation = Some(spec);
        result
    }

    fn verify(
        &mut self,
        exec: &mut dyn Executor,
        feed: u32,
        spec: &mut super::Speculation,
    ) -> Result<()> {
        let base = self.session.tokens().len();
        // At most `remaining` tokens may still be emitted, one of them the target's own; the
        // session must hold the fed token and every drafted one.
        let remaining = self.max_tokens.saturating_sub(self.usage.completion_tokens);
        let room = self.session.capacity().saturating_sub(base + 1);
        let limit = remaining.saturating_sub(1).min(room);
        let mut context = Vec::with_capacity(base + 1);
        context.extend_from_slice(self.session.tokens());
        context.push(feed);
        spec.proposal.clear();
        // Forced tokens come next: nothing to draft. A free drafter proposes all it may and
        // its proposal's class decides how much of it is verified; a costly one is asked for
        // what its class-0 estimate makes worth it.
        let n = if self.has_forced() {
            0
        } else if spec.drafter.free() {
            spec.drafter
                .propose(&context, spec.k.min(limit), &mut spec.proposal)?;
            let class = spec.proposal.class;
            spec.wanted(spec.proposal.tokens.len().min(limit), class)
        } else {
            let k = spec.wanted(limit, 0);
            if k > 0 {
                spec.drafter.propose(&context, k, &mut spec.proposal)?;
            }
            spec.proposal.tokens.len().min(k)
        };
        let proposal = &spec.proposal;
        let class = proposal.class;
        self.spec_stats.target_passes += 1;
        if n == 0 {
            spec.record(0, 0, false, class);
            let started = Instant::now();
            self.session
                .run(exec, &[feed], Logits::Last, &mut self.logits)?;
            spec.observe(1, started.elapsed().as_secs_f64());
            self.draw();
            return Ok(());
        }
        context.extend_from_slice(&proposal.tokens[..n]);
        let started = Instant::now();
        self.session
            .run(exec, &context[base..], Logits::All, &mut self.logits)?;
        let secs = started.elapsed().as_secs_f64();
        spec.observe(n + 1, secs);
        let proposal = &spec.proposal;

        let vocab = exec.vocab_size();
        let rows = std::mem::take(&mut self.logits);
        let (mut row, mut p, mut residual) = (Vec::new(), Vec::new(), Vec::new());
        let mut kept = n + 1;
        let (accepted_before, drafted_before) = (self.spec_stats.accepted, self.spec_stats.drafted);
        let mut refused = false;
        for i in 0..=n {
            row.clear();
            row.extend_from_slice(&rows[i * vocab..(i + 1) * vocab]);
            self.sampler.adjust(&mut row, &context[..base + 1 + i]);
            let (id, rejected) = if i < n {
                let x = proposal.tokens[i];
                self.sampler.distribution(&row, &mut p);
                let q = proposal.dists.get(i).map(Vec::as_slice);
                let u = self.sampler.uniform();
                let sampler = &mut self.sampler;
                // Drafted tokens count as they are judged (a refused one with the rest of its
                // proposal), before the finish that reports them: those after a token that
                // ended the generation are never judged.
                match judge(&p, q, x, u, &mut residual, |d| sampler.draw(d)) {
                    Verdict::Accepted(x) => {
                        self.spec_stats.accepted += 1;
                        self.spec_stats.drafted += 1;
                        (x, false)
                    }
                    Verdict::Replaced(y) => {
                        self.spec_stats.drafted += n - i;
                        (y, true)
                    }
                }
            } else {
                (self.sampler.choose(&row), false)
            };
            refused |= rejected;
            let logprob = self.top_logprobs.map(|m| logprobs(&row, id, m));
            if self.emit(id, logprob) || rejected {
                kept = i + 1;
                break;
            }
        }
        self.logits = rows;
        let judged = self.spec_stats.drafted - drafted_before;
        tracing::trace!(
            "speculative pass at {base}: {n} drafted (class {class}), {judged} judged, {} kept, \
             {:.2} ms ({:.2} plain passes by the estimate)",
            kept - 1,
            secs * 1e3,
            spec.relative_cost(n)
        );
        spec.record(
            judged,
            self.spec_stats.accepted - accepted_before,
            refused,
            class,
        );
        // The session keeps the fed token and the drafted tokens before the last emitted one
        // (which is pending, or ended the generation).
        let want = base + kept;
        self.session.truncate(want);
        if self.session.tokens().len() < want {
            // A recurrent state could not go back: rebuild it.
            sync(exec, &mut self.session, &context[..want], &mut self.logits)?;
        }
        Ok(())
    }
}
