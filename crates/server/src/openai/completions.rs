//! `POST /v1/completions`: a continuation of a text (or token ids), no chat template.

use std::sync::Arc;

use anelm_engine::{Finish, GenerateParams, TokenLogprob};
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{envelope, stream_end, whole_reply, StreamOptions};
use crate::app::App;
use crate::error::ApiError;
use crate::extract::{from_fields, JsonBody};
use crate::ids::{new_id, unix_seconds};
use crate::models::Models;
use crate::params::{choices, max_tokens, Sampling, Stop};
use crate::scheduler::Job;
use crate::stream::{self, json_event, Emit, Piece, Translator};
use crate::structured;

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    model: String,
    prompt: Prompt,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    n: Option<i64>,
    stop: Option<Stop>,
    /// Alternatives per token to report (0 to 5), as the legacy API has it.
    logprobs: Option<i64>,
    echo: Option<bool>,
    suffix: Option<String>,
    /// OpenAI's shape (`json_object`, `json_schema`), as chat takes it.
    response_format: Option<Value>,
    /// llama-server's: a schema the text must follow.
    json_schema: Option<Value>,
    grammar: Option<Value>,
    /// The sampling fields, and whatever else the client sent (ignored).
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// A text, a one-element list of texts, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

/// The legacy API's default answer length.
const DEFAULT_MAX_TOKENS: i64 = 16;
const MAX_LOGPROBS: i64 = 5;

pub async fn handle(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let app = models.get(&req.model).await?;
    app.limits.stop("stop", Stop::count(&req.stop))?;
    app.limits.choices(req.n)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_param(
            "suffix",
            "suffix (insertion) is not supported",
        ));
    }
    let logprobs = match req.logprobs {
        None => None,
        Some(n) if (0..=MAX_LOGPROBS).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::bad_param(
                "logprobs",
                format!("logprobs must be in [0, {MAX_LOGPROBS}], got {n}"),
            ))
        }
    };
    let sampling =
        from_fields::<Sampling>(req.rest)?.to_params(&app.limits, app.model.vocab_size(), 2.0)?;
    let limit = Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    app.limits.max_tokens("max_tokens", limit)?;
    max_tokens("max_tokens", limit, 0, app.model.ctx)?;
    let (prompt, echo_text) = match req.prompt {
        Prompt::Text(t) => (app.tokenize_text(t.clone()).await?, t),
        Prompt::Texts(mut ts) if ts.len() == 1 => {
            let t = ts.remove(0);
            (app.tokenize_text(t.clone()).await?, t)
        }
        Prompt::Texts(_) => {
            return Err(ApiError::bad_param("prompt", "give one prompt per request"))
        }
        Prompt::Ids(ids) => {
            let text = app.model.text_of(&ids);
            (app.model.id_prompt(ids)?, text)
        }
    };
    let stop = Stop::into_vec(req.stop);
    let params = GenerateParams {
        sampling,
        max_tokens: max_tokens("max_tokens", limit, prompt.len(), app.model.ctx)?,
        stop,
        logprobs,
        ..GenerateParams::default()
    };
    let choices = choices(&app.limits, req.n, params)?;
    let n = choices.len();
    let format = structured::format_spec(req.response_format.as_ref(), "response_format", true)?;
    let spec = structured::llama_fields(format, req.json_schema, req.grammar.as_ref())?;
    let constraint = structured::compile(&app, spec, "response_format").await?;
    let rx = app.submit(Job {
        prompt,
        choices,
        constraint,
        thinking: None,
    })?;
    let reply = Reply {
        app: app.clone(),
        id: new_id("cmpl-"),
        created: unix_seconds(),
        echo: req.echo.unwrap_or(false).then_some(echo_text),
        logprobs: logprobs.is_some(),
    };
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return Ok(stream::sse(
            rx,
            Translator::new(n, None, false),
            CompletionStream {
                reply,
                n,
                include_usage,
            },
        ));
    }
    let choices = stream::collect(rx, Translator::new(n, None, false)).await?;
    Ok(Json(reply.body(&choices)).into_response())
}

