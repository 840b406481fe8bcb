use std::collections::BTreeSet;
use std::time::Instant;

use super::*;

/// A Gemma-sized row of logits with a realistic spread (a few strong tokens, a long tail).
fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| {
            let u = r.next_f64() as f32;
            // Mostly in [-8, 2], a few up to ~14.
            if u > 0.9999 {
                6.0 + 8.0 * r.next_f64() as f32
            } else {
                -8.0 + 10.0 * u
            }
        })
        .collect()
}

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: Some(7),
        ..SamplingParams::default()
    }
}

/// llama.cpp's chain spelled out with a full sort: top-k, then top-p, then min-p.
fn reference_set(logits: &[f32], top_k: usize, top_p: f32, min_p: f32) -> BTreeSet<u32> {
    let mut all: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
        })
        .collect();
    all.sort_by(descending);
    if top_k > 0 {
        all.truncate(top_k);
    }
    if top_p < 1.0 {
        let max = all[0].logit;
        let probs: Vec<f64> = all.iter().map(|c| ((c.logit - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        let mut cum = 0.0;
        let mut keep = all.len();
        for (i, p) in probs.iter().enumerate() {
            cum += p / total;
            if cum >= top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        all.truncate(keep);
    }
    if min_p > 0.0 {
        let max = all[0].logit;
        all.retain(|c| ((c.logit - max) as f64).exp() >= min_p as f64);
    }
    all.iter().map(|c| c.id).collect()
}

fn kept(p: SamplingParams, logits: &[f32]) -> BTreeSet<u32> {
    Sampler::new(p)
        .candidates(logits)
        .iter()
        .map(|c| c.id)
        .collect()
}

#[test]
fn a_seed_reproduces_the_draws() {
    let logits = random_logits(262_144, 1);
    let draw = |seed: u64| {
        let mut s = Sampler::new(SamplingParams {
            seed: Some(seed),
            top_k: 0,
            min_p: 0.0,
            ..SamplingParams::default()
        });
        (0..200).map(|_| s.choose(&logits)).collect::<Vec<u32>>()
    };
    assert_eq!(draw(1234), draw(1234));
    assert_ne!(draw(1234), draw(1235));
    let unseeded = Sampler::new(SamplingParams::default());
    let reseeded = Sampler::new(SamplingParams {
        seed: Some(unseeded.seed()),
        ..SamplingParams::default()
    });
    assert_eq!(
        unseeded.seed(),
        reseeded.seed(),
        "the seed taken from the clock is reported back"
    );
}

#[test]
fn draws_follow_the_tempered_distribution() {
    let logits = [2.0f32, 1.0, 0.0, -1.0];
    for t in [1.0f32, 0.5, 2.0] {
        let mut s = Sampler::new(params(t, 0, 1.0, 0.0));
        let n = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.choose(&logits) as usize] += 1;
        }
        let w: Vec<f64> = logits
            .iter()
            .map(|&l| (l as f64 / t as f64).exp())
            .collect();
        let z: f64 = w.iter().sum();
        for i in 0..4 {
            let want = w[i] / z;
            let got = counts[i] as f64 / n as f64;
            assert!(
                (got - want).abs() < 0.005,
                "T={t} token {i}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn greedy_is_argmax_with_ties_to_the_lowest_id() {
    let mut s = Sampler::new(SamplingParams::greedy());
    assert_eq!(s.choose(&[0.0, 3.0, 1.0, 3.0]), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -1.0]), 1);
}

#[test]
fn top_k_keeps_the_k_largest() {
    let logits = random_logits(262_144, 2);
    for k in [1, 5, 40, 1000] {
        assert_eq!(
            kept(params(1.0, k, 1.0, 0.0), &logits),
            reference_set(&logits, k, 1.0, 0.0),
            "k={k}"
        );
    }
    let t = top_k(&[1.0, 5.0, 3.0, 5.0, -2.0], 3);
    assert_eq!(
        t.iter().map(|c| c.id).collect::<Vec<_>>(),
        [1, 3, 2],
        "most likely first, ties by id"
    );
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    // Probabilities 0.5, 0.3, 0.15, 0.05.
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let set = |p: f32| kept(params(1.0, 0, p, 0.0), &logits);
    assert_eq!(set(0.5), BTreeSet::from([0]));
    assert_eq!(set(0.79), BTreeSet::from([0, 1]));
    assert_eq!(set(0.81), BTreeSet::from([0, 1, 2]));
    assert_eq!(set(0.99), BTreeSet::from([0, 1, 2, 3]));
    // A Gemma-sized row: the partial selection must find the same set as a full sort, also
    // when the set is large enough to need several rounds of growth.
    let logits = random_logits(262_144, 3);
    for p in [0.1f32, 0.5, 0.9, 0.95, 0.999] {
        let got = kept(params(1.0, 0, p, 0.0), &logits);
        assert_eq!(got, reference_set(&logits, 0, p, 0.0), "p={p}");
    }
    assert!(
        kept(params(1.0, 0, 0.999, 0.0), &logits).len() > 64 * 8,
        "the test covers the growth path"
    );
}

#[test]
fn min_p_keeps_tokens_near_the_top() {
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    assert_eq!(
        kept(params(1.0, 0, 1.0, 0.2), &logits),
        BTreeSet::from([0, 1, 2])
    );
    assert_eq!(
        kept(params(1.0, 0, 1.0, 0.61), &logits),
        BTreeSet::from([0])
    );
    let logits = random_logits(262_144, 4);
    for m in [0.01f32, 0.05, 0.3] {
        assert_eq!(
            kept(params(1.0, 0, 1.0, m), &logits),
            reference_set(&logits, 0, 1.0, m),
            "min_p={m}"
        );
    }
}

#[test]
fn the_chain_matches_llamacpp_order() {
    let logits = random_logits(262_144, 5);
    for (k, p, m) in [
        (40, 0.95, 0.05),
        (0, 0.9, 0.02),
        (1000, 0.5, 0.0),
        (100, 1.0, 0.1),
        (0, 0.3, 0.5),
    ] {
        assert_eq!(
            kept(params(1.0, k, p, m), &logits),
            reference_set(&logits, k, p, m),
            "k={k} p={p} min_p={m}"
        );
    }
    // Draws only ever come from the kept set.
    let allowed = reference_set(&logits, 40, 0.95, 0.05);
    let mut s = Sampler::new(params(1.5, 40, 0.95, 0.05));
    for _ in 0..500 {
        assert!(allowed.contains(&s.choose(&logits)));
    }
}

#[test]
fn repetition_penalty_touches_only_the_window() {
    let base = vec![2.0f32, -2.0, 4.0, -1.0, 3.0, 0.5];
    let mut logits = base.clone();
    let p = SamplingParams {
        repeat_penalty: 2.0,
        repeat_last_n: 3,
        ..SamplingParams::greedy()
    };
    // Token 4 is outside the last-3 window; token 1 appears twice but is penalised once.
    Sampler::new(p).adjust(&mut logits, &[4, 1, 2, 1]);
    let want = [2.0f32, -4.0, 2.0, -1.0, 3.0, 0.5];
    assert_eq!(logits, want);
    // Off when the penalty is 1 or the window is 0.
    for p in [
        SamplingParams {
            repeat_penalty: 1.0,
            repeat_last_n: 3,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            repeat_penalty: 2.0,
            repeat_last_n: 0,
            ..SamplingParams::greedy()
        },
    ] {
        let mut l = base.clone();
        Sampler::new(p).adjust(&mut l, &[0, 1, 2]);
        assert_eq!(l, base);
    }
}

#[test]
fn presence_and_frequency_penalties_count_generated_tokens() {
    let base = vec![1.0f32; 8];
    let mut s = Sampler::new(SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..SamplingParams::greedy()
    });
    s.accept(5);
    s.accept(5);
    s.accept(7);
    let mut logits = base.clone();
    // The context (prompt) does not count: token 2 is in it but was never generated.
    s.adjust(&mut logits, &[2, 2, 2]);
    let mut want = base.clone();
    want[5] = 1.0 - (2.0 * 0.25 + 0.5);
    want[7] = 1.0 - (0.25 + 0.5);
    assert_eq!(logits, want);
}

#[test]
fn logit_bias_adds_and_bans() {
    let mut s = Sampler::new(SamplingParams {
        logit_bias: vec![(1, f32::NEG_INFINITY), (2, 1.5)],
        ..params(1.0, 0, 1.0, 0.0)
    });
    let mut logits = vec![0.0f32, 10.0, 0.5];
    s.adjust(&mut logits, &[]);
    assert_eq!(logits, [0.0, f32::NEG_INFINITY, 2.0]);
    let base = [0.0f32, 10.0, 0.5];
    for _ in 0..1000 {
        let mut l = base;
        assert_ne!(s.sample(&mut l, &[]), 1, "a banned token is never drawn");
    }
}

#[test]
fn bad_parameters_are_named() {
    let vocab = 100;
    let bad = [
        (
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            "repeat_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: f32::NAN,
                ..Default::default()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                logit_bias: vec![(100, 1.0)],
                ..Default::default()
            },
            "outside the vocabulary",
        ),
    ];
    for (p, needle) in bad {
        let err = p.validate(vocab).unwrap_err();
        assert!(err.contains(needle), "{err}");
    }
    assert!(SamplingParams::default().validate(vocab).is_ok());
}

