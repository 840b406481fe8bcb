//! Speculative decoding keeps the target's law. Greedy: exactly the target's greedy tokens,
//! whatever the drafter (a draft model of the same vocabulary — tiny fixtures share a 512-token
//! vocabulary, so any of them can draft for any other — or prompt lookup), and the session left
//! as a plain generation leaves it. Sampling: the distribution of whole continuations equals the
//! target's, by a chi-squared test on a small vocabulary that also rejects the draft's own law.
//! Drafts of another vocabulary are refused.

use anelm_cpu::CpuExecutor;
use anelm_engine::{
    same_vocabulary, DraftModel, Drafter, Event, Finish, GenerateParams, Input, LoadedModel,
    PromptLookup, Sampler, SamplingParams, Session, Speculation,
};
use anelm_model::Executor;
use anelm_testkit::{ids, model, shared_json, tiny, tiny_gguf, FnExec, SMOLLM2};

fn loaded(arch: &str) -> LoadedModel {
    LoadedModel::load(&tiny(arch)).unwrap()
}

fn cpu(m: &LoadedModel) -> CpuExecutor {
    CpuExecutor::new(m.model.clone(), 2)
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..GenerateParams::default()
    }
}

/// One generation from token ids; with `spec`, speculative. Returns the tokens, the finish and
/// what the session holds afterwards.
fn generate(
    model: &LoadedModel,
    exec: &mut dyn Executor,
    prompt: &[u32],
    params: GenerateParams,
    spec: Option<Speculation>,
) -> (Vec<u32>, Finish, Vec<u32>) {
    let mut session = Session::new(exec, prompt.len() + params.max_tokens + 8).unwrap();
    let (tokens, finish) = {
        let mut g = session
            .generate(model, &Input::Ids(prompt.to_vec()), params)
            .unwrap();
        if let Some(s) = spec {
            g.speculate(s).unwrap();
        }
        let mut tokens = Vec::new();
        loop {
            match g.next_event(exec).unwrap().expect("a finish") {
                Event::Token { id, .. } => tokens.push(id),
                Event::Text(_) => {}
                Event::Finish(f) => break (tokens, f),
            }
        }
    };
    (tokens, finish, session.tokens().to_vec())
}

fn lookup(k: usize) -> Speculation {
    Speculation::new(Box::new(PromptLookup::default()), k).unwrap()
}

fn draft_model(m: &LoadedModel, k: usize) -> Speculation {
    let drafter = DraftModel::new(Box::new(cpu(m)), 256).unwrap();
    Speculation::new(Box::new(drafter), k).unwrap()
}

#[test]
fn greedy_output_is_the_targets_with_either_drafter() {
    for (target_arch, draft_arch) in [
        ("llama", "llama"),
        ("llama", "mistral"),
        ("qwen3", "gemma"),
        ("gemma3", "qwen3_next"),
    ] {
        let reference = shared_json(&format!("fixtures/hf-tiny/{target_arch}/reference.json"));
        let (target, draft) = (loaded(target_arch), loaded(draft_arch));
        let mut exec = cpu(&target);
        for case in ["short", "long"] {
            let prompt = ids(&reference["cases"][case]["input_ids"]);
            let (want, _, want_session) = generate(&target, &mut exec, &prompt, greedy(24), None);
            for k in [1, 3, 6] {
                let label = format!("{target_arch} drafted by {draft_arch}, {case}, k={k}");
                let (got, finish, session) = generate(
                    &target,
                    &mut exec,
                    &prompt,
                    greedy(24),
                    Some(draft_model(&draft, k)),
                );
                assert_eq!(got, want, "{label}");
                assert_eq!(session, want_session, "{label}: the session after");
                let s = finish.speculative;
                // Every target pass emits its accepted tokens and one of its own; the first
                // token comes from the prefill.
                assert_eq!(1 + s.accepted + s.target_passes, 24, "{label}: {s:?}");
                assert!(s.drafted <= k * s.target_passes, "{label}: {s:?}");
                if target_arch == draft_arch {
                    assert_eq!(s.accepted, s.drafted, "a model agrees with itself");
                } else if draft_arch != "mistral" {
                    assert!(
                        s.accepted < s.drafted,
                        "{label}: a different model must miss"
                    );
                }

                let (got, finish, session) =
                    generate(&target, &mut exec, &prompt, greedy(24), Some(lookup(k)));
                assert_eq!(got, want, "{target_arch} by prompt lookup, {case}, k={k}");
                assert_eq!(session, want_session, "{label}: the session after lookup");
                let s = finish.speculative;
                assert_eq!(1 + s.accepted + s.target_passes, 24, "lookup: {s:?}");
            }
        }
    }
}

