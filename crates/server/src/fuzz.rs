//! The fuzz target of the HTTP request bodies (`anelm-fuzz`'s `http_body`): the first byte
//! picks an endpoint, the rest is its body, read as the handler reads it (serde into the
//! request type, with the path of a bad field) and put through every check that needs no model
//! — sampling fields, formats and schemas' shapes, tool choices, Anthropic blocks, Responses
//! items, embedding inputs. Any bytes: no panic, no hang.

use serde_json::Value;

use crate::anthropic::InMessage;
use crate::limits::Limits;
use crate::params::Sampling;
use crate::structured::{self, ToolChoice};

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).ok()
}

/// The checks every endpoint's shared fields go through.
fn common(v: &Value) {
    if let Some(fields) = v.as_object() {
        if let Ok(s) = crate::extract::from_fields::<Sampling>(fields.clone()) {
            let _ = s.to_params(&Limits::default(), 49152, 2.0);
        }
    }
    for (key, nested) in [("response_format", true), ("format", false)] {
        let _ = structured::format_spec(v.get(key), key, nested);
    }
    let _ = structured::llama_fields(None, v.get("json_schema").cloned(), v.get("grammar"));
    let _ = ToolChoice::parse(v.get("tool_choice"));
    if let Some(k) = v.get("chat_template_kwargs") {
        let _ = anelm_engine::template_kwargs(k.clone());
    }
    let _ = crate::template_kwargs::Reasoning::from_anthropic(v.get("thinking").cloned());
    let _ = crate::reasoning::anthropic_budget(v.get("thinking"));
}

pub fn http_body(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            let _ = parse::<crate::openai::chat::ChatRequest>(body);
        }
        1 => {
            let _ = parse::<crate::openai::completions::CompletionRequest>(body);
        }
        2 => {
            let _ = parse::<crate::openai::responses::CreateRequest>(body);
            if let Some(v) = parse::<Value>(body) {
                if let Some(input) = v.get("input") {
                    let _ = crate::openai::responses_input::messages(input.clone(), &[]);
                }
                if let Some(Value::Array(tools)) = v.get("tools") {
                    let _ = crate::openai::responses_input::tools(tools);
                }
            }
        }
        3 => {
            let _ = parse::<crate::anthropic::MessagesRequest>(body);
            if let Some(v) = parse::<Value>(body) {
                if let Some(m) = v
                    .get("messages")
                    .and_then(|m| serde_json::from_value::<Vec<InMessage>>(m.clone()).ok())
                {
                    let _ = crate::anthropic_tools::messages(m);
                }
                if let Some(Value::Array(tools)) = v.get("tools") {
                    let _ = crate::anthropic_tools::tools(tools.clone());
                }
                let _ = crate::anthropic_tools::choice(v.get("tool_choice"));
            }
        }
        4 => {
            let _ = parse::<crate::embeddings::EmbeddingsRequest>(body);
            if let Some(input) = parse::<Value>(body).and_then(|v| v.get("input").cloned()) {
                let _ = crate::embeddings::inputs(input);
            }
        }
        _ => {
            let _ = parse::<crate::tokens::TokenizeRequest>(body);
        }
    }
    if let Some(v) = parse::<Value>(body) {
        common(&v);
    }
}
