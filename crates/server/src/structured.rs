//! What a request asks the reply to be, in every API's words: OpenAI's `response_format` and
//! the Responses API's `text.format` (text, `json_object`, `json_schema`), and `tool_choice`
//! (OpenAI's auto / none / required / a named function, Anthropic's auto / any / tool / none).
//! A forced call becomes a grammar in the model's own call format; the grammar is compiled off
//! the runtime into the job's [`Constrained`].

use std::sync::Arc;

use anelm_constrain::{Constrained, Spec, ToolSpec};
use serde_json::Value;

use crate::app::App;
use crate::error::ApiError;

/// A `response_format` (chat) or `text.format` (Responses): None for plain text. `nested` is
/// true for chat's shape (`{"type": "json_schema", "json_schema": {"schema": …}}`), false for
/// the Responses API's (`{"type": "json_schema", "schema": …}`).
pub fn format_spec(
    format: Option<&Value>,
    param: &str,
    nested: bool,
) -> Result<Option<Spec>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Spec::JsonObject)),
        "json_schema" => {
            let body = if nested {
                format.get("json_schema").ok_or_else(|| {
                    ApiError::bad_param(&format!("{param}.json_schema"), "json_schema is missing")
                })?
            } else {
                format
            };
            let where_ = if nested {
                format!("{param}.json_schema.schema")
            } else {
                format!("{param}.schema")
            };
            match body.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Spec::JsonSchema(s.clone())))
                }
                Some(_) => Err(ApiError::bad_param(
                    &where_,
                    "schema must be a JSON Schema object",
                )),
                None => Err(ApiError::bad_param(&where_, "schema is missing")),
            }
        }
        other => Err(ApiError::bad_param(
            &format!("{param}.type"),
            format!("'{other}' is not a format: use 'text', 'json_object' or 'json_schema'"),
        )),
    }
}

/// llama-server's own fields beside OpenAI's: `json_schema` (a schema, top level) and `grammar`
/// (GBNF, refused: we take schemas and, on the command line, Lark). Both a `response_format` and
/// a `json_schema` is a 400.
pub fn llama_fields(
    format: Option<Spec>,
    json_schema: Option<Value>,
    grammar: Option<&Value>,
) -> Result<Option<Spec>, ApiError> {
    if grammar.is_some_and(|g| !g.is_null()) {
        return Err(ApiError::bad_param(
            "grammar",
            "GBNF grammars are not supported: give a JSON Schema (json_schema or response_format)",
        ));
    }
    match (format, json_schema.filter(|s| !s.is_null())) {
        (Some(_), Some(_)) => Err(ApiError::bad_param(
            "json_schema",
            "give either response_format or json_schema, not both",
        )),
        (None, Some(s @ (Value::Object(_) | Value::Bool(_)))) => Ok(Some(Spec::JsonSchema(s))),
        (None, Some(_)) => Err(ApiError::bad_param(
            "json_schema",
            "json_schema must be a JSON Schema object",
        )),
        (format, None) => Ok(format),
    }
}

