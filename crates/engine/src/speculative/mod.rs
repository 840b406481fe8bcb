//! Exact speculative decoding: a drafter proposes up to `k` tokens, the target scores them all
//! in one forward pass, and the acceptance rule keeps a prefix of them plus one token of the
//! target's own. Greedy, the output is exactly the target's greedy output; sampling, every
//! token is distributed exactly as the target's sampler would draw it ([`accept`]). It runs in
//! any [`crate::Generation`] ([`crate::Generation::speculate`]), so `run`, `chat` and `serve`
//! share it, on every executor.

mod accept;
mod cost;
mod drafter;
mod step;

pub use accept::{judge, Verdict};
use cost::PassCost;
pub use drafter::{DraftModel, Drafter, PromptLookup, Proposal, CLASSES};

use crate::error::{EngineError, Result};
use crate::loaded::LoadedModel;

/// A drafter and at most how many tokens it may propose per target pass.
///
/// How many it is asked for adapts to how it fares: the drafted tokens are kept one after the
/// other with an estimated probability `a` each, and a pass verifying `n` drafted tokens costs
/// `c(n)` plain passes, so `n` maximises the expected tokens per unit of cost,
/// `(1 − aⁿ⁺¹) / (1 − a) / c(n)` — zero (a plain step) when drafting does not pay,
/// with a one-token probe now and then to notice when it starts to. `a` is estimated per
/// confidence class of the proposals ([`Proposal::class`]: prompt lookup's matched length), so
/// a long match drafts far while a single-token match drafts little or nothing. `c(n)` is
/// learnt from the target's own pass times ([`cost`]) unless the draws are seeded: there it is
/// `1 + DEFAULT_COST·n`, so that the schedule depends only on what was accepted and seeded runs
/// stay reproducible.
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    pub k: usize,
    /// What passes cost by their length.
    cost: PassCost,
    /// Whether `cost` learns from timings (off for seeded sampling).
    pub(crate) timed: bool,
    /// Whether the cost was fixed by [`Speculation::fix_cost`] (never timed).
    fixed: bool,
    /// Per class, decayed counts of accepted tokens and of rejections (the estimate of `a`).
    counts: [(f64, f64); CLASSES],
    /// Plain steps since the last drafted pass.
    idle: usize,
    /// Plain steps after which a poor estimate is probed: doubled by each probe that keeps
    /// nothing (up to [`PROBE_MAX`]), back to [`PROBE_AFTER`] once a drafted token is kept.
    probe_after: usize,
    /// Whether the pass in progress is such a probe.
    probing: bool,
    pub(crate) proposal: Proposal,
    /// The tokens of the pass in progress: the session's, the fed token, the drafted ones.
    pub(crate) context: Vec<u32>,
    /// What its drafted tokens were estimated to cost, relative to the pass without them.
    pub(crate) estimate: f64,
}

/// The other runs of a batched pass, as a speculative generation weighs its drafting: their
/// tokens, and how many of them emit a token (decoding sequences; not a prompt's chunk).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Beside {
    pub tokens: usize,
    pub emitting: usize,
}

/// A batched pass as the speculative generations in it see it: its time, its tokens in all,
/// and whether they may learn pass costs from it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PassTime {
    pub secs: f64,
    pub tokens: usize,
    pub timed: bool,
}

