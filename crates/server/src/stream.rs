//! Reading a job's updates: all at once for a plain response, or as server-sent events, each
//! API translating updates into its own events.

use std::convert::Infallible;

use anelm_engine::{Finish, FinishReason, TokenLogprob, Usage};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::error::ApiError;
use crate::model::ServedModel;
use crate::scheduler::Update;

/// One finished choice.
#[derive(Debug)]
pub struct Choice {
    pub text: String,
    pub tokens: Vec<u32>,
    /// One per token, when the request asked for logprobs.
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Finish,
}

/// Waits for every choice of a job.
pub async fn collect(mut rx: UnboundedReceiver<Update>, n: usize) -> Result<Vec<Choice>, ApiError> {
    #[derive(Default)]
    struct Partial {
        text: String,
        tokens: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
        finish: Option<Finish>,
    }
    let mut parts: Vec<Partial> = (0..n).map(|_| Partial::default()).collect();
    while let Some(update) = rx.recv().await {
        match update {
            Update::Token {
                choice,
                id,
                logprob,
            } => {
                parts[choice].tokens.push(id);
                parts[choice].logprobs.extend(logprob);
            }
            Update::Text { choice, text } => parts[choice].text += &text,
            Update::Finish { choice, finish } => parts[choice].finish = Some(finish),
            Update::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    parts
        .into_iter()
        .map(|p| {
            let finish = p
                .finish
                .ok_or_else(|| ApiError::internal("the generation ended without finishing"))?;
            Ok(Choice {
                text: p.text,
                tokens: p.tokens,
                logprobs: p.logprobs,
                finish,
            })
        })
        .collect()
}

/// The usage of a whole job: the prompt once, the completions of every choice.
pub fn total_usage(finishes: &[&Finish]) -> Usage {
    let mut usage = finishes.first().map(|f| f.usage).unwrap_or_default();
    usage.completion_tokens = finishes.iter().map(|f| f.usage.completion_tokens).sum();
    usage
}

/// The stop string that ended a choice: the one found right after the text given out.
pub fn matched_stop(
    model: &ServedModel,
    finish: &Finish,
    tokens: &[u32],
    emitted: &str,
    stops: &[String],
) -> Option<String> {
    if finish.reason != FinishReason::StopString {
        return None;
    }
    let full = model.text_of(tokens);
    let rest = full.get(emitted.len()..)?;
    stops
        .iter()
        .filter(|s| !s.is_empty() && rest.starts_with(s.as_str()))
        .max_by_key(|s| s.len())
        .cloned()
}

/// Speeds for clients that show them (llama.cpp's `timings`).
pub fn timings(finishes: &[&Finish]) -> serde_json::Value {
    let prompt_n: usize = finishes.iter().map(|f| f.timings.prefilled_tokens).sum();
    let prompt_s: f64 = finishes
        .iter()
        .map(|f| f.timings.prefill.as_secs_f64())
        .sum();
    let predicted_n: usize = finishes.iter().map(|f| f.usage.completion_tokens).sum();
    let predicted_s: f64 = finishes
        .iter()
        .map(|f| f.timings.decode.as_secs_f64())
        .sum();
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let mut t = serde_json::json!({
        "prompt_n": prompt_n,
        "prompt_ms": prompt_s * 1e3,
        "prompt_per_second": rate(prompt_n, prompt_s),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_s * 1e3,
        "predicted_per_second": rate(predicted_n, predicted_s),
    });
    // Speculative decoding, in llama-server's names.
    let drafted: usize = finishes.iter().map(|f| f.speculative.drafted).sum();
    if finishes.iter().any(|f| f.speculative.target_passes > 0) {
        let accepted: usize = finishes.iter().map(|f| f.speculative.accepted).sum();
        t["draft_n"] = drafted.into();
        t["draft_n_accepted"] = accepted.into();
    }
    t
}

/// An API's translation of updates into server-sent events.
pub trait Translate: Send + 'static {
    /// Events before the first update.
    fn opening(&mut self) -> Vec<Event>;
    fn update(&mut self, update: Update) -> Vec<Event>;
}

/// A streaming response. Dropping it (the client went away) drops the receiver, which
/// cancels the job.
pub fn sse(rx: UnboundedReceiver<Update>, mut translate: impl Translate) -> Response {
    let opening = translate.opening();
    let events = stream::iter(opening).chain(
        UnboundedReceiverStream::new(rx).flat_map(move |u| stream::iter(translate.update(u))),
    );
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// An event carrying JSON.
pub fn json_event(value: &serde_json::Value) -> Event {
    Event::default().data(value.to_string())
}