/// What `tool_choice` asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    /// No tools in the prompt, no calls.
    None,
    /// At least one call, to any declared tool.
    Required,
    /// One call, to this tool.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's forms: "auto" | "none" | "required", `{"type": "function", "function":
    /// {"name": …}}` (chat) or `{"type": "function", "name": …}` (Responses); and Anthropic's:
    /// `{"type": "auto" | "any" | "none"}`, `{"type": "tool", "name": …}`.
    pub fn parse(choice: Option<&Value>) -> Result<ToolChoice, ApiError> {
        let bad = |what: String| ApiError::bad_param("tool_choice", what);
        let Some(choice) = choice.filter(|c| !c.is_null()) else {
            return Ok(ToolChoice::Auto);
        };
        let kind = match choice {
            Value::String(s) => s.as_str(),
            Value::Object(o) => o.get("type").and_then(Value::as_str).unwrap_or(""),
            other => {
                return Err(bad(format!(
                    "tool_choice must be a string or an object, got {other}"
                )))
            }
        };
        let name = || {
            choice
                .pointer("/function/name")
                .or_else(|| choice.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(format!("tool_choice {choice} names no function")))
        };
        match kind {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" | "any" => Ok(ToolChoice::Required),
            "function" | "tool" => Ok(ToolChoice::Named(name()?)),
            other => Err(bad(format!(
                "tool_choice '{other}' is not one of auto, none, required or a named function"
            ))),
        }
    }

    /// The tools the prompt describes (in the chat shape): none when the choice is `none` or
    /// none are declared; a 400 when a call is forced without tools, or when the template
    /// cannot describe them.
    pub fn offered(&self, app: &App, tools: Vec<Value>) -> Result<Option<Vec<Value>>, ApiError> {
        if tools.is_empty() {
            if matches!(self, ToolChoice::Required | ToolChoice::Named(_)) {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice forces a call, but the request declares no tools",
                ));
            }
            return Ok(None);
        }
        if *self == ToolChoice::None {
            return Ok(None);
        }
        if !app.model.tools_supported {
            return Err(ApiError::bad_param(
                "tools",
                format!(
                    "the chat template of '{}' does not describe tools",
                    app.model.id
                ),
            ));
        }
        Ok(Some(tools))
    }

    /// Under `auto`, when a tool is declared `strict`, the grammar that holds any call the reply
    /// makes to its tools' schemas while leaving text free (None for a template whose calls
    /// have no opening marker, and otherwise). `tools` are in the chat shape.
    pub fn strict_auto(
        &self,
        app: &App,
        tools: &[Value],
        parallel: bool,
    ) -> Result<Option<Spec>, ApiError> {
        let strict = tools
            .iter()
            .any(|t| t.pointer("/function/strict") == Some(&Value::Bool(true)));
        if *self != ToolChoice::Auto || !strict {
            return Ok(None);
        }
        app.model
            .call_format
            .auto_spec(&tool_specs(tools), parallel)
            .map_err(|e| ApiError::bad_param("tools", e.to_string()))
    }

    /// The grammar of the forced call(s), if the choice forces one; an unknown name is a 400.
    /// `tools` are in the chat shape (`{"type": "function", "function": {…}}`).
    pub fn forced(
        &self,
        app: &App,
        tools: &[Value],
        parallel: bool,
    ) -> Result<Option<Spec>, ApiError> {
        let specs = tool_specs(tools);
        let chosen = match self {
            ToolChoice::Auto | ToolChoice::None => return Ok(None),
            ToolChoice::Required => specs,
            ToolChoice::Named(name) => {
                let one: Vec<ToolSpec> = specs.into_iter().filter(|s| &s.name == name).collect();
                if one.is_empty() {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!("tool_choice names '{name}', which is not among the tools"),
                    ));
                }
                one
            }
        };
        let parallel = parallel && *self == ToolChoice::Required;
        app.model
            .call_format
            .spec(&chosen, parallel)
            .map(Some)
            .map_err(|e| ApiError::bad_param("tools", e.to_string()))
    }
}

/// Each chat-shape tool's name and parameter schema.
fn tool_specs(tools: &[Value]) -> Vec<ToolSpec> {
    tools
        .iter()
        .filter_map(|t| t.get("function"))
        .map(|f| ToolSpec {
            name: f
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            parameters: f.get("parameters").cloned(),
        })
        .collect()
}

/// Compiles `spec` for the served model off the runtime (the first one builds the vocabulary's
/// trie); an invalid schema is a 400 naming `param`.
pub async fn compile(
    app: &Arc<App>,
    spec: Option<Spec>,
    param: &'static str,
) -> Result<Option<Constrained>, ApiError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let model = app.model.clone();
    tokio::task::spawn_blocking(move || model.constraint(&spec, param))
        .await
        .map_err(|e| ApiError::internal(format!("compiling the constraint failed: {e}")))?
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_choices_in_every_api_shape() {
        for (v, want) in [
            (json!("auto"), ToolChoice::Auto),
            (json!("none"), ToolChoice::None),
            (json!("required"), ToolChoice::Required),
            (json!({"type": "any"}), ToolChoice::Required),
            (
                json!({"type": "function", "function": {"name": "f"}}),
                ToolChoice::Named("f".into()),
            ),
            (
                json!({"type": "function", "name": "g"}),
                ToolChoice::Named("g".into()),
            ),
            (
                json!({"type": "tool", "name": "h"}),
                ToolChoice::Named("h".into()),
            ),
        ] {
            assert_eq!(ToolChoice::parse(Some(&v)).unwrap(), want, "{v}");
        }
        assert_eq!(ToolChoice::parse(None).unwrap(), ToolChoice::Auto);
        for bad in [json!("sometimes"), json!({"type": "function"}), json!(3)] {
            assert!(ToolChoice::parse(Some(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_in_both_shapes() {
        let schema = json!({"type": "object"});
        let chat = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        assert!(matches!(
            format_spec(Some(&chat), "response_format", true),
            Ok(Some(Spec::JsonSchema(_)))
        ));
        let resp = json!({"type": "json_schema", "name": "x", "schema": schema});
        assert!(matches!(
            format_spec(Some(&resp), "text.format", false),
            Ok(Some(Spec::JsonSchema(_)))
        ));
        assert!(matches!(
            format_spec(Some(&json!({"type": "json_object"})), "f", true),
            Ok(Some(Spec::JsonObject))
        ));
        assert!(matches!(
            format_spec(Some(&json!({"type": "text"})), "f", true),
            Ok(None)
        ));
        for bad in [
            json!({"type": "xml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            let e = format_spec(Some(&bad), "response_format", true).unwrap_err();
            assert!(
                e.param
                    .as_deref()
                    .is_some_and(|p| p.starts_with("response_format")),
                "{bad}"
            );
        }
    }
}