/// Before timings (and always for seeded draws), a verifying pass is taken to cost this much
/// more per drafted token than a one-token pass (the CPU engine on SmolLM2 135M where its
/// weights stay in cache: 9 tokens ≈ 2.4 × 1 token).
pub const DEFAULT_COST: f64 = 0.2;
/// Weight of the past in the acceptance estimate, per pass.
const DECAY: f64 = 0.9;
/// Plain steps after which one token is drafted again to refresh the estimate, at first.
const PROBE_AFTER: usize = 8;
/// The longest wait between probes of a text the drafter keeps missing.
const PROBE_MAX: usize = 64;
/// Accepted tokens and rejections assumed before any pass (an estimate of 2/3).
const PRIOR: (f64, f64) = (1.0, 0.5);

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
            cost: PassCost::new(DEFAULT_COST, k + 1),
            timed: true,
            fixed: false,
            counts: [PRIOR; CLASSES],
            idle: 0,
            probe_after: PROBE_AFTER,
            probing: false,
            proposal: Proposal::default(),
            context: Vec::new(),
            estimate: 1.0,
        })
    }

    /// The estimated probability that a drafted token of confidence `class` is kept.
    pub fn acceptance_estimate(&self, class: usize) -> f64 {
        let (accepted, rejected) = self.counts[class.min(CLASSES - 1)];
        accepted / (accepted + rejected)
    }

    /// The per-token cost assumed before timings, or always when `timed` is off.
    pub fn set_default_cost(&mut self, cost: f64) {
        self.cost.set_default(cost.max(0.0));
    }

    /// Takes a verifying pass to cost `1 + cost · drafted` plain passes, always, instead of
    /// learning it from the target's pass times: a schedule that depends on the tokens alone
    /// (where wall time says nothing of the device, as on the simulator, or in tests).
    pub fn fix_cost(&mut self, cost: f64) {
        self.set_default_cost(cost);
        (self.fixed, self.timed) = (true, false);
    }

    /// Whether the next attachment may learn costs from timings.
    pub(crate) fn may_time(&self) -> bool {
        !self.fixed
    }

    /// What a pass verifying `drafted` tokens costs relative to a plain pass.
    pub fn relative_cost(&self, drafted: usize) -> f64 {
        self.cost_beside(Beside::default(), drafted)
    }

    /// What `drafted` tokens add to a pass that holds the fed token and `beside`'s.
    fn cost_beside(&self, beside: Beside, drafted: usize) -> f64 {
        if self.timed {
            self.cost.relative(1 + beside.tokens, drafted)
        } else {
            self.cost.fixed(1, drafted)
        }
    }

    /// A pass of the target over `tokens` tokens took `secs`.
    pub(crate) fn observe(&mut self, tokens: usize, secs: f64) {
        if self.timed {
            self.cost.observe(tokens, secs);
        }
    }

    /// How many drafted tokens of confidence `class` to verify now (at most `limit`), in a
    /// pass with `beside`'s runs: the most tokens the pass emits per unit of its cost. Beside
    /// other sequences the pass's fixed cost is shared already, so drafting pays less. A
    /// fixed cost (seeded draws) ignores `beside`: a batch does not change such a schedule.
    pub(crate) fn wanted(&mut self, limit: usize, class: usize, beside: Beside) -> usize {
        let a = self.acceptance_estimate(class);
        let beside = if self.timed {
            beside
        } else {
            Beside::default()
        };
        let others = beside.emitting as f64;
        let (mut best, mut best_gain, mut kept, mut emitted) = (0, 1.0 + others, 1.0, 1.0);
        for n in 1..=self.k.min(limit) {
            kept *= a;
            emitted += kept;
            let gain = (others + emitted) / self.cost_beside(beside, n);
            if gain > best_gain {
                (best, best_gain) = (n, gain);
            }
        }
        self.probing = best == 0 && limit > 0 && self.idle >= self.probe_after;
        if self.probing {
            best = 1;
        }
        best
    }

    /// Takes the outcome of a pass that drafted `drafted` tokens of confidence `class` and
    /// kept `accepted`; `rejected`: whether one was refused (not merely cut by the end of the
    /// generation).
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize, rejected: bool, class: usize) {
        if drafted == 0 {
            self.idle += 1;
            return;
        }
        self.idle = 0;
        if accepted > 0 {
            self.probe_after = PROBE_AFTER;
        } else if self.probing {
            self.probe_after = (2 * self.probe_after).min(PROBE_MAX);
        }
        self.probing = false;
        let (acc, rej) = &mut self.counts[class.min(CLASSES - 1)];
        *acc = DECAY * *acc + accepted as f64;
        *rej = DECAY * *rej + f64::from(u8::from(rejected));
    }
}

