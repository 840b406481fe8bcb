//! Drafters: what proposes the tokens the target then verifies in one pass. A small model of
//! the same vocabulary ([`DraftModel`]), or the text itself ([`PromptLookup`]: the tokens that
//! followed the last occurrence of the current n-gram — free, and strong when the answer
//! repeats its input: summaries, edits, code).

use anelm_model::{Executor, Logits};

use crate::error::Result;
use crate::sampler::{Prob, Sampler, SamplingParams};
use crate::session::Session;

/// What a drafter proposed.
#[derive(Clone, Debug, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// The distribution each token was drawn from, one per token; empty when the drafter is
    /// deterministic (each token a point mass).
    pub dists: Vec<Vec<Prob>>,
    /// How much the drafter trusts it, as a small class number (prompt lookup: the length of
    /// the matched n-gram): the scheduler keeps an acceptance estimate per class, below
    /// [`CLASSES`].
    pub class: usize,
}

/// Confidence classes a drafter may report (larger ones are folded into the last).
pub const CLASSES: usize = 8;

impl Proposal {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.dists.clear();
        self.class = 0;
    }
}

pub trait Drafter: Send {
    /// Called once when the drafter is attached to a generation, with its sampling settings.
    fn start(&mut self, _params: &SamplingParams) {}

    /// Proposes at most `k` tokens to follow `context` (everything so far: the prompt and the
    /// generated tokens, the newest last). Proposing none is allowed (a plain step follows).
    fn propose(&mut self, context: &[u32], k: usize, out: &mut Proposal) -> Result<()>;

    /// For logs: "draft model", "prompt lookup".
    fn name(&self) -> &'static str;

    /// Whether proposing costs next to nothing (no model runs): the scheduler then asks for as
    /// many tokens as it may use and decides from the proposal's class how many to verify.
    fn free(&self) -> bool {
        false
    }

    /// The number of logits of the draft model behind it, if any.
    fn vocab_size(&self) -> Option<usize> {
        None
    }
}

/// A smaller model of the same vocabulary ([`crate::same_vocabulary`]) on its own executor.
/// Greedy targets get its greedy tokens; sampling targets get tokens drawn from its own
/// distribution with the same settings (any draft law is exact; a close one is fast).
pub struct DraftModel {
    exec: Box<dyn Executor>,
    session: Session,
    sampler: Sampler,
    logits: Vec<f32>,
}

impl DraftModel {
    pub fn new(exec: Box<dyn Executor>, capacity: usize) -> Result<DraftModel> {
        let session = Session::new(exec.as_ref(), capacity)?;
        Ok(DraftModel {
            exec,
            session,
            sampler: Sampler::new(SamplingParams::greedy()),
            logits: Vec::new(),
        })
    }
}

/// Makes `session` hold exactly `tokens`, computing only what it lacks (a recurrent state
/// that had to start over is rebuilt).
pub(crate) fn sync(
    exec: &mut dyn Executor,
    session: &mut Session,
    tokens: &[u32],
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let common = session
        .tokens()
        .iter()
        .zip(tokens)
        .take_while(|(a, b)| a == b)
        .count();
    session.truncate(common);
    let have = session.tokens().len();
    if have < tokens.len() {
        session.run(exec, &tokens[have..], Logits::None, scratch)?;
    }
    Ok(())
}

impl Drafter for DraftModel {
    fn start(&mut self, params: &SamplingParams) {
        // Its own stream of draws: the target's seed shifted, so runs stay reproducible.
        let seed = params.seed.map(|s| s ^ 0x9e37_79b9_7f4a_7c15);
        self.sampler = Sampler::new(SamplingParams {
            seed,
            ..params.clone()
        });
    }

    fn propose(&mut self, context: &[u32], k: usize, out: &mut Proposal) -> Result<()> {
        out.clear();
        let Some((&pending, before)) = context.split_last() else {
            return Ok(());
        };
        let room = self.session.capacity().saturating_sub(context.len());
        let k = k.min(room);
        if k == 0 {
            return Ok(());
        }
        sync(
            self.exec.as_mut(),
            &mut self.session,
            before,
            &mut self.logits,
        )?;
        let mut feed = pending;
        for _ in 0..k {
            self.session
                .run(self.exec.as_mut(), &[feed], Logits::Last, &mut self.logits)?;
            self.sampler.adjust(&mut self.logits, self.session.tokens());
            let mut dist = Vec::new();
            self.sampler.distribution(&self.logits, &mut dist);
            feed = self.sampler.draw(&dist);
            out.tokens.push(feed);
            out.dists.push(dist);
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "draft model"
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.exec.vocab_size())
    }
}

/// Prompt lookup decoding: the longest recent n-gram (`max_ngram` down to `min_ngram` tokens)
/// that ends the context and occurred before proposes the tokens that followed it then. The
/// proposal's class is the matched length: a match of three tokens is kept far more often than
/// a match of one, and the scheduler learns how much more.
#[derive(Clone, Debug)]
pub struct PromptLookup {
    pub min_ngram: usize,
    pub max_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup {
            min_ngram: 1,
            max_ngram: 3,
        }
    }
}

impl PromptLookup {
    /// Where the continuation of the latest earlier occurrence of `context`'s last `n` tokens
    /// starts.
    fn continuation(context: &[u32], n: usize) -> Option<usize> {
        let len = context.len();
        if n == 0 || len <= n {
            return None;
        }
        let suffix = &context[len - n..];
        (0..len - n)
            .rev()
            .find(|&i| &context[i..i + n] == suffix)
            .map(|i| i + n)
    }
}

impl Drafter for PromptLookup {
    fn propose(&mut self, context: &[u32], k: usize, out: &mut Proposal) -> Result<()> {
        out.clear();
        if k == 0 {
            return Ok(());
        }
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if let Some(start) = Self::continuation(context, n) {
                let end = (start + k).min(context.len());
                out.tokens.extend_from_slice(&context[start..end]);
                out.class = n.min(CLASSES - 1);
                return Ok(());
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "prompt lookup"
    }

    fn free(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_longest_match() {
        let mut l = PromptLookup::default();
        let mut p = Proposal::default();
        // "1 2 3 4 5 ... 1 2 3" → "4 5 6"
        let ctx = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3];
        l.propose(&ctx, 3, &mut p).unwrap();
        assert_eq!(p.tokens, [4, 5, 6]);
        assert!(p.dists.is_empty());
        assert_eq!(p.class, 3, "the matched length is the class");
        // The latest occurrence wins: "7 8" followed by 1 then by 2.
        let ctx = [7, 8, 1, 7, 8, 2, 7, 8];
        l.propose(&ctx, 2, &mut p).unwrap();
        assert_eq!(p.tokens, [2, 7]);
        // Nothing repeats: nothing proposed; k bounds the proposal.
        l.propose(&[1, 2, 3], 4, &mut p).unwrap();
        assert!(p.tokens.is_empty());
        l.propose(&[5, 6, 5, 6, 5], 1, &mut p).unwrap();
        assert_eq!(p.tokens, [6]);
        assert_eq!(p.class, 3);
        l.propose(&[5, 6, 7, 5], 4, &mut p).unwrap();
        assert_eq!((p.tokens.as_slice(), p.class), ([6, 7, 5].as_slice(), 1));
        l.propose(&[5, 6, 5, 6, 5], 0, &mut p).unwrap();
        assert!(p.tokens.is_empty());
    }
}
