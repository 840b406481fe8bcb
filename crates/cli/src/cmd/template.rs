//! `anelm template`: the prompt a conversation becomes under the model's chat template, for
//! checking a template by eye.

use std::path::{Path, PathBuf};

use anelm_engine::{template_kwargs, Message, RenderOptions, TemplateKwargs};
use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::common::{parse_template_kwargs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A JSON file: an OpenAI-style messages array, or an object with "messages" (and "tools",
    /// "chat_template_kwargs").
    #[arg(long)]
    pub messages: PathBuf,
    /// Leave out the header of the assistant's turn at the end.
    #[arg(long)]
    pub no_generation_prompt: bool,
    /// Chat-template variables as a JSON object (transformers' apply_chat_template kwargs, e.g.
    /// '{"enable_thinking": false}'); they override the messages file's "chat_template_kwargs".
    #[arg(long, value_name = "JSON", value_parser = parse_template_kwargs)]
    pub kwargs: Option<TemplateKwargs>,
}

/// What a messages file holds.
struct Conversation {
    messages: Vec<Message>,
    tools: Option<Vec<Value>>,
    kwargs: TemplateKwargs,
}

/// The messages (tools, kwargs) of a file, with errors that name it.
fn read_messages(path: &Path) -> Result<Conversation> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    let (messages, tools, kwargs) = match json {
        Value::Array(_) => (json, None, TemplateKwargs::new()),
        Value::Object(mut o) => {
            let messages = o
                .remove("messages")
                .with_context(|| format!("{}: no \"messages\" array", path.display()))?;
            let tools = match o.remove("tools") {
                None | Some(Value::Null) => None,
                Some(Value::Array(t)) => Some(t),
                Some(_) => bail!("{}: \"tools\" must be an array", path.display()),
            };
            let kwargs = match o.remove("chat_template_kwargs") {
                None | Some(Value::Null) => TemplateKwargs::new(),
                Some(k) => template_kwargs(k).map_err(|e| {
                    anyhow::anyhow!("{}: \"chat_template_kwargs\": {e}", path.display())
                })?,
            };
            (messages, tools, kwargs)
        }
        _ => bail!(
            "{}: expected a messages array or an object with \"messages\"",
            path.display()
        ),
    };
    let messages: Vec<Message> = serde_json::from_value(messages).with_context(|| {
        format!(
            "{}: each message needs a \"role\" (and usually \"content\")",
            path.display()
        )
    })?;
    if messages.is_empty() {
        bail!("{}: the conversation is empty", path.display());
    }
    Ok(Conversation {
        messages,
        tools,
        kwargs,
    })
}

pub fn run(a: Args) -> Result<()> {
    let Conversation {
        messages,
        tools,
        mut kwargs,
    } = read_messages(&a.messages)?;
    kwargs.extend(a.kwargs.unwrap_or_default());
    // No weights needed: a vocabulary-only GGUF is enough.
    let template = a.model.load_text_side()?.chat_template()?;
    tracing::info!("template: {}", template.origin());
    let opts = RenderOptions {
        add_generation_prompt: !a.no_generation_prompt,
        tools,
        variables: kwargs,
        ..RenderOptions::default()
    };
    print!("{}", template.render(&messages, &opts)?);
    Ok(())
}
