//! The fallback executor: a device path that fails part-way through a sequence hands every
//! sequence to the CPU engine, which replays what was processed, so the output is the CPU's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anelm_ane::exec::FallbackExecutor;
use anelm_cpu::CpuExecutor;
use anelm_model::{ExecError, Executor, KvState, Logits};
use anelm_testkit::{argmax, Around};

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
            // The CPU engine as a device that stops working at its `fail_at`-th pass.
            Box::new(Around::failing_from(
                CpuExecutor::new(m.clone(), 1),
                fail_at,
            )),
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

/// Batched steps on a device that fails part-way through one of them (after some of its
/// sequences advanced on the device): every sequence goes on on the CPU, and each one's tokens
/// are the CPU's alone.
#[test]
fn a_batch_on_a_failing_device_goes_on_on_the_cpu() {
    let m = Arc::new(anelm_model::load(&anelm_testkit::tiny("llama")).unwrap());
    let prompts: [&[u32]; 2] = [&[5, 17, 300, 42], &[9, 8, 7]];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| greedy(&mut CpuExecutor::new(m.clone(), 1), p, 6))
        .collect();
    for fail_at in [2, 3, 4, 7] {
        let cpu_model = m.clone();
        let mut e = FallbackExecutor::new(
            // The CPU engine as a device that stops working at its `fail_at`-th pass.
            Box::new(Around::failing_from(
                CpuExecutor::new(m.clone(), 1),
                fail_at,
            )),
            move || Box::new(CpuExecutor::new(cpu_model, 1)),
            |_| {},
        );
        let mut states: Vec<Box<dyn KvState>> = Vec::new();
        let mut next = Vec::new();
        let mut out = Vec::new();
        for p in prompts {
            let mut s = e.new_state(64).unwrap();
            e.forward(s.as_mut(), p, Logits::Last, &mut out).unwrap();
            next.push(argmax(&out));
            states.push(s);
        }
        let mut got = vec![Vec::new(); 2];
        for _ in 0..6 {
            for (g, &t) in got.iter_mut().zip(&next) {
                g.push(t);
            }
            let mut refs: Vec<&mut dyn KvState> = states.iter_mut().map(|s| s.as_mut()).collect();
            e.forward_batch(&mut refs, &next, &mut out).unwrap();
            let vocab = e.vocab_size();
            next = (0..2)
                .map(|i| argmax(&out[i * vocab..(i + 1) * vocab]))
                .collect();
        }
        assert_eq!(got, want, "fail at forward {fail_at}");
        assert!(e.on_cpu(), "fail at forward {fail_at}");
        assert_eq!(states[0].len(), 4 + 6);
    }
}