#[test]
fn limits_hold_inside_a_verified_run() {
    // max_tokens smaller than k: exactly max_tokens come out.
    let target = loaded("llama");
    let mut exec = cpu(&target);
    let reference = shared_json("fixtures/hf-tiny/llama/reference.json");
    let prompt = ids(&reference["cases"]["short"]["input_ids"]);
    for n in [1, 2, 5] {
        let (want, _, _) = generate(&target, &mut exec, &prompt, greedy(n), None);
        let (got, f, _) = generate(
            &target,
            &mut exec,
            &prompt,
            greedy(n),
            Some(draft_model(&target, 6)),
        );
        assert_eq!(got, want);
        assert_eq!(got.len(), n);
        assert_eq!(f.usage.completion_tokens, n);
    }
}

/// A target and a draft over six live tokens of a 512-token vocabulary, their logits functions
/// of the history (the draft's deliberately unlike the target's).
fn target_row(h: &[u32], row: &mut [f32]) {
    live_row(h, row, |last, j, len| {
        ((last * 7 + j * 13 + len * 3) % 11) as f32 * 0.35
    });
}
fn draft_row(h: &[u32], row: &mut [f32]) {
    live_row(h, row, |last, j, _| {
        ((last * 5 + j * 3 + 1) % 7) as f32 * 0.5
    });
}
const LIVE: usize = 6;
fn live_row(h: &[u32], row: &mut [f32], f: impl Fn(usize, usize, usize) -> f32) {
    row.fill(f32::NEG_INFINITY);
    let last = *h.last().unwrap() as usize;
    for (j, l) in row.iter_mut().enumerate().take(LIVE) {
        *l = f(last, j, h.len());
    }
}

/// The exact probability of every continuation of `len` tokens under `row` and `params`.
fn exact_law(prompt: &[u32], len: usize, params: &SamplingParams) -> Vec<(Vec<u32>, f64)> {
    let mut sampler = Sampler::new(params.clone());
    let mut law = vec![(Vec::new(), 1.0)];
    let mut logits = vec![0.0; 512];
    let mut dist = Vec::new();
    for _ in 0..len {
        let mut next = Vec::new();
        for (seq, p) in law {
            let mut h = prompt.to_vec();
            h.extend_from_slice(&seq);
            target_row(&h, &mut logits);
            sampler.distribution(&logits, &mut dist);
            for &(id, q) in &dist {
                let mut s = seq.clone();
                s.push(id);
                next.push((s, p * q));
            }
        }
        law = next;
    }
    law
}

