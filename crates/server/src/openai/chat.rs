//! `POST /v1/chat/completions`.

use std::sync::Arc;

use anelm_engine::{Finish, GenerateParams, Message, TokenLogprob};
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{chat_logprobs, envelope, stream_end, whole_reply, StreamOptions};
use crate::app::App;
use crate::error::ApiError;
use crate::extract::{from_fields, JsonBody};
use crate::ids::{new_id, unix_seconds};
use crate::models::Models;
use crate::params::{choices, max_tokens, Sampling, Stop};
use crate::reasoning;
use crate::scheduler::Job;
use crate::stream::{self, json_event, Emit, Piece, Translator};
use crate::structured::{self, ToolChoice};
use crate::template_kwargs::{self, Reasoning};
use crate::tools::{self, ToolCall};

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n: Option<i64>,
    stop: Option<Stop>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    response_format: Option<Value>,
    /// llama-server's: a schema the reply must follow (as `response_format` json_schema).
    json_schema: Option<Value>,
    grammar: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    /// Chat-template variables (llama-server's field).
    chat_template_kwargs: Option<Value>,
    /// Mapped to the template's `enable_thinking` / `reasoning_effort`.
    reasoning_effort: Option<String>,
    /// The most tokens of thought before the thought is closed ([`crate::reasoning::Budget`]).
    max_thinking_tokens: Option<i64>,
    /// The sampling fields, and whatever else the client sent (ignored).
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// The most alternatives per token OpenAI allows.
const MAX_TOP_LOGPROBS: i64 = 20;

pub async fn handle(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let app = models.get(&req.model).await?;
    let limits = &app.limits;
    limits.stop("stop", Stop::count(&req.stop))?;
    limits.tools(req.tools.as_ref().map_or(0, Vec::len))?;
    limits.choices(req.n)?;
    let messages = req
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| m.into_message(i))
        .collect::<Result<Vec<_>, _>>()?;
    if messages.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "messages must not be empty",
        ));
    }
    results_answer_calls(&messages)?;
    let format = structured::format_spec(req.response_format.as_ref(), "response_format", true)?;
    let format = structured::llama_fields(format, req.json_schema, req.grammar.as_ref())?;
    let choice = ToolChoice::parse(req.tool_choice.as_ref())?;
    let tools = choice.offered(&app, req.tools.unwrap_or_default())?;
    let declared = tools.as_deref().map(tools::declared_names);
    let forced = match &tools {
        Some(t) => choice.forced(&app, t, req.parallel_tool_calls.unwrap_or(true))?,
        None => None,
    };
    if forced.is_some() && format.is_some() {
        return Err(ApiError::bad_param(
            "response_format",
            "a forced tool call and a response format cannot both hold the reply",
        ));
    }
    let (spec, param) = match (forced, format, &tools) {
        (Some(f), _, _) => (Some(f), "tools"),
        (None, Some(f), _) => (Some(f), "response_format"),
        (None, None, Some(t)) => (
            choice.strict_auto(&app, t, req.parallel_tool_calls.unwrap_or(true))?,
            "tools",
        ),
        (None, None, None) => (None, "response_format"),
    };
    let constraint = structured::compile(&app, spec, param).await?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        (false, None) => None,
        (true, None) => Some(0),
        (true, Some(n)) if (0..=MAX_TOP_LOGPROBS).contains(&n) => Some(n as usize),
        (true, Some(n)) => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {n}"),
            ))
        }
    };
    let sampling =
        from_fields::<Sampling>(req.rest)?.to_params(limits, app.model.vocab_size(), 2.0)?;
    let (limit_name, limit) = match req.max_completion_tokens {
        Some(n) => ("max_completion_tokens", Some(n)),
        None => ("max_tokens", req.max_tokens),
    };
    // Check the limit before the (possibly long) tokenizing; its bound needs the prompt.
    limits.max_tokens(limit_name, limit)?;
    max_tokens(limit_name, limit, 0, app.model.ctx)?;
    let thinking_budget = reasoning::budget("max_thinking_tokens", req.max_thinking_tokens)?;
    let kwargs = template_kwargs::for_request(
        &app.model,
        req.chat_template_kwargs,
        Reasoning::from_effort(req.reasoning_effort),
    )?;
    let prompt = app
        .tokenize(move |m| m.chat_prompt(&messages, tools, None, kwargs))
        .await?;
    let stop = Stop::into_vec(req.stop);
    let params = GenerateParams {
        sampling,
        max_tokens: max_tokens(limit_name, limit, prompt.len(), app.model.ctx)?,
        stop: stop.clone(),
        logprobs,
        ..GenerateParams::default()
    };
    let choices = choices(&app.limits, req.n, params)?;
    let n = choices.len();
    let splitter = app.model.splitter(&prompt);
    let thinking = app
        .model
        .thinking_budget(splitter.as_ref(), thinking_budget);
    let translator = Translator::new(n, splitter, declared.is_some());
    let rx = app.submit(Job {
        prompt,
        choices,
        constraint,
        thinking,
    })?;
    let reply = Reply {
        app: app.clone(),
        id: new_id("chatcmpl-"),
        created: unix_seconds(),
        declared,
        logprobs: logprobs.is_some(),
    };
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return Ok(stream::sse(
            rx,
            translator,
            ChatStream::new(reply, n, include_usage),
        ));
    }
    let choices = stream::collect(rx, translator).await?;
    Ok(Json(reply.body(&choices)).into_response())
}

