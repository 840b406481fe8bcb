//! Speculative decoding gives exactly the target's greedy tokens, whatever the draft proposes:
//! tiny fixtures share a 512-token vocabulary, so any of them can draft for any other.

use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_engine::{argmax, generate_greedy_speculative, Session, Side};
use anelm_model::{Executor, Logits};
use anelm_testkit::{ids, shared_json, tiny};

fn exec(arch: &str) -> CpuExecutor {
    CpuExecutor::new(Arc::new(anelm_model::load(&tiny(arch)).unwrap()), 2)
}

/// The target alone: prefill, then one token per pass.
fn plain_greedy(e: &mut CpuExecutor, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(e, prompt.len() + n).unwrap();
    let mut logits = Vec::new();
    s.prefill(e, prompt, &mut logits).unwrap();
    let mut out = vec![argmax(&logits)];
    while out.len() < n {
        s.run(e, &[*out.last().unwrap()], Logits::Last, &mut logits)
            .unwrap();
        out.push(argmax(&logits));
    }
    out
}

#[test]
fn output_is_the_targets_greedy_output() {
    for (target_arch, draft_arch) in [
        ("llama", "llama"),
        ("llama", "mistral"),
        ("qwen3", "gemma"),
        ("gemma3", "qwen3_next"),
    ] {
        let reference = shared_json(&format!("fixtures/hf-tiny/{target_arch}/reference.json"));
        let mut target = exec(target_arch);
        let mut draft = exec(draft_arch);
        for case in ["short", "long"] {
            let prompt = ids(&reference["cases"][case]["input_ids"]);
            let want = plain_greedy(&mut target, &prompt, 24);
            for k in [1, 3, 6] {
                let mut ts = Session::new(&target, prompt.len() + 32).unwrap();
                let mut ds = Session::new(&draft, prompt.len() + 32).unwrap();
                let mut streamed = Vec::new();
                let (got, stats) = generate_greedy_speculative(
                    &mut Side {
                        exec: &mut target,
                        session: &mut ts,
                    },
                    &mut Side {
                        exec: &mut draft,
                        session: &mut ds,
                    },
                    &prompt,
                    24,
                    k,
                    &[],
                    |t| streamed.push(t),
                )
                .unwrap();
                assert_eq!(
                    got, want,
                    "{target_arch} drafted by {draft_arch}, {case}, k={k}"
                );
                assert_eq!(streamed, got);
                assert!(stats.target_passes <= 23, "one pass per round at most");
                if target_arch == draft_arch {
                    assert_eq!(stats.accepted, stats.drafted, "a model agrees with itself");
                } else if draft_arch != "mistral" {
                    assert!(
                        stats.accepted < stats.drafted,
                        "{target_arch}/{draft_arch}: a different model must miss sometimes"
                    );
                }
            }
        }
    }
}

#[test]
fn stops_on_a_stop_id_and_refuses_mismatched_vocabularies() {
    let reference = shared_json("fixtures/hf-tiny/llama/reference.json");
    let prompt = ids(&reference["cases"]["short"]["input_ids"]);
    let mut target = exec("llama");
    let mut draft = exec("llama");
    let want = plain_greedy(&mut target, &prompt, 16);
    let stop = [want[5]];
    let first_stop = want.iter().position(|t| *t == want[5]).unwrap();
    let mut ts = Session::new(&target, 64).unwrap();
    let mut ds = Session::new(&draft, 64).unwrap();
    let (got, _) = generate_greedy_speculative(
        &mut Side {
            exec: &mut target,
            session: &mut ts,
        },
        &mut Side {
            exec: &mut draft,
            session: &mut ds,
        },
        &prompt,
        16,
        4,
        &stop,
        |_| {},
    )
    .unwrap();
    assert_eq!(got, want[..=first_stop]);

    let mut gpt = exec("gpt2");
    assert_eq!(gpt.vocab_size(), 512, "fixture vocabularies are 512");
    let mut ds = Session::new(&gpt, 64).unwrap();
    let err = generate_greedy_speculative(
        &mut Side {
            exec: &mut target,
            session: &mut ts,
        },
        &mut Side {
            exec: &mut gpt,
            session: &mut ds,
        },
        &prompt,
        16,
        0,
        &stop,
        |_| {},
    );
    assert!(err.is_err(), "k = 0 is refused");
}
