//! Load on loopback: 32 clients for 30 s against 4 slots and a queue of 8, on the real SmolLM2.
//! Every request must be answered or refused with 503 (and Retry-After); every answer must be
//! exactly what the same conversation gets alone (greedy), so no conversation ever sees
//! another's state; /health and /v1/models must keep answering. The figures go to stdout and
//! to target/ci-artifacts/load.json.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{artifacts_dir, base, client, config, health, start, MODEL};
use serde_json::{json, Value};

const CLIENTS: usize = 32;
const DURATION: Duration = Duration::from_secs(30);
const MAX_TOKENS: u32 = 12;

/// One client's conversation: its own question, through one of the APIs.
#[derive(Clone, Copy, Debug)]
enum Api {
    Chat,
    ChatStream,
    Messages,
    MessagesStream,
    Completions,
}

#[derive(Clone, Debug)]
struct Conversation {
    api: Api,
    question: String,
}

#[derive(Debug)]
enum Outcome {
    Answer(String),
    Refused,
    Unexpected(String),
}

impl Conversation {
    fn new(i: usize) -> Conversation {
        let api = [
            Api::Chat,
            Api::ChatStream,
            Api::Messages,
            Api::MessagesStream,
            Api::Completions,
        ][i % 5];
        let topics = [
            "lighthouses",
            "volcanoes",
            "bicycles",
            "owls",
            "glaciers",
            "violins",
            "comets",
            "bakeries",
        ];
        let question = format!(
            "Write one sentence about {} and the number {}.",
            topics[i % topics.len()],
            3 + 7 * i
        );
        Conversation { api, question }
    }

    async fn run(&self, c: &reqwest::Client, base: &str) -> Outcome {
        let messages = json!([{"role": "user", "content": self.question}]);
        let (path, body) = match self.api {
            Api::Chat | Api::ChatStream => (
                "/v1/chat/completions",
                json!({"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
                       "stream": matches!(self.api, Api::ChatStream)}),
            ),
            Api::Messages | Api::MessagesStream => (
                "/v1/messages",
                json!({"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
                       "stream": matches!(self.api, Api::MessagesStream)}),
            ),
            Api::Completions => (
                "/v1/completions",
                // No end of text or turn: a plain continuation always has something to compare.
                json!({"model": MODEL, "prompt": self.question, "max_tokens": MAX_TOKENS, "temperature": 0,
                       "logit_bias": {"0": -100, "2": -100}}),
            ),
        };
        let r = match c.post(format!("{base}{path}")).json(&body).send().await {
            Ok(r) => r,
            Err(e) => return Outcome::Unexpected(format!("transport: {e}")),
        };
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap_or("").to_string());
        let text = match r.text().await {
            Ok(t) => t,
            Err(e) => return Outcome::Unexpected(format!("reading the body: {e}")),
        };
        match status {
            200 => match answer(self.api, &text) {
                Some(a) => Outcome::Answer(a),
                None => Outcome::Unexpected(format!("a malformed answer: {text}")),
            },
            503 => {
                let json_error = serde_json::from_str::<Value>(&text)
                    .is_ok_and(|v| v["error"]["message"].is_string());
                if retry_after.as_deref() == Some("1") && json_error {
                    Outcome::Refused
                } else {
                    Outcome::Unexpected(format!(
                        "a 503 without Retry-After or JSON: {retry_after:?} {text}"
                    ))
                }
            }
            other => Outcome::Unexpected(format!("{other}: {text}")),
        }
    }
}

