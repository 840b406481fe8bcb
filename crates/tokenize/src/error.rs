//! Errors of tokenizer construction. Each names the file (and the key) and says what is wrong.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// A GGUF metadata value could not be read (wrong type, missing required key, ...).
    #[error(transparent)]
    Metadata(#[from] anelm_formats::FormatError),
    #[error("{path}: missing metadata key '{key}'")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key '{key}': {msg}")]
    BadValue {
        path: PathBuf,
        key: String,
        msg: String,
    },
    #[error("{path}: unsupported tokenizer model '{model}' (tokenizer.ggml.model): {why}; supported: gpt2, llama, bert, gemma4")]
    UnsupportedModel {
        path: PathBuf,
        model: String,
        why: &'static str,
    },
    #[error("{path}: unknown pre-tokenizer '{pre}' (tokenizer.ggml.pre)")]
    UnknownPre { path: PathBuf, pre: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Json { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    HfTokenizer { path: PathBuf, msg: String },
}

pub type Result<T, E = TokenizeError> = std::result::Result<T, E>;
