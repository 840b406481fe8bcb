//! A served embedding (encoder) model: its tokenizer and its pass, which runs on a blocking
//! thread per request (one at a time: the pass uses every core). It answers `/v1/embeddings`,
//! `/tokenize` and `/detokenize`; generation requests naming it are refused in one line.

use std::sync::{Arc, Mutex};

use anelm_cpu::encoder::EncoderRunner;
use anelm_tokenize::Tokenizer;

use crate::error::ApiError;

/// What loading an embedding model gives.
pub struct EncoderParts {
    pub runner: EncoderRunner,
    pub tokenizer: Arc<Tokenizer>,
}

pub struct Embedder {
    pub id: String,
    /// Its files' size, the estimate of its memory.
    pub bytes: u64,
    pub tokenizer: Arc<Tokenizer>,
    /// Most tokens per input.
    pub max_positions: usize,
    pub vocab_size: usize,
    pub created: u64,
    runner: Mutex<EncoderRunner>,
}

impl Embedder {
    pub fn new(id: String, parts: EncoderParts) -> Embedder {
        let e = parts.runner.encoder();
        Embedder {
            id,
            bytes: crate::models::source_bytes(e.source.path()),
            max_positions: e.max_positions,
            vocab_size: e.vocab_size,
            tokenizer: parts.tokenizer,
            created: crate::ids::unix_seconds(),
            runner: Mutex::new(parts.runner),
        }
    }

    /// The model's name for its pooling ("mean", "cls", "last") and whether it normalises.
    pub fn pooling(&self) -> (&'static str, bool) {
        let r = self.runner.lock().unwrap_or_else(|p| p.into_inner());
        let e = r.encoder();
        (e.pooling.name(), e.normalize)
    }

    /// A text's tokens as the model's own pipeline gives them ([CLS] … [SEP] for BERT).
    pub fn tokens(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text, true, false)
            .map_err(|e| ApiError::bad_param("input", e.to_string()))
    }

    /// Each input's embedding, pooled and normalised as the model says. Blocking.
    pub fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, String> {
        let runner = self.runner.lock().unwrap_or_else(|p| p.into_inner());
        inputs.iter().map(|ids| runner.embed(ids)).collect()
    }
}
