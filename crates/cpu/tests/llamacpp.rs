//! The CPU engine against llama.cpp on the two real models (../shared/fixtures/llamacpp):
//! teacher-forced agreement on prompt + llama.cpp's 32 greedy tokens wherever llama.cpp's own
//! top-1/top-2 margin is at least 0.5 (and at least one such step per prompt), and the top-10
//! logits after each prompt within a stated bound of llama.cpp's `precise` run: 0.46 with f32
//! products, 0.7 with the default 8-bit activations (or, where larger, how far llama.cpp's own
//! default and precise runs of the prompt differ). The models come from
//! scripts/fetch-models.py.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anelm_cpu::{CpuExecutor, CpuOptions};
use anelm_model::{Executor, Logits};
use anelm_testkit::argmax;
use serde_json::Value;

const MARGIN: f64 = 0.5;

fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("ANELM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/anelm/models")
        });
    let p = dir.join(file);
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/fetch-models.py`",
        p.display()
    );
    p
}

fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/llamacpp")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Largest top-10 |difference| from llama.cpp: with f32 products (the same bits on AVX2 and
/// AVX-512; measured 2026-12-06: at most 0.4502, Gemma 3's `french`), and with 8-bit
/// activations. Those round each layer's input to 1/127 of its block's largest value, and which
/// way a value rounds follows any reordering of a sum upstream, so the second bound is the
/// spread over kernels that compute the same thing: measured 2026-12-06 at most 0.5757 with the
/// AVX2 kernels (Gemma 3 `capital`, 0.3461 with AVX-512) and 0.6339 with AVX-512 (`code` against
/// the default run). Where llama.cpp's own default and precise runs differ by more than that
/// (Gemma 3's `code`: 1.33, `french`: 0.72), the prompt is that sensitive to rounding and the
/// 8-bit bound is llama.cpp's own spread: on an AVX2-only AMD EPYC (Zen 3), 2026-12-07, `code`
/// came 0.8577 from the default run with the AVX2 kernels and 0.7358 with the scalar reference
/// kernels (`ANELM_ISA=scalar`), against 0.3169 with f32 products.
const TOP10_EXACT: f64 = 0.46;
const TOP10_Q8: f64 = 0.7;

/// Gemma 3's `code` prompt, where llama.cpp's precise run is the outlier: its default run and
/// an independent float64 forward pass (`scripts/gemma3-f64-forward.py`: top logit 24.188;
/// llama.cpp precise 25.301, default 24.220) agree with each other, so there the bound applies
/// to the default run.
const PRECISE_IS_THE_OUTLIER: &[(&str, &str)] = &[("gemma-3-270m-q4_k_m.gguf", "code")];

/// The largest top-10 |difference| between llama.cpp's default and precise runs of a prompt,
/// over the tokens both lists hold: how far rounding alone moves that prompt's logits.
fn own_spread(p: &Value) -> f64 {
    let top = |v: &Value| -> Vec<(u64, f64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| (e["id"].as_u64().unwrap(), e["logit"].as_f64().unwrap()))
            .collect()
    };
    let precise = top(&p["precise"]["top10_after_prompt"]);
    top(&p["top10_after_prompt"])
        .iter()
        .filter_map(|&(id, l)| precise.iter().find(|e| e.0 == id).map(|e| (l - e.1).abs()))
        .fold(0f64, f64::max)
}

/// `exact`: f32 products for the quantised weights too, instead of the default 8-bit activations.
fn check_model(gguf: &str, fixture_name: &str, exact: bool) {
    let bound = if exact { TOP10_EXACT } else { TOP10_Q8 };
    let fx = fixture(fixture_name);
    let model = Arc::new(anelm_model::load(&model_path(gguf)).unwrap());
    let mut exec = CpuExecutor::with_options(
        model,
        CpuOptions {
            threads: 2,
            exact,
            ..CpuOptions::default()
        },
    );
    let vocab = exec.vocab_size();
    for p in fx["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["ids"]);
        let greedy = ids(&p["greedy_ids"]);
        let all: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
        let mut state = exec.new_state(all.len()).unwrap();
        let mut logits = Vec::new();
        exec.forward(state.as_mut(), &all, Logits::All, &mut logits)
            .unwrap();

        // Teacher-forced agreement on the generated steps.
        let (mut agree, mut checked) = (0, 0);
        for (step, s) in p["greedy_steps"].as_array().unwrap().iter().enumerate() {
            let pos = prompt.len() - 1 + step;
            let ours = argmax(&logits[pos * vocab..(pos + 1) * vocab]);
            if s["margin_top1_top2"].as_f64().unwrap() >= MARGIN {
                checked += 1;
                assert_eq!(
                    ours, greedy[step],
                    "{name}: step {step} (margin {})",
                    s["margin_top1_top2"]
                );
                agree += 1;
            }
        }
        assert!(
            checked > 0,
            "{name}: no teacher-forced step had a margin of {MARGIN}: nothing was judged"
        );
        // Top-10 after the prompt: llama.cpp's precise run (f32 KV, no flash attention) is the
        // reference; its default run bounds llama.cpp's own noise.
        let last = &logits[(prompt.len() - 1) * vocab..prompt.len() * vocab];
        let max_diff = |key: &Value| {
            key.as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (last[e["id"].as_u64().unwrap() as usize] as f64 - e["logit"].as_f64().unwrap())
                        .abs()
                })
                .fold(0f64, f64::max)
        };
        let precise = max_diff(&p["precise"]["top10_after_prompt"]);
        let default = max_diff(&p["top10_after_prompt"]);
        println!(
            "{gguf}{} {name:12}: {agree}/{checked} confident steps agree; top-10 max |diff| {precise:.4} vs precise, {default:.4} vs default",
            if exact { " (exact)" } else { "" }
        );
        let (judged, against) = if PRECISE_IS_THE_OUTLIER.contains(&(gguf, name)) {
            (default, "default")
        } else {
            (precise, "precise")
        };
        let bound = if exact {
            bound
        } else {
            bound.max(own_spread(p))
        };
        assert!(
            judged <= bound,
            "{name}: top-10 logits differ from llama.cpp's {against} run by {judged:.4} > {bound:.4} (precise {precise:.4}, default {default:.4})"
        );
    }
}

#[test]
fn smollm2_matches_llamacpp() {
    check_model(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct-q4_1.prompts.json",
        false,
    );
}

#[test]
fn gemma3_matches_llamacpp() {
    check_model(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma-3-270m-q4_k_m.prompts.json",
        false,
    );
}

#[test]
fn smollm2_exact_matches_llamacpp() {
    check_model(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct-q4_1.prompts.json",
        true,
    );
}

#[test]
fn gemma3_exact_matches_llamacpp() {
    check_model(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma-3-270m-q4_k_m.prompts.json",
        true,
    );
}