/// How a speculative generation went (all zero without speculation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens the drafter proposed that the target judged (not those drafted past the token
    /// that ended the generation).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(k: usize) -> Speculation {
        Speculation::new(Box::new(PromptLookup::default()), k).unwrap()
    }

    #[test]
    fn each_class_learns_its_own_acceptance() {
        let mut s = lookup(8);
        s.timed = false;
        // Matches of one token are always refused, of three always kept.
        for _ in 0..20 {
            s.record(2, 0, true, 1);
            s.record(8, 8, false, 3);
        }
        assert!(s.acceptance_estimate(1) < 0.1);
        assert!(s.acceptance_estimate(3) > 0.9);
        assert_eq!(
            s.wanted(8, 1, Beside::default()),
            0,
            "a poor class is not verified"
        );
        assert_eq!(
            s.wanted(8, 3, Beside::default()),
            8,
            "a good class drafts all it may"
        );
        assert_eq!(s.wanted(5, 3, Beside::default()), 5, "within the limit");
        // An unseen class keeps the prior.
        assert!((s.acceptance_estimate(2) - 2.0 / 3.0).abs() < 1e-12);
        // Classes past the last are folded into it.
        assert_eq!(
            s.acceptance_estimate(CLASSES + 3),
            s.acceptance_estimate(CLASSES - 1)
        );
    }

    #[test]
    fn a_poor_class_is_probed_ever_more_rarely_while_probes_keep_nothing() {
        let mut s = lookup(4);
        s.timed = false;
        for _ in 0..20 {
            s.record(2, 0, true, 1);
        }
        // Plain steps until the next probe, which drafts one token.
        let until_probe = |s: &mut Speculation| {
            let mut gap = 0;
            loop {
                match s.wanted(4, 1, Beside::default()) {
                    0 => s.record(0, 0, false, 1),
                    n => {
                        assert_eq!(n, 1, "one token probes the estimate");
                        return gap;
                    }
                }
                gap += 1;
                assert!(gap <= PROBE_MAX, "no probe within {PROBE_MAX} steps");
            }
        };
        // While every probe misses: 8, 16, 32, then 64 at most.
        let gaps: Vec<usize> = (0..6)
            .map(|_| {
                let gap = until_probe(&mut s);
                s.record(1, 0, true, 1);
                gap
            })
            .collect();
        assert_eq!(gaps, [PROBE_AFTER, 16, 32, 64, 64, 64]);
        // A probe that keeps its token brings the next one back to the first wait.
        until_probe(&mut s);
        s.record(1, 1, false, 1);
        assert_eq!(until_probe(&mut s), PROBE_AFTER);
    }

    /// A lookup of k = 8 whose class-0 acceptance estimate is about 0.6.
    fn accepting_about_60_percent() -> Speculation {
        let mut s = lookup(8);
        for _ in 0..10 {
            s.record(3, 3, true, 0);
            s.record(3, 1, true, 0);
        }
        s
    }

    #[test]
    fn cheap_passes_draft_further() {
        // Acceptance 0.6: at 0.2 per drafted token a few tokens pay; where a pass of nine
        // tokens costs what one does, all of them do.
        let mut s = accepting_about_60_percent();
        let a = s.acceptance_estimate(0);
        assert!((0.5..0.75).contains(&a), "{a}");
        s.timed = false;
        let fixed = s.wanted(8, 0, Beside::default());
        assert!((1..8).contains(&fixed), "{fixed}");
        s.timed = true;
        for n in [1, 4, 9] {
            s.observe(n, 0.010 + 0.0001 * n as f64);
        }
        assert_eq!(s.wanted(8, 0, Beside::default()), 8);
        // Timings ignored when the schedule must not depend on them.
        s.timed = false;
        assert_eq!(s.wanted(8, 0, Beside::default()), fixed);
    }

    #[test]
    fn beside_a_batch_drafting_pays_less() {
        // Weights in cache: a pass costs 1 ms plus 1 ms a token. Alone, drafting at an
        // acceptance of 0.6 pays; beside seven decoding sequences the pass's fixed cost is
        // shared already and it does not.
        let mut s = accepting_about_60_percent();
        for n in [1, 2, 5, 8, 12] {
            s.observe(n, 0.001 + 0.001 * n as f64);
        }
        assert!(s.wanted(8, 0, Beside::default()) >= 1);
        let batch = Beside {
            tokens: 7,
            emitting: 7,
        };
        assert_eq!(s.wanted(8, 0, batch), 0);
        // Memory-bound (a pass costs about the same whatever its tokens): draft beside them too.
        for _ in 0..10 {
            for n in [1, 4, 8, 12, 16] {
                s.observe(n, 0.010 + 0.0001 * n as f64);
            }
        }
        assert!(s.wanted(8, 0, batch) >= 4, "{}", s.wanted(8, 0, batch));
        // A fixed cost gives the same schedule beside a batch as alone.
        s.fix_cost(0.2);
        assert_eq!(s.wanted(8, 0, batch), s.wanted(8, 0, Beside::default()));
    }

    #[test]
    fn a_fixed_cost_ignores_timings_and_stays_fixed() {
        let mut s = lookup(8);
        s.fix_cost(2.0);
        assert!(!s.may_time() && !s.timed);
        assert_eq!(s.relative_cost(3), 7.0);
        // Passes of any length taking the same time would make drafting free if learnt.
        for n in [1, 4, 9] {
            s.observe(n, 0.010);
        }
        assert_eq!(s.relative_cost(3), 7.0);
        assert!(lookup(8).may_time());
    }
}