struct Reply {
    app: Arc<App>,
    id: String,
    created: u64,
    /// The prompt's text, when the answer repeats it.
    echo: Option<String>,
    logprobs: bool,
}

impl Reply {
    fn body(&self, choices: &[stream::Choice]) -> Value {
        let finishes: Vec<&Finish> = choices.iter().map(|c| &c.finish).collect();
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let text = format!("{}{}", self.echo.as_deref().unwrap_or(""), c.text);
                let lps: Vec<_> = c
                    .tokens
                    .iter()
                    .copied()
                    .zip(c.logprobs.iter().cloned())
                    .collect();
                json!({
                    "index": i,
                    "text": text,
                    "logprobs": self.logprobs_json(&lps),
                    "finish_reason": c.finish.reason.openai(),
                })
            })
            .collect();
        let (id, model) = (&self.id, &self.app.model.id);
        whole_reply(
            "text_completion",
            id,
            self.created,
            model,
            choices.into(),
            &finishes,
        )
    }

    /// The legacy logprobs object: tokens, their logprobs, and the alternatives as maps.
    fn logprobs_json(&self, tokens: &[(u32, TokenLogprob)]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let model = &self.app.model;
        let mut offset = self.echo.as_ref().map_or(0, String::len);
        let mut text_offset = Vec::new();
        let pieces: Vec<String> = tokens
            .iter()
            .map(|(id, _)| {
                let piece = model.piece(*id).0;
                text_offset.push(offset);
                offset += piece.len();
                piece
            })
            .collect();
        let top: Vec<Value> = tokens
            .iter()
            .map(|(_, lp)| {
                let map: serde_json::Map<String, Value> = lp
                    .top
                    .iter()
                    .map(|&(t, l)| (model.piece(t).0, json!(l)))
                    .collect();
                Value::Object(map)
            })
            .collect();
        json!({
            "tokens": pieces,
            "token_logprobs": tokens.iter().map(|(_, lp)| lp.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": text_offset,
        })
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let (id, model) = (&self.id, &self.app.model.id);
        envelope("text_completion", id, self.created, model, choices, usage)
    }
}

struct CompletionStream {
    reply: Reply,
    n: usize,
    include_usage: bool,
}

impl CompletionStream {
    fn chunk(
        &self,
        choice: usize,
        text: String,
        logprobs: &[(u32, TokenLogprob)],
        finish: Option<&'static str>,
    ) -> Event {
        let value = self.reply.chunk(
            json!([{
                "index": choice,
                "text": text,
                "logprobs": self.reply.logprobs_json(logprobs),
                "finish_reason": finish,
            }]),
            self.include_usage.then_some(Value::Null),
        );
        json_event(&value)
    }
}

impl Emit for CompletionStream {
    fn opening(&mut self) -> Vec<Event> {
        let Some(echo) = self.reply.echo.clone() else {
            return Vec::new();
        };
        (0..self.n)
            .map(|i| self.chunk(i, echo.clone(), &[], None))
            .collect()
    }

    fn piece(&mut self, piece: Piece) -> Vec<Event> {
        match piece {
            // No chat template, no thought: a continuation is all text.
            Piece::Reasoning { .. } => Vec::new(),
            Piece::Text {
                choice,
                text,
                logprobs,
            } => vec![self.chunk(choice, text, &logprobs, None)],
            Piece::Finish {
                choice,
                whole,
                logprobs,
            } => vec![self.chunk(
                choice,
                String::new(),
                &logprobs,
                Some(whole.finish.reason.openai()),
            )],
            Piece::Done { finishes } => {
                let usage_chunk = self
                    .include_usage
                    .then(|| self.reply.chunk(json!([]), None));
                stream_end(usage_chunk, &finishes)
            }
            Piece::Failed(message) => vec![json_event(&ApiError::internal(message).body())],
        }
    }
}