impl ChatMessage {
    fn into_message(self, i: usize) -> Result<Message, ApiError> {
        let field = |f: &str| format!("messages[{i}].{f}");
        let role = match self.role.as_str() {
            "system" | "developer" => "system",
            "user" | "assistant" | "tool" => self.role.as_str(),
            other => {
                return Err(ApiError::bad_param(
                    &field("role"),
                    format!("unknown role '{other}' (system, developer, user, assistant, tool)"),
                ))
            }
        };
        let content = match self.content {
            Some(Content::Text(t)) => Value::String(t),
            Some(Content::Parts(parts)) => Value::String(text_of_parts(parts, &field("content"))?),
            None if role == "assistant" && self.tool_calls.is_some() => Value::Null,
            None => return Err(ApiError::bad_param(&field("content"), "content is missing")),
        };
        let mut message = Message {
            role: role.to_string(),
            content,
            extra: serde_json::Map::new(),
        };
        if let Some(name) = self.name {
            message.extra.insert("name".into(), name.into());
        }
        if let Some(id) = self.tool_call_id {
            message.extra.insert("tool_call_id".into(), id.into());
        }
        if let Some(calls) = self.tool_calls {
            let calls = calls.into_iter().map(arguments_as_object).collect();
            message
                .extra
                .insert("tool_calls".into(), Value::Array(calls));
        }
        Ok(message)
    }
}

/// Every tool result (`role: tool` with a `tool_call_id`) must answer a call an earlier
/// assistant message made.
fn results_answer_calls(messages: &[Message]) -> Result<(), ApiError> {
    let mut made: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(calls) = m.extra.get("tool_calls").and_then(Value::as_array) {
            made.extend(
                calls
                    .iter()
                    .filter_map(|c| c.get("id").and_then(Value::as_str)),
            );
        }
        let Some(id) = m.extra.get("tool_call_id").and_then(Value::as_str) else {
            continue;
        };
        if m.role == "tool" && !made.contains(&id) {
            return Err(ApiError::bad_param(
                &format!("messages[{i}].tool_call_id"),
                format!("a tool result for '{id}', which no earlier assistant message called"),
            ));
        }
    }
    Ok(())
}

fn text_of_parts(parts: Vec<Part>, field: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.into_iter().enumerate() {
        match (part.kind.as_str(), part.text) {
            ("text", Some(t)) => text += &t,
            (kind, _) => {
                return Err(ApiError::bad_param(
                    &format!("{field}[{j}]"),
                    format!("only text content parts are supported, got '{kind}'"),
                ))
            }
        }
    }
    Ok(text)
}

/// OpenAI sends a call's arguments as JSON text; chat templates (as transformers documents
/// them) expect an object.
fn arguments_as_object(mut call: Value) -> Value {
    if let Some(args) = call.pointer_mut("/function/arguments") {
        if let Some(parsed) = args
            .as_str()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
        {
            *args = parsed;
        }
    }
    call
}

/// What every chat response shares.
struct Reply {
    app: Arc<App>,
    id: String,
    created: u64,
    /// The declared tool names, when the reply may call tools.
    declared: Option<Vec<String>>,
    logprobs: bool,
}

