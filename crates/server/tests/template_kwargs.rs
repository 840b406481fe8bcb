//! Template variables through the APIs: `chat_template_kwargs` (OpenAI chat and Anthropic
//! messages, as llama-server takes it), `reasoning_effort` and Anthropic's `thinking` mapped to
//! the template's `enable_thinking` / `reasoning_effort`, the server's own kwargs under the
//! request's, and a 400 in each API's shape for kwargs that are not an object. The model is
//! hf-tiny llama with a tokenizer and a template that, asked to, shows what it was given.

use anelm_cpu::CpuExecutor;
use anelm_engine::LoadedModel;
use anelm_server::Server;
use serde_json::{json, Value};

mod common;
use common::{base, client, config, post};

/// Refuses a message "show" with the variables it sees; otherwise prints the last message.
const TEMPLATE: &str = "{% if messages[-1].content == 'show' %}{{ raise_exception(\
    'thinking=' ~ (enable_thinking | string) ~ ' effort=' ~ (reasoning_effort | string) \
    ~ ' custom=' ~ (custom | tojson if custom is defined else '-')) }}{% endif %}\
    {{ messages[-1].content }}";

/// hf-tiny llama's weights, a word-level tokenizer and [`TEMPLATE`], in a temporary directory.
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tiny = anelm_testkit::tiny("llama");
    for f in ["config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(tiny.join(f), dir.path().join(f)).unwrap();
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hi": 1, "show": 2}, "unk_token": "<unk>"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), TEMPLATE).unwrap();
    dir
}

async fn shown(c: &reqwest::Client, url: &str, extra: Value) -> String {
    let mut body = json!({
        "model": "m", "max_tokens": 1,
        "messages": [{"role": "user", "content": "show"}],
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (status, json) = post(c, url, &body).await;
    assert_eq!(status, 400, "{json}");
    let msg = json["error"]["message"].as_str().unwrap().to_string();
    msg.split_once("refused the conversation: ")
        .unwrap_or_else(|| panic!("{msg}"))
        .1
        .to_string()
}

#[tokio::test]
async fn requests_set_template_variables() {
    let dir = model_dir();
    let mut loaded = LoadedModel::load(dir.path()).expect("the model loads");
    // The server's own kwargs (serve --chat-template-kwargs), under every request's.
    loaded.template_kwargs = json!({"reasoning_effort": "low"})
        .as_object()
        .unwrap()
        .clone();
    let exec = Box::new(CpuExecutor::new(loaded.model.clone(), 0));
    let mut cfg = config(1, 4);
    cfg.model_id = Some("m".into());
    let server = Server::start(cfg, loaded, exec).expect("the server starts");
    let base = base(&server);
    let c = client();
    let chat = format!("{base}/v1/chat/completions");
    let messages = format!("{base}/v1/messages");
    let count = format!("{base}/v1/messages/count_tokens");

    for url in [&chat, &messages, &count] {
        assert_eq!(
            shown(&c, url, json!({})).await,
            "thinking= effort=low custom=-",
            "{url}"
        );
        assert_eq!(
            shown(
                &c,
                url,
                json!({"chat_template_kwargs": {"enable_thinking": false, "custom": {"a": [1, 2.5]}}})
            )
            .await,
            "thinking=False effort=low custom={\"a\": [1, 2.5]}",
            "{url}"
        );
    }
    // reasoning_effort sets both switches; the request's kwargs win over it.
    assert_eq!(
        shown(&c, &chat, json!({"reasoning_effort": "high"})).await,
        "thinking=True effort=high custom=-"
    );
    assert_eq!(
        shown(&c, &chat, json!({"reasoning_effort": "none"})).await,
        "thinking=False effort=none custom=-"
    );
    assert_eq!(
        shown(
            &c,
            &chat,
            json!({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": false}})
        )
        .await,
        "thinking=False effort=high custom=-"
    );
    // Anthropic's thinking turns the template's switch.
    for (thinking, want) in [
        (json!({"type": "enabled", "budget_tokens": 1024}), "True"),
        (json!({"type": "disabled"}), "False"),
    ] {
        for url in [&messages, &count] {
            assert_eq!(
                shown(&c, url, json!({"thinking": thinking})).await,
                format!("thinking={want} effort=low custom=-")
            );
        }
    }

    // Kwargs that are not an object: a 400 in the API's shape naming the field.
    for bad in [json!([1]), json!("x"), json!(true)] {
        let body = json!({"model": "m", "max_tokens": 1, "chat_template_kwargs": bad,
                          "messages": [{"role": "user", "content": "hi"}]});
        let (status, json) = post(&c, &chat, &body).await;
        assert_eq!(status, 400, "{json}");
        assert_eq!(json["error"]["param"], "chat_template_kwargs", "{json}");
        for url in [&messages, &count] {
            let (status, json) = post(&c, url, &body).await;
            assert_eq!(status, 400, "{json}");
            assert_eq!(json["type"], "error", "{json}");
            assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
            let msg = json["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains("chat_template_kwargs") && msg.contains("JSON object"),
                "{msg}"
            );
        }
    }
    let body = json!({"model": "m", "max_tokens": 1, "thinking": {"type": "sometimes"},
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, json) = post(&c, &messages, &body).await;
    assert_eq!(status, 400, "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("thinking"),
        "{json}"
    );

    // The server keeps serving: a plain request renders and answers.
    let body =
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]});
    let (status, json) = post(&c, &chat, &body).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["usage"]["prompt_tokens"], 1, "{json}");
}
