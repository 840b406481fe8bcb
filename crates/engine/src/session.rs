//! A session: one sequence's KV state and the tokens it holds. Feeding a prompt that extends
//! the cached tokens prefills only the new suffix.

use std::ops::Range;

use anelm_model::{Executor, KvState, Logits};

use crate::error::{EngineError, Result};

/// Tokens per forward pass when prefilling; bounds the activation memory of long prompts.
pub const PREFILL_CHUNK: usize = 512;

/// What one [`Session::prefill_chunk`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillStep {
    /// Prompt tokens the session held when the step began (kept, not recomputed).
    pub reused: usize,
    /// The whole prompt is in, and the logits after it are written.
    pub done: bool,
}

pub struct Session {
    state: Box<dyn KvState>,
    tokens: Vec<u32>,
}

impl Session {
    /// A session holding up to `capacity` positions.
    pub fn new(exec: &dyn Executor, capacity: usize) -> Result<Session> {
        Ok(Session {
            state: exec.new_state(capacity)?,
            tokens: Vec::new(),
        })
    }

    /// The tokens whose keys and values the state holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn capacity(&self) -> usize {
        self.state.capacity()
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Keeps at most the first `len` tokens (fewer when the state cannot go back that far).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.state.truncate(self.tokens.len());
        self.tokens.truncate(self.state.len());
    }

    /// Makes the session hold exactly `prompt` and writes the logits after its last token into
    /// `logits`. Reuses the longest common prefix with the cached tokens (at least one token is
    /// always recomputed, to produce logits); returns how many tokens were reused.
    pub fn prefill(
        &mut self,
        exec: &mut dyn Executor,
        prompt: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<usize> {
        let first = self.prefill_chunk(exec, prompt, logits)?;
        let mut done = first.done;
        while !done {
            done = self.prefill_chunk(exec, prompt, logits)?.done;
        }
        Ok(first.reused)
    }

    /// One step of [`Session::prefill`]: the session takes at most [`PREFILL_CHUNK`] more
    /// tokens of `prompt`, after the longest prefix it already holds; the last chunk writes the
    /// logits after the prompt's last token. Repeated calls complete the prefill, so a caller
    /// can stop, or lend the executor to other work, between the chunks of a long prompt.
    pub fn prefill_chunk(
        &mut self,
        exec: &mut dyn Executor,
        prompt: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<PrefillStep> {
        let (chunk, step) = self.next_chunk(prompt, PREFILL_CHUNK)?;
        let want = if step.done {
            Logits::Last
        } else {
            Logits::None
        };
        self.run(exec, &prompt[chunk], want, logits)?;
        Ok(step)
    }

    /// What the next [`Session::prefill_chunk`] feeds, without feeding it: the session is cut
    /// back to the longest prefix it shares with `prompt`, and the range of `prompt` that comes
    /// next (at most `most` tokens, at most [`PREFILL_CHUNK`]) is returned with the step (a
    /// batched pass feeds it, then [`Session::appended`]).
    pub(crate) fn next_chunk(
        &mut self,
        prompt: &[u32],
        most: usize,
    ) -> Result<(Range<usize>, PrefillStep)> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.capacity() {
            return Err(EngineError::PromptTooLong {
                tokens: prompt.len(),
                capacity: self.capacity(),
            });
        }
        let common = self.common_prefix(prompt);
        // A recurrent state may keep less than asked (it cannot go back): reuse what it kept.
        self.truncate(common.min(prompt.len() - 1));
        let reused = self.tokens.len();
        let end = (reused + most.clamp(1, PREFILL_CHUNK)).min(prompt.len());
        let done = end == prompt.len();
        Ok((reused..end, PrefillStep { reused, done }))
    }

    /// Takes the first `len` tokens of `src` (another session of the same executor) with their
    /// keys and values, copied rather than computed, where the state can
    /// ([`KvState::copy_prefix`]); false, with nothing changed, where it cannot.
    pub fn adopt_prefix(&mut self, src: &mut Session, len: usize) -> bool {
        let len = len.min(src.tokens.len());
        if len <= self.common_prefix(&src.tokens[..len]) {
            return false;
        }
        if !self.state.copy_prefix(src.state.as_mut(), len) {
            return false;
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(&src.tokens[..len]);
        true
    }

    /// How many of `tokens` the session holds at its start.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// The state, for a batched pass that appends one token ([`Session::appended`] records it).
    pub(crate) fn state_mut(&mut self) -> &mut dyn KvState {
        self.state.as_mut()
    }

    /// Records the tokens a batched pass appended to the state.
    pub(crate) fn appended(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        debug_assert_eq!(self.tokens.len(), self.state.len());
    }

    /// Appends `tokens` and writes the requested logits.
    pub fn run(
        &mut self,
        exec: &mut dyn Executor,
        tokens: &[u32],
        want: Logits,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        exec.forward(self.state.as_mut(), tokens, want, logits)?;
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }
}
