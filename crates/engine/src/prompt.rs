//! Turning a request's input into prompt tokens, and the context-overflow policy.

use anelm_tokenize::{Message, RenderOptions};

use crate::error::{EngineError, Result};
use crate::loaded::LoadedModel;

/// What to generate from.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Text, tokenized as llama.cpp tokenizes a prompt: BOS as the model says, the text of
    /// special tokens (e.g. `<|im_start|>`) read as those tokens.
    Text(String),
    /// Token ids, as given.
    Ids(Vec<u32>),
    /// A conversation, rendered by the model's chat template and ending with the header of the
    /// assistant's turn.
    Messages(Vec<Message>),
}

/// What to do when the prompt does not fit the session's context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Refuse: [`EngineError::ContextOverflow`].
    #[default]
    Error,
    /// For conversations: drop the oldest turns (a leading system message and the last turn
    /// stay) until the prompt plus `max_tokens` fits; the count is reported in
    /// [`crate::Usage::dropped_messages`]. Other inputs are refused as with `Error`.
    DropOldestTurns,
}

/// A prompt ready to prefill.
#[derive(Debug)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Messages the overflow policy dropped.
    pub dropped_messages: usize,
}

/// The prompt for `input` in a context of `capacity` positions. A prompt fits when it leaves
/// room for at least one generated token.
pub fn prepare(
    model: &LoadedModel,
    input: &Input,
    capacity: usize,
    max_tokens: usize,
    overflow: Overflow,
) -> Result<Prompt> {
    let (ids, dropped_messages) = match input {
        Input::Ids(ids) => (ids.clone(), 0),
        Input::Text(text) => (model.tokenizer()?.encode(text, true, true)?, 0),
        Input::Messages(msgs) if overflow == Overflow::DropOldestTurns => {
            fit_messages(model, msgs, capacity, max_tokens)?
        }
        Input::Messages(msgs) => (chat_ids(model, msgs)?, 0),
    };
    if ids.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let vocab = model.model.config.vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::TokenOutOfRange { id, vocab });
    }
    if ids.len() >= capacity {
        return Err(EngineError::ContextOverflow {
            prompt_tokens: ids.len(),
            capacity,
            dropped_messages,
        });
    }
    Ok(Prompt {
        ids,
        dropped_messages,
    })
}

/// A conversation's tokens: the template's text with the assistant header (and the model's
/// template kwargs), its special-token text read as special tokens, nothing added (templates
/// write their own BOS).
pub fn chat_ids(model: &LoadedModel, msgs: &[Message]) -> Result<Vec<u32>> {
    let template = model.chat_template()?;
    let text = template.render(
        msgs,
        &RenderOptions {
            add_generation_prompt: true,
            variables: model.template_kwargs.clone(),
            ..RenderOptions::default()
        },
    )?;
    Ok(model.tokenizer()?.encode(&text, false, true)?)
}

/// Drops whole turns (a user message and the replies up to the next user message), oldest
/// first, until the prompt and `max_tokens` fit or only the system message and the last turn
/// are left.
fn fit_messages(
    model: &LoadedModel,
    msgs: &[Message],
    capacity: usize,
    max_tokens: usize,
) -> Result<(Vec<u32>, usize)> {
    let mut kept = msgs.to_vec();
    let first = usize::from(kept.first().is_some_and(|m| m.role == "system"));
    loop {
        let ids = chat_ids(model, &kept)?;
        if ids.len() + max_tokens <= capacity {
            return Ok((ids, msgs.len() - kept.len()));
        }
        // The oldest turn ends where the next user message starts; the last one always stays.
        let next_user = kept
            .iter()
            .enumerate()
            .skip(first + 1)
            .find(|(_, m)| m.role == "user")
            .map(|(i, _)| i);
        match next_user {
            Some(end) => {
                kept.drain(first..end);
            }
            None => return Ok((ids, msgs.len() - kept.len())),
        }
    }
}
