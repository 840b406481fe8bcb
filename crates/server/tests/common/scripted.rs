//! A scripted model: hf-tiny llama's config with a word-level tokenizer and an executor whose
//! next token is a fixed function of the last one ([`next`]), so a test knows every reply. To
//! "hi" it thinks (`<think>hmm yes</think>answer<end>`); to "weather" it calls `get_weather`
//! (one token holds the whole `<tool_call>…</tool_call>`); to "celsius" (a weather tool's
//! result, in the agent test) it calls `to_fahrenheit`; to anything else (a tool's result) it
//! answers `answer`. Its template describes tools.

use anelm_engine::LoadedModel;
use anelm_server::Server;
use serde_json::{json, Value};

use super::config;

pub const VOCAB: [&str; 12] = [
    "<unk>", "hi", "<think>", "hmm", "yes", "</think>", "answer", "<end>", "weather", CALL,
    "celsius", CALL2,
];

/// The call the model makes, as one token.
pub const CALL: &str =
    "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>";

/// The second call of a two-tool task, as one token.
pub const CALL2: &str =
    "<tool_call>{\"name\": \"to_fahrenheit\", \"arguments\": {\"celsius\": 21}}</tool_call>";

/// The token after `last`: hi → <think> → hmm → yes → </think> → answer → <end>; weather →
/// the call → <end>; celsius → the second call → <end>; anything else → answer.
pub fn next(last: u32) -> u32 {
    match last {
        1..=5 => last + 1,
        8 => 9,
        10 => 11,
        0 => 6,
        _ => 7,
    }
}

pub fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tiny = anelm_testkit::tiny("llama");
    for f in ["config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(tiny.join(f), dir.path().join(f)).unwrap();
    }
    let vocab: serde_json::Map<String, Value> = VOCAB
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), json!(i)))
        .collect();
    let added = |id: usize, special: bool| {
        json!({"id": id, "content": VOCAB[id], "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": special})
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(2, false), added(5, false), added(7, true), added(9, false), added(11, false)],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        json!({"eos_token": "<end>"}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% if tools %}tools {% endif %}{% for m in messages %}{{ m.content }} {% endfor %}",
    )
    .unwrap();
    dir
}

/// Serves the scripted model as "m"; keep the directory while the server runs.
pub fn start() -> (Server, tempfile::TempDir) {
    let dir = model_dir();
    let loaded = LoadedModel::load(dir.path()).expect("the model loads");
    let vocab = loaded.model.config.vocab_size;
    let mut cfg = config(1, 4);
    cfg.model_id = Some("m".into());
    let server = Server::start(
        cfg,
        loaded,
        Box::new(anelm_testkit::FnExec::new(vocab, |history, row| {
            row[next(*history.last().expect("a token")) as usize] = 100.0;
        })),
    )
    .expect("starts");
    (server, dir)
}
