//! Tool calls in a model's reply, in the shapes chat templates teach: `<tool_call>{json}
//! </tool_call>` blocks (Hermes, Qwen, SmolLM3), a `[TOOL_CALLS]` list (Mistral), or a reply that
//! is one JSON call (Llama 3). A call counts only if it names a declared tool, so ordinary JSON
//! in a reply stays text.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// The names of the functions a request declares (`tools[].function.name`).
pub fn declared_names(tools: &[Value]) -> Vec<String> {
    tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// Splits a reply into its text (None when nothing but calls) and its tool calls.
pub fn parse(reply: &str, declared: &[String]) -> (Option<String>, Vec<ToolCall>) {
    let as_text = |t: &str| {
        let t = t.trim();
        (!t.is_empty()).then(|| t.to_string())
    };
    let (text, calls) = tagged_calls(reply, declared)
        .or_else(|| mistral_calls(reply, declared))
        .or_else(|| bare_call(reply, declared).map(|c| (String::new(), vec![c])))
        .unwrap_or_else(|| (reply.to_string(), Vec::new()));
    (as_text(&text), calls)
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// `<tool_call>{...}</tool_call>` blocks; the last one may lack its closing tag (the model
/// ended its turn instead), or be cut short after complete ones (then it is dropped). The JSON
/// is read as JSON, so an argument that contains the closing tag stays whole.
fn tagged_calls(reply: &str, declared: &[String]) -> Option<(String, Vec<ToolCall>)> {
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut rest = reply;
    while let Some(start) = rest.find(OPEN) {
        text.push_str(&rest[..start]);
        let body = &rest[start + OPEN.len()..];
        match json_call(body, declared) {
            Some((call, used)) => {
                calls.push(call);
                let after = body[used..].trim_start();
                rest = after.strip_prefix(CLOSE).unwrap_or(after);
            }
            // A last call cut short (by the token limit) after complete ones is dropped.
            None if !body.contains(CLOSE) && !calls.is_empty() => {
                rest = "";
                break;
            }
            None => return None,
        }
    }
    text.push_str(rest);
    (!calls.is_empty()).then_some((text, calls))
}

/// The call at the start of `body` (after whitespace), and the bytes it took.
fn json_call(body: &str, declared: &[String]) -> Option<(ToolCall, usize)> {
    let lead = body.len() - body.trim_start().len();
    let mut values = serde_json::Deserializer::from_str(&body[lead..]).into_iter::<Value>();
    let value = values.next()?.ok()?;
    let call = call_from_value(&value, declared)?;
    Some((call, lead + values.byte_offset()))
}

fn mistral_calls(reply: &str, declared: &[String]) -> Option<(String, Vec<ToolCall>)> {
    let at = reply.find("[TOOL_CALLS]")?;
    let list: Vec<Value> = serde_json::from_str(reply[at + "[TOOL_CALLS]".len()..].trim()).ok()?;
    let calls = list
        .iter()
        .map(|v| call_from_value(v, declared))
        .collect::<Option<Vec<_>>>()?;
    (!calls.is_empty()).then(|| (reply[..at].to_string(), calls))
}

fn bare_call(reply: &str, declared: &[String]) -> Option<ToolCall> {
    call_from_json(reply.trim(), declared)
}

fn call_from_json(json: &str, declared: &[String]) -> Option<ToolCall> {
    call_from_value(&serde_json::from_str(json).ok()?, declared)
}

/// `{"name": ..., "arguments"|"parameters": {...}}`, the arguments an object or JSON text.
fn call_from_value(v: &Value, declared: &[String]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?;
    if !declared.iter().any(|d| d == name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "add".into()]
    }

    #[test]
    fn tagged_calls_with_text_around_them() {
        let reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}";
        let (text, calls) = parse(reply, &names());
        assert_eq!(text.as_deref(), Some("Let me check."));
        assert_eq!(
            calls,
            [
                ToolCall {
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into()
                },
                ToolCall {
                    name: "add".into(),
                    arguments: r#"{"a":1,"b":2}"#.into()
                },
            ]
        );
    }

    #[test]
    fn a_call_cut_short_after_complete_ones_is_dropped() {
        let reply = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"argu";
        let (text, calls) = parse(reply, &names());
        assert_eq!((text, calls.len()), (None, 1));
        assert_eq!(calls[0].arguments, r#"{"a":1}"#);
    }

    #[test]
    fn an_argument_holding_the_closing_tag_stays_whole() {
        let reply = "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": \"</tool_call>\"}}</tool_call> done";
        let (text, calls) = parse(reply, &names());
        assert_eq!(text.as_deref(), Some("done"));
        assert_eq!(calls[0].arguments, r#"{"a":"</tool_call>"}"#);
    }

    #[test]
    fn llama_and_mistral_shapes() {
        let (text, calls) = parse(r#"{"name": "add", "parameters": {"a": 1}}"#, &names());
        assert_eq!(
            (text, calls.len(), calls[0].arguments.as_str()),
            (None, 1, r#"{"a":1}"#)
        );
        let (text, calls) = parse(
            r#"[TOOL_CALLS][{"name": "add", "arguments": "{\"a\": 2}"}]"#,
            &names(),
        );
        assert_eq!((text, calls[0].arguments.as_str()), (None, r#"{"a": 2}"#));
    }

    #[test]
    fn undeclared_names_and_broken_json_stay_text() {
        for reply in [
            r#"{"name": "rm_rf", "arguments": {}}"#,
            "<tool_call>{\"name\": \"add\", </tool_call>",
            "The answer is {\"name\": \"add\"} in JSON.",
        ] {
            let (text, calls) = parse(reply, &names());
            assert!(calls.is_empty(), "{reply}");
            assert_eq!(text.as_deref(), Some(reply.trim()));
        }
    }
}
