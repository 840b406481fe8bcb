use anelm_model::ExecError;
use anelm_tokenize::{ChatTemplateError, TokenizeError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens but the context holds {capacity}")]
    PromptTooLong { tokens: usize, capacity: usize },
    /// The prompt leaves no room to generate, and the overflow policy is to refuse (or there was
    /// nothing left to drop).
    #[error("context overflow: the prompt has {prompt_tokens} tokens and the context holds {capacity}{}", hint(*dropped_messages))]
    ContextOverflow {
        prompt_tokens: usize,
        capacity: usize,
        dropped_messages: usize,
    },
    #[error("{path}: no tokenizer (no tokenizer.json); text and chat need one, token ids do not")]
    NoTokenizer { path: std::path::PathBuf },
    #[error("{path}: no chat template, and no built-in one for the '{family}' family")]
    NoChatTemplate {
        path: std::path::PathBuf,
        family: String,
    },
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("bad generation parameter: {0}")]
    BadParams(String),
}

fn hint(dropped: usize) -> String {
    if dropped > 0 {
        format!(" even after dropping the {dropped} oldest messages")
    } else {
        String::new()
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
