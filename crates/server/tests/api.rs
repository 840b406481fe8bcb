//! The HTTP API on the real SmolLM2: bad input of every kind, streaming against non-streaming,
//! choices, logprobs, tools and JSON mode, the API key, CORS, the page (sessions, cancellation
//! and the queue: `slots.rs`).

mod common;

use std::sync::LazyLock;

use anelm_server::Server;
use common::{base, chat, client, config, post, start, MODEL};
use serde_json::{json, Value};

/// The server most tests share: a small context, so that overflowing it is cheap.
static SHARED: LazyLock<Server> = LazyLock::new(|| {
    start(anelm_server::ServerConfig {
        ctx: Some(512),
        limits: anelm_server::Limits {
            max_body_bytes: 256 << 10,
            ..Default::default()
        },
        ..config(2, 8)
    })
});

fn shared() -> String {
    base(&SHARED)
}

/// A prompt longer than the shared server's context.
fn long_text() -> String {
    "The quick brown fox jumps over the lazy dog. ".repeat(80)
}

#[tokio::test]
async fn bad_requests_get_json_4xx_and_the_server_keeps_serving() {
    let base = shared();
    let c = client();
    let chat_url = format!("{base}/v1/chat/completions");
    let cmpl_url = format!("{base}/v1/completions");
    let msg_url = format!("{base}/v1/messages");
    let count_url = format!("{base}/v1/messages/count_tokens");
    let user = json!([{"role": "user", "content": "Hi"}]);
    // (url, raw body, status, OpenAI param or Anthropic error type)
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        (&chat_url, "{\"model\": ".into(), 400, None),
        (&chat_url, "[1, 2".into(), 400, None),
        (&chat_url, "".into(), 400, None),
        (&chat_url, json!({"model": MODEL, "messages": "hi"}).to_string(), 400, Some("messages")),
        (&chat_url, json!({"model": MODEL, "messages": user, "temperature": "hot"}).to_string(), 400, Some("temperature")),
        (&chat_url, json!({"model": MODEL, "messages": user, "max_tokens": 1.5}).to_string(), 400, Some("max_tokens")),
        (&chat_url, json!({"model": MODEL, "messages": [{"role": 7, "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        (&chat_url, json!({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        (&chat_url, json!({"model": MODEL}).to_string(), 400, None),
        (&chat_url, json!({"model": "gpt-17", "messages": user}).to_string(), 404, Some("model")),
        (&chat_url, json!({"model": MODEL, "messages": user, "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        (&chat_url, json!({"model": MODEL, "messages": user, "max_tokens": -3}).to_string(), 400, Some("max_tokens")),
        (&chat_url, json!({"model": MODEL, "messages": user, "max_completion_tokens": 0}).to_string(), 400, Some("max_completion_tokens")),
        (&chat_url, json!({"model": MODEL, "messages": user, "n": 0}).to_string(), 400, Some("n")),
        (&chat_url, json!({"model": MODEL, "messages": user, "top_logprobs": 3}).to_string(), 400, Some("top_logprobs")),
        (&chat_url, json!({"model": MODEL, "messages": user, "logit_bias": {"999999": 1}}).to_string(), 400, Some("logit_bias")),
        (&chat_url, json!({"model": MODEL, "messages": [{"role": "user", "content": long_text()}]}).to_string(), 400, Some("messages")),
        (&cmpl_url, json!({"model": MODEL, "prompt": long_text()}).to_string(), 400, Some("prompt")),
        (&cmpl_url, json!({"model": MODEL, "prompt": "Hi", "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        (&cmpl_url, json!({"model": "nope", "prompt": "Hi"}).to_string(), 404, Some("model")),
        (&cmpl_url, json!({"model": MODEL, "prompt": {"text": "Hi"}}).to_string(), 400, Some("prompt")),
        (&msg_url, "{oops".into(), 400, Some("invalid_request_error")),
        (&msg_url, json!({"model": MODEL, "messages": user}).to_string(), 400, Some("invalid_request_error")),
        (&msg_url, json!({"model": "claude-9", "messages": user, "max_tokens": 5}).to_string(), 404, Some("not_found_error")),
        (&msg_url, json!({"model": MODEL, "messages": user, "max_tokens": 0}).to_string(), 400, Some("invalid_request_error")),
        (&msg_url, json!({"model": MODEL, "messages": user, "max_tokens": "ten"}).to_string(), 400, Some("invalid_request_error")),
        (&msg_url, json!({"model": MODEL, "messages": [{"role": "system", "content": "x"}], "max_tokens": 5}).to_string(), 400, Some("invalid_request_error")),
        (&msg_url, json!({"model": MODEL, "messages": [{"role": "user", "content": long_text()}], "max_tokens": 5}).to_string(), 400, Some("invalid_request_error")),
        (&count_url, json!({"model": "claude-9", "messages": user}).to_string(), 404, Some("not_found_error")),
        (&chat_url, format!("{{\"model\": \"{MODEL}\", \"pad\": \"{}\"}}", "x".repeat(300 << 10)), 413, None),
        (&msg_url, format!("{{\"model\": \"{MODEL}\", \"pad\": \"{}\"}}", "x".repeat(300 << 10)), 413, Some("request_too_large")),
    ];
    for (url, body, status, expect) in cases {
        let r = c
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("the server answers");
        let got = r.status().as_u16();
        let ctype = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let text = r.text().await.unwrap();
        let shown = &body[..body.len().min(80)];
        assert_eq!(got, status, "{url} {shown}: {text}");
        assert_eq!(ctype.as_deref(), Some("application/json"), "{url} {shown}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: not JSON ({e}): {text}"));
        if url.contains("/v1/messages") {
            assert_eq!(v["type"], "error", "{text}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{text}"
            );
            if let Some(kind) = expect {
                assert_eq!(v["error"]["type"], kind, "{shown}: {text}");
            }
        } else {
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{text}"
            );
            assert!(v["error"]["type"].is_string(), "{text}");
            if let Some(param) = expect {
                assert_eq!(v["error"]["param"], param, "{shown}: {text}");
            }
        }
    }
    // A prompt that nearly fills the context: the answer gets what is left, and ends there.
    let near = "The quick brown fox jumps over the lazy dog. ".repeat(45);
    let (status, v) = post(
        &c,
        &chat_url,
        &json!({"model": MODEL, "messages": [{"role": "user", "content": near}], "temperature": 0,
        "logit_bias": {"0": -100, "2": -100}}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (p, n) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["completion_tokens"].as_u64().unwrap(),
    );
    assert!(
        p > 400 && p + n == 512,
        "prompt {p} + completion {n} fill the context of 512"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Over the context: OpenAI's code for it.
    let (_, v) = post(
        &c,
        &chat_url,
        &json!({"model": MODEL, "messages": [{"role": "user", "content": long_text()}]}),
    )
    .await;
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    // Unknown routes and methods answer in JSON too.
    let r = c.get(format!("{base}/v1/engines")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/engines"));
    let r = c
        .get(format!("{base}/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.json::<Value>().await.unwrap()["error"].is_object());
    // And the server still serves.
    let (status, v) = post(&c, &chat_url, &chat("Say hello.", 4)).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{v}"
    );
}

/// Reads a server-sent-event stream into (event name, data) pairs.
async fn sse(c: &reqwest::Client, url: &str, body: &Value) -> Vec<(String, String)> {
    let r = c.post(url).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut event = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_string();
                }
            }
            (event, data)
        })
        .collect()
}

fn json_of(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"))
}

#[tokio::test]
async fn streams_carry_the_same_answer_as_plain_responses() {
    let base = shared();
    let c = client();
    let prompt = "List three colours.";

    // OpenAI chat.
    let url = format!("{base}/v1/chat/completions");
    let (_, plain) = post(&c, &url, &chat(prompt, 24)).await;
    let mut body = chat(prompt, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = sse(&c, &url, &body).await;
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| json_of(d))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, [&plain["choices"][0]["finish_reason"]]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[k], plain["usage"][k], "{k}");
    }
    assert!(
        chunks.last().unwrap()["timings"]["predicted_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    // Two sampled choices, streamed: each index carries the same text as without streaming.
    let mut body = chat(prompt, 16);
    body["n"] = json!(2);
    body["temperature"] = json!(1.0);
    body["seed"] = json!(99);
    let (_, plain) = post(&c, &url, &body).await;
    body["stream"] = json!(true);
    let events = sse(&c, &url, &body).await;
    for i in 0..2 {
        let text: String = events[..events.len() - 1]
            .iter()
            .map(|(_, d)| json_of(d))
            .filter(|c| c["choices"][0]["index"] == i)
            .filter_map(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect();
        assert_eq!(
            text,
            plain["choices"][i]["message"]["content"].as_str().unwrap(),
            "choice {i}"
        );
    }

    // OpenAI completions.
    let url = format!("{base}/v1/completions");
    let req =
        json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0});
    let (_, plain) = post(&c, &url, &req).await;
    let mut body = req.clone();
    body["stream"] = json!(true);
    let events = sse(&c, &url, &body).await;
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| {
            json_of(d)["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, plain["choices"][0]["text"].as_str().unwrap());
    assert_eq!(plain["usage"]["completion_tokens"], 12);
    assert_eq!(plain["choices"][0]["finish_reason"], "length");

    // Anthropic messages: the exact event sequence.
    let url = format!("{base}/v1/messages");
    let req = json!({"model": MODEL, "max_tokens": 24, "temperature": 0,
                     "messages": [{"role": "user", "content": prompt}]});
    let (_, plain) = post(&c, &url, &req).await;
    let mut body = req.clone();
    body["stream"] = json!(true);
    let events = sse(&c, &url, &body).await;
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    assert!(deltas > 0);
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for (name, data) in &events {
        assert_eq!(json_of(data)["type"], name.as_str());
    }
    let text: String = events
        .iter()
        .filter(|(e, _)| e == "content_block_delta")
        .map(|(_, d)| json_of(d)["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, plain["content"][0]["text"].as_str().unwrap());
    let start = json_of(&events[0].1);
    assert_eq!(
        start["message"]["usage"]["input_tokens"],
        plain["usage"]["input_tokens"]
    );
    let delta = json_of(&events[events.len() - 2].1);
    assert_eq!(
        delta["usage"]["output_tokens"],
        plain["usage"]["output_tokens"]
    );
    assert_eq!(delta["delta"]["stop_reason"], plain["stop_reason"]);

    // count_tokens agrees with the usage.
    let (status, count) = post(
        &c,
        &format!("{base}/v1/messages/count_tokens"),
        &json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(count["input_tokens"], plain["usage"]["input_tokens"]);
}

#[tokio::test]
async fn choices_seeds_and_logprobs() {
    let base = shared();
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let mut body = chat("Invent a name for a cat.", 12);
    body["n"] = json!(3);
    body["temperature"] = json!(1.0);
    body["seed"] = json!(1234);
    let (status, a) = post(&c, &url, &body).await;
    assert_eq!(status, 200, "{a}");
    let (_, b) = post(&c, &url, &body).await;
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect()
    };
    let (ta, tb) = (texts(&a), texts(&b));
    assert_eq!(ta.len(), 3);
    assert_eq!(ta, tb, "the same seed gives the same choices");
    let distinct: std::collections::HashSet<_> = ta.iter().collect();
    assert!(
        distinct.len() >= 2,
        "choices drawn with different seeds differ: {ta:?}"
    );
    let per_choice: u64 = a["choices"].as_array().unwrap().iter().map(|_| 1).sum();
    assert_eq!(per_choice, 3);
    assert!(
        a["usage"]["completion_tokens"].as_u64().unwrap() > 12,
        "three choices' tokens count"
    );

    let mut body = chat("Name a fruit.", 8);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (status, v) = post(&c, &url, &body).await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"]);
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        let bytes: Vec<u8> = entry["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            entry["token"].as_str().unwrap()
        );
    }
    let joined: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert!(
        joined.starts_with(v["choices"][0]["message"]["content"].as_str().unwrap()),
        "{joined}"
    );

    // A banned token never appears; a stop string cuts the answer before it.
    let (_, plain) = post(&c, &url, &chat("Name a fruit.", 8)).await;
    let text = plain["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let word = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_string();
    let mut body = chat("Name a fruit.", 8);
    body["stop"] = json!([word.clone()]);
    let (_, stopped) = post(&c, &url, &body).await;
    let cut = &text[..text.find(&word).unwrap()];
    assert_eq!(stopped["choices"][0]["message"]["content"], cut);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // Penalties reach the sampler: a strong frequency penalty changes a greedy answer, and a
    // logit bias of +100 on one token makes it the whole answer.
    let (_, plain) = post(&c, &url, &chat("List ten colours.", 24)).await;
    let mut body = chat("List ten colours.", 24);
    body["frequency_penalty"] = json!(2.0);
    let (_, penalised) = post(&c, &url, &body).await;
    assert_ne!(
        plain["choices"][0]["message"]["content"],
        penalised["choices"][0]["message"]["content"]
    );
    let loaded =
        anelm_engine::LoadedModel::load(&anelm_testkit::model(anelm_testkit::SMOLLM2)).unwrap();
    let blue = loaded
        .tokenizer()
        .unwrap()
        .encode(" blue", false, false)
        .unwrap();
    assert_eq!(blue.len(), 1, "' blue' is one token");
    let mut body = chat("List ten colours.", 3);
    body["logit_bias"] = json!({blue[0].to_string(): 100});
    body["logprobs"] = json!(true);
    let (_, biased) = post(&c, &url, &body).await;
    let tokens: Vec<&Value> = biased["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["token"])
        .collect();
    assert_eq!(tokens, [&json!(" blue"); 3]);
}

#[tokio::test]
async fn tools_need_a_template_that_describes_them() {
    let base = shared();
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let tool = json!([{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]);
    let mut body = chat("What time is it?", 4);
    body["tools"] = tool.clone();
    let (status, v) = post(&c, &url, &body).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("tools")),
        "{v}"
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("does not describe tools"));
    body["tool_choice"] = json!("none");
    let (status, v) = post(&c, &url, &body).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test]
async fn json_mode_replies_are_json_objects() {
    let base = shared();
    let c = client();
    let url = format!("{base}/v1/chat/completions");
    let ask = "Reply with a JSON object with two keys, name and age, for a cat.";
    let mut body = chat(ask, 60);
    body["response_format"] = json!({"type": "json_object"});
    let (status, v) = post(&c, &url, &body).await;
    assert_eq!(status, 200, "{v}");
    let greedy = v["choices"][0]["message"]["content"].as_str().unwrap();
    let object: Value = serde_json::from_str(greedy).unwrap_or_else(|e| panic!("{e}: {greedy}"));
    assert!(
        object.is_object() && object.get("name").is_some(),
        "{greedy}"
    );
    assert_eq!(
        v["choices"][0]["finish_reason"], "stop",
        "the object closes and the turn ends"
    );
    // Sampled choices too: each is an object, or (cut by max_tokens) the start of one.
    body["temperature"] = json!(1.0);
    body["seed"] = json!(3);
    body["n"] = json!(3);
    let (_, v) = post(&c, &url, &body).await;
    let mut closed = 0;
    for choice in v["choices"].as_array().unwrap() {
        let text = choice["message"]["content"].as_str().unwrap();
        assert!(text.trim_start().starts_with('{'), "{text}");
        if choice["finish_reason"] == "stop" {
            let parsed: Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(parsed.is_object(), "{text}");
            closed += 1;
        }
    }
    assert!(closed >= 1, "{v}");
    // A question the model answers in prose comes back as an object all the same.
    let (_, prose) = post(&c, &url, &chat("Tell me about cats.", 24)).await;
    let prose = prose["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!prose.trim_start().starts_with('{'), "{prose}");
    let mut body = chat("Tell me about cats.", 24);
    body["response_format"] = json!({"type": "json_object"});
    let (_, v) = post(&c, &url, &body).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.trim_start().starts_with('{'), "{text}");
    for (format, param) in [
        (
            json!({"type": "json_schema"}),
            "response_format.json_schema",
        ),
        (json!({"type": "yaml"}), "response_format.type"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}),
            "response_format",
        ),
    ] {
        let mut body = chat(ask, 4);
        body["response_format"] = format;
        let (status, v) = post(&c, &url, &body).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{v}"
        );
    }
}

#[tokio::test]
async fn the_api_key_guards_the_api_only() {
    let server = start(anelm_server::ServerConfig {
        api_key: Some("s3cret".into()),
        ..config(1, 4)
    });
    let base = base(&server);
    let c = client();
    let r = c.get(format!("{base}/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "authentication_error"
    );
    let r = c
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", "wrong")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (&v["type"], &v["error"]["type"]),
        (&json!("error"), &json!("authentication_error"))
    );
    let r = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(format!("{base}/v1/models"))
        .header("x-api-key", "s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The page and the health check stay open.
    for path in ["/", "/health"] {
        assert_eq!(
            c.get(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "{path}"
        );
    }
}

#[tokio::test]
async fn cors_preflight_and_the_page() {
    let base = shared();
    let c = client();
    let r = c
        .request(
            reqwest::Method::OPTIONS,
            format!("{base}/v1/chat/completions"),
        )
        .header("origin", "http://example.test")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    let methods = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(methods.contains("POST"), "{methods}");

    let r = c.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let page = r.text().await.unwrap();
    assert!(page.contains("renderMarkdown") && page.contains("localStorage"));
    // Self-contained: nothing loaded from elsewhere.
    for external in [
        "src=\"http",
        "href=\"http",
        "stylesheet",
        "<script src",
        "@import",
    ] {
        assert!(!page.contains(external), "the page loads '{external}'");
    }
}
