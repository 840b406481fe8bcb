//! A fake executor whose logits are a function of the token history, for tests of everything
//! above executors (generation, batching, speculative decoding, servers): one implementation,
//! not one per test file.

use std::any::Any;
use std::sync::{Arc, Mutex};

use anelm_model::{ExecError, Executor, KvState, Logits};

/// The state of a [`FnExec`]: the tokens seen.
pub struct TokenState {
    pub tokens: Vec<u32>,
    capacity: usize,
}

impl KvState for TokenState {
    fn len(&self) -> usize {
        self.tokens.len()
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Writes the logits row after `history` (every token so far, the newest last) into `row`
/// (zeroed, `vocab` long).
pub type RowFn = dyn Fn(&[u32], &mut [f32]) + Send;

/// An executor with `vocab` logits per row given by a function of the history. Records the
/// number of tokens of every forward pass.
pub struct FnExec {
    vocab: usize,
    row: Box<RowFn>,
    pub passes: Arc<Mutex<Vec<usize>>>,
}

impl FnExec {
    pub fn new(vocab: usize, row: impl Fn(&[u32], &mut [f32]) + Send + 'static) -> FnExec {
        FnExec {
            vocab,
            row: Box::new(row),
            passes: Arc::default(),
        }
    }
}

impl Executor for FnExec {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        Ok(Box::new(TokenState {
            tokens: Vec::new(),
            capacity,
        }))
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let st = state
            .as_any_mut()
            .downcast_mut::<TokenState>()
            .ok_or(ExecError::ForeignState)?;
        if st.tokens.len() + tokens.len() > st.capacity {
            return Err(ExecError::ContextFull {
                needed: st.tokens.len() + tokens.len(),
                capacity: st.capacity,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(ExecError::TokenOutOfRange {
                id,
                vocab: self.vocab,
            });
        }
        st.tokens.extend_from_slice(tokens);
        self.passes.lock().unwrap().push(tokens.len());
        let rows = logits.rows(tokens.len());
        out.clear();
        out.resize(rows * self.vocab, 0.0);
        let len = st.tokens.len();
        for (r, row) in out.chunks_exact_mut(self.vocab).enumerate() {
            (self.row)(&st.tokens[..len - rows + r + 1], row);
        }
        Ok(())
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }
}

/// What [`Around`] runs instead of its inner executor's `forward`: it gets the inner executor
/// and the call's arguments.
pub type ForwardFn = dyn FnMut(
        &mut dyn Executor,
        &mut dyn KvState,
        &[u32],
        Logits,
        &mut Vec<f32>,
    ) -> Result<(), ExecError>
    + Send;

/// A real executor with its `forward` wrapped (to fail at some call, to count calls), everything
/// else passed through. Its `forward_runs` is the trait's default, so it also stands for an
/// executor that batches nothing itself.
pub struct Around {
    inner: Box<dyn Executor>,
    forward: Box<ForwardFn>,
}

impl Around {
    pub fn new(
        inner: impl Executor + 'static,
        forward: impl FnMut(
                &mut dyn Executor,
                &mut dyn KvState,
                &[u32],
                Logits,
                &mut Vec<f32>,
            ) -> Result<(), ExecError>
            + Send
            + 'static,
    ) -> Around {
        Around {
            inner: Box::new(inner),
            forward: Box::new(forward),
        }
    }

    /// Every call passed through unchanged.
    pub fn plain(inner: impl Executor + 'static) -> Around {
        Around::new(inner, |e, state, tokens, logits, out| {
            e.forward(state, tokens, logits, out)
        })
    }

    /// Fails with a device error from the `fail_at`-th forward pass on (counting from 1), as a
    /// device that stops working does.
    pub fn failing_from(inner: impl Executor + 'static, fail_at: usize) -> Around {
        let mut calls = 0;
        Around::new(inner, move |e, state, tokens, logits, out| {
            calls += 1;
            if calls >= fail_at {
                return Err(ExecError::Device("fake: evaluating chunk0: refused".into()));
            }
            e.forward(state, tokens, logits, out)
        })
    }
}

impl Executor for Around {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        self.inner.new_state(capacity)
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        (self.forward)(self.inner.as_mut(), state, tokens, logits, out)
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
}