/// Pearson's statistic of `counts` against `law` (cells expecting fewer than 5 merged) and its
/// critical value at significance 1e-3 (Wilson–Hilferty).
fn chi_squared(
    law: &[(Vec<u32>, f64)],
    counts: &std::collections::HashMap<Vec<u32>, usize>,
    n: usize,
) -> (f64, f64) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut rest_e, mut rest_o) = (0.0, 0.0);
    for (seq, p) in law {
        let e = p * n as f64;
        let o = *counts.get(seq).unwrap_or(&0) as f64;
        if e < 5.0 {
            rest_e += e;
            rest_o += o;
        } else {
            stat += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    let outside: usize = counts
        .iter()
        .filter(|(s, _)| !law.iter().any(|(l, _)| l == *s))
        .map(|(_, c)| c)
        .sum();
    rest_o += outside as f64;
    if rest_e > 0.0 {
        stat += (rest_o - rest_e).powi(2) / rest_e.max(1e-9);
        cells += 1;
    }
    let df = (cells - 1) as f64;
    let z = 3.090; // the 0.999 quantile of the standard normal
    let crit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    (stat, crit)
}

#[test]
fn sampling_keeps_the_targets_distribution() {
    let model = loaded("llama"); // only its 512-token vocabulary and no stop ids are used
    let prompt = [1u32, 2, 3, 1, 2, 3, 1, 2];
    const LEN: usize = 4;
    const N: usize = 20_000;
    let settings = [
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.7,
            top_k: 4,
            top_p: 0.9,
            min_p: 0.05,
            ..SamplingParams::default()
        },
    ];
    for params in settings {
        let law = exact_law(&prompt, LEN, &params);
        let run = |drafter: &dyn Fn() -> Option<Box<dyn Drafter>>, row: fn(&[u32], &mut [f32])| {
            let mut exec = FnExec::new(512, row);
            let mut counts = std::collections::HashMap::new();
            let mut stats = anelm_engine::SpecStats::default();
            for seed in 0..N as u64 {
                let p = GenerateParams {
                    sampling: SamplingParams {
                        seed: Some(seed),
                        ..params.clone()
                    },
                    max_tokens: LEN,
                    ..GenerateParams::default()
                };
                let spec = drafter().map(|d| Speculation::new(d, 3).unwrap());
                let (tokens, f, _) = generate(&model, &mut exec, &prompt, p, spec);
                *counts.entry(tokens).or_insert(0) += 1;
                stats.drafted += f.speculative.drafted;
                stats.accepted += f.speculative.accepted;
            }
            (counts, stats)
        };
        let by_model = || -> Option<Box<dyn Drafter>> {
            Some(Box::new(
                DraftModel::new(Box::new(FnExec::new(512, draft_row)), 64).unwrap(),
            ))
        };
        let by_lookup = || -> Option<Box<dyn Drafter>> { Some(Box::new(PromptLookup::default())) };
        for (name, drafter) in [
            (
                "draft model",
                &by_model as &dyn Fn() -> Option<Box<dyn Drafter>>,
            ),
            ("prompt lookup", &by_lookup),
        ] {
            let (counts, stats) = run(drafter, target_row);
            let (stat, crit) = chi_squared(&law, &counts, N);
            assert!(
                stat < crit,
                "{name}, {params:?}: chi-squared {stat:.1} ≥ {crit:.1}"
            );
            // Both drafters really drafted, and were sometimes wrong.
            assert!(stats.drafted > N / 4, "{name}: {stats:?}");
            assert!(
                stats.accepted > 0 && stats.accepted < stats.drafted,
                "{name}: {stats:?}"
            );
        }
        // The test has power: the draft's own law is rejected.
        let (counts, _) = run(&|| None, draft_row);
        let (stat, crit) = chi_squared(&law, &counts, N);
        assert!(
            stat > crit,
            "the draft's law passed for the target's: {stat:.1} < {crit:.1}"
        );
    }
}

#[test]
fn refuses_k_zero_and_a_draft_of_another_size() {
    assert!(Speculation::new(Box::new(PromptLookup::default()), 0)
        .is_err_and(|e| e.to_string().contains("k ≥ 1")));
    let model = loaded("llama");
    let mut session = Session::new(&cpu(&model), 64).unwrap();
    let mut g = session
        .generate(&model, &Input::Ids(vec![1, 2, 3]), greedy(4))
        .unwrap();
    let other = DraftModel::new(Box::new(FnExec::new(100, draft_row)), 64).unwrap();
    let err = g
        .speculate(Speculation::new(Box::new(other), 3).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("100 tokens, the target's 512"), "{err}");
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
