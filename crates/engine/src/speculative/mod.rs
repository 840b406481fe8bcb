//! Exact speculative decoding: a drafter proposes up to `k` tokens, the target scores them all
//! in one forward pass, and the acceptance rule keeps a prefix of them plus one token of the
//! target's own. Greedy, the output is exactly the target's greedy output; sampling, every
//! token is distributed exactly as the target's sampler would draw it ([`accept`]). It runs in
//! any [`crate::Generation`] ([`crate::Generation::speculate`]), so `run`, `chat` and `serve`
//! share it, on every executor.

mod accept;
mod drafter;
mod step;

pub use accept::{judge, Verdict};
pub use drafter::{DraftModel, Drafter, PromptLookup, Proposal};

use crate::error::{EngineError, Result};
use crate::loaded::LoadedModel;

/// A drafter and at most how many tokens it may propose per target pass.
///
/// How many it is asked for adapts to how it fares: the drafted tokens are kept one after the
/// other with an estimated probability `a` each, and a pass verifying `n` drafted tokens costs
/// `1 + cost·n` plain passes, so `n` maximises the expected tokens per unit of cost,
/// `(1 − aⁿ⁺¹) / (1 − a) / (1 + cost·n)` — zero (a plain step) when drafting does not pay,
/// with a one-token probe now and then to notice when it starts to. The schedule depends only
/// on what was accepted, so seeded runs stay reproducible.
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    pub k: usize,
    /// The cost of one more token in a verifying pass, relative to a plain pass.
    pub cost: f64,
    /// Decayed counts of accepted tokens and of rejections (the estimate of `a`).
    accepted: f64,
    rejected: f64,
    /// Plain steps since the last drafted pass.
    idle: usize,
    pub(crate) proposal: Proposal,
}

/// A verifying pass of the CPU engine on a small model costs about this much more per drafted
/// token than a one-token pass (measured: SmolLM2 135M, 9 tokens ≈ 2.4 × 1 token).
pub const DEFAULT_COST: f64 = 0.2;
/// Weight of the past in the acceptance estimate, per pass.
const DECAY: f64 = 0.9;
/// Plain steps after which one token is drafted again to refresh the estimate.
const PROBE_AFTER: usize = 8;

impl Speculation {
    /// Refuses k = 0 (nothing would ever be drafted).
    pub fn new(drafter: Box<dyn Drafter>, k: usize) -> Result<Speculation> {
        if k == 0 {
            return Err(EngineError::BadParams(
                "speculative decoding needs k ≥ 1 drafted tokens per pass".into(),
            ));
        }
        Ok(Speculation {
            drafter,
            k,
            cost: DEFAULT_COST,
            accepted: 1.0,
            rejected: 0.5,
            idle: 0,
            proposal: Proposal::default(),
        })
    }

    /// The estimated probability that a drafted token is kept.
    pub fn acceptance_estimate(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// How many tokens to ask the drafter for now (at most `limit`).
    pub(crate) fn wanted(&mut self, limit: usize) -> usize {
        let (a, cost) = (self.acceptance_estimate(), self.cost.max(0.0));
        let (mut best, mut best_gain, mut kept, mut emitted) = (0, 1.0, 1.0, 1.0);
        for n in 1..=self.k.min(limit) {
            kept *= a;
            emitted += kept;
            let gain = emitted / (1.0 + cost * n as f64);
            if gain > best_gain {
                (best, best_gain) = (n, gain);
            }
        }
        if best == 0 && limit > 0 && self.idle >= PROBE_AFTER {
            best = 1;
        }
        best
    }

    /// Takes the outcome of a pass that drafted `drafted` tokens and kept `accepted`;
    /// `rejected`: whether one was refused (not merely cut by the end of the generation).
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize, rejected: bool) {
        if drafted == 0 {
            self.idle += 1;
            return;
        }
        self.idle = 0;
        self.accepted = DECAY * self.accepted + accepted as f64;
        self.rejected = DECAY * self.rejected + f64::from(u8::from(rejected));
    }
}

/// How a speculative generation went (all zero without speculation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens the drafter proposed.
    pub drafted: usize,
    /// Proposed tokens the target kept.
    pub accepted: usize,
    /// Forward passes of the target after the prompt (verifying passes and plain steps).
    pub target_passes: usize,
}

impl SpecStats {
    /// Share of drafted tokens the target kept.
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Whether `draft` may draft for `target`: the same number of tokens and, where both have a
/// tokenizer, the same token behind every id (its bytes and whether it is special). Models
/// without a tokenizer (ids given directly) are compared by size alone.
pub fn same_vocabulary(target: &LoadedModel, draft: &LoadedModel) -> Result<()> {
    let (nt, nd) = (
        target.model.config.vocab_size,
        draft.model.config.vocab_size,
    );
    if nt != nd {
        return Err(EngineError::BadParams(format!(
            "the draft's vocabulary has {nd} tokens, the target's {nt}: they must be the same"
        )));
    }
    let (Some(t), Some(d)) = (&target.tokenizer, &draft.tokenizer) else {
        return Ok(());
    };
    if t.vocab_size() != d.vocab_size() {
        return Err(EngineError::BadParams(format!(
            "the draft's tokenizer has {} tokens, the target's {}: they must be the same",
            d.vocab_size(),
            t.vocab_size()
        )));
    }
    for id in 0..t.vocab_size() as u32 {
        let (a, b) = (t.token_to_piece(id), d.token_to_piece(id));
        if a != b || t.is_special(id) != d.is_special(id) {
            return Err(EngineError::BadParams(format!(
                "the draft's vocabulary differs from the target's at id {id} ({:?} vs {:?}): it cannot draft for it",
                String::from_utf8_lossy(&b),
                String::from_utf8_lossy(&a)
            )));
        }
    }
    Ok(())
}
