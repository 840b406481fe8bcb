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
    /// Makes this state hold the first `len` positions of `src` (another state of the same
    /// executor), as if it had computed them: a new sequence that shares a prefix with another
    /// one (a system prompt) skips its prefill. False, with nothing changed, where the state
    /// cannot (the default: the caller prefills instead).
    fn copy_prefix(&mut self, _src: &mut dyn KvState, _len: usize) -> bool {
        false
    }
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

/// One sequence's part of a pass of runs ([`Executor::forward_runs`]): `len` tokens appended
/// to its state, and the logits after the last `logits` of them wanted — one for a decode
/// token or a prompt's last chunk, none for a chunk inside a prompt, the whole run for a
/// verifying pass of drafted tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub len: usize,
    pub logits: usize,
}

impl Run {
    /// A run of `len` tokens with the logits after its last one.
    pub fn last(len: usize) -> Run {
        Run { len, logits: 1 }
    }

    /// The same selection as a [`Logits`] of a single sequence's pass.
    pub fn selection(self) -> Logits {
        match self.logits {
            0 => Logits::None,
            1 => Logits::Last,
            n if n >= self.len => Logits::All,
            n => Logits::Tail(n),
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
    #[error("a batch of {states} states was given {tokens} tokens (one each)")]
    BatchMismatch { states: usize, tokens: usize },
    #[error(
        "a pass of {states} states was given {runs} runs of {tokens} tokens in all \
         (one run of at least one token per state, covering the tokens, wanting at most its \
         own tokens' logits)"
    )]
    RunMismatch {
        states: usize,
        runs: usize,
        tokens: usize,
    },
    #[error("{0}")]
    Device(String),
    #[error("this executor cannot {0}")]
    Unsupported(&'static str),
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

/// A router's top-k boundary narrower than this (the gap between the k-th and the (k+1)-th
/// logit over the largest |logit|, at least 1) is a near-tie: a whole expert's contribution
/// hangs on rounding, and either choice is right — the fp16 path's own relative error is 5e-3
/// to 1.3e-2 on the tiny mixtures (measured on their 150-token prompt and greedy steps in the
/// fused strategy, 2026-12-05: of 12 positions where the device's choice flipped, 10 had
/// reference gaps below this, 2 had 1.1e-2 and 1.3e-2; 7 to 14 % of tokens fall below it).
pub const ROUTE_NEAR_TIE: f32 = 1e-2;

/// The experts one mixture chose for one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteChoice {
    /// The token's position in its sequence.
    pub position: usize,
    pub layer: usize,
    /// Ascending.
    pub experts: Vec<usize>,
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

    /// One decode step of several sequences at once: `tokens[i]` is appended to `states[i]`
    /// and `out` gets the logits after it, one row of `vocab` floats per sequence, in order,
    /// replacing its contents. Each row is what [`Executor::forward`] of that token alone gives
    /// (bit for bit); an executor that batches reads its weights once for all of them. The
    /// default runs the sequences one after the other. On an error no state has advanced,
    /// unless the executor failed mid-step (a device error), which may leave earlier states
    /// advanced: callers check [`KvState::len`].
    fn forward_batch(
        &mut self,
        states: &mut [&mut dyn KvState],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        check_batch(states, tokens, self.vocab_size())?;
        forward_each(self, states, tokens, out)
    }

    /// One pass of several sequences, each appending a run of tokens (a decode token, a chunk
    /// of a prompt, a verifying pass's drafted tokens): the `runs[i].len` tokens of `tokens`
    /// that follow the earlier runs go to `states[i]`, and `out` gets the logits after the last
    /// `runs[i].logits` tokens of each run, rows of `vocab` floats, in order, replacing its
    /// contents. Each row is what [`Executor::forward`] of that run alone gives (bit for bit);
    /// an executor that batches reads its weights once for all the tokens. The default runs the
    /// one-token runs as one [`Executor::forward_batch`] step and each longer run by itself. On
    /// an error no state has advanced, unless the executor failed mid-step (see
    /// [`Executor::forward_batch`]).
    fn forward_runs(
        &mut self,
        states: &mut [&mut dyn KvState],
        runs: &[Run],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let vocab = self.vocab_size();
        check_runs(states, runs, tokens, vocab)?;
        let mut singles: Vec<&mut dyn KvState> = Vec::new();
        let mut single_tokens = Vec::new();
        let mut at = 0;
        for (s, run) in states.iter_mut().zip(runs) {
            if run.len == 1 {
                singles.push(&mut **s);
                single_tokens.push(tokens[at]);
            }
            at += run.len;
        }
        let mut batch = Vec::new();
        if !singles.is_empty() {
            self.forward_batch(&mut singles, &single_tokens, &mut batch)?;
        }
        drop(singles);
        out.clear();
        let (mut rows, mut next_single, mut at) = (Vec::new(), 0, 0);
        for (s, run) in states.iter_mut().zip(runs) {
            if run.len == 1 {
                if run.logits == 1 {
                    out.extend_from_slice(&batch[next_single * vocab..(next_single + 1) * vocab]);
                }
                next_single += 1;
            } else {
                let toks = &tokens[at..at + run.len];
                self.forward(&mut **s, toks, run.selection(), &mut rows)?;
                out.extend_from_slice(&rows);
            }
            at += run.len;
        }
        Ok(())
    }

    /// Like [`Executor::forward`], but writes the final-normed hidden state of every token
    /// (`hidden_size` floats per row, token-major) instead of logits: what embeddings pool.
    /// Executors that cannot give them refuse with [`ExecError::Unsupported`].
    fn hidden_states(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let _ = (state, tokens, out);
        Err(ExecError::Unsupported("give hidden states"))
    }

    /// Per token of the last call (in order; a batch step's one per sequence), how near its
    /// mixtures' expert choices came to another: the narrowest gap between the k-th and the
    /// (k+1)-th router logit over the largest |logit|, across the model's mixtures. Empty when
    /// the model has none or the executor does not record them. Comparisons with other
    /// arithmetic treat a small gap as a near-tie: a choice rounding elsewhere may flip.
    fn route_gaps(&self) -> &[f32] {
        &[]
    }

    /// The expert choices at router near-ties ([`ROUTE_NEAR_TIE`]) of the tokens the last call
    /// ran, by position in their sequence then layer (a single sequence's call; empty for a
    /// batch step, without mixtures, or where the executor does not record them).
    fn tied_routes(&self) -> &[RouteChoice] {
        &[]
    }

    /// From now on, wherever `routes` names a position and layer this executor runs, choose
    /// those experts instead of its own (their weights its own router's): verify's teacher
    /// forcing of the reference's near-tied choices, so that the comparison measures
    /// arithmetic rather than which of two right choices rounding fell on. An empty list ends
    /// it. False (and nothing changes) where the executor cannot follow them.
    fn force_routes(&mut self, routes: &[RouteChoice]) -> bool {
        let _ = routes;
        false
    }

    /// Vocabulary size (length of one logits row).
    fn vocab_size(&self) -> usize;
}

/// A batch step as one [`Executor::forward`] per sequence, the rows in order into `out` (the
/// default [`Executor::forward_batch`], and an executor's way when it cannot batch).
pub fn forward_each<E: Executor + ?Sized>(
    exec: &mut E,
    states: &mut [&mut dyn KvState],
    tokens: &[u32],
    out: &mut Vec<f32>,
) -> Result<(), ExecError> {
    out.clear();
    let mut row = Vec::new();
    for (state, &token) in states.iter_mut().zip(tokens) {
        exec.forward(&mut **state, &[token], Logits::Last, &mut row)?;
        out.extend_from_slice(&row);
    }
    Ok(())
}

/// The checks of [`Executor::forward_runs`] that need no executor: a run of at least one token
/// per state wanting at most its own tokens' logits, the runs covering the tokens, every token
/// in the vocabulary, and room for each run in its state.
pub fn check_runs(
    states: &[&mut dyn KvState],
    runs: &[Run],
    tokens: &[u32],
    vocab: usize,
) -> Result<(), ExecError> {
    if states.len() != runs.len()
        || runs.iter().any(|r| r.len == 0 || r.logits > r.len)
        || runs.iter().map(|r| r.len).sum::<usize>() != tokens.len()
    {
        return Err(ExecError::RunMismatch {
            states: states.len(),
            runs: runs.len(),
            tokens: tokens.len(),
        });
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ExecError::TokenOutOfRange { id, vocab });
    }
    for (s, run) in states.iter().zip(runs) {
        if s.len() + run.len > s.capacity() {
            return Err(ExecError::ContextFull {
                needed: s.len() + run.len,
                capacity: s.capacity(),
            });
        }
    }
    Ok(())
}

