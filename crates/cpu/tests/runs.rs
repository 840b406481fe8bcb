//! Passes of runs (`Executor::forward_runs`): prompt chunks, verifying passes and decode tokens
//! of several sequences in one pass give, bit for bit, the logits each run gives alone (the
//! rows each run wants: none, its last, several, all of them), and leave each
//! state as its own pass would (the next batched step agrees too) — on tiny models of every
//! family kind and the two real models; the trait's default (an executor that does not batch
//! runs) agrees as well; bad runs are refused before any state advances.

use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_model::{Executor, KvState, Logits, Run};
use anelm_testkit::{any_tiny, model, token_ids as ids, Around, EVERY_LAYER_KIND, GEMMA3, SMOLLM2};

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Each sequence: the tokens already in its state, then the run of this pass and how many of
/// its last rows of logits it wants.
struct Case {
    before: usize,
    run: usize,
    logits: usize,
}

/// A run that wants the logits after its last token.
fn case(before: usize, run: usize) -> Case {
    Case {
        before,
        run,
        logits: 1,
    }
}

/// Prepares every case twice (solo and for the pass), runs each run alone and all in one
/// `forward_runs` pass, and compares; then one batched decode step of all the states against
/// solo steps. Returns the rows compared.
fn runs_equal_solo(exec: &mut dyn Executor, name: &str, cases: &[Case]) -> usize {
    let vocab = exec.vocab_size();
    let cap = cases.iter().map(|c| c.before + c.run + 2).max().unwrap();
    let mut solo: Vec<Box<dyn KvState>> = Vec::new();
    let mut pass: Vec<Box<dyn KvState>> = Vec::new();
    let mut row = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let (mut a, mut b) = (exec.new_state(cap).unwrap(), exec.new_state(cap).unwrap());
        if c.before > 0 {
            let p = ids(c.before, vocab, 101 + 2 * i as u64);
            exec.forward(a.as_mut(), &p, Logits::None, &mut row)
                .unwrap();
            exec.forward(b.as_mut(), &p, Logits::None, &mut row)
                .unwrap();
        }
        solo.push(a);
        pass.push(b);
    }
    let runs: Vec<Vec<u32>> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| ids(c.run, vocab, 201 + 2 * i as u64))
        .collect();
    let spec: Vec<Run> = cases
        .iter()
        .map(|c| Run {
            len: c.run,
            logits: c.logits,
        })
        .collect();
    let want: Vec<Vec<f32>> = solo
        .iter_mut()
        .zip(&runs)
        .zip(&spec)
        .map(|((s, r), run)| {
            exec.forward(s.as_mut(), r, run.selection(), &mut row)
                .unwrap();
            row.clone()
        })
        .collect();
    let tokens: Vec<u32> = runs.concat();
    let mut out = Vec::new();
    {
        let mut states: Vec<&mut dyn KvState> = pass.iter_mut().map(|b| b.as_mut()).collect();
        exec.forward_runs(&mut states, &spec, &tokens, &mut out)
            .unwrap();
    }
    let rows: usize = cases.iter().map(|c| c.logits).sum();
    assert_eq!(out.len(), rows * vocab, "{name}");
    let mut at = 0;
    for (i, w) in want.iter().enumerate() {
        assert_eq!(w.len(), cases[i].logits * vocab, "{name}: run {i}");
        let got = &out[at..at + w.len()];
        at += w.len();
        assert!(
            same_bits(got, w),
            "{name}: run {i} ({} tokens after {}, {} rows) differs from the run alone",
            cases[i].run,
            cases[i].before,
            cases[i].logits
        );
        assert_eq!(pass[i].len(), solo[i].len(), "{name}: run {i}");
    }
    // The states the pass left decode as the solo ones do.
    let next: Vec<u32> = (0..cases.len()).map(|i| (i * 7 % vocab) as u32).collect();
    let want: Vec<Vec<f32>> = solo
        .iter_mut()
        .zip(&next)
        .map(|(s, &t)| {
            exec.forward(s.as_mut(), &[t], Logits::Last, &mut row)
                .unwrap();
            row.clone()
        })
        .collect();
    let mut states: Vec<&mut dyn KvState> = pass.iter_mut().map(|b| b.as_mut()).collect();
    exec.forward_batch(&mut states, &next, &mut out).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            same_bits(&out[i * vocab..(i + 1) * vocab], w),
            "{name}: the step after run {i} differs"
        );
    }
    2 * cases.len()
}