impl Reply {
    fn body(&self, choices: &[stream::Choice]) -> Value {
        let finishes: Vec<&Finish> = choices.iter().map(|c| &c.finish).collect();
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (content, calls) = self.split_calls(&c.text);
                let mut message = json!({"role": "assistant", "content": content});
                if !c.reasoning.is_empty() {
                    message["reasoning_content"] = c.reasoning.clone().into();
                }
                if !calls.is_empty() {
                    message["tool_calls"] = tool_calls_json(&calls);
                }
                json!({
                    "index": i,
                    "message": message,
                    "logprobs": self.logprobs_json(&c.tokens, &c.logprobs),
                    "finish_reason": finish_reason(&c.finish, &calls),
                })
            })
            .collect();
        let (id, model) = (&self.id, &self.app.model.id);
        whole_reply(
            "chat.completion",
            id,
            self.created,
            model,
            choices.into(),
            &finishes,
        )
    }

    /// The reply's text and tool calls (none when the request declared no tools).
    fn split_calls(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        match &self.declared {
            Some(names) => tools::parse(text, names),
            None => (Some(text.to_string()), Vec::new()),
        }
    }

    fn logprobs_json(&self, tokens: &[u32], logprobs: &[TokenLogprob]) -> Value {
        if self.logprobs {
            json!({"content": chat_logprobs(&self.app.model, tokens, logprobs)})
        } else {
            Value::Null
        }
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let (id, model) = (&self.id, &self.app.model.id);
        envelope(
            "chat.completion.chunk",
            id,
            self.created,
            model,
            choices,
            usage,
        )
    }
}

fn finish_reason(finish: &Finish, calls: &[ToolCall]) -> &'static str {
    if calls.is_empty() {
        finish.reason.openai()
    } else {
        "tool_calls"
    }
}

fn tool_calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "index": i,
                "id": new_id("call_"),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect()
}

/// Streaming: a role chunk per choice, a chunk per piece of thought (`reasoning_content`) and
/// of text (with the logprobs of the tokens behind it), a finish chunk per choice, the usage
/// chunk when asked, then `[DONE]`. With tools declared, each choice's text is held back to its
/// end, where it becomes either text or tool calls.
struct ChatStream {
    reply: Reply,
    n: usize,
    /// `usage: null` on every chunk and a last chunk with the usage.
    include_usage: bool,
}

impl ChatStream {
    fn new(reply: Reply, n: usize, include_usage: bool) -> ChatStream {
        ChatStream {
            reply,
            n,
            include_usage,
        }
    }

    fn chunk(&self, choice: Value) -> Event {
        json_event(
            &self
                .reply
                .chunk(json!([choice]), self.include_usage.then_some(Value::Null)),
        )
    }

    fn logprobs(&self, pending: Vec<(u32, TokenLogprob)>) -> Value {
        if !self.reply.logprobs {
            return Value::Null;
        }
        let (ids, lps): (Vec<u32>, Vec<TokenLogprob>) = pending.into_iter().unzip();
        self.reply.logprobs_json(&ids, &lps)
    }
}

impl Emit for ChatStream {
    fn opening(&mut self) -> Vec<Event> {
        (0..self.n)
            .map(|i| {
                self.chunk(json!({
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                }))
            })
            .collect()
    }

    fn piece(&mut self, piece: Piece) -> Vec<Event> {
        match piece {
            Piece::Reasoning { choice, text } => vec![self.chunk(json!({
                "index": choice,
                "delta": {"reasoning_content": text},
                "logprobs": null,
                "finish_reason": null,
            }))],
            Piece::Text {
                choice,
                text,
                logprobs,
            } => vec![self.chunk(json!({
                "index": choice,
                "delta": {"content": text},
                "logprobs": self.logprobs(logprobs),
                "finish_reason": null,
            }))],
            Piece::Finish {
                choice,
                whole,
                logprobs,
            } => {
                let (content, calls) = self.reply.split_calls(&whole.text);
                let mut delta = json!({});
                if self.reply.declared.is_some() {
                    delta["content"] = content.into();
                    if !calls.is_empty() {
                        delta["tool_calls"] = tool_calls_json(&calls);
                    }
                }
                vec![self.chunk(json!({
                    "index": choice,
                    "delta": delta,
                    "logprobs": self.logprobs(logprobs),
                    "finish_reason": finish_reason(&whole.finish, &calls),
                }))]
            }
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
