//! OpenAI's Responses API: `POST /v1/responses` (streaming and not), `GET` and `DELETE
//! /v1/responses/{id}`. A response continues an earlier one by `previous_response_id`, from
//! the responses the server keeps ([`super::responses_store`]); its output is a reasoning item
//! (when the model thinks), a message and function calls.

use std::sync::Arc;

use anelm_engine::{FinishReason, GenerateParams, Message};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::responses_input;
use super::responses_store::Stored;
use super::responses_stream::ResponseStream;
use crate::app::App;
use crate::error::ApiError;
use crate::extract::{from_fields, JsonBody};
use crate::ids::{new_id, unix_seconds};
use crate::models::Models;
use crate::params::{max_tokens, Sampling};
use crate::reasoning;
use crate::scheduler::Job;
use crate::stream::{self, Choice, Translator};
use crate::structured::{self, ToolChoice};
use crate::template_kwargs::{self, Reasoning};
use crate::tools;

#[derive(Debug, Deserialize)]
pub struct CreateRequest {
    model: String,
    input: Value,
    instructions: Option<String>,
    previous_response_id: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<i64>,
    /// anelm's thinking budget (as on chat completions).
    max_thinking_tokens: Option<i64>,
    store: Option<bool>,
    stream: Option<bool>,
    reasoning: Option<ReasoningConfig>,
    text: Option<TextConfig>,
    metadata: Option<Value>,
    chat_template_kwargs: Option<Value>,
    /// The sampling fields (`temperature`, `top_p`, llama.cpp's extras), and whatever else
    /// the client sent (ignored).
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct ReasoningConfig {
    effort: Option<String>,
}

#[derive(Debug, Deserialize)]
struct TextConfig {
    format: Option<Value>,
}

/// `POST /v1/responses`.
pub async fn create(
    State(models): State<Arc<Models>>,
    JsonBody(req): JsonBody<CreateRequest>,
) -> Result<Response, ApiError> {
    let app = models.get(&req.model).await?;
    let limits = &app.limits;
    limits.tools(req.tools.as_ref().map_or(0, Vec::len))?;
    let previous = match &req.previous_response_id {
        None => Vec::new(),
        Some(id) => app
            .responses
            .get(id)
            .ok_or_else(|| ApiError {
                code: Some("previous_response_not_found"),
                ..ApiError::bad_param(
                    "previous_response_id",
                    format!(
                        "Previous response with id '{id}' not found (this server keeps its last {} stored responses)",
                        super::responses_store::KEPT
                    ),
                )
            })?
            .conversation,
    };
    let mut conversation = previous.clone();
    conversation.extend(responses_input::messages(req.input, &previous)?);
    let given_tools = req.tools.clone().unwrap_or_default();
    let choice = ToolChoice::parse(req.tool_choice.as_ref())?;
    let chat_tools = responses_input::tools(&given_tools)?;
    let tools = choice.offered(&app, chat_tools)?;
    let declared = tools.as_deref().map(tools::declared_names);
    let text_format = req
        .text
        .as_ref()
        .and_then(|t| t.format.clone())
        .unwrap_or_else(|| json!({"type": "text"}));
    let format = structured::format_spec(
        req.text.as_ref().and_then(|t| t.format.as_ref()),
        "text.format",
        false,
    )?;
    let forced = match &tools {
        Some(t) => choice.forced(&app, t, req.parallel_tool_calls.unwrap_or(true))?,
        None => None,
    };
    if forced.is_some() && format.is_some() {
        return Err(ApiError::bad_param(
            "text.format",
            "a forced tool call and a text format cannot both hold the reply",
        ));
    }
    let (spec, param) = match (forced, format, &tools) {
        (Some(f), _, _) => (Some(f), "tools"),
        (None, Some(f), _) => (Some(f), "text.format"),
        (None, None, Some(t)) => (
            choice.strict_auto(&app, t, req.parallel_tool_calls.unwrap_or(true))?,
            "tools",
        ),
        (None, None, None) => (None, "text.format"),
    };
    let constraint = structured::compile(&app, spec, param).await?;
    let sampling_fields = from_fields::<Sampling>(req.rest)?;
    let sampling = sampling_fields.to_params(limits, app.model.vocab_size(), 2.0)?;
    limits.max_tokens("max_output_tokens", req.max_output_tokens)?;
    max_tokens("max_output_tokens", req.max_output_tokens, 0, app.model.ctx)?;
    let thinking_budget = reasoning::budget("max_thinking_tokens", req.max_thinking_tokens)?;
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    let kwargs = template_kwargs::for_request(
        &app.model,
        req.chat_template_kwargs,
        Reasoning::from_effort(effort.clone()),
    )?;
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instructions) = &req.instructions {
        messages.push(Message::system(instructions));
    }
    messages.extend(conversation.iter().cloned());
    let prompt = app
        .tokenize(move |m| m.chat_prompt(&messages, tools, None, kwargs))
        .await?;
    let params = GenerateParams {
        sampling,
        max_tokens: max_tokens(
            "max_output_tokens",
            req.max_output_tokens,
            prompt.len(),
            app.model.ctx,
        )?,
        ..GenerateParams::default()
    };
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
    let turn = Turn {
        app: app.clone(),
        id: new_id("resp_"),
        created_at: unix_seconds(),
        echo: json!({
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": effort, "summary": null},
            "store": req.store.unwrap_or(true),
            "temperature": sampling_fields.temperature.unwrap_or(1.0),
            "top_p": sampling_fields.top_p.unwrap_or(1.0),
            "text": {"format": text_format},
            "tool_choice": req.tool_choice.unwrap_or_else(|| json!("auto")),
            "tools": given_tools,
            "metadata": req.metadata.unwrap_or_else(|| json!({})),
        }),
        conversation,
        declared,
        store: req.store.unwrap_or(true),
        reasoning_id: new_id("rs_"),
        message_id: new_id("msg_"),
    };
    if req.stream.unwrap_or(false) {
        return Ok(stream::sse(rx, translator, ResponseStream::new(turn)));
    }
    let mut choices = stream::collect(rx, translator).await?;
    let choice = choices.remove(0);
    let output = turn.output(&choice);
    Ok(Json(turn.finish(&choice, output)).into_response())
}

