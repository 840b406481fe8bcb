//! Slow and greedy clients against the real SmolLM2: each limit (headers and body in time, open
//! connections, body size, `n`, `max_tokens`, stop strings, logit_bias, tools) is refused with
//! an error in the API's shape that names the limit's flag, and the server keeps serving.

mod common;

use std::time::Duration;

use anelm_server::{Limits, Server, ServerConfig};
use common::{base, chat, client, config, post, start, MODEL};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;

fn small_limits() -> Limits {
    Limits {
        header_timeout: Duration::from_millis(800),
        body_timeout: Duration::from_millis(800),
        max_connections: 3,
        max_body_bytes: 64 << 10,
        max_choices: 2,
        max_tokens: 50,
        max_stop: 2,
        max_logit_bias: 2,
        max_tools: 1,
    }
}

fn serve(limits: Limits) -> Server {
    start(ServerConfig {
        ctx: Some(512),
        limits,
        ..config(1, 4)
    })
}

/// A raw connection (the server runs on its own threads: blocking here is fine).
fn connect(server: &Server) -> TcpStream {
    let s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Everything the server sends on `stream` until it closes (at most 30 s between reads).
fn read_all(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    stream
        .read_to_end(&mut out)
        .expect("the server answers and closes");
    String::from_utf8_lossy(&out).into_owned()
}

/// The status and JSON body of a raw HTTP/1.1 answer.
fn parse_answer(raw: &str) -> (u16, Value) {
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {raw:?}"));
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("");
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {raw:?}"));
    (status, json)
}

#[tokio::test]
async fn oversized_requests_are_refused_naming_the_limit() {
    let server = serve(small_limits());
    let base = base(&server);
    let c = client();
    let chat_url = format!("{base}/v1/chat/completions");
    let cmpl_url = format!("{base}/v1/completions");
    let msg_url = format!("{base}/v1/messages");
    let count_url = format!("{base}/v1/messages/count_tokens");
    let user = json!([{"role": "user", "content": "Hi"}]);
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {}}});
    // (url, body, status, OpenAI param, flag named in the message)
    let cases: Vec<(&str, Value, u16, Option<&str>, &str)> = vec![
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "n": 3}),
            400,
            Some("n"),
            "--max-n",
        ),
        (
            &cmpl_url,
            json!({"model": MODEL, "prompt": "Hi", "n": 3}),
            400,
            Some("n"),
            "--max-n",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "max_tokens": 51}),
            400,
            Some("max_tokens"),
            "--max-tokens-limit",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "max_completion_tokens": 51}),
            400,
            Some("max_completion_tokens"),
            "--max-tokens-limit",
        ),
        (
            &cmpl_url,
            json!({"model": MODEL, "prompt": "Hi", "max_tokens": 51}),
            400,
            Some("max_tokens"),
            "--max-tokens-limit",
        ),
        (
            &msg_url,
            json!({"model": MODEL, "messages": user, "max_tokens": 51}),
            400,
            None,
            "--max-tokens-limit",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "stop": ["a", "b", "c"]}),
            400,
            Some("stop"),
            "--max-stop",
        ),
        (
            &cmpl_url,
            json!({"model": MODEL, "prompt": "Hi", "stop": ["a", "b", "c"]}),
            400,
            Some("stop"),
            "--max-stop",
        ),
        (
            &msg_url,
            json!({"model": MODEL, "messages": user, "max_tokens": 5, "stop_sequences": ["a", "b", "c"]}),
            400,
            None,
            "--max-stop",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "logit_bias": {"1": 1, "2": 1, "3": 1}}),
            400,
            Some("logit_bias"),
            "--max-logit-bias",
        ),
        (
            &cmpl_url,
            json!({"model": MODEL, "prompt": "Hi", "logit_bias": {"1": 1, "2": 1, "3": 1}}),
            400,
            Some("logit_bias"),
            "--max-logit-bias",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "tools": [tool, tool]}),
            400,
            Some("tools"),
            "--max-tools",
        ),
        (
            &count_url,
            json!({"model": MODEL, "messages": user, "tools": [tool, tool]}),
            400,
            None,
            "--max-tools",
        ),
        (
            &chat_url,
            json!({"model": MODEL, "messages": user, "pad": "x".repeat(70 << 10)}),
            413,
            None,
            "--max-body-bytes",
        ),
        (
            &msg_url,
            json!({"model": MODEL, "messages": user, "pad": "x".repeat(70 << 10)}),
            413,
            None,
            "--max-body-bytes",
        ),
    ];
    for (url, body, status, param, flag) in &cases {
        let (got, v) = post(&c, url, body).await;
        assert_eq!(got, *status, "{url} {body:.200}: {v}");
        let message = if url.contains("/v1/messages") {
            assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
            v["error"]["message"].as_str()
        } else {
            assert_eq!(v["error"]["param"].as_str(), *param, "{v}");
            v["error"]["message"].as_str()
        };
        let message = message.unwrap_or_else(|| panic!("no message: {v}"));
        assert!(
            message.contains(flag),
            "{url}: {message} should name {flag}"
        );
    }
    // At the limits, the same requests are served.
    let mut ok = chat("Hi", 50);
    ok["n"] = json!(2);
    ok["stop"] = json!(["a", "b"]);
    ok["logit_bias"] = json!({"1": 1, "2": 1});
    let (status, v) = post(&c, &chat_url, &ok).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
}

#[tokio::test]
async fn slow_headers_and_bodies_get_408_and_the_server_keeps_serving() {
    let server = serve(small_limits());

    // Headers that never end.
    let mut slow = connect(&server);
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (status, v) = parse_answer(&read_all(&mut slow));
    assert_eq!(status, 408, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--header-timeout"), "{message}");

    // A body that stops short of its length, on the Anthropic route: Anthropic's shape.
    let mut slow = connect(&server);
    slow.write_all(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\": ",
    )
    .unwrap();
    let (status, v) = parse_answer(&read_all(&mut slow));
    assert_eq!(status, 408, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--body-timeout"), "{message}");

    let (status, v) = post(
        &client(),
        &format!("{}/v1/chat/completions", base(&server)),
        &chat("Hi", 2),
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn past_the_connection_limit_a_connection_is_refused_with_503() {
    let server = serve(Limits {
        header_timeout: Duration::from_secs(60),
        ..small_limits()
    });
    // Three idle connections hold every place (each is accepted before the next connects:
    // a request on it is answered).
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect(&server);
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
        held.push(s);
    }
    let mut extra = connect(&server);
    let _ = extra.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let raw = read_all(&mut extra);
    let (status, v) = parse_answer(&raw);
    assert_eq!(status, 503, "{v}");
    assert!(raw.to_ascii_lowercase().contains("retry-after: 1"), "{raw}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("limit of 3") && message.contains("--max-connections"));

    // Closing one frees its place.
    drop(held.pop());
    let c = client();
    let health = format!("{}/health", base(&server));
    let mut answered = false;
    for _ in 0..100 {
        if let Ok(r) = c.get(&health).send().await {
            if r.status() == 200 {
                answered = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        answered,
        "a place freed by a closed connection serves again"
    );
}
