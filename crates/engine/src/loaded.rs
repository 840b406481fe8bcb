//! A model with everything needed to talk to it: the weights and plan, the tokenizer, the chat
//! template and the tokens that end a generation.

use std::path::Path;
use std::sync::Arc;

use anelm_model::Model;
use anelm_tokenize::{ChatTemplate, Message, RenderOptions, TemplateKwargs, Tokenizer};

use crate::error::{EngineError, Result};
use crate::text_side;

/// A loaded model and its tokenizer (absent for HF directories without tokenizer.json).
pub struct LoadedModel {
    pub model: Arc<Model>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// Template variables every conversation is rendered with (transformers' extra keyword
    /// arguments of apply_chat_template, e.g. `enable_thinking`); empty when loaded.
    pub template_kwargs: TemplateKwargs,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Model(#[from] anelm_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] anelm_tokenize::TokenizeError),
}

impl LoadedModel {
    pub fn load(path: &Path) -> Result<LoadedModel, LoadError> {
        let model = anelm_model::load(path)?;
        let tokenizer = text_side::tokenizer_of(&model.source)?;
        Ok(LoadedModel {
            model: Arc::new(model),
            tokenizer: tokenizer.map(Arc::new),
            template_kwargs: TemplateKwargs::new(),
        })
    }

    /// The tokenizer, or an error naming the model that has none.
    pub fn tokenizer(&self) -> Result<&Arc<Tokenizer>> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| EngineError::NoTokenizer {
                path: self.model.source.path().to_path_buf(),
            })
    }

    /// The chat template: the model's own (GGUF `tokenizer.chat_template`, or the Hugging Face
    /// files), else the built-in template of its family. `bos_token`/`eos_token` are the
    /// tokenizer's strings where there is a tokenizer.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        text_side::chat_template(
            &self.model.source,
            self.tokenizer.as_deref(),
            self.model.config.family.name(),
        )
    }

    /// Ids that end a generation, ascending: the tokenizer's end-of-generation ids (llama.cpp's
    /// rule) and the end-of-turn token the chat template writes after an assistant message.
    /// None without a tokenizer.
    pub fn stop_ids(&self) -> Vec<u32> {
        let Some(tok) = &self.tokenizer else {
            return Vec::new();
        };
        let mut ids = tok.eog_ids();
        if let Some(id) = self.chat_template().ok().and_then(|t| end_of_turn(tok, &t)) {
            ids.push(id);
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// The special token a template writes right after an assistant message's text (`<|im_end|>`,
/// `<end_of_turn>`, `<|eot_id|>`, ...): the model ends its turn with it.
fn end_of_turn(tok: &Tokenizer, template: &ChatTemplate) -> Option<u32> {
    const REPLY: &str = "anelm-probe-reply";
    let chat = [Message::user("hello"), Message::assistant(REPLY)];
    let text = template.render(&chat, &RenderOptions::default()).ok()?;
    let after = &text[text.rfind(REPLY)? + REPLY.len()..];
    let first = *tok.encode(after, false, true).ok()?.first()?;
    tok.is_special(first).then_some(first)
}