/// A decode token, a fresh prompt chunk longer than an attention block, a verifying pass on a
/// state that has history (every row), a fresh three-token chunk inside a prompt (no row), a
/// run that wants its last two rows, and another decode token.
fn cases() -> Vec<Case> {
    vec![
        case(9, 1),
        case(0, 37),
        Case {
            before: 21,
            run: 5,
            logits: 5,
        },
        Case {
            before: 0,
            run: 3,
            logits: 0,
        },
        Case {
            before: 6,
            run: 4,
            logits: 2,
        },
        case(40, 1),
    ]
}

fn tiny_exec(arch: &str, threads: usize) -> CpuExecutor {
    let m = anelm_model::load(&any_tiny(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
    CpuExecutor::new(Arc::new(m), threads)
}

#[test]
fn runs_in_one_pass_equal_runs_alone_on_tiny_models() {
    for arch in EVERY_LAYER_KIND {
        for threads in [1, 2] {
            let mut exec = tiny_exec(arch, threads);
            assert_eq!(runs_equal_solo(&mut exec, arch, &cases()), 12, "{arch}");
        }
    }
}

#[test]
fn runs_in_one_pass_equal_runs_alone_on_the_real_models() {
    for path in [SMOLLM2, GEMMA3] {
        let m = Arc::new(anelm_model::load(&model(path)).unwrap());
        let mut exec = CpuExecutor::new(m, 2);
        let mut cs = cases();
        // Past Gemma 3's 512-position sliding window, and a run as long as a pass holds.
        cs.push(case(520, 2));
        cs.push(case(3, 300));
        assert_eq!(runs_equal_solo(&mut exec, path, &cs), 16);
    }
}

#[test]
fn the_default_runs_agree_and_passes_longer_than_the_buffers_split() {
    // An executor that batches nothing itself: `forward_runs` is the trait's default.
    let mut plain = Around::plain(tiny_exec("qwen3", 2));
    assert_eq!(runs_equal_solo(&mut plain, "default", &cases()), 12);
    // Runs past one pass's 512 rows: the runs are grouped into several passes.
    let mut exec = tiny_exec("llama", 2);
    let cs = vec![
        case(0, 300),
        Case {
            before: 5,
            run: 250,
            logits: 250,
        },
        case(2, 1),
        Case {
            before: 0,
            run: 600,
            logits: 3,
        },
        Case {
            before: 1,
            run: 1,
            logits: 0,
        },
    ];
    assert_eq!(runs_equal_solo(&mut exec, "split", &cs), 10);
}

#[test]
fn bad_runs_are_refused_before_any_state_advances() {
    let mut exec = tiny_exec("llama", 2);
    let mut a = exec.new_state(8).unwrap();
    let mut b = exec.new_state(8).unwrap();
    let mut out = Vec::new();
    let mut check = |runs: &[(usize, usize)], tokens: &[u32], want: &str| {
        let runs: Vec<Run> = runs
            .iter()
            .map(|&(len, logits)| Run { len, logits })
            .collect();
        let err = exec
            .forward_runs(&mut [a.as_mut(), b.as_mut()], &runs, tokens, &mut out)
            .unwrap_err();
        assert!(err.to_string().contains(want), "{err}");
        assert_eq!((a.len(), b.len()), (0, 0));
    };
    check(&[(1, 1)], &[1], "2 states was given 1 runs");
    check(&[(1, 1), (0, 0)], &[1], "one run of at least one token");
    check(&[(1, 1), (2, 1)], &[1, 2], "2 runs of 2 tokens");
    check(
        &[(1, 1), (2, 3)],
        &[1, 2, 3],
        "at most its own tokens' logits",
    );
    check(&[(1, 1), (9, 1)], &[1; 10], "9");
    check(&[(1, 1), (1, 1)], &[1, 1 << 30], "vocab");
}
