//! `/tokenize`, `/detokenize` (llama-server's shapes) against llama.cpp's own tokenization of
//! SmolLM2 (../shared/fixtures/llamacpp), and `/metrics` parsed by prometheus_client's parsers
//! (pinned in scripts/requirements-test.txt), its counters moving by what the requests did.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{base, chat, client, config, health, post, start};
use serde_json::{json, Value};

fn fixture() -> Value {
    let p = anelm_testkit::shared("fixtures/llamacpp/smollm2-135m-instruct-q4_1.tokenize.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a `piece`: a string, or an array of byte values.
fn piece_bytes(piece: &Value) -> Vec<u8> {
    match piece {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(a) => a.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
        other => panic!("a piece is a string or bytes, not {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_match_llama_cpp() {
    let server = start(config(1, 4));
    let (c, b) = (client(), base(&server));
    let f = fixture();
    let strings = f["strings"].as_array().unwrap();
    assert!(strings.len() >= 10);
    let mut byte_pieces = 0;
    for s in strings {
        let text = s["text"].as_str().unwrap();
        // llama-server's defaults: no BOS/EOS, special tokens parsed.
        let (status, r) = post(&c, &format!("{b}/tokenize"), &json!({"content": text})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["tokens"], s["parse_special"], "{text:?}");
        let (_, r) = post(
            &c,
            &format!("{b}/tokenize"),
            &json!({"content": text, "add_special": true}),
        )
        .await;
        assert_eq!(r["tokens"], s["add_special+parse_special"], "{text:?}");
        // Plain text, with pieces: ids and bytes as llama.cpp's.
        let (_, r) = post(
            &c,
            &format!("{b}/tokenize"),
            &json!({"content": text, "parse_special": false, "with_pieces": true}),
        )
        .await;
        let tokens = r["tokens"].as_array().unwrap();
        let ids: Vec<Value> = tokens.iter().map(|t| t["id"].clone()).collect();
        assert_eq!(Value::Array(ids.clone()), s["plain"], "{text:?}");
        let pieces: Vec<String> = tokens
            .iter()
            .map(|t| hex(&piece_bytes(&t["piece"])))
            .collect();
        assert_eq!(json!(pieces), s["plain_pieces_hex"], "{text:?}");
        byte_pieces += tokens.iter().filter(|t| t["piece"].is_array()).count();
        // And back.
        let (status, r) = post(&c, &format!("{b}/detokenize"), &json!({"tokens": ids})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["content"], text, "{text:?}");
    }
    // Some fixture strings split characters across tokens: those pieces come as bytes.
    assert!(byte_pieces > 0);

    // A mixed prompt: texts and ids, BOS only before a leading text.
    let hello = post(&c, &format!("{b}/tokenize"), &json!({"content": "Hello"}))
        .await
        .1;
    let world = post(&c, &format!("{b}/tokenize"), &json!({"content": " world"}))
        .await
        .1;
    let (_, mixed) = post(
        &c,
        &format!("{b}/tokenize"),
        &json!({"content": ["Hello", 42, " world"]}),
    )
    .await;
    let mut want: Vec<Value> = hello["tokens"].as_array().unwrap().clone();
    want.push(json!(42));
    want.extend(world["tokens"].as_array().unwrap().iter().cloned());
    assert_eq!(mixed["tokens"], Value::Array(want));

    // Bad input is named.
    let (status, r) = post(
        &c,
        &format!("{b}/detokenize"),
        &json!({"tokens": [1, 4000000]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(r["error"]["param"], "tokens", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("4000000"),
        "{r}"
    );
    let (status, r) = post(&c, &format!("{b}/tokenize"), &json!({"text": "x"})).await;
    assert_eq!(status, 400);
    assert!(
        r["error"]["message"].as_str().unwrap().contains("content"),
        "{r}"
    );
    let (status, _) = post(
        &c,
        &format!("{b}/tokenize"),
        &json!({"content": ["a", 99999999]}),
    )
    .await;
    assert_eq!(status, 400);
}

/// A sample's name and its labels, sorted.
type SampleKey = (String, Vec<(String, String)>);
type Samples = HashMap<SampleKey, f64>;
/// What the parser script prints per sample: family, type, name, labels, value.
type ParsedSample = (String, String, String, HashMap<String, String>, f64);

/// The samples of a /metrics body, parsed by prometheus_client: (sample name, labels) -> value.
fn parse_metrics(body: &str) -> Samples {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/metrics/parse_metrics.py");
    let mut child = Command::new(anelm_testkit::python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the metrics parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} rejected the body ({}): {}\n(missing packages? run scripts/setup-python.sh)\n{body}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<ParsedSample> = serde_json::from_slice(&out.stdout).unwrap();
    samples
        .into_iter()
        .map(|(_, _, name, labels, value)| {
            let mut labels: Vec<(String, String)> = labels.into_iter().collect();
            labels.sort();
            ((name, labels), value)
        })
        .collect()
}

fn get(m: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    *m.get(&(name.to_string(), l))
        .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
}

async fn scrape(c: &reqwest::Client, b: &str) -> Samples {
    let r = c.get(format!("{b}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    parse_metrics(&r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_the_requests_did() {
    let server = start(config(2, 8));
    let (c, b) = (client(), base(&server));
    let before = scrape(&c, &b).await;
    assert_eq!(get(&before, "anelm_generated_tokens_total", &[]), 0.0);
    assert_eq!(get(&before, "anelm_slots", &[]), 2.0);
    assert_eq!(get(&before, "anelm_models_loaded", &[]), 1.0);
    assert_eq!(get(&before, "anelm_queue_length", &[]), 0.0);
    assert_eq!(
        get(&before, "anelm_time_to_first_token_seconds_count", &[]),
        0.0
    );

    // The same conversation twice: the second finds its prefix in a cached session.
    let mut usages = Vec::new();
    for _ in 0..2 {
        let (status, r) = post(
            &c,
            &format!("{b}/v1/chat/completions"),
            &chat("Name a colour.", 6),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        usages.push(r["usage"].clone());
    }
    post(&c, &format!("{b}/tokenize"), &json!({"content": "hi"})).await;
    let (status, _) = post(&c, &format!("{b}/detokenize"), &json!({"tokens": [-1]})).await;
    assert_eq!(status, 400);
    let r = c.get(format!("{b}/no/such/page")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let mut stats = health(&c, &b).await;
    for _ in 0..100 {
        if stats["busy"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        stats = health(&c, &b).await;
    }

    let after = scrape(&c, &b).await;
    let sum = |k: &str| usages.iter().map(|u| u[k].as_f64().unwrap()).sum::<f64>();
    let completion = sum("completion_tokens");
    assert!(completion >= 2.0);
    assert_eq!(
        get(
            &after,
            "anelm_requests_total",
            &[("endpoint", "/v1/chat/completions"), ("status", "200")]
        ),
        2.0
    );
    assert_eq!(
        get(
            &after,
            "anelm_requests_total",
            &[("endpoint", "/tokenize"), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(
        get(
            &after,
            "anelm_requests_total",
            &[("endpoint", "/detokenize"), ("status", "400")]
        ),
        1.0
    );
    assert_eq!(
        get(
            &after,
            "anelm_requests_total",
            &[("endpoint", "other"), ("status", "404")]
        ),
        1.0
    );
    // The first scrape itself was counted.
    assert_eq!(
        get(
            &after,
            "anelm_requests_total",
            &[("endpoint", "/metrics"), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(get(&after, "anelm_generated_tokens_total", &[]), completion);
    assert_eq!(
        get(&after, "anelm_prompt_tokens_total", &[]),
        sum("prompt_tokens")
    );
    let cached: f64 = usages
        .iter()
        .map(|u| {
            u["prompt_tokens_details"]["cached_tokens"]
                .as_f64()
                .unwrap()
        })
        .sum();
    assert_eq!(get(&after, "anelm_prompt_tokens_cached_total", &[]), cached);
    assert_eq!(
        get(&after, "anelm_prompt_tokens_processed_total", &[]),
        sum("prompt_tokens") - cached
    );
    let hits = usages
        .iter()
        .filter(|u| {
            u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
                > 0
        })
        .count() as f64;
    assert!(
        hits >= 1.0,
        "the repeated conversation reused no prefix: {usages:?}"
    );
    assert_eq!(get(&after, "anelm_prefix_cache_hits_total", &[]), hits);
    assert_eq!(
        get(&after, "anelm_prefix_cache_misses_total", &[]),
        2.0 - hits
    );
    // One first token per choice; every other token is one per-token gap.
    assert_eq!(
        get(&after, "anelm_time_to_first_token_seconds_count", &[]),
        2.0
    );
    assert_eq!(
        get(&after, "anelm_time_per_output_token_seconds_count", &[]),
        completion - 2.0
    );
    assert!(get(&after, "anelm_time_to_first_token_seconds_sum", &[]) > 0.0);
    assert!(get(&after, "anelm_generation_tokens_per_second", &[]) > 0.0);
    assert!(get(&after, "anelm_prompt_tokens_per_second", &[]) > 0.0);
    assert_eq!(
        get(&after, "anelm_slots_busy", &[]),
        stats["busy"].as_f64().unwrap()
    );
    assert_eq!(get(&after, "anelm_queue_length", &[]), 0.0);
}

/// With an API key, /tokenize and /detokenize need it (as the /v1 routes do); /metrics is open
/// for scrapers, as /health is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_needs_the_key_and_metrics_does_not() {
    let server = start(anelm_server::ServerConfig {
        api_key: Some("k".into()),
        ..config(1, 2)
    });
    let (c, b) = (client(), base(&server));
    let (status, _) = post(&c, &format!("{b}/tokenize"), &json!({"content": "hi"})).await;
    assert_eq!(status, 401);
    let (status, _) = post(&c, &format!("{b}/detokenize"), &json!({"tokens": [1]})).await;
    assert_eq!(status, 401);
    let r = c
        .post(format!("{b}/tokenize"))
        .bearer_auth("k")
        .json(&json!({"content": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = scrape(&c, &b).await;
    assert_eq!(
        get(
            &m,
            "anelm_requests_total",
            &[("endpoint", "/tokenize"), ("status", "401")]
        ),
        1.0
    );
}
