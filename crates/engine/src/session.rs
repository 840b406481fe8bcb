//! A session: one sequence's KV state and the tokens it holds. Feeding a prompt that extends
//! the cached tokens prefills only the new suffix.

use anelm_model::{Executor, KvState, Logits};

use crate::error::{EngineError, Result};

/// Tokens per forward pass when prefilling; bounds the activation memory of long prompts.
pub const PREFILL_CHUNK: usize = 512;

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
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.capacity() {
            return Err(EngineError::PromptTooLong {
                tokens: prompt.len(),
                capacity: self.capacity(),
            });
        }
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        self.truncate(common.min(prompt.len() - 1));
        let reused = self.tokens.len();
        let rest = &prompt[reused..];
        let n_chunks = rest.len().div_ceil(PREFILL_CHUNK);
        for (i, chunk) in rest.chunks(PREFILL_CHUNK).enumerate() {
            let want = if i + 1 == n_chunks {
                Logits::Last
            } else {
                Logits::None
            };
            self.run(exec, chunk, want, logits)?;
        }
        Ok(reused)
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
