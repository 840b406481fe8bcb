//! A model's text side — tokenizer and chat template — from its source alone, so that
//! `tokenize` and `template` work on a vocabulary-only GGUF (no tensors) or a directory without
//! weights; [`crate::LoadedModel`] builds its own text side with the same functions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anelm_model::ModelSource;
use anelm_tokenize::{
    builtin_template, gguf_chat_template, hf_chat_template, ChatTemplate, Tokenizer,
};

use crate::error::{EngineError, Result};
use crate::loaded::LoadError;

/// The tokenizer a source carries: GGUF metadata, or `tokenizer.json` in a Hugging Face
/// directory (none when the directory has no such file).
pub fn tokenizer_of(source: &ModelSource) -> Result<Option<Tokenizer>, LoadError> {
    Ok(match source {
        ModelSource::Gguf { metadata, .. } => Some(Tokenizer::from_gguf(metadata)?),
        ModelSource::HfDir { dir } if dir.join("tokenizer.json").exists() => {
            Some(Tokenizer::from_hf_dir(dir)?)
        }
        ModelSource::HfDir { .. } => None,
    })
}

/// The chat template: the source's own (GGUF `tokenizer.chat_template`, or the Hugging Face
/// files), else the built-in template of `family`. `bos_token`/`eos_token` are the tokenizer's
/// strings where there is a tokenizer.
pub fn chat_template(
    source: &ModelSource,
    tokenizer: Option<&Tokenizer>,
    family: &str,
) -> Result<ChatTemplate> {
    let piece = |id: Option<u32>| {
        let t = tokenizer?;
        Some(String::from_utf8_lossy(&t.token_to_piece(id?)).into_owned())
    };
    let bos = piece(tokenizer.and_then(|t| t.bos()));
    let eos = piece(tokenizer.and_then(|t| t.eos()));
    let own = match source {
        ModelSource::Gguf { metadata, .. } => gguf_chat_template(metadata)?,
        ModelSource::HfDir { dir } => hf_chat_template(dir)?,
    };
    if let Some((text, origin)) = own {
        return Ok(ChatTemplate::new(&text, origin, bos, eos)?);
    }
    let builtin = builtin_template(family).ok_or_else(|| EngineError::NoChatTemplate {
        path: source.path().to_path_buf(),
        family: family.to_string(),
    })?;
    Ok(ChatTemplate::builtin(builtin, bos, eos))
}

/// A model's tokenizer and template without its weights.
pub struct TextSide {
    pub source: ModelSource,
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// The family name for the built-in template: ours where we run the family, else the
    /// file's own architecture (or model type) name.
    family: String,
}

impl TextSide {
    /// Reads only what the text side needs: GGUF metadata (a vocabulary-only file will do) or
    /// the directory's tokenizer and config files.
    pub fn load(path: &Path) -> Result<TextSide, LoadError> {
        let source = anelm_model::open_source(path)?;
        let family = match anelm_model::family_of(&source) {
            Some(f) => f.name().to_string(),
            None => anelm_model::architecture_of(&source).unwrap_or_else(|| "unknown".into()),
        };
        let tokenizer = tokenizer_of(&source)?.map(Arc::new);
        Ok(TextSide {
            source,
            tokenizer,
            family,
        })
    }

    /// The tokenizer, or an error naming the model that has none.
    pub fn tokenizer(&self) -> Result<&Arc<Tokenizer>> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| EngineError::NoTokenizer { path: self.path() })
    }

    pub fn chat_template(&self) -> Result<ChatTemplate> {
        chat_template(&self.source, self.tokenizer.as_deref(), &self.family)
    }

    pub fn path(&self) -> PathBuf {
        self.source.path().to_path_buf()
    }
}
