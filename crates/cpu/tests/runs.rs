//! Passes of runs (`Executor::forward_runs`): prompt chunks and decode tokens of several
//! sequences in one pass give, bit for bit, the logits each run gives alone, and leave each
//! state as its own pass would (the next batched step agrees too) — on tiny models of every
//! family kind and the two real models; the trait's default (an executor that does not batch
//! runs) agrees as well; bad runs are refused before any state advances.

use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_model::{ExecError, Executor, KvState, Logits};
use anelm_testkit::{any_tiny, model, token_ids as ids, EVERY_LAYER_KIND, GEMMA3, SMOLLM2};

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Each sequence: the tokens already in its state, then the run of this pass.
struct Case {
    before: usize,
    run: usize,
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
    let want: Vec<Vec<f32>> = solo
        .iter_mut()
        .zip(&runs)
        .map(|(s, r)| {
            exec.forward(s.as_mut(), r, Logits::Last, &mut row).unwrap();
            row.clone()
        })
        .collect();
    let lens: Vec<usize> = runs.iter().map(Vec::len).collect();
    let tokens: Vec<u32> = runs.concat();
    let mut out = Vec::new();
    {
        let mut states: Vec<&mut dyn KvState> = pass.iter_mut().map(|b| b.as_mut()).collect();
        exec.forward_runs(&mut states, &lens, &tokens, &mut out)
            .unwrap();
    }
    assert_eq!(out.len(), cases.len() * vocab, "{name}");
    for (i, w) in want.iter().enumerate() {
        let got = &out[i * vocab..(i + 1) * vocab];
        assert!(
            same_bits(got, w),
            "{name}: run {i} ({} tokens after {}) differs from the run alone",
            cases[i].run,
            cases[i].before
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

/// A decode token, a fresh prompt chunk longer than an attention block, a short run on a
/// state that has history, a fresh three-token prompt, and another decode token.
fn cases() -> Vec<Case> {
    vec![
        Case { before: 9, run: 1 },
        Case { before: 0, run: 37 },
        Case { before: 21, run: 5 },
        Case { before: 0, run: 3 },
        Case { before: 40, run: 1 },
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
            assert_eq!(runs_equal_solo(&mut exec, arch, &cases()), 10, "{arch}");
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
        cs.push(Case {
            before: 520,
            run: 2,
        });
        cs.push(Case {
            before: 3,
            run: 300,
        });
        assert_eq!(runs_equal_solo(&mut exec, path, &cs), 14);
    }
}

/// An executor that batches nothing itself: `forward_runs` is the trait's default.
struct Plain(CpuExecutor);

impl Executor for Plain {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        self.0.new_state(capacity)
    }
    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        self.0.forward(state, tokens, logits, out)
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
}

#[test]
fn the_default_runs_agree_and_passes_longer_than_the_buffers_split() {
    let mut plain = Plain(tiny_exec("qwen3", 2));
    assert_eq!(runs_equal_solo(&mut plain, "default", &cases()), 10);
    // Runs past one pass's 512 rows: the runs are grouped into several passes.
    let mut exec = tiny_exec("llama", 2);
    let cs = vec![
        Case {
            before: 0,
            run: 300,
        },
        Case {
            before: 5,
            run: 250,
        },
        Case { before: 2, run: 1 },
        Case {
            before: 0,
            run: 600,
        },
        Case { before: 1, run: 1 },
    ];
    assert_eq!(runs_equal_solo(&mut exec, "split", &cs), 10);
}

#[test]
fn bad_runs_are_refused_before_any_state_advances() {
    let mut exec = tiny_exec("llama", 2);
    let mut a = exec.new_state(8).unwrap();
    let mut b = exec.new_state(8).unwrap();
    let mut out = Vec::new();
    let mut check = |lens: &[usize], tokens: &[u32], want: &str| {
        let err = exec
            .forward_runs(&mut [a.as_mut(), b.as_mut()], lens, tokens, &mut out)
            .unwrap_err();
        assert!(err.to_string().contains(want), "{err}");
        assert_eq!((a.len(), b.len()), (0, 0));
    };
    check(&[1], &[1], "2 states was given 1 runs");
    check(&[1, 0], &[1], "one run of at least one token");
    check(&[1, 2], &[1, 2], "2 runs of 2 tokens");
    check(&[1, 9], &[1; 10], "9");
    check(&[1, 1], &[1, 1 << 30], "vocab");
}
