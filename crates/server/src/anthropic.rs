//! The Anthropic API: `POST /v1/messages` (streaming and not) and
//! `POST /v1/messages/count_tokens`. Errors take Anthropic's shape. Tools as Anthropic sends
//! them (`input_schema`, `tool_use` / `tool_result` blocks) are read into the chat shape the
//! template knows ([`crate::anthropic_tools`]); calls come back as `tool_use` blocks.

use std::sync::Arc;

use anelm_engine::{Finish, FinishReason, GenerateParams, Message};
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::anthropic_tools;
use crate::app::App;
use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::ids::new_id;
use crate::models::Models;
use crate::params::{max_tokens, Sampling};
use crate::reasoning;
use crate::scheduler::Job;
use crate::stream::{self, Emit, Piece, Translator};
use crate::structured;
use crate::template_kwargs::{self, Reasoning};
use crate::tools::{self, ToolCall};

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    model: String,
    max_tokens: i64,
    messages: Vec<InMessage>,
    system: Option<Content>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    /// Chat-template variables (llama-server's field).
    chat_template_kwargs: Option<Value>,
    /// Mapped to the template's `enable_thinking`.
    thinking: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct CountRequest {
    model: String,
    messages: Vec<InMessage>,
    system: Option<Content>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    chat_template_kwargs: Option<Value>,
    thinking: Option<Value>,
}

