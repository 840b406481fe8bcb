use anelm_model::ExecError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens but the context holds {capacity}")]
    PromptTooLong { tokens: usize, capacity: usize },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
