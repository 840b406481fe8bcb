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

use crate::model::ServedModel;
use crate::models::Models;
use crate::stream::{json_event, timings, total_usage};

/// `GET /v1/models`: every model served, with its state (loaded, loading, unloaded, failed);
/// a loaded one also with its context and kind (chat or embedding).
pub async fn models(State(models): State<Arc<Models>>) -> Json<Value> {
    let data: Vec<Value> = (models.listing().into_iter())
        .map(|e| {
            let mut m = json!({
                "id": e["id"],
                "object": "model",
                "created": e.get("created").cloned().unwrap_or(json!(models.started)),
                "owned_by": "anelm",
                "state": e["state"],
            });
            for key in ["context_length", "kind"] {
                if let Some(v) = e.get(key) {
                    m[key] = v.clone();
                }
            }
            m
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// What a completion object or chunk of `object` ("chat.completion", "text_completion", …)
/// says of itself — its id, creation time and model — around its choices; a chunk adds the
/// usage where asked for (`Some(null)` on every chunk but the last, then the usage itself).
pub fn envelope(
    object: &str,
    id: &str,
    created: u64,
    model: &str,
    choices: Value,
    usage: Option<Value>,
) -> Value {
    let mut v = json!({
        "id": id,
        "object": object,
        "created": created,
        "model": model,
        "choices": choices,
    });
    if let Some(u) = usage {
        v["usage"] = u;
    }
    v
}

/// A whole (not streamed) completion object: its choices, the usage and timings of `finishes`.
pub fn whole_reply(
    object: &str,
    id: &str,
    created: u64,
    model: &str,
    choices: Value,
    finishes: &[&Finish],
) -> Value {
    let mut v = envelope(object, id, created, model, choices, None);
    v["usage"] = usage_json(&total_usage(finishes));
    v["timings"] = timings(finishes);
    v
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
