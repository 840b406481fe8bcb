//! Anthropic's tools in the chat shape templates know: `tools[].input_schema` becomes a
//! function's `parameters`; an assistant's `tool_use` blocks become its `tool_calls`; a user's
//! `tool_result` blocks become `tool` messages (each must answer a call made earlier); a call
//! in the reply becomes a `tool_use` block.

use std::collections::HashSet;

use anelm_engine::Message;
use serde_json::{json, Map, Value};

use crate::anthropic::{Block, Content, InMessage};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::structured::ToolChoice;
use crate::tools::ToolCall;

/// `tools` in the chat shape; every tool needs a name and an object `input_schema`.
pub fn tools(tools: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let field = |f: &str| format!("tools[{i}].{f}");
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_param(&field("name"), "a tool needs a name"))?;
            let schema = match t.get("input_schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                Some(_) => {
                    return Err(ApiError::bad_param(
                        &field("input_schema"),
                        "input_schema must be a JSON Schema object",
                    ))
                }
                None => {
                    return Err(ApiError::bad_param(
                        &field("input_schema"),
                        "a tool needs an input_schema",
                    ))
                }
            };
            let mut function = json!({"name": name, "parameters": schema});
            for key in ["description", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function[key] = v.clone();
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `tool_choice` and whether several calls may come in one reply
/// (`disable_parallel_tool_use`).
pub fn choice(choice: Option<&Value>) -> Result<(ToolChoice, bool), ApiError> {
    let parallel = !choice
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((ToolChoice::parse(choice)?, parallel))
}

/// The messages, their blocks read: text, earlier thoughts (dropped, as templates drop them),
/// `tool_use` (an assistant's calls) and `tool_result` (a user's answers to them).
pub fn messages(messages: Vec<InMessage>) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    let mut calls: HashSet<String> = HashSet::new();
    for (i, m) in messages.into_iter().enumerate() {
        let field = format!("messages[{i}].content");
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::bad_param(
                &format!("messages[{i}].role"),
                format!("role must be 'user' or 'assistant', got '{}'", m.role),
            ));
        }
        let blocks = match m.content {
            Content::Text(t) => {
                out.push(Message::new(&m.role, &t));
                continue;
            }
            Content::Blocks(b) => b,
        };
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for (j, b) in blocks.into_iter().enumerate() {
            let at = format!("{field}[{j}]");
            match (m.role.as_str(), b.kind.as_str()) {
                (_, "text") => text += b.text.as_deref().unwrap_or(""),
                (_, "thinking" | "redacted_thinking") => {}
                ("assistant", "tool_use") => {
                    let call = tool_use_in(&b, &at)?;
                    calls.insert(call["id"].as_str().unwrap_or("").to_string());
                    tool_calls.push(call);
                }
                ("user", "tool_result") => {
                    let id = b
                        .rest
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            ApiError::bad_param(
                                &format!("{at}.tool_use_id"),
                                "tool_use_id is missing",
                            )
                        })?;
                    if !calls.contains(id) {
                        return Err(ApiError::bad_param(
                            &format!("{at}.tool_use_id"),
                            format!("tool_result for '{id}', which no earlier tool_use made"),
                        ));
                    }
                    let mut result = Message::new("tool", &result_text(&b, &at)?);
                    result.extra.insert("tool_call_id".into(), id.into());
                    out.push(result);
                }
                (role, kind) => {
                    return Err(ApiError::bad_param(
                        &at,
                        format!("a {role} message cannot hold a '{kind}' block"),
                    ))
                }
            }
        }
        if !tool_calls.is_empty() {
            let mut msg = Message::new("assistant", &text);
            if text.is_empty() {
                msg.content = Value::Null;
            }
            msg.extra
                .insert("tool_calls".into(), Value::Array(tool_calls));
            out.push(msg);
        } else if !text.is_empty()
            || m.role == "assistant"
            || out.last().is_none_or(|l| l.role != "tool")
        {
            out.push(Message::new(&m.role, &text));
        }
    }
    Ok(out)
}

/// A `tool_use` block as a chat call (the input as an object, as templates expect).
fn tool_use_in(b: &Block, at: &str) -> Result<Value, ApiError> {
    let id =
        b.rest.get("id").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_param(&format!("{at}.id"), "a tool_use block needs an id")
        })?;
    let name = b.rest.get("name").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_param(&format!("{at}.name"), "a tool_use block needs a name")
    })?;
    let input = b.rest.get("input").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
}

/// A `tool_result`'s content: a string or text blocks; `is_error` says so in the text.
fn result_text(b: &Block, at: &str) -> Result<String, ApiError> {
    let text = match b.rest.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (k, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text += t,
                    _ => {
                        return Err(ApiError::bad_param(
                            &format!("{at}.content[{k}]"),
                            "only text parts are supported in a tool_result",
                        ))
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                &format!("{at}.content"),
                "content must be a string or a list of text blocks",
            ))
        }
    };
    let failed = b
        .rest
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(if failed {
        format!("Error: {text}")
    } else {
        text
    })
}

/// A call in the reply as a `tool_use` block.
pub fn tool_use(call: &ToolCall) -> Value {
    let input = serde_json::from_str::<Value>(&call.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::Object(Map::new()));
    json!({"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": input})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Vec<InMessage> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn calls_and_results_become_chat_messages() {
        let m = messages(parse(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ])))
        .unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        assert_eq!(m[1].text(), "Checking.");
        assert_eq!(
            m[1].extra["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(
            (m[2].text(), &m[2].extra["tool_call_id"]),
            ("Sunny".into(), &json!("toolu_1"))
        );
        assert_eq!(m[3].text(), "And tomorrow?");
    }

    #[test]
    fn a_result_for_an_unknown_call_is_refused() {
        let e = messages(parse(json!([
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]},
        ])))
        .unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("messages[0].content[0].tool_use_id")
        );
    }

    #[test]
    fn tools_need_names_and_object_schemas() {
        let t = tools(vec![
            json!({"name": "f", "description": "d", "input_schema": {"type": "object"}}),
        ])
        .unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}})
        );
        assert!(tools(vec![json!({"name": "f"})]).is_err());
        assert!(tools(vec![json!({"name": "f", "input_schema": "x"})]).is_err());
        assert!(tools(vec![json!({"input_schema": {}})]).is_err());
    }
}
