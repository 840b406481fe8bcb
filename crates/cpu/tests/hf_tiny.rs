//! The CPU engine against Hugging Face transformers on the tiny random-weight fixtures
//! (../shared/fixtures/hf-tiny): argmax at every prompt position, the last four logit rows within
//! 1e-4, and 16 greedy tokens decoded through the KV cache (and the recurrent state of the
//! DeltaNet layers) — from safetensors and from GGUF, for the dense, MoE and hybrid families.

use std::path::Path;
use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_model::{Executor, Logits};
use anelm_testkit::{
    argmax, ids, repo_tiny, tiny, tiny_gguf, DENSE_TINY as DENSE, MOE_HYBRID_TINY,
    TINY_WITH_GGUF as WITH_GGUF,
};
use serde_json::Value;

fn fixtures() -> std::path::PathBuf {
    anelm_testkit::shared("fixtures/hf-tiny")
}

/// Checks one model file against the arch's reference; returns the largest logit difference.
fn check(arch: &str, model_path: &Path) -> f32 {
    check_against(
        &fixtures().join(arch).join("reference.json"),
        arch,
        model_path,
    )
}

/// [`check`] against the reference file `reference`: transformers' reference.json of a fixture,
/// or llama.cpp's outputs on a GGUF (scripts/gen-llamacpp-tiny.py; greedy tokens as a plain list).
fn check_against(reference: &Path, arch: &str, model_path: &Path) -> f32 {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let model = Arc::new(anelm_model::load(model_path).unwrap_or_else(|e| panic!("{arch}: {e}")));
    let mut exec = CpuExecutor::new(model, 2);
    let vocab = exec.vocab_size();
    let mut worst = 0f32;
    for (case_name, case) in reference["cases"].as_object().unwrap() {
        let prompt = ids(&case["input_ids"]);
        let mut state = exec.new_state(prompt.len() + 16).unwrap();
        let mut logits = Vec::new();
        exec.forward(state.as_mut(), &prompt, Logits::All, &mut logits)
            .unwrap();
        let got: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
        assert_eq!(
            got,
            ids(&case["argmax"]),
            "{arch} {case_name}: argmax per position ({})",
            model_path.display()
        );
        for (row, pos) in case["last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .zip(case["last_positions"].as_array().unwrap())
        {
            let pos = pos.as_u64().unwrap() as usize;
            for (i, want) in row.as_array().unwrap().iter().enumerate() {
                let d = (logits[pos * vocab + i] - want.as_f64().unwrap() as f32).abs();
                worst = worst.max(d);
            }
        }
        // Greedy decoding through the cache, one token per step.
        let mut next = *got.last().unwrap();
        let mut greedy = vec![next];
        for _ in 1..16 {
            exec.forward(state.as_mut(), &[next], Logits::Last, &mut logits)
                .unwrap();
            next = argmax(&logits);
            greedy.push(next);
        }
        let want = &case["greedy"];
        let want = ids(if want.is_array() {
            want
        } else {
            &want["tokens"]
        });
        assert_eq!(
            greedy,
            want,
            "{arch} {case_name}: greedy ({})",
            model_path.display()
        );
    }
    assert!(
        worst <= 1e-4,
        "{arch}: largest logit difference {worst} ({})",
        model_path.display()
    );
    worst
}

#[test]
fn dense_safetensors_match_transformers() {
    for arch in DENSE {
        let d = check(arch, &fixtures().join(arch));
        println!("{arch:8} safetensors: max |logit diff| {d:.2e}");
    }
}

#[test]
fn moe_and_hybrid_safetensors_match_transformers() {
    for arch in MOE_HYBRID_TINY {
        let d = check(arch, &tiny(arch));
        println!("{arch:12} safetensors: max |logit diff| {d:.2e}");
    }
}

#[test]
fn dense_gguf_match_transformers() {
    for arch in WITH_GGUF {
        let d = check(arch, &fixtures().join(arch).join("model.gguf"));
        println!("{arch:8} gguf: max |logit diff| {d:.2e}");
    }
}

/// GGUF files written by llama.cpp's converter from fixtures that ship none
/// (scripts/gen-gguf-fixtures.py): (fixture folder, file).
const CONVERTED: [(&str, &str); 9] = [
    ("gemma", "gemma"),
    ("gemma2", "gemma2"),
    ("gpt2", "gpt2"),
    ("qwen2_moe", "qwen2_moe"),
    ("qwen3_moe", "qwen3_moe"),
    ("qwen3_next", "qwen3_next"),
    ("qwen3_next", "qwen3_next-fused"),
    ("qwen3_5", "qwen3_5"),
    ("qwen3_5_moe", "qwen3_5_moe"),
];

/// The fixture's safetensors as a GGUF file can express them. GGUF has no key for Gemma 2's
/// `query_pre_attn_scalar` (the fixture's is 24, not its head_dim of 32): llama.cpp scales by
/// 1/sqrt(key_length), so the GGUF is compared with the safetensors under that config.
fn safetensors_as_gguf_holds_it(arch: &str) -> std::path::PathBuf {
    if arch != "gemma2" {
        return tiny(arch);
    }
    let dir = std::env::temp_dir().join(format!("anelm-hf-tiny-gemma2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny(arch).join("config.json")).unwrap())
            .unwrap();
    config["query_pre_attn_scalar"] = config["head_dim"].clone();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        tiny(arch).join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    dir
}

#[test]
fn converted_gguf_match_transformers_and_safetensors() {
    for (arch, file) in CONVERTED {
        let gguf = tiny_gguf(file);
        // transformers' reference holds Gemma 2's real scale, which the GGUF cannot carry.
        let d = if arch == "gemma2" {
            f32::NAN
        } else {
            check(arch, &gguf)
        };
        let from_gguf = last_logits(&gguf);
        let from_st = last_logits(&safetensors_as_gguf_holds_it(arch));
        let worst = from_gguf
            .iter()
            .zip(&from_st)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-4,
            "{file}: GGUF vs safetensors logits differ by {worst}"
        );
        println!(
            "{file:20} gguf: max |logit diff| {d:.2e} vs transformers, {worst:.2e} vs safetensors"
        );
    }
}

/// Every logit at every position of an 80-token prompt (past the DeltaNet chunk of 64).
fn last_logits(model_path: &Path) -> Vec<f32> {
    let model = Arc::new(anelm_model::load(model_path).unwrap());
    let mut exec = CpuExecutor::new(model, 2);
    let prompt: Vec<u32> = (0..80u32).map(|i| 4 + (i * 37) % 500).collect();
    let mut state = exec.new_state(prompt.len()).unwrap();
    let mut logits = Vec::new();
    exec.forward(state.as_mut(), &prompt, Logits::All, &mut logits)
        .unwrap();
    logits
}

/// LFM2 (short convolutions and attention layers, scripts/gen-lfm2-fixture.py): from safetensors
/// and from the GGUF llama.cpp's converter wrote.
#[test]
fn lfm2_safetensors_and_gguf_match_transformers() {
    let dir = repo_tiny("lfm2");
    let reference = dir.join("reference.json");
    let d = check_against(&reference, "lfm2", &dir);
    let g = check_against(&reference, "lfm2", &tiny_gguf("lfm2"));
    let (a, b) = (last_logits(&dir), last_logits(&tiny_gguf("lfm2")));
    let worst = a
        .iter()
        .zip(&b)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-4,
        "lfm2: GGUF vs safetensors logits differ by {worst}"
    );
    println!("lfm2     max |logit diff| vs transformers: safetensors {d:.2e}, gguf {g:.2e}; gguf vs safetensors {worst:.2e}");
}

/// Mixture layouts the shared fixtures do not cover (scripts/gen-moe-fixtures.py): Qwen2-MoE
/// with sliding-window layers (a window of 16 on layers 0 and 2, every prompt past it), and
/// Qwen3-MoE with dense and mixture layers interleaved (6 experts, top-3, weights not
/// renormalised) — each layout read from the config as transformers reads it, the logits in
/// prefill and through the cached greedy steps.
#[test]
fn moe_layouts_match_transformers() {
    use anelm_model::plan::Ffn;
    let swa = anelm_model::load(&repo_tiny("qwen2_moe_swa")).unwrap();
    let windows: Vec<_> = (swa.layers.iter())
        .map(|l| l.attention().unwrap().window)
        .collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    let mixed = anelm_model::load(&repo_tiny("qwen3_moe_mixed")).unwrap();
    let ffns: Vec<_> = (mixed.layers.iter())
        .map(|l| match &l.ffn {
            Ffn::Moe(m) => Some((m.experts.len(), m.top_k, m.norm_top_k)),
            _ => None,
        })
        .collect();
    let moe = Some((6, 3, false));
    assert_eq!(ffns, [None, moe, None, moe]);
    for name in ["qwen2_moe_swa", "qwen3_moe_mixed"] {
        let dir = repo_tiny(name);
        let d = check_against(&dir.join("reference.json"), name, &dir);
        println!("{name:16} max |logit diff| vs transformers: {d:.2e}");
    }
}

/// The CPU engine against llama.cpp running the same converted GGUF files
/// (scripts/gen-llamacpp-tiny.py: llama.cpp of llama-cpp-python 0.3.36, f32 KV, no flash
/// attention): argmax at every prompt position, 16 greedy tokens, and the last four logit rows
/// within 1e-4. The DeltaNet hybrids are not among them: that llama.cpp refuses their fixtures
/// (it takes the value head width to be the key head width; the fixtures' differ).
#[test]
fn moe_and_lfm2_gguf_match_llamacpp() {
    for file in ["qwen2_moe", "qwen3_moe", "lfm2"] {
        let gguf = tiny_gguf(file);
        let reference = gguf.with_extension("llamacpp.json");
        let worst = check_against(&reference, file, &gguf);
        println!("{file:10} vs llama.cpp: max |logit diff| {worst:.2e}");
    }
}
