//! The Responses API's input, as the chat template reads it: `input` as a string or a list of
//! items (messages with text parts, `function_call` and `function_call_output` items), the
//! function tools in the chat shape. Every bad item is a 400 naming it.

use anelm_engine::Message;
use serde_json::{json, Value};

use crate::error::ApiError;

/// `input`, after the conversation of `previous` (earlier calls' ids are known there), as
/// chat messages; `instructions` are not part of it (they are never carried over).
pub fn messages(input: Value, previous: &[Message]) -> Result<Vec<Message>, ApiError> {
    let items = match input {
        Value::String(text) => return Ok(vec![Message::user(&text)]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::bad_param(
                "input",
                "input must be a string or a list of items",
            ))
        }
    };
    if items.is_empty() {
        return Err(ApiError::bad_param("input", "input must not be empty"));
    }
    let mut known_calls: Vec<String> = previous.iter().flat_map(call_ids).collect();
    let mut out: Vec<Message> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let field = |f: &str| format!("input[{i}]{f}");
        let Value::Object(item) = item else {
            return Err(ApiError::bad_param(
                &field(""),
                "an input item must be an object",
            ));
        };
        let kind = match item.get("type") {
            None => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(_) => {
                return Err(ApiError::bad_param(
                    &field(".type"),
                    "type must be a string",
                ))
            }
        };
        match kind {
            "message" => out.push(message(&item, &field)?),
            "function_call" => {
                let call_id = text_field(&item, "call_id", &field)?;
                let name = text_field(&item, "name", &field)?;
                let arguments = text_field(&item, "arguments", &field)?;
                // Chat templates (as transformers documents them) expect the arguments as an
                // object.
                let arguments = serde_json::from_str::<Value>(&arguments)
                    .unwrap_or(Value::String(arguments));
                let call = json!({"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}});
                known_calls.push(call_id);
                push_call(&mut out, call);
            }
            "function_call_output" => {
                let call_id = text_field(&item, "call_id", &field)?;
                if !known_calls.contains(&call_id) {
                    return Err(ApiError::bad_param(
                        &field(".call_id"),
                        format!("no function_call with call_id '{call_id}' comes before this output"),
                    ));
                }
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_of_parts(parts, &field(".output"))?,
                    _ => {
                        return Err(ApiError::bad_param(
                            &field(".output"),
                            "output must be a string or a list of text parts",
                        ))
                    }
                };
                let mut m = Message::new("tool", &output);
                m.extra.insert("tool_call_id".into(), call_id.into());
                out.push(m);
            }
            // An earlier thought: the templates that render one read it from the message.
            "reasoning" => {}
            other => {
                return Err(ApiError::bad_param(
                    &field(".type"),
                    format!("input items of type '{other}' are not supported (message, function_call, function_call_output, reasoning)"),
                ))
            }
        }
    }
    Ok(out)
}

/// The ids of the calls an assistant message made.
fn call_ids(m: &Message) -> Vec<String> {
    m.extra
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// A call joins the assistant message just before it (one turn, as templates render it).
fn push_call(out: &mut Vec<Message>, call: Value) {
    if let Some(last) = out.last_mut().filter(|m| m.role == "assistant") {
        if let Some(Value::Array(calls)) = last.extra.get_mut("tool_calls") {
            calls.push(call);
            return;
        }
        last.extra.insert("tool_calls".into(), json!([call]));
        return;
    }
    let mut m = Message::new("assistant", "");
    m.content = Value::Null;
    m.extra.insert("tool_calls".into(), json!([call]));
    out.push(m);
}

fn message(
    item: &serde_json::Map<String, Value>,
    field: &dyn Fn(&str) -> String,
) -> Result<Message, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => "system",
        Some(r @ ("user" | "assistant")) => r,
        Some(other) => {
            return Err(ApiError::bad_param(
                &field(".role"),
                format!("unknown role '{other}' (user, assistant, system, developer)"),
            ))
        }
        None => return Err(ApiError::bad_param(&field(".role"), "role is missing")),
    };
    let text = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_of_parts(parts, &field(".content"))?,
        _ => {
            return Err(ApiError::bad_param(
                &field(".content"),
                "content must be a string or a list of parts",
            ))
        }
    };
    Ok(Message::new(role, &text))
}

