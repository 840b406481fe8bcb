//! Forced tool calls: a grammar that makes the reply one call (or several) in the model's own
//! format, the name one of the declared tools and the arguments valid against that tool's
//! parameter schema — so a forced call always parses.

use serde_json::{json, Value};

use crate::{with_layout, ConstrainError, Spec};

/// How a chat template teaches the model to call a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Hermes, Qwen, SmolLM3).
    Tagged,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` (Mistral).
    Mistral,
    /// The reply is one JSON object (Llama 3.x), its arguments under `parameters` or
    /// `arguments` as the template says.
    Bare { parameters: bool },
}

/// A declared function: its name and the JSON Schema of its arguments.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Option<Value>,
}

impl CallFormat {
    /// The format a chat template's source teaches (Hermes-style tags when it says nothing
    /// recognisable: most templates that describe tools use them).
    pub fn detect(template: &str) -> CallFormat {
        if template.contains("<tool_call>") {
            CallFormat::Tagged
        } else if template.contains("[TOOL_CALLS]") {
            CallFormat::Mistral
        } else if template.contains("\"parameters\"") || template.contains("'parameters'") {
            // Llama 3.x: `{"name": function name, "parameters": dictionary of argument name…}`.
            CallFormat::Bare { parameters: true }
        } else {
            CallFormat::Tagged
        }
    }

    /// Whether one reply may hold several calls in this format.
    pub fn parallel_capable(self) -> bool {
        !matches!(self, CallFormat::Bare { .. })
    }

    /// The grammar of a reply that is only calls to `tools` (at least one; more only when
    /// `parallel` and the format allows).
    pub fn spec(self, tools: &[ToolSpec], parallel: bool) -> Result<Spec, ConstrainError> {
        let call = call_schema(self, tools)?;
        let parallel = parallel && self.parallel_capable();
        let lark = match self {
            CallFormat::Tagged => format!("start: calls\n{}", tagged_calls(call, parallel)),
            CallFormat::Mistral => format!("start: calls\n{}", mistral_calls(call, parallel)),
            CallFormat::Bare { .. } => format!("start: %json {}\n", with_layout(call)),
        };
        Ok(Spec::Lark(lark))
    }

    /// The grammar of a reply under `tool_choice: auto` with strict tools: free text that
    /// never opens a call, optionally followed by calls to `tools` that parse and fit their
    /// schemas. None for the bare format, whose calls have no opening marker to tell them from
    /// text.
    pub fn auto_spec(
        self,
        tools: &[ToolSpec],
        parallel: bool,
    ) -> Result<Option<Spec>, ConstrainError> {
        let call = with_layout(call_schema(self, tools)?);
        let parallel = parallel && self.parallel_capable();
        // The text before the calls and the opener are one lexeme: llguidance's lexer is greedy,
        // so free text as its own lexeme would run on into the opener and never give way.
        // OPENED is text with exactly one opener, at its end (`&` and `~` are llguidance's).
        let (opener, rest) = match self {
            CallFormat::Tagged => {
                let more = if parallel {
                    " (\"\\n\" \"<tool_call>\" body)*"
                } else {
                    ""
                };
                (
                    "<tool_call>",
                    format!(
                        "calls: body{more}\nbody: \"\\n\"? %json {call} \"\\n\"? \"</tool_call>\"\n"
                    ),
                )
            }
            CallFormat::Mistral => {
                let mut list = json!({"type": "array", "items": call, "minItems": 1});
                if !parallel {
                    list["maxItems"] = json!(1);
                }
                ("[TOOL_CALLS]", format!("calls: %json {list}\n"))
            }
            CallFormat::Bare { .. } => return Ok(None),
        };
        let o = regex_escape(opener);
        Ok(Some(Spec::Lark(format!(
            "start: TEXT? | OPENED calls\n{rest}\
             TEXT: /(?s:.+)/ & ~/(?s:.*{o}.*)/\n\
             OPENED: /(?s:.*){o}/ & ~/(?s:.*{o}(?s:.+))/\n"
        ))))
    }
}

/// One call's JSON: `{"name": <a declared tool>, "arguments" | "parameters": <its schema>}`.
fn call_schema(format: CallFormat, tools: &[ToolSpec]) -> Result<Value, ConstrainError> {
    if tools.is_empty() {
        return Err(ConstrainError::Invalid("no tool to call".into()));
    }
    let key = match format {
        CallFormat::Bare { parameters: true } => "parameters",
        _ => "arguments",
    };
    let calls = tools
        .iter()
        .map(|t| {
            let params = match &t.parameters {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(other) => {
                    return Err(ConstrainError::Invalid(format!(
                        "the parameters of tool '{}' must be a JSON Schema object, got {other}",
                        t.name
                    )))
                }
            };
            Ok(json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: params},
                "required": ["name", key],
                "additionalProperties": false,
            }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(if calls.len() == 1 {
        calls.into_iter().next().expect("one call")
    } else {
        json!({"anyOf": calls})
    })
}

/// The `calls` rule of the tagged format: `<tool_call>` JSON `</tool_call>`, several on
/// their own lines when `parallel`. The newlines inside the tags are as templates write them,
/// optional as parsers read them.
fn tagged_calls(call: Value, parallel: bool) -> String {
    let more = if parallel { " (\"\\n\" call)*" } else { "" };
    format!(
        "calls: call{more}\ncall: \"<tool_call>\" \"\\n\"? %json {} \"\\n\"? \"</tool_call>\"\n",
        with_layout(call)
    )
}

/// The `calls` rule of Mistral's format: `[TOOL_CALLS]` and a JSON list of calls.
fn mistral_calls(call: Value, parallel: bool) -> String {
    let mut list = json!({"type": "array", "items": call, "minItems": 1});
    if !parallel {
        list["maxItems"] = json!(1);
    }
    format!("calls: \"[TOOL_CALLS]\" %json {}\n", with_layout(list))
}

/// `s` as a regex matching itself.
fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if "\\.+*?()|[]{}^$/".contains(c) {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect()
}
