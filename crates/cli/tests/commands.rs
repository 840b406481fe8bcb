//! Smoke tests of commands with no other test of their own output: `serve` answering over
//! HTTP with its limits taken from flags (and listed in `serve --help`), `serve --models` with a
//! directory of models loaded in turn under `--max-loaded` and `--memory`, `mil print|check`,
//! `verify --reference cpu` on the simulator, and `verify --no-settle-ties` parting from the
//! reference at a near-tie that the f32 recheck otherwise settles.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anelm_testkit::{model, shared, tiny, workspace_root, SMOLLM2};
use serde_json::{json, Value};

fn anelm(args: &[&str]) -> (bool, String, String) {
    anelm_testkit::run_program(env!("CARGO_BIN_EXE_anelm"), args)
}

/// `anelm serve` on a free port, stopped when dropped.
struct Served {
    child: Child,
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Served {
    let m = model(SMOLLM2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(["serve", "--model", m.to_str().unwrap(), "--port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("serve prints its address before anything else ends")
            .unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split([' ', '/', ')']).next().unwrap().to_string();
        }
    };
    // Keep draining stderr so that the server never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    Served { child, addr }
}

/// One HTTP/1.1 request; the status and the JSON body.
fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw.split(' ').nth(1).unwrap().parse().unwrap();
    let text = raw.split("\r\n\r\n").nth(1).unwrap_or("");
    let json = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {raw}"));
    (status, json)
}

#[test]
fn serve_answers_with_the_limits_its_flags_set() {
    let s = serve(&["--max-n", "2", "--max-stop", "1"]);
    let (status, health) = request(&s.addr, "GET", "/health", None);
    assert_eq!((status, &health["status"]), (200, &json!("ok")), "{health}");
    assert_eq!(health["model"], "SmolLM2-135M-Instruct.Q4_1");
    let chat = |extra: Value| {
        let mut body = json!({
            "model": "SmolLM2-135M-Instruct.Q4_1",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8,
            "temperature": 0,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        request(&s.addr, "POST", "/v1/chat/completions", Some(&body))
    };
    let (status, v) = chat(json!({"n": 2}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty(), "{v}");
    let used = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        (1..=16).contains(&used),
        "two choices of at most 8 tokens: {v}"
    );
    let (status, v) = chat(json!({"n": 3}));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--max-n"));
    let (status, v) = chat(json!({"stop": ["a", "b"]}));
    assert_eq!((status, &v["error"]["param"]), (400, &json!("stop")), "{v}");
}

/// The states /v1/models reports, by model.
fn states(addr: &str) -> Vec<(String, String)> {
    let (status, v) = request(addr, "GET", "/v1/models", None);
    assert_eq!(status, 200, "{v}");
    (v["data"].as_array().unwrap().iter())
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap().to_string();
            (s("id"), s("state"))
        })
        .collect()
}

#[test]
fn serve_models_from_a_directory_take_turns_under_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let gemma = model(anelm_testkit::GEMMA3);
    std::os::unix::fs::symlink(&gemma, dir.path().join("gemma-3-270m-q4_k_m.gguf")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a model").unwrap();
    let listed = dir.path().to_str().unwrap();
    let s = serve(&["--models", listed, "--max-loaded", "1", "-t", "2"]);
    let (smol, gemma) = ("SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m");
    let pair = |a: &str, b: &str| {
        vec![
            (smol.to_string(), a.to_string()),
            (gemma.to_string(), b.to_string()),
        ]
    };
    assert_eq!(states(&s.addr), pair("loaded", "unloaded"));
    let chat = |addr: &str, model: &str| {
        let body = json!({"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hello"}]});
        request(addr, "POST", "/v1/chat/completions", Some(&body))
    };
    let (status, v) = chat(&s.addr, gemma);
    assert_eq!((status, &v["model"]), (200, &json!(gemma)), "{v}");
    assert_eq!(states(&s.addr), pair("unloaded", "loaded"));
    let (status, v) = chat(&s.addr, smol);
    assert_eq!((status, &v["model"]), (200, &json!(smol)), "{v}");
    assert_eq!(states(&s.addr), pair("loaded", "unloaded"));
    drop(s);
    // A budget no model fits: the default model still serves (it was asked for by name at
    // start), Gemma is refused in one line.
    let s = serve(&["--models", listed, "--memory", "64M"]);
    let (status, v) = chat(&s.addr, gemma);
    assert_eq!(
        (status, &v["error"]["code"]),
        (400, &json!("model_too_large")),
        "{v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--memory"),
        "{v}"
    );
    assert_eq!(chat(&s.addr, smol).0, 200);
    // Bad flags: one line each.
    for (args, says) in [
        (vec!["--memory", "lots"], "not a size"),
        (vec!["--max-loaded", "0"], "--max-loaded"),
        (vec!["--models", "/nonexistent-dir/"], "nonexistent"),
    ] {
        let m = model(SMOLLM2);
        let mut all = vec!["serve", "--model", m.to_str().unwrap(), "--port", "0"];
        all.extend(args.iter().copied());
        let (ok, _, err) = anelm(&all);
        assert!(!ok && err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn embed_gives_sentence_transformers_embeddings_and_run_refuses_an_encoder() {
    let dir = anelm_testkit::repo_tiny("bert");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let cases = reference["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let gguf = anelm_testkit::tiny_gguf("bert");
    for model in [dir.to_str().unwrap(), gguf.to_str().unwrap()] {
        let mut args = vec!["embed", "-m", model];
        args.extend(&texts);
        let (ok, out, err) = anelm(&args);
        assert!(ok, "{err}");
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), texts.len());
        for (got, case) in lines.iter().zip(cases) {
            let worst = (got.as_array().unwrap().iter())
                .zip(case["embedding"].as_array().unwrap())
                .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
                .fold(0.0, f64::max);
            assert!(worst < 2e-6, "{model}: off by {worst}");
        }
    }
    let (ok, _, err) = anelm(&["run", "-m", dir.to_str().unwrap(), "-p", "hi"]);
    assert!(
        !ok && err.contains("is an embedding (encoder) model"),
        "{err}"
    );
}

#[test]
fn serve_help_lists_every_limit_with_its_default() {
    let (ok, out, err) = anelm(&["serve", "--help"]);
    assert!(ok, "{err}");
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for (flag, default) in [
        ("--header-timeout", "10"),
        ("--body-timeout", "30"),
        ("--max-connections", "256"),
        ("--max-body-bytes", "4194304"),
        ("--max-n", "8"),
        ("--max-tokens-limit", "65536"),
        ("--max-stop", "16"),
        ("--max-logit-bias", "1024"),
        ("--max-tools", "128"),
    ] {
        let at = flat
            .find(flag)
            .unwrap_or_else(|| panic!("{flag} missing: {out}"));
        let next = flat[at + flag.len()..]
            .find("[default: ")
            .map(|i| &flat[at + flag.len() + i + 10..]);
        assert!(
            next.is_some_and(|d| d.starts_with(&format!("{default}]"))),
            "{flag} should default to {default}: {out}"
        );
    }
}

fn golden(name: &str) -> PathBuf {
    workspace_root().join("crates/mil/tests/golden").join(name)
}

#[test]
fn mil_print_is_canonical_and_check_reports() {
    let file = golden("swiglu_ffn.a.mil");
    let (ok, printed, err) = anelm(&["mil", "print", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(printed, std::fs::read_to_string(&file).unwrap());
    let (ok, checked, err) = anelm(&["mil", "check", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(checked.contains("swiglu_ffn.a.mil: parses; "), "{checked}");
    // Not MIL: one error naming the file, exit 1.
    let bad = std::env::temp_dir().join(format!("anelm-not-mil-{}.mil", std::process::id()));
    std::fs::write(&bad, "program(1.3) { func main<ios18>(").unwrap();
    let (ok, _, err) = anelm(&["mil", "check", bad.to_str().unwrap()]);
    std::fs::remove_file(&bad).unwrap();
    assert!(!ok);
    assert!(err.contains("anelm-not-mil"), "{err}");
}

fn verify_tiny(extra: &[&str]) -> Value {
    let m = tiny("llama");
    let prompts = shared("fixtures/hf-tiny/llama/reference.json");
    let mut args = vec![
        "verify",
        "--model",
        m.to_str().unwrap(),
        "--device",
        "sim",
        "--prompts",
        prompts.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = anelm(&args);
    assert!(ok, "anelm {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn verify_against_the_quantising_cpu_engine() {
    let v = verify_tiny(&["--reference", "cpu"]);
    assert_eq!(v["reference"], "cpu", "{v}");
    let rel = v["max_rel_err"].as_f64().unwrap();
    assert!(rel > 0.0 && rel < 2e-2, "{v}");
    assert_eq!(v["prompts"].as_array().unwrap().len(), 3, "{v}");
}

/// SmolLM2's `digits` prompt (verify's default), where the reference's top two logits after the
/// prompt are 1.4e-4 (relative) apart.
const DIGITS: &str = "Order #12345678 shipped on 2024-03-15 at 09:41, total: $1,234.56";

#[test]
fn verify_reports_the_device_alone_with_no_settle_ties() {
    let m = model(SMOLLM2);
    let verify = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--prompt",
            DIGITS,
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = anelm(&args);
        assert!(ok, "anelm {args:?}: {err}");
        out
    };
    let json = |out: String| -> Value {
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    // With the f32 recheck of near-tied top logits: the reference's greedy tokens.
    let settled = json(verify(&["--json"]));
    assert_eq!(settled["settle_ties"], true);
    assert_eq!(settled["greedy_same"], true, "{settled}");
    // The device alone takes the other of the two at once: a near-tie, and said so.
    let alone = json(verify(&["--json", "--no-settle-ties"]));
    assert_eq!(alone["settle_ties"], false);
    assert_eq!(alone["greedy_same"], false, "{alone}");
    assert_eq!(alone["greedy_same_but_near_ties"], true, "{alone}");
    let first = &alone["prompts"][0]["first_difference"];
    assert_eq!(first["step"], 0, "{alone}");
    let gap = first["reference_gap"].as_f64().unwrap();
    assert!(gap > 0.0 && gap < 3e-3, "{alone}");
    let rel = alone["max_rel_err"].as_f64().unwrap();
    assert!(rel > 0.0 && rel < 2e-2, "{alone}");
    let text = verify(&["--no-settle-ties"]);
    assert!(
        text.contains("differ from step 0 on, a near-tie")
            && text.contains("differ only after near-ties")
            && text.contains("--no-settle-ties"),
        "{text}"
    );
}

/// `serve --draft M` speculates with a draft model (here SmolLM2 drafting for itself, so its
/// greedy drafts are kept) and says so in llama-server's timings; a draft of another
/// vocabulary is refused before the server starts.
#[test]
fn serve_with_a_draft_model_reports_its_drafts() {
    let m = model(SMOLLM2);
    let s = serve(&["--draft", m.to_str().unwrap()]);
    let body = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "messages": [{"role": "user", "content": "Count from one to ten."}],
        "max_tokens": 24,
        "temperature": 0,
    });
    let (status, v) = request(&s.addr, "POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status, 200, "{v}");
    assert!(
        v["timings"]["draft_n_accepted"].as_u64().unwrap() > 0,
        "{v}"
    );
    drop(s);
    let other = tiny("llama");
    let (ok, _, err) = anelm(&[
        "serve",
        "--model",
        m.to_str().unwrap(),
        "--draft",
        other.to_str().unwrap(),
        "--port",
        "0",
    ]);
    assert!(!ok, "a draft of another vocabulary must be refused");
    assert!(err.contains("--draft"), "{err}");
}
