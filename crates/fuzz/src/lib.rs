//! Every fuzz target by name: the libFuzzer harness (`fuzz/`, run by `scripts/fuzz.sh`) picks one,
//! and `tests/corpus.rs` replays each committed corpus (`corpus/<name>/`) through the same function.

/// A fuzz target: any bytes in, no panic, no hang, no unbounded allocation.
pub type Target = fn(&[u8]);

/// The targets in priority order.
pub const TARGETS: &[(&str, Target)] = &[
    ("gguf", anelm_formats::fuzz::gguf),
    ("dequant", anelm_formats::fuzz::dequant),
    ("gguf_model", anelm_model::fuzz::gguf_model),
    ("safetensors", anelm_formats::fuzz::safetensors),
    ("safetensors_index", anelm_formats::fuzz::safetensors_index),
    ("hf_config", anelm_model::fuzz::hf_config),
    ("tokenizer_json", anelm_tokenize::fuzz::tokenizer_json),
    ("gguf_tokenizer", anelm_tokenize::fuzz::gguf_tokenizer),
    ("chat_template", anelm_tokenize::fuzz::chat_template),
    ("mil_text", anelm_mil::fuzz::mil_text),
    ("http_body", anelm_server::fuzz::http_body),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// The inputs that once crashed target `name` (kept apart from the corpus, which `fuzz.sh`
/// minimises; the directory may not exist).
pub fn regressions_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(name)
}

/// The committed corpus directory of target `name`.
pub fn corpus_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name)
}
