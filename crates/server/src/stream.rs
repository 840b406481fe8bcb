//! Reading a job's updates: one translation into pieces (the thought apart from the answer,
//! logprobs with the text they belong to), read all at once for a plain response or as
//! server-sent events, each API mapping pieces to its own events.

use std::convert::Infallible;

use anelm_engine::{Finish, FinishReason, TokenLogprob, Usage};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::error::ApiError;
use crate::model::ServedModel;
use crate::reasoning::{self, Splitter};
use crate::scheduler::Update;

/// One finished choice.
#[derive(Debug)]
pub struct Choice {
    /// The answer (the thought apart, when the model thinks in marked text).
    pub text: String,
    /// The thought.
    pub reasoning: String,
    /// All the text the engine gave out, thought and markers included (what stop strings
    /// are matched after).
    pub emitted: String,
    pub tokens: Vec<u32>,
    /// One per token, when the request asked for logprobs.
    pub logprobs: Vec<TokenLogprob>,
    /// Tokens drawn while the reply was in its thought.
    pub reasoning_tokens: usize,
    pub finish: Finish,
}

/// What an API turns into its own events: the engine's updates per choice, the thought apart
/// from the answer, each piece of answer with the logprobs of the tokens behind it.
#[derive(Debug)]
pub enum Piece {
    Reasoning {
        choice: usize,
        text: String,
    },
    /// Answer text (never when the translation holds the answer to the end).
    Text {
        choice: usize,
        text: String,
        logprobs: Vec<(u32, TokenLogprob)>,
    },
    /// A choice ended: all of it, and the logprobs no piece has carried yet.
    Finish {
        choice: usize,
        whole: Box<Choice>,
        logprobs: Vec<(u32, TokenLogprob)>,
    },
    /// Every choice has ended (after the last `Finish`).
    Done {
        finishes: Vec<Finish>,
    },
    /// The engine failed; the message is for the client.
    Failed(String),
}

/// The updates of a job, per choice, turned into [`Piece`]s: the one translation every API
/// uses, streaming or not.
pub struct Translator {
    choices: Vec<Partial>,
    /// Answer text is given only in the `Finish` (a reply that may be tool calls).
    hold: bool,
    finishes: Vec<Finish>,
}

#[derive(Default)]
struct Partial {
    splitter: Option<Splitter>,
    whole: Draft,
    /// Tokens not yet reported with their logprobs.
    pending: Vec<(u32, TokenLogprob)>,
}

/// A choice so far.
#[derive(Default)]
struct Draft {
    text: String,
    reasoning: String,
    emitted: String,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    reasoning_tokens: usize,
}

impl Translator {
    /// `n` choices; `reasoning`: the splitter each choice's reply goes through (None: the
    /// reply is all answer).
    pub fn new(n: usize, reasoning: Option<Splitter>, hold: bool) -> Translator {
        Translator {
            choices: (0..n)
                .map(|_| Partial {
                    splitter: reasoning.clone(),
                    ..Partial::default()
                })
                .collect(),
            hold,
            finishes: Vec::new(),
        }
    }

    pub fn update(&mut self, update: Update) -> Vec<Piece> {
        match update {
            Update::Token {
                choice,
                id,
                logprob,
            } => {
                let c = &mut self.choices[choice];
                c.whole.tokens.push(id);
                if c.splitter.as_ref().is_some_and(Splitter::thinking) {
                    c.whole.reasoning_tokens += 1;
                }
                if let Some(lp) = logprob {
                    c.whole.logprobs.push(lp.clone());
                    c.pending.push((id, lp));
                }
                Vec::new()
            }
            Update::Text { choice, text } => {
                let c = &mut self.choices[choice];
                c.whole.emitted += &text;
                let pieces = match &mut c.splitter {
                    Some(s) => s.push(&text),
                    None => vec![reasoning::Piece::Answer(text)],
                };
                self.pieces(choice, pieces)
            }
            Update::Finish { choice, finish } => {
                let rest = match &mut self.choices[choice].splitter {
                    Some(s) => s.finish(),
                    None => Vec::new(),
                };
                let mut out = self.pieces(choice, rest);
                let c = &mut self.choices[choice];
                let d = std::mem::take(&mut c.whole);
                let whole = Choice {
                    text: d.text,
                    reasoning: d.reasoning,
                    emitted: d.emitted,
                    tokens: d.tokens,
                    logprobs: d.logprobs,
                    reasoning_tokens: d.reasoning_tokens,
                    finish: finish.clone(),
                };
                out.push(Piece::Finish {
                    choice,
                    whole: Box::new(whole),
                    logprobs: std::mem::take(&mut c.pending),
                });
                self.finishes.push(finish);
                if self.finishes.len() == self.choices.len() {
                    out.push(Piece::Done {
                        finishes: std::mem::take(&mut self.finishes),
                    });
                }
                out
            }
            Update::Failed(message) => vec![Piece::Failed(message)],
        }
    }

    fn pieces(&mut self, choice: usize, pieces: Vec<reasoning::Piece>) -> Vec<Piece> {
        let c = &mut self.choices[choice];
        let mut out = Vec::new();
        for p in pieces {
            match p {
                reasoning::Piece::Reasoning(text) => {
                    c.whole.reasoning += &text;
                    out.push(Piece::Reasoning { choice, text });
                }
                reasoning::Piece::Answer(text) => {
                    c.whole.text += &text;
                    if !self.hold {
                        out.push(Piece::Text {
                            choice,
                            text,
                            logprobs: std::mem::take(&mut c.pending),
                        });
                    }
                }
            }
        }
        out
    }
}

/// Waits for every choice of a job.
pub async fn collect(
    mut rx: UnboundedReceiver<Update>,
    mut translator: Translator,
) -> Result<Vec<Choice>, ApiError> {
    let mut done: Vec<Option<Choice>> = (0..translator.choices.len()).map(|_| None).collect();
    while let Some(update) = rx.recv().await {
        for piece in translator.update(update) {
            match piece {
                Piece::Finish { choice, whole, .. } => done[choice] = Some(*whole),
                Piece::Failed(message) => return Err(ApiError::internal(message)),
                _ => {}
            }
        }
    }
    done.into_iter()
        .map(|c| c.ok_or_else(|| ApiError::internal("the generation ended without finishing")))
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

/// An API's events for the pieces of a job.
pub trait Emit: Send + 'static {
    /// Events before the first update.
    fn opening(&mut self) -> Vec<Event>;
    fn piece(&mut self, piece: Piece) -> Vec<Event>;
}

/// A streaming response. Dropping it (the client went away) drops the receiver, which
/// cancels the job.
pub fn sse(
    rx: UnboundedReceiver<Update>,
    mut translator: Translator,
    mut emit: impl Emit,
) -> Response {
    let opening = emit.opening();
    let events = stream::iter(opening).chain(UnboundedReceiverStream::new(rx).flat_map(move |u| {
        let events: Vec<Event> = translator
            .update(u)
            .into_iter()
            .flat_map(|p| emit.piece(p))
            .collect();
        stream::iter(events)
    }));
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// An event carrying JSON.
pub fn json_event(value: &serde_json::Value) -> Event {
    Event::default().data(value.to_string())
}
