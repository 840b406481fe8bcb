//! The interface between the engine and whatever runs the model (CPU, ANE simulator, ANE).
//! The engine owns the per-sequence state; the executor creates it and knows its layout.

use std::any::Any;

/// Per-sequence state of an executor: the KV cache and its fill level.
pub trait KvState: Any + Send {
    /// Positions already processed.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions the state can hold.
    fn capacity(&self) -> usize;
    /// Forgets every position from `len` on (prefix reuse, speculative rollback). A state that
    /// cannot go back (a recurrent one) may keep fewer positions, down to none: callers read
    /// [`KvState::len`] afterwards.
    fn truncate(&mut self, len: usize);
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last position only.
    Last,
    /// Every position of the batch, in order.
    All,
    /// The last `n` positions of the batch, in order.
    Tail(usize),
}

impl Logits {
    /// Rows of logits a forward pass over `n_tokens` returns.
    pub fn rows(self, n_tokens: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last => n_tokens.min(1),
            Logits::All => n_tokens,
            Logits::Tail(k) => k.min(n_tokens),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("context full: {needed} positions needed, the state holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("state belongs to a different executor")]
    ForeignState,
    #[error("{0}")]
    Device(String),
}

/// A state that names the executor that made it, so that no other executor uses it.
pub trait OwnedState: KvState + Sized {
    /// The id of the executor that made it.
    fn owner(&self) -> usize;
}

/// The checks every forward pass starts with: `state` is an `S` made by executor `owner`,
/// every token is in the vocabulary, and the state has room for them. Returns the state.
pub fn checked_state<'s, S: OwnedState>(
    state: &'s mut dyn KvState,
    owner: usize,
    tokens: &[u32],
    vocab: usize,
) -> Result<&'s mut S, ExecError> {
    let state = state
        .as_any_mut()
        .downcast_mut::<S>()
        .filter(|s| s.owner() == owner)
        .ok_or(ExecError::ForeignState)?;
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ExecError::TokenOutOfRange { id, vocab });
    }
    let needed = state.len() + tokens.len();
    if needed > state.capacity() {
        return Err(ExecError::ContextFull {
            needed,
            capacity: state.capacity(),
        });
    }
    Ok(state)
}

/// Runs a model forward over tokens appended to a state.
pub trait Executor: Send {
    /// A fresh state for up to `capacity` positions.
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError>;

    /// Processes `tokens` at positions `state.len()..`, extends the state, and writes the
    /// requested logits (`vocab` floats per row) into `out`, replacing its contents.
    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError>;

    /// Vocabulary size (length of one logits row).
    fn vocab_size(&self) -> usize;
}
