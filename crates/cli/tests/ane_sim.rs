//! The ANE path through the `anelm` binary on the simulator: verify (both real models, the shared
//! llama.cpp prompts, 16 greedy tokens each), check (every kernel), layers, compile (MIL
//! directories, and a Core ML package the coremltools validator accepts) and run --device sim;
//! and the errors of these commands.

use std::path::Path;
use std::time::Instant;

use anelm_testkit::{model, shared, tiny, validate_mlpackage, GEMMA3, SMOLLM2};
use serde_json::Value;

fn anelm(args: &[&str]) -> (bool, String, String) {
    anelm_testkit::run_program(env!("CARGO_BIN_EXE_anelm"), args)
}

fn anelm_json(args: &[&str]) -> Value {
    let (ok, out, err) = anelm(args);
    assert!(ok, "anelm {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("anelm {args:?}: {e}: {out}"))
}

/// `anelm verify --device sim` of a model on a prompt file, in `dialect`; checks the accuracy
/// every run must reach and that the dialect was the one asked for.
fn verify_in(m: &Path, prompts: &Path, strategy: &str, dialect: &str) -> Value {
    verify_with(m, prompts, strategy, dialect, &[])
}

/// [`verify_in`] with more arguments.
fn verify_with(m: &Path, prompts: &Path, strategy: &str, dialect: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "verify",
        "--model",
        m.to_str().unwrap(),
        "--device",
        "sim",
        "--strategy",
        strategy,
        "--mil-dialect",
        dialect,
        "--prompts",
        prompts.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let v = anelm_json(&args);
    assert_eq!(v["mil_dialect"], dialect, "{v}");
    assert_eq!(v["strategy"], strategy, "{v}");
    let rel = v["max_rel_err"].as_f64().unwrap();
    assert!(rel > 0.0 && rel <= 2e-2, "max_rel_err {rel}");
    // Greedy decoding may part only at a near-tie of the reference (its top-2 gap below 3e-3
    // of the largest logit), and then for one prompt at most.
    assert_eq!(v["greedy_same_but_near_ties"], true, "{v}");
    let mut parted = 0;
    for p in v["prompts"].as_array().unwrap() {
        assert_eq!(p["greedy_device"].as_array().unwrap().len(), 16);
        match p["first_difference"]["step"].as_u64() {
            None => assert_eq!(p["greedy_device"], p["greedy_reference"], "{p}"),
            Some(step) => {
                parted += 1;
                let (d, r) = (&p["greedy_device"], &p["greedy_reference"]);
                for i in 0..step as usize {
                    assert_eq!(d[i], r[i], "{p}");
                }
            }
        }
    }
    assert!(parted <= 1, "{parted} prompts parted: {v}");
    v
}

fn verify(file: &str, fixture: &str, strategy: &str) -> Value {
    let m = model(file);
    let prompts = shared(&format!("fixtures/llamacpp/{fixture}"));
    let v = verify_in(&m, &prompts, strategy, "a");
    // 4 prompts of at most 64 tokens: one evaluation of every program per prompt, then 15 per
    // prompt for the decoded tokens.
    let per_token = v["dispatches_per_token"].as_u64().unwrap();
    assert_eq!(v["dispatches"].as_u64().unwrap(), 4 * 16 * per_token, "{v}");
    for p in v["prompts"].as_array().unwrap() {
        println!(
            "{}: rel {} same {}",
            p["name"], p["rel_err"], p["greedy_same"]
        );
    }
    assert_eq!(v["prompts"].as_array().unwrap().len(), 4);
    assert_eq!(v["reference"], "cpu-f32");
    // The default policy holds the file's blocks: well under the fp16 bytes, nothing kept at fp16.
    let w = &v["weights"];
    assert_eq!(w["policy"], "auto", "{w}");
    assert!(w["ratio_to_fp16"].as_f64().unwrap() < 0.6, "{w}");
    assert_eq!(w["kept_fp16"].as_array().unwrap().len(), 0, "{w}");
    assert!(
        w["uncompressed_max_rel_err"].is_null(),
        "auto compresses nothing: {w}"
    );
    v
}

#[test]
fn smollm2_verify_within_a_minute() {
    let t = Instant::now();
    let v = verify(
        SMOLLM2,
        "smollm2-135m-instruct-q4_1.prompts.json",
        "projection",
    );
    let secs = t.elapsed().as_secs_f64();
    println!("SmolLM2 verify: {secs:.1} s ({})", v["seconds"]);
    assert_eq!(
        (v["strategy"].as_str(), v["programs"].as_u64()),
        (Some("projection"), Some(3 * 30 + 1))
    );
    assert_eq!(v["dispatches_per_token"], 3 * 30 + 1);
    assert!(secs < 60.0, "a full SmolLM2 verify took {secs:.1} s");
}

#[test]
fn gemma3_verify() {
    let v = verify(GEMMA3, "gemma-3-270m-q4_k_m.prompts.json", "projection");
    println!("Gemma 3 verify: {}", v["seconds"]);
}

#[test]
fn fused_verify_of_both_models() {
    // SmolLM2's 30 layers in two chunks (24 layers at most each); Gemma 3's 18 in one.
    for (file, fixture, chunks) in [
        (SMOLLM2, "smollm2-135m-instruct-q4_1.prompts.json", 2),
        (GEMMA3, "gemma-3-270m-q4_k_m.prompts.json", 1),
    ] {
        let v = verify(file, fixture, "fused");
        println!(
            "{file} fused verify: {} dispatches per token, {}",
            v["dispatches_per_token"], v["seconds"]
        );
        assert_eq!(v["strategy"], "fused");
        assert_eq!(v["dispatches_per_token"], chunks, "{file}");
    }
}

#[test]
fn fused_packages_validate_and_fused_check() {
    let out = tempfile::tempdir().unwrap();
    let m = model(SMOLLM2);
    let m = m.to_str().unwrap();
    let (ok, stdout, err) = anelm(&[
        "compile",
        "--model",
        m,
        "--strategy",
        "fused",
        "--out",
        out.path().to_str().unwrap(),
        "--format",
        "mlpackage",
    ]);
    assert!(ok, "{err}");
    assert!(
        stdout.contains("2 chunks") && stdout.contains("2 dispatches per token"),
        "the plan is printed: {stdout}"
    );
    assert!(
        stdout.contains("layers 0..15") && stdout.contains("layers 15..30 + head"),
        "{stdout}"
    );
    for chunk in ["chunk0", "chunk1"] {
        let pkg = out
            .path()
            .join(format!("SmolLM2-135M-Instruct.Q4_1_{chunk}.mlpackage"));
        let (code, report) = validate_mlpackage(&pkg);
        assert_eq!(code, 0, "{chunk}: {report}");
        let f = report["summary"]["functions"].as_object().unwrap();
        assert_eq!(f.len(), 2, "{chunk}: prefill and decode");
        assert_eq!(f["decode"]["inputs"]["x"], "FLOAT16[1,576,1,1]");
        assert_eq!(f["prefill"]["inputs"]["x"], "FLOAT16[1,576,1,64]");
    }
    let v = anelm_json(&["check", "--model", m, "--strategy", "fused", "--json"]);
    let chunks = v["kernels"].as_array().unwrap();
    assert_eq!(chunks.len(), 4, "two chunks, prefill and decode: {v}");
    assert_eq!(v["pass"], true, "{v}");
    assert!(v["max_rel_err"].as_f64().unwrap() <= 2e-2);
}

#[test]
fn check_every_kernel_of_both_models() {
    for file in [SMOLLM2, GEMMA3] {
        let m = model(file);
        let v = anelm_json(&["check", "--model", m.to_str().unwrap(), "--json"]);
        let kernels = v["kernels"].as_array().unwrap();
        let layers = if file == SMOLLM2 { 30 } else { 18 };
        assert_eq!(
            kernels.len(),
            2 * (3 * layers + 1),
            "{file}: prefill and decode of every kernel"
        );
        // Measured 2026-12-02 (--weights auto): SmolLM2 3.75e-3, Gemma 3 1.72e-3.
        for k in kernels {
            assert!(k["rel_err"].as_f64().unwrap() <= 4e-3, "{file}: {k}");
        }
        assert_eq!(v["pass"], true);
        println!("{file}: worst kernel {}", v["max_rel_err"]);
    }
}

#[test]
fn compile_writes_a_package_the_validator_accepts() {
    let out = tempfile::tempdir().unwrap();
    let m = model(SMOLLM2);
    let (ok, stdout, err) = anelm(&[
        "compile",
        "--model",
        m.to_str().unwrap(),
        "--out",
        out.path().to_str().unwrap(),
        "--format",
        "mlpackage",
    ]);
    assert!(ok, "{err}");
    assert!(
        stdout.contains("layer29_ffn") && stdout.contains("lm_head"),
        "the plan is printed: {stdout}"
    );
    let pkg = out.path().join("SmolLM2-135M-Instruct.Q4_1.mlpackage");
    let (code, report) = validate_mlpackage(&pkg);
    assert_eq!(code, 0, "{report}");
    let functions = report["summary"]["functions"].as_object().unwrap();
    assert_eq!(functions.len(), 91);
    assert_eq!(
        functions["layer00_qkv"]["inputs"]["x"],
        "FLOAT16[1,576,1,64]"
    );
    assert_eq!(
        functions["layer00_qkv"]["inputs"]["descale"],
        "FLOAT16[1,1,1,64]"
    );
    assert!(
        report["warnings"].as_array().unwrap().is_empty(),
        "{report}"
    );
}

#[test]
fn compile_mil_directories_read_back() {
    let out = tempfile::tempdir().unwrap();
    let dir = tiny("qwen2");
    let (ok, _, err) = anelm(&[
        "compile",
        "--model",
        dir.to_str().unwrap(),
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let p = anelm_mil::text::read_model_dir(&out.path().join("layer00_qkv")).unwrap();
    let f = &p.functions[0];
    assert!(
        f.ops().iter().any(|o| o.op_type == "add"),
        "qwen2's QKV biases are added after the conv"
    );
    assert!(out.path().join("lm_head/weights/logits0_w.bin").exists());
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 3 * 4 + 1);
}

#[test]
fn layers_and_run_on_the_simulator() {
    let m = model(SMOLLM2);
    let m = m.to_str().unwrap();
    let v = anelm_json(&["layers", "--model", m, "--upto", "2", "--json"]);
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    assert!(
        layers.iter().all(|l| l["rel_err"].as_f64().unwrap() < 1e-2),
        "{v}"
    );
    for (strategy, per_token) in [("projection", 3 * 30 + 1), ("fused", 2)] {
        let r = anelm_json(&[
            "run",
            "--model",
            m,
            "--device",
            "sim",
            "--strategy",
            strategy,
            "--ids",
            "504,3575,282,4649,314",
            "-n",
            "3",
            "--json",
        ]);
        assert_eq!(r["ids"].as_array().unwrap().len(), 3);
        assert!(r["text"].as_str().unwrap().starts_with(" Paris"), "{r}");
        assert_eq!(r["dispatches_per_token"], per_token, "{strategy}: {r}");
    }
}

#[test]
fn bad_requests_are_one_line_errors() {
    let m = model(SMOLLM2);
    let m = m.to_str().unwrap();
    for (args, needle) in [
        (vec!["verify", "--model", m], "--device sim"),
        (vec!["layers", "--model", m, "--upto", "30"], "30 layers"),
        (
            vec![
                "verify",
                "--model",
                m,
                "--device",
                "sim",
                "--prompts",
                "/nonexistent.json",
            ],
            "/nonexistent.json",
        ),
        (
            vec![
                "verify",
                "--model",
                m,
                "--device",
                "sim",
                "--ids",
                "1,99999999",
            ],
            "outside the vocabulary",
        ),
    ] {
        let (ok, _, err) = anelm(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.trim().starts_with("error:") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn fused_programs_hold_the_context_the_command_needs() {
    // 1100 positions: more than the lowering's default context (1024).
    let m = tiny("llama");
    let ids: Vec<String> = (0..1100).map(|i| (3 + i * 7 % 500).to_string()).collect();
    let ids = ids.join(",");
    let eval = |device: &[&str]| {
        let mut args = vec![
            "eval",
            "--model",
            m.to_str().unwrap(),
            "--ids",
            &ids,
            "--json",
        ];
        args.extend_from_slice(device);
        anelm_json(&args)
    };
    let sim = eval(&["--device", "sim", "--strategy", "fused"]);
    let cpu = eval(&["--device", "cpu"]);
    let row = |v: &Value| -> Vec<f32> {
        let l = v["last_logits"].as_array().unwrap();
        l.iter().map(|x| x.as_f64().unwrap() as f32).collect()
    };
    let (a, b) = (row(&sim), row(&cpu));
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        err <= 2e-2 * scale,
        "last logits differ by {err} (scale {scale})"
    );
}

#[test]
fn dialect_b_verify_of_the_tiny_fixtures_and_smollm2_both_strategies() {
    for strategy in ["projection", "fused"] {
        for family in ["llama", "gemma3", "gpt2"] {
            let prompts = shared(&format!("fixtures/hf-tiny/{family}/reference.json"));
            let v = verify_in(&tiny(family), &prompts, strategy, "b");
            println!("{family} {strategy} dialect b: rel {}", v["max_rel_err"]);
        }
        let v = verify_in(
            &model(SMOLLM2),
            &shared("fixtures/llamacpp/smollm2-135m-instruct-q4_1.prompts.json"),
            strategy,
            "b",
        );
        assert_eq!(v["greedy_same"], true, "{v}");
        println!("SmolLM2 {strategy} dialect b: rel {}", v["max_rel_err"]);
    }
}

/// Dialect B has no blockwise weights: `auto` keeps the file's values as fp16 and says so per
/// tensor; `int8` holds them per channel (constexpr_affine_dequantize), its error against the
/// uncompressed model measured; `int4` is refused naming a tensor.
#[test]
fn dialect_b_weights_of_both_models() {
    let gemma = model(GEMMA3);
    let gemma_prompts = shared("fixtures/llamacpp/gemma-3-270m-q4_k_m.prompts.json");
    for strategy in ["projection", "fused"] {
        let v = verify_in(&gemma, &gemma_prompts, strategy, "b");
        println!("Gemma 3 {strategy} dialect b: rel {}", v["max_rel_err"]);
        let w = &v["weights"];
        assert_eq!(w["policy"], "auto", "{w}");
        assert!(w["ratio_to_fp16"].as_f64().unwrap() > 0.99, "{w}");
        let kept = w["kept_fp16"].as_array().unwrap();
        assert!(!kept.is_empty());
        assert!(kept.iter().any(|k| k["reason"]
            .as_str()
            .unwrap()
            .contains("dialect B (ios16) has no blockwise weights")));
    }
    let smol = model(SMOLLM2);
    let smol_prompts = shared("fixtures/llamacpp/smollm2-135m-instruct-q4_1.prompts.json");
    let v = verify_with(
        &smol,
        &smol_prompts,
        "projection",
        "b",
        &["--weights", "int8"],
    );
    let w = &v["weights"];
    println!("SmolLM2 dialect b int8: {w}");
    let ratio = w["ratio_to_fp16"].as_f64().unwrap();
    assert!((0.5..0.52).contains(&ratio), "{w}");
    let against = w["uncompressed_max_rel_err"].as_f64().unwrap();
    assert!(against > 0.0 && against < 0.1, "{w}");
    assert_eq!(w["kept_fp16"].as_array().unwrap().len(), 0, "{w}");
    let (ok, _, err) = anelm(&[
        "verify",
        "--model",
        smol.to_str().unwrap(),
        "--device",
        "sim",
        "--mil-dialect",
        "b",
        "--weights",
        "int4",
        "--ids",
        "1,2,3",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--weights int4 needs dialect A") && err.lines().count() <= 2,
        "{err}"
    );
}

#[test]
fn dialect_b_packages_validate_at_spec_7() {
    let m = tiny("llama");
    // Dialect B's weights: fp16 under auto, per-channel uint8 (constexpr_affine_dequantize)
    // under int8.
    for (weights, strategy, files) in [
        (
            "auto",
            "projection",
            vec!["layer00_qkv".to_string(), "lm_head".into()],
        ),
        (
            "auto",
            "fused",
            vec!["chunk0_prefill".into(), "chunk0_decode".into()],
        ),
        (
            "int8",
            "projection",
            vec!["layer00_ffn".to_string(), "lm_head".into()],
        ),
        ("int8", "fused", vec!["chunk0_decode".into()]),
    ] {
        let out = tempfile::tempdir().unwrap();
        let (ok, _, err) = anelm(&[
            "compile",
            "--model",
            m.to_str().unwrap(),
            "--strategy",
            strategy,
            "--weights",
            weights,
            "--mil-dialect",
            "b",
            "--out",
            out.path().to_str().unwrap(),
            "--format",
            "mlpackage",
        ]);
        assert!(ok, "{err}");
        let written = std::fs::read_dir(out.path()).unwrap().count();
        let expected = if strategy == "projection" {
            3 * 4 + 1
        } else {
            2
        };
        assert_eq!(
            written, expected,
            "{strategy}: one package per kernel / function"
        );
        for f in files {
            let pkg = std::fs::read_dir(out.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.to_string_lossy().ends_with(&format!("_{f}.mlpackage")))
                .unwrap_or_else(|| panic!("{strategy}: no package of {f}"));
            let (code, report) = validate_mlpackage(&pkg);
            assert_eq!(code, 0, "{f}: {report}");
            let ops = &report["summary"]["functions"]["main"]["op_types"];
            let affine = ops["constexpr_affine_dequantize"].as_u64().unwrap_or(0);
            assert_eq!(affine > 0, weights == "int8", "{f}: {ops}");
            assert_eq!(
                report["summary"]["specificationVersion"], 7,
                "{f}: {report}"
            );
            assert!(
                report["warnings"].as_array().unwrap().is_empty(),
                "{report}"
            );
        }
    }
}

/// `--mb-per-chunk`: under a ceiling below one tiny Qwen2-MoE layer (0.099 MB) each mixture is
/// split by experts across two programs, verify holds its bar, the dispatches say so; a ceiling
/// that is not a positive number is one clear line.
#[test]
fn fused_verify_with_mixtures_split_across_programs() {
    let dir = tiny("qwen2_moe");
    let prompts = dir.join("reference.json");
    let v = verify_with(&dir, &prompts, "fused", "a", &["--mb-per-chunk", "0.09"]);
    println!("qwen2_moe split: {v}");
    assert_eq!(
        v["dispatches_per_token"], 8,
        "two programs per layer, the head in the last"
    );
    // The long prompt's greedy steps meet a router near-tie of the reference (position 41,
    // gap 1.9e-3): the device ran it again following the reference's tied choices.
    let forced: Vec<_> = (v["prompts"].as_array().unwrap().iter())
        .filter(|p| p["router_choices_forced"].as_u64().is_some_and(|n| n > 0))
        .collect();
    assert!(!forced.is_empty(), "{v}");
    for p in forced {
        assert!(
            p["rel_err_clear_of_router_ties"].as_f64() <= p["rel_err"].as_f64(),
            "{p}"
        );
    }
    let (ok, _, err) = anelm(&[
        "verify",
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "sim",
        "--strategy",
        "fused",
        "--mb-per-chunk",
        "0",
    ]);
    assert!(
        !ok && err.contains("not a positive number of megabytes"),
        "{err}"
    );
}

/// `bench --batch` on the simulator in the fused strategy: the batch functions come with it
/// (as many slots as the largest batch) and every batched run reports its rate; a batch
/// function asked of the projection strategy is a one-line error.
#[test]
fn fused_bench_batches_through_the_batch_functions() {
    let dir = tiny("llama");
    let m = dir.to_str().unwrap();
    let j = anelm_json(&[
        "bench",
        "--model",
        m,
        "--device",
        "sim",
        "--strategy",
        "fused",
        "-p",
        "0",
        "-n",
        "6",
        "-r",
        "1",
        "--batch",
        "2,3",
        "--stream-reads",
        "0",
        "--json",
    ]);
    let batch = j["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 2, "{j}");
    for (b, n) in batch.iter().zip([2, 3]) {
        assert_eq!(b["n"], n);
        assert!(b["tok_s"].as_f64().unwrap() > 0.0, "{j}");
    }
    let (ok, _, err) = anelm(&[
        "bench",
        "--model",
        m,
        "--device",
        "sim",
        "--strategy",
        "projection",
        "-p",
        "0",
        "-n",
        "2",
        "--decode-batch",
        "4",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--decode-batch applies to --strategy fused"),
        "{err}"
    );
}