/// `GET /v1/responses/{id}`.
pub async fn retrieve(
    State(models): State<Arc<Models>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    (models.shared.responses)
        .get(&id)
        .map(|s| Json(s.response))
        .ok_or_else(|| not_found(&id))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(models): State<Arc<Models>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if models.shared.responses.remove(&id) {
        Ok(Json(
            json!({"id": id, "object": "response", "deleted": true}),
        ))
    } else {
        Err(not_found(&id))
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Response with id '{id}' not found."),
    )
}

/// One response in the making: what it echoes of the request, its conversation, the ids of
/// its items.
pub struct Turn {
    pub app: Arc<App>,
    pub id: String,
    created_at: u64,
    /// The request's settings, as the response object repeats them.
    echo: Value,
    conversation: Vec<Message>,
    /// The declared function names, when the reply may call them.
    pub declared: Option<Vec<String>>,
    store: bool,
    pub reasoning_id: String,
    pub message_id: String,
}

impl Turn {
    /// The response object: `output` and `usage` as given.
    pub fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "model": self.app.model.id,
            "output": output,
            "parallel_tool_calls": true,
            "truncation": "disabled",
            "usage": usage,
        });
        for (k, v) in self.echo.as_object().into_iter().flatten() {
            r[k] = v.clone();
        }
        r
    }

    /// The output items of a finished reply: its thought, its message, its calls.
    pub fn output(&self, c: &Choice) -> Vec<Value> {
        let mut items = Vec::new();
        if !c.reasoning.is_empty() {
            items.push(json!({
                "id": self.reasoning_id,
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": c.reasoning}],
                "status": "completed",
            }));
        }
        let (text, calls) = match &self.declared {
            Some(names) => tools::parse(&c.text, names),
            None => (Some(c.text.clone()), Vec::new()),
        };
        if text.is_some() || calls.is_empty() {
            items.push(json!({
                "id": self.message_id,
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text.unwrap_or_default(), "annotations": [], "logprobs": []}],
            }));
        }
        for call in calls {
            items.push(json!({
                "id": new_id("fc_"),
                "type": "function_call",
                "call_id": new_id("call_"),
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }));
        }
        items
    }

    /// The finished response: stored (when asked) with its conversation, and returned.
    pub fn finish(&self, c: &Choice, output: Vec<Value>) -> Value {
        let u = &c.finish.usage;
        let usage = json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": c.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        });
        let incomplete = matches!(
            c.finish.reason,
            FinishReason::Length | FinishReason::ContextFull
        );
        let status = if incomplete {
            "incomplete"
        } else {
            "completed"
        };
        let mut response = self.response(status, output.clone(), usage);
        if incomplete {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        if self.store {
            let mut conversation = self.conversation.clone();
            conversation.push(reply_message(c, &output));
            self.app.responses.put(
                self.id.clone(),
                Stored {
                    response: response.clone(),
                    conversation,
                },
            );
        }
        response
    }
}

/// The reply as the assistant message of the conversation that continues it.
fn reply_message(c: &Choice, output: &[Value]) -> Message {
    let text: String = output
        .iter()
        .filter(|i| i["type"] == "message")
        .filter_map(|i| i.pointer("/content/0/text").and_then(Value::as_str))
        .collect();
    let calls: Vec<Value> = output
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(|i| {
            let args = i["arguments"].as_str().unwrap_or("{}");
            let args = serde_json::from_str::<Value>(args).unwrap_or_else(|_| args.into());
            json!({"id": i["call_id"], "type": "function",
                   "function": {"name": i["name"], "arguments": args}})
        })
        .collect();
    let mut m = Message::assistant(&text);
    if !calls.is_empty() {
        if text.is_empty() {
            m.content = Value::Null;
        }
        m.extra.insert("tool_calls".into(), Value::Array(calls));
    }
    if !c.reasoning.is_empty() {
        m.extra
            .insert("reasoning_content".into(), c.reasoning.clone().into());
    }
    m
}
