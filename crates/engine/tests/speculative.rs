//! Speculative decoding gives exactly the target's greedy tokens, whatever the draft proposes:
//! tiny fixtures share a 512-token vocabulary, so any of them can draft for any other. Drafts of
//! another vocabulary (size, or the tokens behind the ids) are refused.

use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_engine::{
    argmax, generate_greedy_speculative, same_vocabulary, LoadedModel, Session, Side,
};
use anelm_model::Logits;
use anelm_testkit::{ids, model, shared_json, tiny, tiny_gguf, SMOLLM2};

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
                // Each target pass keeps its accepted tokens and one of its own; the first
                // token comes from the prefill; the last pass's own token may fall past 24.
                let made = 1 + stats.accepted + stats.target_passes;
                assert!(
                    made == 24 || made == 25,
                    "{target_arch}/{draft_arch} k={k}: {stats:?} for 24 tokens"
                );
                assert!(stats.drafted <= k * stats.target_passes, "{stats:?}");
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
fn stops_on_a_stop_id_and_refuses_a_draft_of_another_size() {
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

    // A draft with another number of logits is refused before anything runs.
    let mut smollm2 = CpuExecutor::new(Arc::new(anelm_model::load(&model(SMOLLM2)).unwrap()), 2);
    let mut ds = Session::new(&smollm2, 64).unwrap();
    let mut ts = Session::new(&target, 64).unwrap();
    let err = generate_greedy_speculative(
        &mut Side {
            exec: &mut target,
            session: &mut ts,
        },
        &mut Side {
            exec: &mut smollm2,
            session: &mut ds,
        },
        &prompt,
        16,
        4,
        &stop,
        |_| panic!("nothing is generated"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    assert!(ts.tokens().is_empty() && ds.tokens().is_empty());
    let mut ds = Session::new(&draft, 64).unwrap();
    assert!(generate_greedy_speculative(
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
        0,
        &stop,
        |_| {},
    )
    .is_err_and(|e| e.to_string().contains("k ≥ 1")));
}

#[test]
fn vocabularies_are_compared_token_by_token() {
    let load = |p: std::path::PathBuf| LoadedModel::load(&p).unwrap();
    // Two 512-token vocabularies: llama.cpp's converter wrote the same trained BPE into both
    // of these, and a SentencePiece one into gemma's.
    let (gpt2, qwen3_moe, gemma) = (
        load(tiny_gguf("gpt2")),
        load(tiny_gguf("qwen3_moe")),
        load(tiny_gguf("gemma")),
    );
    assert_eq!(gemma.model.config.vocab_size, gpt2.model.config.vocab_size);
    same_vocabulary(&gpt2, &qwen3_moe).unwrap();
    let err = same_vocabulary(&gpt2, &gemma).unwrap_err().to_string();
    assert!(err.contains("differs from the target's at id"), "{err}");
    // Of another size: refused by its size.
    let smollm2 = load(model(SMOLLM2));
    let err = same_vocabulary(&smollm2, &gpt2).unwrap_err().to_string();
    assert!(err.contains("512 tokens, the target's 49152"), "{err}");
    // Without tokenizers (ids given directly) the sizes decide.
    same_vocabulary(&load(tiny("llama")), &load(tiny("gpt2"))).unwrap();
}
