//! A server on the real SmolLM2 for the tests, on a free loopback port, and small helpers.

#![allow(dead_code)] // each test binary uses its own share of these

pub mod scripted;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anelm_cpu::CpuExecutor;
use anelm_engine::LoadedModel;
use anelm_server::{SchedulerConfig, Server, ServerConfig};
use anelm_testkit::{model, SMOLLM2};
use serde_json::Value;

pub const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

/// A config for the tests: any free loopback port, the other settings as given.
pub fn config(parallel: usize, queue: usize) -> ServerConfig {
    ServerConfig {
        port: 0,
        scheduler: SchedulerConfig {
            parallel,
            queue,
            cached_sessions: 4,
            ..SchedulerConfig::default()
        },
        ..ServerConfig::default()
    }
}

/// Serves SmolLM2 on the CPU.
pub fn start(config: ServerConfig) -> Server {
    let loaded = LoadedModel::load(&model(SMOLLM2)).expect("SmolLM2 loads");
    let exec = Box::new(CpuExecutor::new(loaded.model.clone(), 0));
    Server::start(config, loaded, exec).expect("the server starts")
}

/// `serve --draft` with SmolLM2 drafting for itself (so greedy drafts are nearly all kept),
/// and a count of the draft models made.
pub fn self_draft(k: usize) -> (anelm_server::DraftConfig, Arc<AtomicUsize>) {
    let loaded = Arc::new(LoadedModel::load(&model(SMOLLM2)).expect("SmolLM2 loads"));
    let made = Arc::new(AtomicUsize::new(0));
    let counter = made.clone();
    let make = move || -> anyhow::Result<Box<dyn anelm_engine::Drafter>> {
        counter.fetch_add(1, Ordering::Relaxed);
        let exec = Box::new(CpuExecutor::new(loaded.model.clone(), 0));
        Ok(Box::new(anelm_engine::DraftModel::new(exec, 2048)?))
    };
    let config = anelm_server::DraftConfig {
        k,
        make: Arc::new(make),
    };
    (config, made)
}

pub fn base(server: &Server) -> String {
    format!("http://{}", server.addr())
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("an HTTP client")
}

/// A greedy chat request for one user message.
pub fn chat(content: &str, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Greedy, long and without end-of-turn: SmolLM2's `<|endoftext|>` (0) and `<|im_end|>` (2)
/// banned, so the generation runs until stopped.
pub fn endless(max_tokens: u32, stream: bool) -> Value {
    let mut body = chat(
        "Tell me a very long story about a lighthouse keeper.",
        max_tokens,
    );
    body["logit_bias"] = serde_json::json!({"0": -100, "2": -100});
    body["stream"] = serde_json::json!(stream);
    body
}

/// POSTs JSON, returning the status and the body as JSON.
pub async fn post(c: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = c
        .post(url)
        .json(body)
        .send()
        .await
        .expect("the server answers");
    let status = r.status().as_u16();
    let text = r.text().await.expect("a body");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

/// GETs `url`: the body as text (the status must be 200).
pub async fn get_text(c: &reqwest::Client, url: &str) -> String {
    let r = c.get(url).send().await.expect("the server answers");
    assert_eq!(r.status(), 200, "GET {url}");
    r.text().await.expect("a body")
}

/// GETs `url`: the body as JSON (the status must be 200).
pub async fn get_json(c: &reqwest::Client, url: &str) -> Value {
    let text = get_text(c, url).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The current scheduler counters from /health.
pub async fn health(c: &reqwest::Client, base: &str) -> Value {
    let r = c
        .get(format!("{base}/health"))
        .send()
        .await
        .expect("/health answers");
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.expect("JSON health")["scheduler"].clone()
}

/// Where tests write what CI keeps (screenshots, logs): `<workspace>/target/ci-artifacts`.
pub fn artifacts_dir() -> PathBuf {
    let d = anelm_testkit::workspace_root().join("target/ci-artifacts");
    std::fs::create_dir_all(&d).expect("creating target/ci-artifacts");
    d.canonicalize().expect("target/ci-artifacts exists")
}

/// Runs a Python client script of tests/clients with `env`, prints its output, and checks that
/// it ended well and reported `passed` checks ("<N> passed, 0 failed").
pub fn run_python_clients(script: &str, env: &[(&str, String)], passed: usize) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let out = std::process::Command::new(anelm_testkit::python())
        .arg(&script)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("running the Python clients");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}\n(missing packages? run scripts/setup-python.sh)",
        script.display(),
        out.status
    );
    assert!(
        stdout.contains(&format!("{passed} passed, 0 failed")),
        "{stdout}"
    );
}
