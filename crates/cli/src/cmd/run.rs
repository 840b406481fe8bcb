//! `anelm run`: generate a continuation of a prompt, streamed as it is produced.

use std::io::Write;

use anyhow::Result;
use anelm_engine::{generate_greedy, Session, Utf8Stream};
use serde::Serialize;

use super::common::{prompt_ids, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text (tokenized with special tokens added and parsed, as llama.cpp does).
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids.
    #[arg(long)]
    pub ids: Option<String>,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct RunJson {
    prompt_ids: Vec<u32>,
    ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.model.load()?;
    let prompt = prompt_ids(&loaded, a.prompt.as_deref(), a.ids.as_deref())?;
    let tokenizer = loaded.tokenizer.clone();
    let stop: Vec<u32> = tokenizer.as_ref().map(|t| t.eog_ids()).unwrap_or_default();
    let mut exec = a.model.executor(&loaded)?;
    let capacity = (prompt.len() + a.max_tokens).min(loaded.model.max_positions());
    let mut session = Session::new(exec.as_ref(), capacity)?;
    let max_new = capacity.saturating_sub(prompt.len()).min(a.max_tokens);
    let mut stream = Utf8Stream::new();
    let mut stdout = std::io::stdout().lock();
    let ids = generate_greedy(exec.as_mut(), &mut session, &prompt, max_new, &stop, |id| {
        if a.json || stop.contains(&id) {
            return;
        }
        if let Some(t) = &tokenizer {
            let text = stream.push(&t.token_to_piece(id));
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    let stopped = ids.last().is_some_and(|id| stop.contains(id));
    if a.json {
        let text_ids = if stopped { &ids[..ids.len() - 1] } else { &ids[..] };
        let text = tokenizer.as_ref().map(|t| String::from_utf8_lossy(&t.decode(text_ids)).into_owned()).unwrap_or_default();
        let out = RunJson { prompt_ids: prompt, ids, text, finish_reason: if stopped { "stop" } else { "length" } };
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else if tokenizer.is_some() {
        writeln!(stdout, "{}", stream.finish())?;
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(stdout, "{}", list.join(","))?;
    }
    Ok(())
}
