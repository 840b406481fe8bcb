//! Shared test helpers: where the models and the llama.cpp fixtures are.

#![allow(dead_code)]

use std::path::PathBuf;

use anelm_formats::Gguf;
use anelm_tokenize::Tokenizer;
use serde_json::Value;

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A model file from $ANELM_MODELS (default ~/.cache/anelm/models); fails if it is missing.
pub fn model(file: &str) -> PathBuf {
    let dir = match std::env::var_os("ANELM_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
            .join(".cache/anelm/models"),
    };
    let path = dir.join(file);
    assert!(
        path.exists(),
        "model {} is missing: run scripts/fetch-models.py",
        path.display()
    );
    path
}

pub fn gguf_tokenizer(file: &str) -> Tokenizer {
    let gguf = Gguf::open(model(file)).unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::from_gguf(&gguf.metadata).unwrap_or_else(|e| panic!("{e}"))
}

/// A JSON file of ../shared/fixtures/llamacpp.
pub fn llamacpp_fixture(name: &str) -> Value {
    let path = workspace_root()
        .join("../shared/fixtures/llamacpp")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
