//! A loaded model: configuration, the layer plan with its weights, embeddings and head.

use std::path::PathBuf;

use anelm_formats::Metadata;

use crate::plan::{Ffn, GatedMlp, Layer, Norm};
use crate::weight::Weight;

/// The model families anelm runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma,
    Gemma2,
    Gemma3,
    Gpt2,
    Qwen2Moe,
    Qwen3Moe,
    Qwen3Next,
    Qwen35,
    Qwen35Moe,
    Lfm2,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma => "gemma",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3",
            Family::Gpt2 => "gpt2",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Qwen3Next => "qwen3_next",
            Family::Qwen35 => "qwen3_5",
            Family::Qwen35Moe => "qwen3_5_moe",
            Family::Lfm2 => "lfm2",
        }
    }
}

/// Where a model came from.
#[derive(Debug)]
pub enum ModelSource {
    /// A GGUF file; its metadata is kept for the tokenizer and chat template.
    Gguf {
        path: PathBuf,
        metadata: Box<Metadata>,
    },
    /// A Hugging Face directory (config.json, *.safetensors, tokenizer.json).
    HfDir { dir: PathBuf },
}

impl ModelSource {
    pub fn path(&self) -> &std::path::Path {
        match self {
            ModelSource::Gguf { path, .. } => path,
            ModelSource::HfDir { dir } => dir,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub family: Family,
    /// A human-readable name (GGUF general.name, or the directory name).
    pub name: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// The context length the model was trained for.
    pub context_length: usize,
}

pub struct Model {
    pub config: ModelConfig,
    pub source: ModelSource,
    /// Token embeddings `[vocab, hidden]`.
    pub embedding: Weight,
    /// Multiplier of the looked-up embedding (Gemma's `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Learned absolute position embeddings `[n_positions, hidden]` (GPT-2).
    pub pos_embedding: Option<Weight>,
    pub layers: Vec<Layer>,
    pub final_norm: Norm,
    /// Output head `[vocab, hidden]`; the embedding's bytes when tied.
    pub lm_head: Weight,
    /// `logits = cap * tanh(logits / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
}

impl Model {
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The most positions the model can attend over (learned positions bound GPT-2).
    pub fn max_positions(&self) -> usize {
        match &self.pos_embedding {
            Some(p) => p.rows.min(self.config.context_length),
            None => self.config.context_length,
        }
    }

    /// Bytes of weights read for one decoded token: every layer matrix plus the head (the
    /// embedding contributes one row).
    pub fn bytes_per_token(&self) -> usize {
        let mut n = self.lm_head.n_bytes() + self.embedding.row_bytes();
        for l in &self.layers {
            n += l
                .mixer
                .linears()
                .iter()
                .map(|w| w.weight.n_bytes())
                .sum::<usize>();
            n += match &l.ffn {
                Ffn::Gated { gate, up, down, .. } => {
                    gate.weight.n_bytes() + up.weight.n_bytes() + down.weight.n_bytes()
                }
                Ffn::Plain { up, down, .. } => up.weight.n_bytes() + down.weight.n_bytes(),
                // A token reads the router, its top-k experts (the largest, as a bound) and the
                // shared expert.
                Ffn::Moe(m) => {
                    let mlp = |e: &GatedMlp| {
                        e.gate.weight.n_bytes() + e.up.weight.n_bytes() + e.down.weight.n_bytes()
                    };
                    let largest = m.experts.iter().map(mlp).max().unwrap_or(0);
                    let shared = m.shared.as_ref().map_or(0, |s| {
                        mlp(&s.mlp) + s.gate.as_ref().map_or(0, |g| g.n_bytes())
                    });
                    m.router.n_bytes() + m.top_k * largest + shared
                }
            };
        }
        n
    }

    /// GGUF metadata, when the model came from a GGUF file.
    pub fn gguf_metadata(&self) -> Option<&Metadata> {
        match &self.source {
            ModelSource::Gguf { metadata, .. } => Some(metadata),
            ModelSource::HfDir { .. } => None,
        }
    }
}
