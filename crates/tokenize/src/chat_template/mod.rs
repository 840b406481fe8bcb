//! Chat templates: a model's Jinja template rendered as transformers' `apply_chat_template`
//! renders it — the same environment settings (`trim_blocks`, `lstrip_blocks`, loop controls),
//! the helpers Hugging Face templates call (`raise_exception`, `strftime_now`, Python's
//! `json.dumps` as `tojson`, Python string and dict methods) and the same variables
//! (`messages`, `tools`, `documents`, `add_generation_prompt`, `bos_token`, `eos_token`).

mod builtin;
mod pyjson;
mod pymethods;
mod pystr;
mod pyvalue;
mod rewrite;
mod source;

use std::collections::BTreeMap;
use std::path::PathBuf;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

pub use builtin::{builtin_template, BuiltinTemplate};
pub use source::{gguf_chat_template, hf_chat_template};

/// One chat message, OpenAI style. Fields other than `role` and `content` (`tool_calls`,
/// `tool_call_id`, `name`, ...) reach the template as given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// A string, a list of parts (`[{"type": "text", "text": ...}]`), or null (an assistant
    /// message that only calls tools). Null is left out of what the template sees, as
    /// transformers drops None-valued keys.
    #[serde(default)]
    pub content: serde_json::Value,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            extra: serde_json::Map::new(),
        }
    }
    pub fn system(content: &str) -> Message {
        Message::new("system", content)
    }
    pub fn user(content: &str) -> Message {
        Message::new("user", content)
    }
    pub fn assistant(content: &str) -> Message {
        Message::new("assistant", content)
    }

    /// The text of the message: the string, or its text parts joined.
    pub fn text(&self) -> String {
        match &self.content {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(serde_json::Value::as_str))
                .collect::<Vec<_>>()
                .concat(),
            _ => String::new(),
        }
    }

    /// The message as the template sees it, as transformers 5 hands it over: role, content, then
    /// the other fields, None-valued keys dropped; reasoning given under any of its names
    /// (`reasoning_content`, `thinking`, `reasoning`, first non-null wins) is copied to
    /// `thinking` (first, unless already there) and `reasoning_content` (gpt-oss templates read
    /// the one, most others the other).
    fn to_template_value(&self) -> serde_json::Value {
        let mut obj = serde_json::Map::new();
        obj.insert("role".into(), self.role.clone().into());
        obj.insert("content".into(), self.content.clone());
        obj.extend(self.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        obj.retain(|_, v| !v.is_null());
        let reasoning = REASONING_FIELDS.iter().find_map(|k| obj.get(*k)).cloned();
        if let Some(reasoning) = reasoning {
            let mut aliased = serde_json::Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            // `{"thinking": r, **message, "reasoning_content": r}`: a message's own `thinking`
            // keeps the first place with its own value.
            aliased.extend(obj);
            aliased.insert("reasoning_content".into(), reasoning);
            obj = aliased;
        }
        serde_json::Value::Object(obj)
    }
}

/// Template variables by name: transformers' extra keyword arguments of apply_chat_template.
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// Template kwargs given as JSON (`--chat-template-kwargs`, a request's `chat_template_kwargs`):
/// an object, whose keys become template variables.
pub fn template_kwargs(value: serde_json::Value) -> Result<TemplateKwargs, String> {
    match value {
        serde_json::Value::Object(map) => Ok(map),
        other => {
            let kind = match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::String(_) => "a string",
                _ => "an array",
            };
            Err(format!(
                "chat template kwargs must be a JSON object of template variables \
                 (e.g. {{\"enable_thinking\": false}}), got {kind}"
            ))
        }
    }
}

/// The names a message's reasoning comes under, in transformers' order of preference.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// What a rendering adds to the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, so the model answers next.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, OpenAI style, for templates that describe tools.
    pub tools: Option<Vec<serde_json::Value>>,
    /// More template variables (e.g. `enable_thinking`), as transformers' extra keyword
    /// arguments; they override the special-token strings of the same name.
    pub variables: TemplateKwargs,
    /// The local time `strftime_now` reads; None is the system clock. Fixed in tests so that a
    /// template that prints today's date renders the same bytes every day.
    pub now: Option<jiff::civil::DateTime>,
}

/// Where a template came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// `tokenizer.chat_template` of a GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face file (tokenizer_config.json, chat_template.jinja or chat_template.json).
    HfFile(PathBuf),
    /// anelm's built-in template of that name.
    Builtin(&'static str),
}

impl std::fmt::Display for TemplateOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateOrigin::Gguf(p) => write!(f, "{} (tokenizer.chat_template)", p.display()),
            TemplateOrigin::HfFile(p) => write!(f, "{}", p.display()),
            TemplateOrigin::Builtin(name) => write!(f, "built-in template '{name}'"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("{origin}: the chat template does not parse: {msg}")]
    Syntax { origin: TemplateOrigin, msg: String },
    /// The template itself refused the conversation (`raise_exception`).
    #[error("{origin}: the chat template refused the conversation: {msg}")]
    Raised { origin: TemplateOrigin, msg: String },
    #[error("{origin}: rendering the chat template failed: {msg}")]
    Render { origin: TemplateOrigin, msg: String },
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
}