#[test]
fn logprobs_are_log_softmax() {
    let logits = random_logits(10_000, 6);
    let lp = logprobs(&logits, 17, 5);
    let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
    assert!((lp.logprob as f64 - (logits[17] as f64 - z.ln())).abs() < 1e-4);
    let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
    let want: Vec<u32> = reference_set(&logits, 5, 1.0, 0.0).into_iter().collect();
    assert_eq!(
        ids.iter().copied().collect::<BTreeSet<_>>(),
        want.into_iter().collect()
    );
    assert!(
        lp.top.windows(2).all(|w| w[0].1 >= w[1].1),
        "most likely first"
    );
}

/// Sampling a 262k row must cost a small fraction of a full sort of it (what a naive sampler
/// would do per token).
#[test]
fn sampling_a_gemma_row_is_cheaper_than_sorting_it() {
    let logits = random_logits(262_144, 8);
    let time = |f: &mut dyn FnMut()| {
        let runs = 10;
        let start = Instant::now();
        for _ in 0..runs {
            f();
        }
        start.elapsed() / runs
    };
    let sort = time(&mut || {
        let mut all: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &logit)| Candidate {
                id: i as u32,
                logit,
            })
            .collect();
        all.sort_unstable_by(descending);
        std::hint::black_box(&all);
    });
    for (name, p) in [
        ("llama.cpp defaults", params(0.8, 40, 0.95, 0.05)),
        ("top-p only", params(1.0, 0, 0.95, 0.0)),
    ] {
        let mut s = Sampler::new(p);
        let sample = time(&mut || {
            std::hint::black_box(s.choose(&logits));
        });
        assert!(
            sample * 2 < sort,
            "{name}: sampling took {sample:?}, a full sort {sort:?}"
        );
    }
}
