//! Where a model keeps its chat template: GGUF metadata, or one of the files transformers
//! writes beside a Hugging Face model.

use std::path::Path;

use anelm_formats::Metadata;
use serde_json::Value;

use super::{ChatTemplateError, TemplateOrigin};

/// The GGUF metadata key holding the template.
const GGUF_KEY: &str = "tokenizer.chat_template";

/// `tokenizer.chat_template` of a GGUF file, if present.
pub fn gguf_chat_template(
    meta: &Metadata,
) -> Result<Option<(String, TemplateOrigin)>, ChatTemplateError> {
    let file_error = |msg: String| ChatTemplateError::File {
        path: meta.path().to_path_buf(),
        msg,
    };
    match meta.str_opt(GGUF_KEY) {
        Ok(Some(s)) => Ok(Some((
            s.to_string(),
            TemplateOrigin::Gguf(meta.path().to_path_buf()),
        ))),
        Ok(None) => Ok(None),
        Err(e) => Err(file_error(format!("metadata key '{GGUF_KEY}': {e}"))),
    }
}

/// The template of a Hugging Face model directory, looked up as transformers does:
/// `chat_template.jinja`, else `chat_template.json`, else the `chat_template` of
/// `tokenizer_config.json` (a string, or a list of named templates of which `default` is used).
pub fn hf_chat_template(dir: &Path) -> Result<Option<(String, TemplateOrigin)>, ChatTemplateError> {
    let jinja = dir.join("chat_template.jinja");
    if let Some(text) = read(&jinja)? {
        return Ok(Some((text, TemplateOrigin::HfFile(jinja))));
    }
    for name in ["chat_template.json", "tokenizer_config.json"] {
        let path = dir.join(name);
        let Some(text) = read(&path)? else { continue };
        let json: Value = serde_json::from_str(&text).map_err(|e| ChatTemplateError::File {
            path: path.clone(),
            msg: format!("invalid JSON: {e}"),
        })?;
        if let Some(t) = template_field(&path, json.get("chat_template"))? {
            return Ok(Some((t, TemplateOrigin::HfFile(path))));
        }
    }
    Ok(None)
}

fn read(path: &Path) -> Result<Option<String>, ChatTemplateError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ChatTemplateError::File {
            path: path.to_path_buf(),
            msg: e.to_string(),
        }),
    }
}

fn template_field(path: &Path, v: Option<&Value>) -> Result<Option<String>, ChatTemplateError> {
    let bad = |msg: &str| ChatTemplateError::File {
        path: path.to_path_buf(),
        msg: format!("chat_template: {msg}"),
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let default = named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"));
            match default
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
            {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(bad("a list of named templates without a 'default' one")),
            }
        }
        Some(_) => Err(bad("expected a string or a list of {name, template}")),
    }
}