/// A compiled chat template with the special-token strings it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: TemplateOrigin,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const TEMPLATE_NAME: &str = "chat";

/// The work one render may do (minijinja fuel: about one per instruction and one per 64 bytes
/// of data, output included), so an untrusted template cannot hang or exhaust the process: at
/// most about 64 MB of data. Real templates spend a few thousand on a long conversation.
pub const TEMPLATE_FUEL: u64 = 1_000_000;

/// The marker `raise_exception` puts before its message, so a refusal can be told apart from
/// other render errors.
const RAISED: &str = "raise_exception: ";

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` are the strings the template sees under
    /// those names (left undefined when None, as transformers does for unset tokens).
    pub fn new(
        source: &str,
        origin: TemplateOrigin,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build();
        let syntax = syntax.map_err(|e| ChatTemplateError::Syntax {
            origin: origin.clone(),
            msg: e.to_string(),
        })?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        pymethods::install(&mut env);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("{RAISED}{msg}"),
            ))
        });
        pyvalue::install(&mut env);
        env.add_function(
            rewrite::MARKUP_ADD,
            |terms: minijinja::value::Rest<Value>| pystr::markup_add(&terms),
        );
        env.add_filter("tojson", pyjson::tojson);
        env.add_filter("trim", pystr::trim);
        env.add_filter("string", pystr::string);
        env.set_formatter(pystr::format);
        env.add_template_owned(TEMPLATE_NAME, rewrite::rewrite(source))
            .map_err(|e| ChatTemplateError::Syntax {
                origin: origin.clone(),
                msg: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            origin,
            bos_token,
            eos_token,
        })
    }

    /// A family's built-in template; the model's own special-token strings win where it has
    /// a tokenizer to take them from.
    pub fn builtin(
        t: BuiltinTemplate,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> ChatTemplate {
        let bos = bos_token.or(t.bos_token.map(str::to_string));
        let eos = eos_token.or(t.eos_token.map(str::to_string));
        // The built-in sources are fixed and tested; a failure here is a bug in this crate.
        ChatTemplate::new(t.source, TemplateOrigin::Builtin(t.name), bos, eos)
            .expect("built-in chat templates compile")
    }

    /// Whether the template reads variable `name` without setting it (e.g. `enable_thinking`),
    /// so that a setting can be mapped to the template's own switch.
    pub fn uses_variable(&self, name: &str) -> bool {
        self.env
            .get_template(TEMPLATE_NAME)
            .is_ok_and(|t| t.undeclared_variables(false).contains(name))
    }

    pub fn origin(&self) -> &TemplateOrigin {
        &self.origin
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders a conversation.
    pub fn render(
        &self,
        messages: &[Message],
        opts: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        let to_value = |json: serde_json::Value| {
            Value::deserialize(json).map_err(|e| ChatTemplateError::Render {
                origin: self.origin.clone(),
                msg: e.to_string(),
            })
        };
        let messages = to_value(messages.iter().map(Message::to_template_value).collect())?;
        let tools = match &opts.tools {
            Some(t) => to_value(serde_json::Value::Array(t.clone()))?,
            None => Value::from(()),
        };
        // Special tokens and strftime_now first (globals in transformers), the caller's variables
        // over them, the conversation over all.
        let mut ctx = BTreeMap::new();
        ctx.insert("strftime_now".to_string(), strftime_now(opts.now));
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".to_string(), Value::from(b.as_str()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".to_string(), Value::from(e.as_str()));
        }
        for (k, v) in &opts.variables {
            ctx.insert(k.clone(), to_value(v.clone())?);
        }
        ctx.insert("messages".into(), messages);
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        );
        let ctx = Value::from_object(ctx);
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| self.render_error(&e))?;
        tmpl.render(ctx).map_err(|e| self.render_error(&e))
    }

    fn render_error(&self, e: &Error) -> ChatTemplateError {
        let origin = self.origin.clone();
        match e.detail().and_then(|d| d.strip_prefix(RAISED)) {
            Some(msg) => ChatTemplateError::Raised {
                origin,
                msg: msg.to_string(),
            },
            None => ChatTemplateError::Render {
                origin,
                msg: describe(e),
            },
        }
    }
}

/// `strftime_now(format)`: the clock's local time formatted as Python's `datetime.strftime`.
fn strftime_now(now: Option<jiff::civil::DateTime>) -> Value {
    Value::from_function(move |format: String| -> Result<Value, Error> {
        let now = now.unwrap_or_else(|| jiff::Zoned::now().datetime());
        let text = jiff::fmt::strtime::format(&format, now)
            .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))?;
        Ok(Value::from(text))
    })
}

/// A minijinja error on one line: what went wrong and where.
fn describe(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests;