/// The checks of a batch that need no executor: one token per state, every token in the
/// vocabulary, and room for it in each state (so that the default [`Executor::forward_batch`]
/// fails before it advances any state).
pub fn check_batch(
    states: &[&mut dyn KvState],
    tokens: &[u32],
    vocab: usize,
) -> Result<(), ExecError> {
    if states.len() != tokens.len() {
        return Err(ExecError::BatchMismatch {
            states: states.len(),
            tokens: tokens.len(),
        });
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ExecError::TokenOutOfRange { id, vocab });
    }
    for s in states {
        if s.len() >= s.capacity() {
            return Err(ExecError::ContextFull {
                needed: s.len() + 1,
                capacity: s.capacity(),
            });
        }
    }
    Ok(())
}

/// Index of the largest logit; ties go to the lowest id, as llama.cpp's greedy sampler does
/// (NaNs are passed over; 0 when there is nothing else). Two passes the compiler vectorises —
/// the largest value in independent lanes, then the first block and place that hold it — since
/// a serial scan that reloads the best so far took about a tenth of a millisecond for Gemma 3's
/// 262144 logits, on one thread, per token.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let blocks = logits.chunks_exact(LANES);
    let tail = blocks.remainder();
    for block in blocks {
        for (m, &v) in lanes.iter_mut().zip(block) {
            *m = if v > *m { v } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let first = logits
        .chunks(LANES)
        .position(|block| block.iter().fold(false, |hit, &v| hit | (v == max)))
        .and_then(|b| {
            let at = logits[b * LANES..].iter().position(|&v| v == max)?;
            Some(b * LANES + at)
        });
    first.unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::argmax;

    /// The serial definition: the first index whose value no earlier one exceeds.
    fn reference(logits: &[f32]) -> u32 {
        let mut best: Option<usize> = None;
        for (i, &v) in logits.iter().enumerate() {
            if !v.is_nan() && best.is_none_or(|b| v > logits[b]) {
                best = Some(i);
            }
        }
        best.unwrap_or(0) as u32
    }

    #[test]
    fn the_first_largest_wins_at_every_length_and_place() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in (0..70).chain([1000, 262_144]) {
            for _ in 0..20 {
                // Few distinct values, so that ties are common; now and then NaN and infinities.
                let v: Vec<f32> = (0..len)
                    .map(|_| match next() % 40 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        n => (n % 7) as f32 - 3.0,
                    })
                    .collect();
                assert_eq!(argmax(&v), reference(&v), "{v:?}");
            }
        }
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1.0]), 1);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        let mut big = vec![0.0f32; 262_144];
        big[200_001] = 1.0;
        big[262_143] = 1.0;
        assert_eq!(argmax(&big), 200_001);
    }
}
