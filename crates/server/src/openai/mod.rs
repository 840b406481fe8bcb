//! The OpenAI API: chat completions, completions, responses, models.

pub mod chat;
pub mod completions;
pub mod responses;
pub(crate) mod responses_input;
pub mod responses_store;
mod responses_stream;

use std::sync::Arc;

use anelm_engine::{Finish, TokenLogprob, Usage};
use axum::extract::State;
use axum::response::sse::Event;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::App;
use crate::model::ServedModel;
use crate::stream::{json_event, timings, total_usage};

/// `GET /v1/models`.
pub async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    let m = &app.model;
    Json(json!({
        "object": "list",
        "data": [{
            "id": m.id,
            "object": "model",
            "created": m.created,
            "owned_by": "anelm",
            "context_length": m.ctx,
        }],
    }))
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// OpenAI's usage object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Chat logprobs entries (`choices[].logprobs.content`), one per token.
pub fn chat_logprobs(model: &ServedModel, tokens: &[u32], logprobs: &[TokenLogprob]) -> Vec<Value> {
    let entry = |id: u32, logprob: f32| {
        let (token, bytes) = model.piece(id);
        json!({"token": token, "logprob": logprob, "bytes": bytes})
    };
    tokens
        .iter()
        .zip(logprobs)
        .map(|(&id, lp)| {
            let mut e = entry(id, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
            e
        })
        .collect()
}

/// The end of a stream: the usage chunk (given with empty choices) when the client asked for
/// it, then `[DONE]`.
pub fn stream_end(usage_chunk: Option<Value>, finishes: &[Finish]) -> Vec<Event> {
    let mut events = Vec::new();
    if let Some(mut chunk) = usage_chunk {
        let finishes: Vec<&Finish> = finishes.iter().collect();
        chunk["usage"] = usage_json(&total_usage(&finishes));
        chunk["timings"] = timings(&finishes);
        events.push(json_event(&chunk));
    }
    events.push(Event::default().data("[DONE]"));
    events
}
