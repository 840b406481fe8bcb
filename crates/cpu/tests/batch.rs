//! Batched decode on the CPU: a step that advances several sequences at once gives, bit for bit,
//! the logits each sequence's own decode step gives — sequences at different positions, joining
//! and leaving between steps, in any order — on tiny models of the dense, sliding-window,
//! soft-capped, MoE and gated-DeltaNet families and on the two real models (Q4_1, Q4_K_M).

use std::sync::Arc;

use anelm_cpu::{CpuExecutor, CpuOptions};
use anelm_model::{ExecError, Executor, KvState, Logits};
use anelm_testkit::{any_tiny, argmax, model, tiny, EVERY_LAYER_KIND, GEMMA3, SMOLLM2};

/// One sequence of a scenario: its prompt length, and the steps it is in the batch for.
struct Seq {
    prompt: usize,
    join: usize,
    leave: usize,
}

/// `n` token ids below `vocab`, different for each `seed`.
fn prompt(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// The first index where `a` and `b` differ in their bits (None: identical).
fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

/// Runs the scenario twice over: every active sequence decoded alone, and all of them in one
/// batched step (in an order that changes from step to step); the logits must be the same bits.
/// Returns how many batched rows were compared.
fn batched_equals_solo(exec: &mut CpuExecutor, seqs: &[Seq], steps: usize) -> usize {
    let vocab = exec.vocab_size();
    let name = exec.model().source.path().display().to_string();
    let cap = seqs.iter().map(|s| s.prompt + steps + 1).max().unwrap();
    let mut solo: Vec<Option<Box<dyn KvState>>> = seqs.iter().map(|_| None).collect();
    let mut batch: Vec<Option<Box<dyn KvState>>> = seqs.iter().map(|_| None).collect();
    let mut next = vec![0u32; seqs.len()];
    let (mut row, mut rows) = (Vec::new(), Vec::new());
    let mut compared = 0;
    for step in 0..steps {
        for (i, s) in seqs.iter().enumerate() {
            if s.join == step {
                let p = prompt(s.prompt, vocab, i as u64 + 1);
                let (mut a, mut b) = (exec.new_state(cap).unwrap(), exec.new_state(cap).unwrap());
                exec.forward(a.as_mut(), &p, Logits::Last, &mut row)
                    .unwrap();
                exec.forward(b.as_mut(), &p, Logits::Last, &mut rows)
                    .unwrap();
                assert_eq!(first_difference(&row, &rows), None, "{name}: prefill");
                next[i] = argmax(&row);
                (solo[i], batch[i]) = (Some(a), Some(b));
            }
            if s.leave == step {
                (solo[i], batch[i]) = (None, None);
            }
        }
        let mut active: Vec<usize> = (0..seqs.len()).filter(|&i| solo[i].is_some()).collect();
        let turn = step % active.len().max(1);
        active.rotate_left(turn);
        if step % 2 == 1 {
            active.reverse();
        }
        let want: Vec<Vec<f32>> = active
            .iter()
            .map(|&i| {
                let st = solo[i].as_mut().unwrap();
                exec.forward(st.as_mut(), &[next[i]], Logits::Last, &mut row)
                    .unwrap();
                row.clone()
            })
            .collect();
        let tokens: Vec<u32> = active.iter().map(|&i| next[i]).collect();
        let mut taken: Vec<Box<dyn KvState>> =
            active.iter().map(|&i| batch[i].take().unwrap()).collect();
        let mut states: Vec<&mut dyn KvState> = taken.iter_mut().map(|b| b.as_mut()).collect();
        exec.forward_batch(&mut states, &tokens, &mut rows).unwrap();
        assert_eq!(rows.len(), active.len() * vocab);
        for (k, &i) in active.iter().enumerate() {
            let got = &rows[k * vocab..(k + 1) * vocab];
            assert_eq!(
                first_difference(got, &want[k]),
                None,
                "{name}: step {step}, sequence {i} (row {k} of {}) differs from its solo step",
                active.len()
            );
            assert_eq!(states[k].len(), solo[i].as_ref().unwrap().len());
            next[i] = argmax(got);
            compared += 1;
        }
        for (&i, b) in active.iter().zip(taken) {
            batch[i] = Some(b);
        }
    }
    compared
}

/// Four sequences of different lengths from the start, a fifth joining at step 2, the second
/// leaving at step 4. Lengths pass the tiny models' 32-position sliding window.
fn scenario() -> Vec<Seq> {
    vec![
        Seq {
            prompt: 3,
            join: 0,
            leave: usize::MAX,
        },
        Seq {
            prompt: 40,
            join: 0,
            leave: 4,
        },
        Seq {
            prompt: 17,
            join: 0,
            leave: usize::MAX,
        },
        Seq {
            prompt: 1,
            join: 0,
            leave: usize::MAX,
        },
        Seq {
            prompt: 29,
            join: 2,
            leave: usize::MAX,
        },
    ]
}

fn tiny_exec(arch: &str, threads: usize) -> CpuExecutor {
    let m = anelm_model::load(&any_tiny(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
    CpuExecutor::new(Arc::new(m), threads)
}

#[test]
fn batched_steps_equal_solo_steps_on_tiny_models() {
    for arch in EVERY_LAYER_KIND {
        for threads in [1, 2] {
            let mut exec = tiny_exec(arch, threads);
            let compared = batched_equals_solo(&mut exec, &scenario(), 8);
            assert_eq!(compared, 8 + 4 + 8 + 8 + 6, "{arch}");
        }
    }
}

#[test]
fn batched_steps_equal_solo_steps_on_the_tiny_gguf_and_exact_mode() {
    let m = Arc::new(anelm_model::load(&tiny("qwen2").join("model.gguf")).unwrap());
    let mut exec = CpuExecutor::new(m.clone(), 2);
    assert!(batched_equals_solo(&mut exec, &scenario(), 6) > 0);
    let opts = CpuOptions {
        threads: 2,
        exact: true,
        ..CpuOptions::default()
    };
    let mut exact = CpuExecutor::with_options(m, opts);
    assert!(batched_equals_solo(&mut exact, &scenario(), 6) > 0);
}

#[test]
fn batched_steps_equal_solo_steps_on_smollm2() {
    let m = Arc::new(anelm_model::load(&model(SMOLLM2)).unwrap());
    let mut exec = CpuExecutor::new(m, 2);
    let mut seqs = scenario();
    // A longer one, so that decode attention splits its positions into several parts.
    seqs.push(Seq {
        prompt: 150,
        join: 1,
        leave: usize::MAX,
    });
    assert!(batched_equals_solo(&mut exec, &seqs, 6) > 20);
}

#[test]
fn batched_steps_equal_solo_steps_on_gemma3_past_its_window() {
    let m = Arc::new(anelm_model::load(&model(GEMMA3)).unwrap());
    let mut exec = CpuExecutor::new(m, 2);
    let seqs = vec![
        // Past Gemma 3's 512-position sliding window.
        Seq {
            prompt: 530,
            join: 0,
            leave: usize::MAX,
        },
        Seq {
            prompt: 5,
            join: 0,
            leave: 3,
        },
        Seq {
            prompt: 60,
            join: 1,
            leave: usize::MAX,
        },
    ];
    assert!(batched_equals_solo(&mut exec, &seqs, 5) > 8);
}

#[test]
fn bad_batches_are_refused_before_any_state_advances() {
    let mut exec = tiny_exec("llama", 2);
    let other = tiny_exec("llama", 1);
    let (mut a, mut b) = (exec.new_state(8).unwrap(), exec.new_state(2).unwrap());
    let mut out = Vec::new();
    exec.forward(b.as_mut(), &[1, 2], Logits::None, &mut out)
        .unwrap();
    let mut foreign = other.new_state(8).unwrap();
    let check = |r: Result<(), ExecError>, what: &str| {
        let e = r.expect_err(what);
        format!("{e}")
    };
    // Two states, one token.
    let e = check(
        exec.forward_batch(&mut [a.as_mut(), foreign.as_mut()], &[1], &mut out),
        "mismatch",
    );
    assert!(e.contains("2 states") && e.contains("1 tokens"), "{e}");
    // `b` is full.
    let e = check(
        exec.forward_batch(&mut [a.as_mut(), b.as_mut()], &[1, 2], &mut out),
        "full",
    );
    assert!(e.contains("context full"), "{e}");
    // A token outside the vocabulary.
    let e = check(
        exec.forward_batch(&mut [a.as_mut()], &[512], &mut out),
        "vocab",
    );
    assert!(e.contains("outside the vocabulary"), "{e}");
    // A state of another executor.
    let e = check(
        exec.forward_batch(&mut [a.as_mut(), foreign.as_mut()], &[1, 2], &mut out),
        "foreign",
    );
    assert!(e.contains("different executor"), "{e}");
    assert_eq!((a.len(), b.len(), foreign.len()), (0, 2, 0));
    // An empty batch is no work.
    exec.forward_batch(&mut [], &[], &mut out).unwrap();
    assert!(out.is_empty());
}

/// Router gaps ([`Executor::route_gaps`]): one per token of the last call — a prefill's every
/// token, a batch step's one per sequence — each the narrowest boundary of its mixtures, the
/// same however the token was batched or chunked; none for a model without mixtures.
#[test]
fn router_gaps_are_per_token_and_the_same_however_batched() {
    for threads in [1, 2] {
        let mut exec = tiny_exec("qwen2_moe", threads);
        let vocab = exec.vocab_size();
        let ids = prompt(40, vocab, 7);
        let mut state = exec.new_state(64).unwrap();
        let mut out = Vec::new();
        exec.forward(state.as_mut(), &ids, Logits::Last, &mut out)
            .unwrap();
        let whole = exec.route_gaps().to_vec();
        assert_eq!(whole.len(), ids.len());
        assert!(
            whole.iter().all(|g| g.is_finite() && *g >= 0.0),
            "{whole:?}"
        );
        assert!(
            whole.iter().any(|&g| g < 0.05),
            "some choices are close: {whole:?}"
        );
        // Token by token, and two sequences in one batch step.
        let mut one = exec.new_state(64).unwrap();
        let mut other = exec.new_state(64).unwrap();
        let mut alone = Vec::new();
        for &t in &ids[..10] {
            exec.forward(one.as_mut(), &[t], Logits::Last, &mut out)
                .unwrap();
            alone.extend_from_slice(exec.route_gaps());
        }
        assert_eq!(alone, whole[..10], "token by token");
        // The choices at near-ties: at the positions whose gap is below the bar, top-k
        // experts each, ascending; the same positions token by token.
        let ties = exec_ties(&mut exec, &ids);
        let tied: std::collections::BTreeSet<usize> = ties.iter().map(|c| c.position).collect();
        let narrow: std::collections::BTreeSet<usize> = (whole.iter().enumerate())
            .filter(|(_, &g)| g < anelm_model::ROUTE_NEAR_TIE)
            .map(|(p, _)| p)
            .collect();
        assert!(!tied.is_empty(), "{whole:?}");
        assert_eq!(tied, narrow);
        assert!(ties
            .iter()
            .all(|c| c.experts.len() == 2 && c.experts.windows(2).all(|w| w[0] < w[1])));
        let mut stepwise = Vec::new();
        let mut s = exec.new_state(64).unwrap();
        for &t in &ids {
            exec.forward(s.as_mut(), &[t], Logits::Last, &mut out)
                .unwrap();
            stepwise.extend_from_slice(exec.tied_routes());
        }
        assert_eq!(stepwise, ties, "positions are the sequence's");
        exec.forward(other.as_mut(), &ids[..9], Logits::None, &mut out)
            .unwrap();
        exec.forward_batch(
            &mut [one.as_mut(), other.as_mut()],
            &[ids[10], ids[9]],
            &mut out,
        )
        .unwrap();
        assert_eq!(exec.route_gaps(), [whole[10], whole[9]], "a batch step");
    }
    let mut dense = tiny_exec("llama", 1);
    let mut state = dense.new_state(8).unwrap();
    let mut out = Vec::new();
    dense
        .forward(state.as_mut(), &[1, 2, 3], Logits::Last, &mut out)
        .unwrap();
    assert!(dense.route_gaps().is_empty());
    assert!(dense.tied_routes().is_empty());
}

/// The tied router choices of `ids` as one prompt.
fn exec_ties(exec: &mut CpuExecutor, ids: &[u32]) -> Vec<anelm_model::RouteChoice> {
    let mut state = exec.new_state(64).unwrap();
    let mut out = Vec::new();
    exec.forward(state.as_mut(), ids, Logits::Last, &mut out)
        .unwrap();
    exec.tied_routes().to_vec()
}
