//! The fallback executor: a device path that fails part-way through a sequence hands every
//! sequence to the CPU engine, which replays what was processed, so the output is the CPU's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anelm_ane::exec::FallbackExecutor;
use anelm_cpu::CpuExecutor;
use anelm_model::{ExecError, Executor, KvState, Logits};

/// The CPU engine as a "device" that fails with a device error from its `fail_at`-th forward on.
struct Flaky {
    inner: CpuExecutor,
    calls: usize,
    fail_at: usize,
}

impl Executor for Flaky {
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
        self.calls += 1;
        if self.calls >= self.fail_at {
            return Err(ExecError::Device("fake: evaluating chunk0: refused".into()));
        }
        self.inner.forward(state, tokens, logits, out)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
}

fn greedy(e: &mut dyn Executor, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = e.new_state(64).unwrap();
    let mut out = Vec::new();
    e.forward(s.as_mut(), prompt, Logits::Last, &mut out)
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let next = (0..out.len())
            .max_by(|&a, &b| out[a].total_cmp(&out[b]))
            .unwrap() as u32;
        ids.push(next);
        e.forward(s.as_mut(), &[next], Logits::Last, &mut out)
            .unwrap();
    }
    ids
}

#[test]
fn a_failing_device_hands_over_to_the_cpu_mid_sequence() {
    let m = Arc::new(anelm_model::load(&anelm_testkit::tiny("llama")).unwrap());
    let prompt = [5, 17, 300, 42];
    let want = greedy(&mut CpuExecutor::new(m.clone(), 1), &prompt, 8);
    for fail_at in [1, 2, 5] {
        let warnings = Arc::new(AtomicUsize::new(0));
        let w = warnings.clone();
        let cpu_model = m.clone();
        let mut e = FallbackExecutor::new(
            Box::new(Flaky {
                inner: CpuExecutor::new(m.clone(), 1),
                calls: 0,
                fail_at,
            }),
            move || Box::new(CpuExecutor::new(cpu_model, 1)),
            move |why| {
                assert!(why.contains("chunk0"), "{why}");
                w.fetch_add(1, Ordering::Relaxed);
            },
        );
        // A second sequence made before the failure moves over too.
        let mut other = e.new_state(64).unwrap();
        assert_eq!(
            greedy(&mut e, &prompt, 8),
            want,
            "fail at forward {fail_at}"
        );
        assert!(e.on_cpu());
        assert_eq!(warnings.load(Ordering::Relaxed), 1, "one warning");
        let mut out = Vec::new();
        e.forward(other.as_mut(), &prompt, Logits::Last, &mut out)
            .unwrap();
        assert_eq!(other.len(), 4);
        // Errors that are not the device's still reach the caller.
        let e2 = e.forward(other.as_mut(), &[u32::MAX], Logits::Last, &mut out);
        assert!(
            matches!(e2, Err(ExecError::TokenOutOfRange { .. })),
            "{e2:?}"
        );
    }
}
