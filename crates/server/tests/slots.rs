//! The generation slots on the real SmolLM2: a continuing conversation reuses its prefix, a
//! client that goes away cancels its generation, past the queue requests are refused with 503
//! and Retry-After, and without a queue only busy slots refuse.

mod common;

use std::time::{Duration, Instant};

use common::{base, chat, client, config, endless, health, post, start, MODEL};
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test]
async fn a_continuing_conversation_reuses_its_prefix() {
    let server = start(config(1, 4));
    let base = base(&server);
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let first = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let (_, a) = post(
        &c,
        &url,
        &json!({"model": MODEL, "messages": first, "max_tokens": 20, "temperature": 0}),
    )
    .await;
    let reply = a["choices"][0]["message"]["content"].as_str().unwrap();
    let p1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    let second = json!([
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And of Italy?"},
    ]);
    let (_, b) = post(
        &c,
        &url,
        &json!({"model": MODEL, "messages": second, "max_tokens": 8, "temperature": 0}),
    )
    .await;
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let p2 = b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= p1 && cached < p2,
        "cached {cached} of {p2}; the first prompt had {p1}"
    );
    // An unrelated conversation shares at most the template's opening.
    let (_, d) = post(
        &c,
        &url,
        &chat("Unrelated question: why is the sky blue?", 4),
    )
    .await;
    let cached = d["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached < p1, "{d}");
}

/// Starts a greedy generation that streams until stopped.
async fn endless_stream(c: &reqwest::Client, url: &str) -> reqwest::Response {
    c.post(url)
        .json(&endless(4000, true))
        .send()
        .await
        .expect("the server answers")
}

/// Polls /health until the slots are idle; returns how long it took.
async fn until_idle(c: &reqwest::Client, base: &str) -> (Duration, Value) {
    let start = Instant::now();
    loop {
        let h = health(c, base).await;
        if h["busy"] == 0 && h["waiting"] == 0 {
            return (start.elapsed(), h);
        }
        assert!(start.elapsed() < Duration::from_secs(10), "still busy: {h}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_generation() {
    let server = start(config(1, 4));
    let base = base(&server);
    let c = client();
    let url = format!("{base}/v1/chat/completions");

    // Streaming: read a few chunks, then hang up.
    let r = endless_stream(&c, &url).await;
    let mut body = r.bytes_stream();
    for _ in 0..4 {
        body.next().await.expect("a chunk").unwrap();
    }
    // /health and /v1/models answer while the generation runs.
    for path in ["/health", "/v1/models"] {
        let t = Instant::now();
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{path} took {:?}",
            t.elapsed()
        );
    }
    assert_eq!(health(&c, &base).await["busy"], 1);
    drop(body);
    let (took, h) = until_idle(&c, &base).await;
    assert_eq!(h["cancelled"], 1, "{h}");
    assert!(took < Duration::from_secs(1), "cancelled after {took:?}");

    // Not streaming: the request is dropped mid-generation.
    let request = tokio::spawn({
        let c = c.clone();
        let url = url.clone();
        async move { c.post(&url).json(&endless(4000, false)).send().await }
    });
    let t = Instant::now();
    while health(&c, &base).await["busy"] != 1 {
        assert!(t.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    request.abort();
    let (took, h) = until_idle(&c, &base).await;
    assert_eq!(h["cancelled"], 2, "{h}");
    assert!(took < Duration::from_secs(1), "cancelled after {took:?}");
    assert_eq!(h["completed"], 0);
}

#[tokio::test]
async fn past_the_queue_requests_are_refused_with_503_and_retry_after() {
    let server = start(config(1, 1));
    let base = base(&server);
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    // One generation runs, one waits: the queue is full.
    let running = endless_stream(&c, &url).await;
    let waiting = endless_stream(&c, &url).await;
    assert_eq!(
        (running.status().as_u16(), waiting.status().as_u16()),
        (200, 200)
    );
    // A streamed answer starts before the engine takes its job: wait until it has.
    let mut h = health(&c, &base).await;
    for _ in 0..100 {
        if h["busy"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        h = health(&c, &base).await;
    }
    assert_eq!(
        (h["busy"].as_u64(), h["waiting"].as_u64()),
        (Some(1), Some(1)),
        "{h}"
    );
    for (path, body, kind) in [
        ("/v1/chat/completions", chat("Hi", 4), "server_error"),
        (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
            "overloaded_error",
        ),
    ] {
        let r = c
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], kind, "{v}");
    }
    assert_eq!(health(&c, &base).await["refused"], 2);
    drop((running, waiting));
    until_idle(&c, &base).await;
    let (status, v) = post(&c, &url, &chat("Hi", 4)).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn without_a_queue_only_busy_slots_refuse() {
    let server = start(config(1, 0));
    let base = base(&server);
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let (status, v) = post(&c, &url, &chat("Hi", 2)).await;
    assert_eq!(status, 200, "an idle slot takes the job: {v}");
    let running = endless_stream(&c, &url).await;
    assert_eq!(running.status(), 200);
    let (status, v) = post(&c, &url, &chat("Hi", 2)).await;
    assert_eq!(status, 503, "{v}");
    drop(running);
    until_idle(&c, &base).await;
    let (status, _) = post(&c, &url, &chat("Hi", 2)).await;
    assert_eq!(status, 200);
}
