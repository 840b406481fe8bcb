//! `anelm template`: the prompt a conversation becomes under the model's chat template, for
//! checking a template by eye.

use std::path::{Path, PathBuf};

use anelm_engine::{Message, RenderOptions};
use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::common::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A JSON file: an OpenAI-style messages array, or an object with "messages" (and "tools").
    #[arg(long)]
    pub messages: PathBuf,
    /// Leave out the header of the assistant's turn at the end.
    #[arg(long)]
    pub no_generation_prompt: bool,
}

/// The messages (and tools) of a file, with errors that name it.
fn read_messages(path: &Path) -> Result<(Vec<Message>, Option<Vec<Value>>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    let (messages, tools) = match json {
        Value::Array(_) => (json, None),
        Value::Object(mut o) => {
            let messages = o
                .remove("messages")
                .with_context(|| format!("{}: no \"messages\" array", path.display()))?;
            let tools = match o.remove("tools") {
                None | Some(Value::Null) => None,
                Some(Value::Array(t)) => Some(t),
                Some(_) => bail!("{}: \"tools\" must be an array", path.display()),
            };
            (messages, tools)
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
    Ok((messages, tools))
}

pub fn run(a: Args) -> Result<()> {
    let (messages, tools) = read_messages(&a.messages)?;
    // No weights needed: a vocabulary-only GGUF is enough.
    let template = a.model.load_text_side()?.chat_template()?;
    tracing::info!("template: {}", template.origin());
    let opts = RenderOptions {
        add_generation_prompt: !a.no_generation_prompt,
        tools,
        ..RenderOptions::default()
    };
    print!("{}", template.render(&messages, &opts)?);
    Ok(())
}