/// What both routes read: the messages, the system prompt, the tools, the template variables.
struct Conversation {
    messages: Vec<InMessage>,
    system: Option<Content>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    chat_template_kwargs: Option<Value>,
    thinking: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct InMessage {
    pub role: String,
    pub content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// The rest of a `tool_use` / `tool_result` block.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

impl Content {
    pub(crate) fn text(self, field: &str) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t),
            Content::Blocks(blocks) => {
                let mut text = String::new();
                for (j, b) in blocks.into_iter().enumerate() {
                    match (b.kind.as_str(), b.text) {
                        ("text", Some(t)) => text += &t,
                        // An earlier reply's thought, sent back as clients keep it: templates
                        // drop past thoughts, and so does the prompt.
                        ("thinking" | "redacted_thinking", _) => {}
                        (kind, _) => {
                            return Err(ApiError::bad_param(
                                &format!("{field}[{j}]"),
                                format!("only text content blocks are supported, got '{kind}'"),
                            ))
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}

/// A conversation ready to generate: its prompt, the declared tool names (when the reply may
/// call them) and the forced call's grammar.
struct Prepared {
    prompt: Vec<u32>,
    declared: Option<Vec<String>>,
    forced: Option<anelm_constrain::Spec>,
}

impl Conversation {
    /// The prompt's tokens. A last assistant message is the start of the reply (prefill).
    async fn prompt(self, app: &App) -> Result<Prepared, ApiError> {
        app.limits.tools(self.tools.as_ref().map_or(0, Vec::len))?;
        if self.messages.is_empty() {
            return Err(ApiError::bad_param(
                "messages",
                "messages must not be empty",
            ));
        }
        let (choice, parallel) = anthropic_tools::choice(self.tool_choice.as_ref())?;
        let tools = anthropic_tools::tools(self.tools.unwrap_or_default())?;
        let tools = choice.offered(app, tools)?;
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = self.system {
            messages.push(Message::system(&system.text("system")?));
        }
        messages.extend(anthropic_tools::messages(self.messages)?);
        let prefill = match messages.last() {
            Some(m) if m.role == "assistant" && !m.extra.contains_key("tool_calls") => {
                messages.pop().map(|m| m.text())
            }
            _ => None,
        };
        let forced = match &tools {
            Some(t) => choice.forced(app, t, parallel)?,
            None => None,
        };
        // Strict tools under `auto` hold the calls, not the text (not after a prefill, whose
        // text the grammar has not seen).
        let forced = match (forced, &tools, &prefill) {
            (None, Some(t), None) => choice.strict_auto(app, t, parallel)?,
            (f, _, _) => f,
        };
        if forced.is_some() && prefill.is_some() {
            return Err(ApiError::bad_param(
                "messages",
                "a forced tool call cannot follow a prefilled assistant turn",
            ));
        }
        let declared = tools.as_deref().map(tools::declared_names);
        let kwargs = template_kwargs::for_request(
            &app.model,
            self.chat_template_kwargs,
            Reasoning::from_anthropic(self.thinking)?,
        )?;
        let prompt = app
            .tokenize(move |m| m.chat_prompt(&messages, tools, prefill.as_deref(), kwargs))
            .await?;
        Ok(Prepared {
            prompt,
            declared,
            forced,
        })
    }
}

/// `POST /v1/messages/count_tokens`.
pub async fn count_tokens(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<CountRequest>,
) -> Result<Json<Value>, ApiError> {
    let count = async {
        let app = models.get(&req.model).await?;
        let conversation = Conversation {
            messages: req.messages,
            system: req.system,
            tools: req.tools,
            tool_choice: req.tool_choice,
            chat_template_kwargs: req.chat_template_kwargs,
            thinking: req.thinking,
        };
        conversation.prompt(&app).await
    };
    let prepared = count.await.map_err(ApiError::anthropic)?;
    Ok(Json(json!({"input_tokens": prepared.prompt.len()})))
}

/// `POST /v1/messages`.
pub async fn messages(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, ApiError> {
    respond(models, req).await.map_err(ApiError::anthropic)
}

async fn respond(models: Arc<Models>, req: MessagesRequest) -> Result<Response, ApiError> {
    let app = models.get(&req.model).await?;
    let stop_count = req.stop_sequences.as_ref().map_or(0, Vec::len);
    app.limits.stop("stop_sequences", stop_count)?;
    let sampling = Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        ..Sampling::default()
    }
    .to_params(&app.limits, app.model.vocab_size(), 1.0)?;
    app.limits.max_tokens("max_tokens", Some(req.max_tokens))?;
    max_tokens("max_tokens", Some(req.max_tokens), 0, app.model.ctx)?;
    let thinking_budget = reasoning::anthropic_budget(req.thinking.as_ref())?;
    let conversation = Conversation {
        messages: req.messages,
        system: req.system,
        tools: req.tools,
        tool_choice: req.tool_choice,
        chat_template_kwargs: req.chat_template_kwargs,
        thinking: req.thinking,
    };
    let Prepared {
        prompt,
        declared,
        forced,
    } = conversation.prompt(&app).await?;
    let constraint = structured::compile(&app, forced, "tools").await?;
    let stops = req.stop_sequences.unwrap_or_default();
    let params = GenerateParams {
        sampling,
        max_tokens: max_tokens(
            "max_tokens",
            Some(req.max_tokens),
            prompt.len(),
            app.model.ctx,
        )?,
        stop: stops.clone(),
        ..GenerateParams::default()
    };
    let input_tokens = prompt.len();
    let splitter = app.model.splitter(&prompt);
    let thinking = app
        .model
        .thinking_budget(splitter.as_ref(), thinking_budget);
    let translator = Translator::new(1, splitter, declared.is_some());
    let rx = app.submit(Job {
        prompt,
        choices: vec![params],
        constraint,
        thinking,
    })?;
    let reply = Reply {
        app: app.clone(),
        id: new_id("msg_"),
        stops,
        declared,
    };
    if req.stream.unwrap_or(false) {
        return Ok(stream::sse(
            rx,
            translator,
            MessageStream {
                reply,
                input_tokens,
                open: None,
                blocks: 0,
            },
        ));
    }
    let mut choices = stream::collect(rx, translator).await?;
    let c = choices.remove(0);
    let stop_sequence = reply.stop_sequence(&c.finish, &c.tokens, &c.emitted);
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}));
    }
    let (text, calls) = reply.split_calls(&c.text);
    if calls.is_empty() || text.is_some() {
        content.push(json!({"type": "text", "text": text.unwrap_or_default()}));
    }
    content.extend(calls.iter().map(anthropic_tools::tool_use));
    Ok(Json(json!({
        "id": reply.id,
        "type": "message",
        "role": "assistant",
        "model": app.model.id,
        "content": content,
        "stop_reason": stop_reason(c.finish.reason, &calls),
        "stop_sequence": stop_sequence,
        "usage": usage(&c.finish),
    }))
    .into_response())
}

struct Reply {
    app: Arc<App>,
    id: String,
    stops: Vec<String>,
    /// The declared tool names, when the reply may call tools.
    declared: Option<Vec<String>>,
}

impl Reply {
    /// The reply's text and tool calls (none when the request declared no tools).
    fn split_calls(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        match &self.declared {
            Some(names) => tools::parse(text, names),
            None => (Some(text.to_string()), Vec::new()),
        }
    }

