//! The chat-template variables of a request: llama-server's `chat_template_kwargs` (a JSON
//! object), and the APIs' reasoning settings (OpenAI's `reasoning_effort`, Anthropic's
//! `thinking`) mapped to the template's own switch where the template reads one.

use anelm_engine::{template_kwargs, TemplateKwargs};
use serde_json::Value;

use crate::error::ApiError;
use crate::model::ServedModel;

/// A request's reasoning setting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reasoning {
    /// Think or not: `enable_thinking` for templates that read it (Qwen3, SmolLM3, ...).
    pub enabled: Option<bool>,
    /// OpenAI's effort (`low`, `medium`, `high`, ...): `reasoning_effort` for templates that
    /// read it (gpt-oss).
    pub effort: Option<String>,
}

impl Reasoning {
    /// OpenAI's `reasoning_effort`: "none" turns thinking off, any other effort on.
    pub fn from_effort(effort: Option<String>) -> Reasoning {
        Reasoning {
            enabled: effort.as_deref().map(|e| e != "none"),
            effort,
        }
    }

    /// Anthropic's `thinking`: `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}`
    /// or `{"type": "disabled"}`.
    pub fn from_anthropic(thinking: Option<Value>) -> Result<Reasoning, ApiError> {
        let Some(thinking) = thinking.filter(|t| !t.is_null()) else {
            return Ok(Reasoning::default());
        };
        let enabled = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::bad_param(
                    "thinking",
                    "thinking must be an object with \"type\": \"enabled\", \"adaptive\" or \"disabled\"",
                ))
            }
        };
        Ok(Reasoning {
            enabled: Some(enabled),
            effort: None,
        })
    }
}

/// The variables a request's conversation is rendered with: the server's (`serve
/// --chat-template-kwargs`), then the reasoning setting where the template reads the variable,
/// then the request's `chat_template_kwargs` over all. Not an object is a 400 naming the field.
pub fn for_request(
    model: &ServedModel,
    chat_template_kwargs: Option<Value>,
    reasoning: Reasoning,
) -> Result<TemplateKwargs, ApiError> {
    let mut kwargs = model.loaded.template_kwargs.clone();
    if let Some(on) = reasoning.enabled {
        if model.template_uses("enable_thinking") {
            kwargs.insert("enable_thinking".into(), on.into());
        }
    }
    if let Some(effort) = reasoning.effort {
        if model.template_uses("reasoning_effort") {
            kwargs.insert("reasoning_effort".into(), effort.into());
        }
    }
    match chat_template_kwargs {
        None | Some(Value::Null) => {}
        Some(v) => {
            let given = template_kwargs(v).map_err(|e| {
                ApiError::bad_param("chat_template_kwargs", format!("chat_template_kwargs: {e}"))
            })?;
            kwargs.extend(given);
        }
    }
    Ok(kwargs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_settings_map_to_thinking_on_or_off() {
        assert_eq!(Reasoning::from_effort(None), Reasoning::default());
        assert_eq!(
            Reasoning::from_effort(Some("none".into())).enabled,
            Some(false)
        );
        assert_eq!(
            Reasoning::from_effort(Some("high".into())).enabled,
            Some(true)
        );
        let on = serde_json::json!({"type": "enabled", "budget_tokens": 1024});
        assert_eq!(
            Reasoning::from_anthropic(Some(on)).unwrap().enabled,
            Some(true)
        );
        let off = serde_json::json!({"type": "disabled"});
        assert_eq!(
            Reasoning::from_anthropic(Some(off)).unwrap().enabled,
            Some(false)
        );
        for bad in [
            serde_json::json!(true),
            serde_json::json!({"type": "maybe"}),
        ] {
            let e = Reasoning::from_anthropic(Some(bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("thinking"));
        }
    }
}