/// The answer's text, from a JSON body or a complete event stream.
fn answer(api: Api, text: &str) -> Option<String> {
    let data = || {
        text.split("\n\n")
            .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    match api {
        Api::Chat => {
            let v: Value = serde_json::from_str(text).ok()?;
            Some(v["choices"][0]["message"]["content"].as_str()?.to_string())
        }
        Api::Completions => {
            let v: Value = serde_json::from_str(text).ok()?;
            Some(v["choices"][0]["text"].as_str()?.to_string())
        }
        Api::Messages => {
            let v: Value = serde_json::from_str(text).ok()?;
            Some(v["content"][0]["text"].as_str()?.to_string())
        }
        Api::ChatStream => {
            let data = data();
            if data.last()? != "[DONE]" {
                return None;
            }
            let mut out = String::new();
            for d in &data[..data.len() - 1] {
                let v: Value = serde_json::from_str(d).ok()?;
                out += v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
            }
            Some(out)
        }
        Api::MessagesStream => {
            let mut out = String::new();
            let mut stopped = false;
            for d in data() {
                let v: Value = serde_json::from_str(&d).ok()?;
                match v["type"].as_str()? {
                    "content_block_delta" => out += v["delta"]["text"].as_str()?,
                    "message_stop" => stopped = true,
                    _ => {}
                }
            }
            stopped.then_some(out)
        }
    }
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    refused: usize,
    wrong: Vec<String>,
    unexpected: Vec<String>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_clients_for_thirty_seconds() {
    let server = start(config(4, 8));
    let base = base(&server);
    let c = client();
    let conversations: Vec<Conversation> = (0..CLIENTS).map(Conversation::new).collect();

    // Each conversation alone first: the answers the load must reproduce.
    let mut expected = Vec::new();
    for conv in &conversations {
        match conv.run(&c, &base).await {
            Outcome::Answer(a) if !a.is_empty() => expected.push(a),
            other => panic!("{conv:?} alone: {other:?}"),
        }
    }

    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let deadline = started + DURATION;
    let mut tasks = Vec::new();
    for (conv, expected) in conversations.iter().cloned().zip(expected) {
        let (c, base, tally) = (c.clone(), base.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let t = Instant::now();
                let outcome = conv.run(&c, &base).await;
                let refused = matches!(outcome, Outcome::Refused);
                {
                    let mut tally = tally.lock().unwrap();
                    match outcome {
                        Outcome::Answer(a) if a == expected => tally.latencies.push(t.elapsed()),
                        Outcome::Answer(a) => tally
                            .wrong
                            .push(format!("{conv:?}: got {a:?}, alone {expected:?}")),
                        Outcome::Refused => tally.refused += 1,
                        Outcome::Unexpected(e) => tally.unexpected.push(format!("{conv:?}: {e}")),
                    }
                }
                if refused {
                    // As a client should: wait as long as Retry-After says.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }));
    }
    // Meanwhile, /health and /v1/models keep answering.
    let monitor = tokio::spawn({
        let (c, base) = (c.clone(), base.clone());
        async move {
            let mut slowest = Duration::ZERO;
            let mut busy_seen = 0;
            while Instant::now() < deadline {
                for path in ["/health", "/v1/models"] {
                    let t = Instant::now();
                    let r = c
                        .get(format!("{base}{path}"))
                        .send()
                        .await
                        .expect("the server answers");
                    assert_eq!(r.status(), 200, "{path}");
                    let v: Value = r.json().await.expect("JSON");
                    slowest = slowest.max(t.elapsed());
                    if path == "/health" && v["scheduler"]["busy"].as_u64() > Some(0) {
                        busy_seen += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (slowest, busy_seen)
        }
    });
    for t in tasks {
        t.await.expect("a client task");
    }
    let (slowest_probe, busy_seen) = monitor.await.expect("the monitor");
    let elapsed = started.elapsed();

    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let mut sorted = tally.latencies.clone();
    sorted.sort();
    // The last answers are out; the slots settle right after.
    let mut stats = health(&c, &base).await;
    for _ in 0..100 {
        if stats["busy"] == 0 && stats["waiting"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        stats = health(&c, &base).await;
    }
    let served = sorted.len();
    let figures = json!({
        "clients": CLIENTS,
        "seconds": elapsed.as_secs_f64(),
        "served": served,
        "refused_503": tally.refused,
        "wrong_answers": tally.wrong.len(),
        "unexpected": tally.unexpected.len(),
        "latency_ms": if served > 0 { json!({
            "p50": percentile(&sorted, 0.5).as_millis(),
            "p95": percentile(&sorted, 0.95).as_millis(),
            "max": sorted[served - 1].as_millis(),
        }) } else { Value::Null },
        "requests_per_second": served as f64 / elapsed.as_secs_f64(),
        "slowest_health_or_models_ms": slowest_probe.as_millis(),
        "scheduler": stats,
    });
    println!("{}", serde_json::to_string_pretty(&figures).unwrap());
    let path = artifacts_dir().join("load.json");
    std::fs::write(&path, serde_json::to_string_pretty(&figures).unwrap())
        .expect("writing load.json");
    println!("figures written to {}", path.display());

    assert!(
        tally.unexpected.is_empty(),
        "neither answered nor refused: {:#?}",
        tally.unexpected
    );
    assert!(
        tally.wrong.is_empty(),
        "answers differ from the same conversation alone: {:#?}",
        tally.wrong
    );
    assert!(
        served >= CLIENTS,
        "only {served} requests served in {elapsed:?}"
    );
    assert!(
        tally.refused > 0,
        "32 clients against 4 slots and a queue of 8 must meet the bound"
    );
    assert!(
        busy_seen > 0,
        "/health never saw a busy slot during the load"
    );
    assert!(
        slowest_probe < Duration::from_secs(2),
        "/health or /v1/models took {slowest_probe:?}"
    );
    assert_eq!(stats["failed"], 0, "{stats}");
    assert_eq!(
        (stats["busy"].as_u64(), stats["waiting"].as_u64()),
        (Some(0), Some(0)),
        "{stats}"
    );
}