    fn stop_sequence(&self, finish: &Finish, tokens: &[u32], text: &str) -> Option<String> {
        stream::matched_stop(&self.app.model, finish, tokens, text, &self.stops)
    }
}

fn stop_reason(reason: FinishReason, calls: &[ToolCall]) -> &'static str {
    if !calls.is_empty() {
        return "tool_use";
    }
    match reason {
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        FinishReason::StopString => "stop_sequence",
        FinishReason::Length | FinishReason::ContextFull => "max_tokens",
    }
}

fn usage(finish: &Finish) -> Value {
    json!({
        "input_tokens": finish.usage.prompt_tokens,
        "output_tokens": finish.usage.completion_tokens,
    })
}

/// Streaming, in Anthropic's order: `message_start`, then for each block (a `thinking` block
/// first when the model thinks, then the `text` block) `content_block_start` (the first one
/// followed by `ping`), its deltas and `content_block_stop`; then `message_delta`,
/// `message_stop`.
struct MessageStream {
    reply: Reply,
    input_tokens: usize,
    /// The block open now, and how many were opened.
    open: Option<Kind>,
    blocks: usize,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    /// A `tool_use` block: the call, whose input goes out as one `input_json_delta`.
    ToolUse(Value),
}

fn event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl MessageStream {
    /// The events that make `kind` the open block: the open one stopped, the new one started.
    fn enter(&mut self, kind: Kind) -> Vec<Event> {
        if self.open.as_ref() == Some(&kind) && !matches!(kind, Kind::ToolUse(_)) {
            return Vec::new();
        }
        let mut events = self.close();
        let block = match &kind {
            Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Kind::Text => json!({"type": "text", "text": ""}),
            Kind::ToolUse(block) => {
                let mut start = block.clone();
                start["input"] = json!({});
                start
            }
        };
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.blocks, "content_block": block}),
        ));
        if self.blocks == 0 {
            events.push(event("ping", json!({"type": "ping"})));
        }
        self.open = Some(kind);
        self.blocks += 1;
        events
    }

    /// The events that stop the open block, if any.
    fn close(&mut self) -> Vec<Event> {
        let Some(kind) = self.open.take() else {
            return Vec::new();
        };
        let index = self.blocks - 1;
        let mut events = Vec::new();
        if kind == Kind::Thinking {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": ""}}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        events
    }

    fn delta(&self, delta: Value) -> Event {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}),
        )
    }
}

impl Emit for MessageStream {
    fn opening(&mut self) -> Vec<Event> {
        vec![event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.reply.id,
                "type": "message",
                "role": "assistant",
                "model": self.reply.app.model.id,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
            }}),
        )]
    }

    fn piece(&mut self, piece: Piece) -> Vec<Event> {
        match piece {
            Piece::Reasoning { text, .. } => {
                let mut events = self.enter(Kind::Thinking);
                events.push(self.delta(json!({"type": "thinking_delta", "thinking": text})));
                events
            }
            Piece::Text { text, .. } => {
                let mut events = self.enter(Kind::Text);
                events.push(self.delta(json!({"type": "text_delta", "text": text})));
                events
            }
            Piece::Finish { whole, .. } => {
                let (text, calls) = self.reply.split_calls(&whole.text);
                let mut events = Vec::new();
                if self.reply.declared.is_some() {
                    // The text was held back: it comes now, before the calls.
                    if let Some(text) = text.filter(|t| !t.is_empty()) {
                        events.extend(self.enter(Kind::Text));
                        events.push(self.delta(json!({"type": "text_delta", "text": text})));
                    }
                }
                for call in &calls {
                    let block = anthropic_tools::tool_use(call);
                    let input = block["input"].to_string();
                    events.extend(self.enter(Kind::ToolUse(block)));
                    events.push(
                        self.delta(json!({"type": "input_json_delta", "partial_json": input})),
                    );
                }
                if calls.is_empty() {
                    // A reply always has its text block, empty as it may be.
                    events.extend(self.enter(Kind::Text));
                }
                events.extend(self.close());
                let finish = &whole.finish;
                let stop_sequence = self
                    .reply
                    .stop_sequence(finish, &whole.tokens, &whole.emitted);
                events.extend([
                    event(
                        "message_delta",
                        json!({"type": "message_delta",
                               "delta": {"stop_reason": stop_reason(finish.reason, &calls), "stop_sequence": stop_sequence},
                               "usage": {"output_tokens": finish.usage.completion_tokens}}),
                    ),
                    event("message_stop", json!({"type": "message_stop"})),
                ]);
                events
            }
            Piece::Done { .. } => Vec::new(),
            Piece::Failed(message) => {
                vec![event(
                    "error",
                    ApiError::internal(message).anthropic().body(),
                )]
            }
        }
    }
}
