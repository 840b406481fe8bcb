//! One speculative decode step of a [`Generation`]: draft, verify every drafted token in one
//! target pass, emit the kept prefix and the target's own next token, and roll the session back
//! to what was kept.

use std::time::Instant;

use anelm_model::{Executor, Logits, Run};

use super::accept::{judge, Verdict};
use super::drafter::sync;
use super::{Beside, PassTime};
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
        let n = self.draft(feed, spec, Beside::default())?;
        let base = self.session.tokens().len();
        let started = Instant::now();
        let logits = if n == 0 { Logits::Last } else { Logits::All };
        self.session
            .run(exec, &spec.context[base..], logits, &mut self.logits)?;
        let secs = started.elapsed().as_secs_f64();
        spec.observe(n + 1, secs);
        let mut rows = std::mem::take(&mut self.logits);
        let judged = self.judge_pass(exec, spec, n, secs, &mut rows);
        self.logits = rows;
        judged
    }

    /// The first half of a speculative step: `spec.context` becomes the session's tokens, the
    /// fed token and the drafted tokens the target is to verify (in a pass with `beside`'s
    /// runs); returns how many were drafted (zero: a plain step).
    fn draft(&mut self, feed: u32, spec: &mut super::Speculation, beside: Beside) -> Result<usize> {
        let base = self.session.tokens().len();
        // At most `remaining` tokens may still be emitted, one of them the target's own; the
        // session must hold the fed token and every drafted one.
        let remaining = self.max_tokens.saturating_sub(self.usage.completion_tokens);
        let room = self.session.capacity().saturating_sub(base + 1);
        let limit = remaining.saturating_sub(1).min(room);
        let context = &mut spec.context;
        context.clear();
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
                .propose(&spec.context, spec.k.min(limit), &mut spec.proposal)?;
            let class = spec.proposal.class;
            spec.wanted(spec.proposal.tokens.len().min(limit), class, beside)
        } else {
            let k = spec.wanted(limit, 0, beside);
            if k > 0 {
                spec.drafter.propose(&spec.context, k, &mut spec.proposal)?;
            }
            spec.proposal.tokens.len().min(k)
        };
        spec.context.extend_from_slice(&spec.proposal.tokens[..n]);
        spec.estimate = spec.cost_beside(beside, n);
        Ok(n)
    }

    /// The second half: the target has run over `spec.context` past the session's tokens
    /// (which the session now holds, `secs` the pass), its logits `rows` — the last row only
    /// when nothing was drafted, else every row (the sampler may change them). Emits the kept
    /// drafted tokens and the target's own, and rolls the session back to what was kept.
    fn judge_pass(
        &mut self,
        exec: &mut dyn Executor,
        spec: &mut super::Speculation,
        n: usize,
        secs: f64,
        rows: &mut [f32],
    ) -> Result<()> {
        let class = spec.proposal.class;
        self.spec_stats.target_passes += 1;
        if n == 0 {
            spec.record(0, 0, false, class);
            self.draw_from(rows);
            return Ok(());
        }
        let base = spec.context.len() - n - 1;
        let context = std::mem::take(&mut spec.context);
        let proposal = &spec.proposal;
        let vocab = exec.vocab_size();
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
        let judged = self.spec_stats.drafted - drafted_before;
        tracing::trace!(
            "speculative pass at {base}: {n} drafted (class {class}), {judged} judged, {} kept, \
             {:.2} ms (the drafted tokens estimated at {:.2}× the pass without them)",
            kept - 1,
            secs * 1e3,
            spec.estimate
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
            let synced = sync(exec, &mut self.session, &context[..want], &mut self.logits);
            spec.context = context;
            return synced;
        }
        spec.context = context;
        Ok(())
    }

    /// The first half of a batched speculative step: drafts after `feed` and returns the run
    /// to verify ([`Generation::verify_tokens`]: the fed token and the drafted ones, every row
    /// wanted; a single token with its last row when nothing was drafted), or `None` when the
    /// context is full.
    pub(crate) fn batch_draft(&mut self, feed: u32, beside: Beside) -> Result<Option<Run>> {
        if !self.room() {
            return Ok(None);
        }
        let Some(mut spec) = self.speculation.take() else {
            unreachable!("a speculative step needs a drafter");
        };
        let drafted = self.draft(feed, &mut spec, beside);
        self.speculation = Some(spec);
        let n = drafted?;
        Ok(Some(Run {
            len: n + 1,
            logits: n + 1,
        }))
    }

    /// The tokens of the run [`Generation::batch_draft`] returned.
    pub(crate) fn verify_tokens(&self) -> &[u32] {
        let context = self.speculation.as_ref().map_or(&[][..], |s| &s.context);
        &context[self.session.tokens().len().min(context.len())..]
    }

    /// The second half of a batched speculative step: the batched `pass` ran the run
    /// [`Generation::batch_draft`] returned; `rows` are its logits (the sampler may change
    /// them).
    pub(crate) fn batch_judge(
        &mut self,
        exec: &mut dyn Executor,
        rows: &mut [f32],
        pass: PassTime,
    ) -> Result<()> {
        let Some(mut spec) = self.speculation.take() else {
            unreachable!("a speculative step needs a drafter");
        };
        let base = self.session.tokens().len();
        let n = spec.context.len() - base - 1;
        self.session.appended(&spec.context[base..]);
        if pass.timed {
            spec.observe(pass.tokens, pass.secs);
        }
        let result = self.judge_pass(exec, &mut spec, n, pass.secs, rows);
        self.speculation = Some(spec);
        self.step_done();
        result
    }
}
