//! Shared test helpers: where the models and the llama.cpp fixtures are.

#![allow(dead_code, unused_imports)]

use anelm_formats::Gguf;
use anelm_tokenize::Tokenizer;
use serde_json::Value;

pub use anelm_testkit::{ids, model, workspace_root, GEMMA3, SMOLLM2};

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

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
