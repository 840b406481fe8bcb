//! A device path that does not dead-end: when the device refuses an evaluation, the executor
//! warns once and carries on with a CPU executor, replaying each sequence's tokens so far into
//! a fresh CPU state — the caller sees the same logits a CPU run would have given.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

use anelm_model::{checked_state, ExecError, Executor, KvState, Logits, OwnedState};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

type MakeCpu = Box<dyn FnOnce() -> Box<dyn Executor> + Send>;
type Warn = Box<dyn Fn(&str) + Send>;

/// The device executor until it fails with a device error, then the CPU one.
pub struct FallbackExecutor {
    device: Option<Box<dyn Executor>>,
    make_cpu: Option<MakeCpu>,
    cpu: Option<Box<dyn Executor>>,
    warn: Warn,
    vocab: usize,
    id: usize,
}

/// A sequence of a [`FallbackExecutor`]: the state of whichever executor runs it, and its
/// tokens (to rebuild it on the CPU).
struct FallbackState {
    owner: usize,
    inner: Box<dyn KvState>,
    on_cpu: bool,
    tokens: Vec<u32>,
    capacity: usize,
}

impl OwnedState for FallbackState {
    fn owner(&self) -> usize {
        self.owner
    }
}

impl KvState for FallbackState {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn truncate(&mut self, len: usize) {
        self.inner.truncate(len);
        self.tokens.truncate(self.inner.len());
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl FallbackExecutor {
    /// `device` until it fails; then the executor `make_cpu` builds, after `warn` is told why
    /// (once).
    pub fn new(
        device: Box<dyn Executor>,
        make_cpu: impl FnOnce() -> Box<dyn Executor> + Send + 'static,
        warn: impl Fn(&str) + Send + 'static,
    ) -> FallbackExecutor {
        FallbackExecutor {
            vocab: device.vocab_size(),
            device: Some(device),
            make_cpu: Some(Box::new(make_cpu)),
            cpu: None,
            warn: Box::new(warn),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether the device has failed and the CPU runs every sequence.
    pub fn on_cpu(&self) -> bool {
        self.device.is_none()
    }

    fn cpu(&mut self) -> &mut Box<dyn Executor> {
        if self.cpu.is_none() {
            let make = self.make_cpu.take().expect("made once");
            self.cpu = Some(make());
        }
        self.cpu.as_mut().expect("just made")
    }
}

impl Executor for FallbackExecutor {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        let (inner, on_cpu) = match (&self.device, &self.cpu) {
            (Some(d), _) => (d.new_state(capacity)?, false),
            (None, Some(c)) => (c.new_state(capacity)?, true),
            (None, None) => unreachable!("the CPU executor is made when the device goes"),
        };
        Ok(Box::new(FallbackState {
            owner: self.id,
            inner,
            on_cpu,
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
        let st: &mut FallbackState = checked_state(state, self.id, tokens, self.vocab)?;
        if !st.on_cpu {
            let ran = self
                .device
                .as_mut()
                .map(|d| d.forward(st.inner.as_mut(), tokens, logits, out));
            match ran {
                Some(Ok(())) => {
                    st.tokens.extend_from_slice(tokens);
                    return Ok(());
                }
                Some(Err(ExecError::Device(why))) => {
                    (self.warn)(&why);
                    self.device = None;
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
            // This sequence, rebuilt on the CPU from its tokens.
            let cpu = self.cpu();
            let mut inner = cpu.new_state(st.capacity)?;
            if !st.tokens.is_empty() {
                cpu.forward(inner.as_mut(), &st.tokens, Logits::None, out)?;
            }
            st.inner = inner;
            st.on_cpu = true;
        }
        self.cpu().forward(st.inner.as_mut(), tokens, logits, out)?;
        st.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// On the device in one batched pass while every sequence is there; after a device
    /// failure (in this step or before), one by one through [`Executor::forward`], which
    /// rebuilds each sequence on the CPU from its tokens.
    fn forward_batch(
        &mut self,
        states: &mut [&mut dyn KvState],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        anelm_model::check_batch(states, tokens, self.vocab)?;
        let mut sts: Vec<&mut FallbackState> = Vec::with_capacity(states.len());
        for (state, t) in states.iter_mut().zip(tokens) {
            sts.push(checked_state(
                &mut **state,
                self.id,
                std::slice::from_ref(t),
                self.vocab,
            )?);
        }
        if let (Some(device), true) = (self.device.as_mut(), sts.iter().all(|s| !s.on_cpu)) {
            let mut inner: Vec<&mut dyn KvState> =
                sts.iter_mut().map(|s| s.inner.as_mut()).collect();
            match device.forward_batch(&mut inner, tokens, out) {
                Ok(()) => {
                    sts.iter_mut()
                        .zip(tokens)
                        .for_each(|(s, &t)| s.tokens.push(t));
                    return Ok(());
                }
                Err(ExecError::Device(why)) => {
                    (self.warn)(&why);
                    self.device = None;
                }
                Err(e) => return Err(e),
            }
        }
        drop(sts);
        anelm_model::forward_each(self, states, tokens, out)
    }

    /// The device follows them while it runs; the CPU engine that replaces it cannot.
    fn force_routes(&mut self, routes: &[anelm_model::RouteChoice]) -> bool {
        (self.device.as_mut()).is_some_and(|d| d.force_routes(routes))
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }
}
