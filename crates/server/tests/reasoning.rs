//! Thinking kept apart, end to end, on the scripted model ([`common::scripted`]): the reply to
//! "hi" is always `<think>hmm yes</think>answer<end>` — unless a thinking budget closes the
//! thought early. Checked through OpenAI chat (stream and not),
//! Anthropic messages (stream and not) and the Responses API.

use serde_json::{json, Value};

mod common;
use common::scripted::start;
use common::{base, client, post};

/// The `data:` payloads of an SSE body (without `[DONE]`).
async fn events(c: &reqwest::Client, url: &str, body: &Value) -> Vec<Value> {
    let text = c
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.split("\n\n")
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

#[tokio::test]
async fn thinking_comes_apart_from_the_answer_and_a_budget_ends_it() {
    let (server, _dir) = start();
    let base = base(&server);
    let c = client();
    let chat_url = format!("{base}/v1/chat/completions");
    let chat = |extra: Value| {
        let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };

    let (status, v) = post(&c, &chat_url, &chat(json!({}))).await;
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (&m["reasoning_content"], &m["content"]),
        (&json!("hmmyes"), &json!("answer")),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Streaming: the thought in reasoning_content deltas, then the answer in content deltas.
    let chunks = events(&c, &chat_url, &chat(json!({"stream": true}))).await;
    let joined = |key: &str| -> String {
        chunks
            .iter()
            .filter_map(|ch| ch["choices"][0]["delta"][key].as_str())
            .collect()
    };
    assert_eq!(
        (joined("reasoning_content"), joined("content")),
        ("hmmyes".into(), "answer".into())
    );
    let first_content = chunks
        .iter()
        .position(|ch| ch["choices"][0]["delta"]["content"] == "answer")
        .unwrap();
    let last_reasoning = chunks
        .iter()
        .rposition(|ch| ch["choices"][0]["delta"]["reasoning_content"].is_string())
        .unwrap();
    assert!(last_reasoning < first_content);

    // A budget of one token: the closing marker is forced after "hmm", then the answer.
    let (_, v) = post(&c, &chat_url, &chat(json!({"max_thinking_tokens": 1}))).await;
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (&m["reasoning_content"], &m["content"]),
        (&json!("hmm"), &json!("answer")),
        "{v}"
    );
    assert_eq!(
        v["usage"]["completion_tokens"], 5,
        "<think> hmm </think> answer <end>"
    );
    let (status, v) = post(&c, &chat_url, &chat(json!({"max_thinking_tokens": 0}))).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("max_thinking_tokens"))
    );

    // Anthropic: a thinking block before the text block, and thinking_delta events.
    let messages_url = format!("{base}/v1/messages");
    let ask =
        json!({"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]});
    let (status, v) = post(&c, &messages_url, &ask).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["content"],
        json!([{"type": "thinking", "thinking": "hmmyes", "signature": ""}, {"type": "text", "text": "answer"}])
    );
    let mut budgeted = ask.clone();
    budgeted["thinking"] = json!({"type": "enabled", "budget_tokens": 1});
    let (_, v) = post(&c, &messages_url, &budgeted).await;
    assert_eq!(v["content"][0]["thinking"], "hmm", "{v}");
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let evs = events(&c, &messages_url, &streamed).await;
    let kinds: Vec<String> = evs
        .iter()
        .map(|e| {
            let t = e["type"].as_str().unwrap().to_string();
            match e["delta"]["type"].as_str() {
                Some(d) => format!("{t}:{d}"),
                None => t,
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta:thinking_delta",
            "content_block_delta:thinking_delta",
            "content_block_delta:signature_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta:text_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(evs[1]["content_block"]["type"], "thinking");
    assert_eq!(evs[7]["index"], 1);

    // Responses: a reasoning item, then the message; reasoning tokens counted.
    let responses_url = format!("{base}/v1/responses");
    let (status, v) = post(&c, &responses_url, &json!({"model": "m", "input": "hi"})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(v["output"][0]["content"][0]["text"], "hmmyes");
    assert_eq!(v["output"][1]["content"][0]["text"], "answer");
    assert_eq!(
        v["usage"]["output_tokens_details"]["reasoning_tokens"], 3,
        "hmm yes </think>: {v}"
    );
    let evs = events(
        &c,
        &responses_url,
        &json!({"model": "m", "input": "hi", "stream": true}),
    )
    .await;
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let seq: Vec<u64> = evs
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..evs.len() as u64).collect::<Vec<_>>());
}
