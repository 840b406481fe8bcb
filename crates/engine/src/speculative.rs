//! Exact speculative decoding (greedy): a small draft model proposes `k` tokens, the target
//! checks them all in one forward pass, and keeps the longest prefix it agrees with plus its own
//! next token. Every kept token is the target's own greedy choice, so the output is exactly the
//! target's greedy output — only faster when the draft guesses well. Both models must share the
//! vocabulary.

use anelm_model::{Executor, Logits};

use crate::error::{EngineError, Result};
use crate::loaded::LoadedModel;
use crate::sampler::argmax;
use crate::session::Session;

/// How a speculative generation went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens the draft proposed.
    pub drafted: usize,
    /// Proposed tokens the target kept.
    pub accepted: usize,
    /// Forward passes of the target after the prompt.
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

/// One model of the pair: its executor and its session.
pub struct Side<'a> {
    pub exec: &'a mut dyn Executor,
    pub session: &'a mut Session,
}

/// Makes `s` hold exactly `tokens`, computing only what it lacks (a recurrent state that had to
/// start over is rebuilt).
fn sync(s: &mut Side<'_>, tokens: &[u32], scratch: &mut Vec<f32>) -> Result<()> {
    let common = s
        .session
        .tokens()
        .iter()
        .zip(tokens)
        .take_while(|(a, b)| a == b)
        .count();
    s.session.truncate(common);
    let have = s.session.tokens().len();
    if have < tokens.len() {
        s.session
            .run(s.exec, &tokens[have..], Logits::None, scratch)?;
    }
    Ok(())
}

/// Generates up to `max_new` tokens after `prompt` with the target's greedy choices, stopping
/// after any id of `stop` (included). `k` tokens are drafted per round. The executors must
/// have as many logits per row (checked); that the ids mean the same tokens is
/// [`same_vocabulary`]'s to check.
pub fn generate_greedy_speculative(
    target: &mut Side<'_>,
    draft: &mut Side<'_>,
    prompt: &[u32],
    max_new: usize,
    k: usize,
    stop: &[u32],
    mut on_token: impl FnMut(u32),
) -> Result<(Vec<u32>, SpecStats)> {
    if k == 0 {
        return Err(EngineError::BadParams(
            "speculative decoding needs k ≥ 1 drafted tokens".into(),
        ));
    }
    if target.exec.vocab_size() != draft.exec.vocab_size() {
        return Err(EngineError::BadParams(format!(
            "the draft's vocabulary ({}) differs from the target's ({})",
            draft.exec.vocab_size(),
            target.exec.vocab_size()
        )));
    }
    let mut stats = SpecStats::default();
    let (mut logits, mut scratch) = (Vec::new(), Vec::new());
    target.session.prefill(target.exec, prompt, &mut logits)?;
    let mut out = Vec::with_capacity(max_new);
    if max_new == 0 {
        return Ok((out, stats));
    }
    // Invariant: both sessions hold `prompt + out[..len - 1]`; the last token of `out` is pending.
    let first = argmax(&logits);
    out.push(first);
    on_token(first);
    let mut context: Vec<u32> = prompt.to_vec();
    while !stop.contains(out.last().expect("out is not empty")) && out.len() < max_new {
        let pending = *out.last().expect("out is not empty");
        sync(draft, &context, &mut scratch)?;
        // Never draft past what the caller wants or the contexts hold.
        let room = (target.session.capacity().min(draft.session.capacity()))
            .saturating_sub(context.len() + 1);
        let k = k.min(max_new - out.len()).min(room);
        let mut proposal = Vec::with_capacity(k);
        let mut feed = pending;
        for _ in 0..k {
            draft
                .session
                .run(draft.exec, &[feed], Logits::Last, &mut logits)?;
            feed = argmax(&logits);
            proposal.push(feed);
        }
        stats.drafted += proposal.len();

        // The target sees the pending token and the proposal in one pass.
        let mut batch = Vec::with_capacity(k + 1);
        batch.push(pending);
        batch.extend_from_slice(&proposal);
        target
            .session
            .run(target.exec, &batch, Logits::All, &mut logits)?;
        stats.target_passes += 1;
        let vocab = target.exec.vocab_size();
        let choice = |i: usize| argmax(&logits[i * vocab..(i + 1) * vocab]);
        let accepted = proposal
            .iter()
            .enumerate()
            .take_while(|&(i, &d)| choice(i) == d)
            .count();
        stats.accepted += accepted;

        let mut kept: Vec<u32> = proposal[..accepted].to_vec();
        kept.push(choice(accepted));
        for &t in &kept {
            if out.len() == max_new {
                break;
            }
            out.push(t);
            on_token(t);
            if stop.contains(&t) {
                break;
            }
        }
        // Everything emitted but the newest token is now context; the target drops what it
        // computed for rejected tokens.
        context.truncate(prompt.len());
        context.extend_from_slice(&out[..out.len() - 1]);
        sync(target, &context, &mut scratch)?;
    }
    Ok((out, stats))
}