/// The text of `input_text` / `output_text` parts; other parts are refused.
fn text_of_parts(parts: &[Value], field: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, part.get("text").and_then(Value::as_str)) {
            ("input_text" | "output_text" | "text", Some(t)) => text += t,
            _ => {
                return Err(ApiError::bad_param(
                    &format!("{field}[{j}]"),
                    format!(
                        "only text parts (input_text, output_text) are supported, got '{kind}'"
                    ),
                ))
            }
        }
    }
    Ok(text)
}

fn text_field(
    item: &serde_json::Map<String, Value>,
    name: &str,
    field: &dyn Fn(&str) -> String,
) -> Result<String, ApiError> {
    match item.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(ApiError::bad_param(
            &field(&format!(".{name}")),
            format!("{name} must be a string"),
        )),
    }
}

/// The Responses API's function tools (`{"type": "function", "name", "parameters", ...}`) in
/// the chat shape templates read (`{"type": "function", "function": {...}}`).
pub fn tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let field = format!("tools[{i}]");
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {}
                other => {
                    return Err(ApiError::bad_param(
                        &format!("{field}.type"),
                        format!(
                            "only function tools are supported, got {}",
                            other.unwrap_or("none")
                        ),
                    ))
                }
            }
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                return Err(ApiError::bad_param(
                    &format!("{field}.name"),
                    "a function tool needs a name",
                ));
            };
            let mut function = json!({"name": name});
            for key in ["description", "parameters", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function[key] = v.clone();
                }
            }
            if !function
                .get("parameters")
                .is_none_or(serde_json::Value::is_object)
            {
                return Err(ApiError::bad_param(
                    &format!("{field}.parameters"),
                    "parameters must be a JSON schema object",
                ));
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_is_one_user_message() {
        let m = messages(json!("hi"), &[]).unwrap();
        assert_eq!((m[0].role.as_str(), m[0].text()), ("user", "hi".into()));
    }

    #[test]
    fn items_become_messages_calls_and_results() {
        let input = json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
        ]);
        let m = messages(input, &[]).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(m[1].text(), "Weather in Paris?");
        let calls = m[2].extra["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "consecutive calls are one turn");
        assert_eq!(calls[0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(m[3].extra["tool_call_id"], "c1");
    }

    #[test]
    fn a_result_may_answer_a_call_of_the_previous_response() {
        let earlier = messages(
            json!([{"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}]),
            &[],
        )
        .unwrap();
        let input = json!([{"type": "function_call_output", "call_id": "c9", "output": "ok"}]);
        assert!(messages(input.clone(), &earlier).is_ok());
        let e = messages(input, &[]).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("input[0].call_id"),
            "{}",
            e.message
        );
    }

    #[test]
    fn bad_items_name_their_place() {
        for (input, param) in [
            (json!(5), "input"),
            (json!([]), "input"),
            (json!(["x"]), "input[0]"),
            (json!([{"role": "robot", "content": "x"}]), "input[0].role"),
            (json!([{"role": "user"}]), "input[0].content"),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input[0].content[0]",
            ),
            (json!([{"type": "web_search_call"}]), "input[0].type"),
            (
                json!([{"type": "function_call", "call_id": "c", "name": "f"}]),
                "input[0].arguments",
            ),
        ] {
            let e = messages(input.clone(), &[]).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{input}: {}", e.message);
        }
    }

    #[test]
    fn function_tools_take_the_chat_shape() {
        let t = tools(&[
            json!({"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}),
        ])
        .unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}})
        );
        assert!(tools(&[json!({"type": "web_search"})]).is_err());
        assert!(tools(&[json!({"type": "function"})]).is_err());
        assert!(tools(&[json!({"type": "function", "name": "f", "parameters": 3})]).is_err());
    }
}
