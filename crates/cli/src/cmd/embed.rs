//! `anelm embed`: each text's embedding as a JSON line — an embedding model (BERT) with its own
//! tokenizer pipeline, pooling and normalisation, or a chat model's final-normed hidden states
//! pooled as `--pooling` says and scaled to unit length (what `/v1/embeddings` serves).

use std::io::{BufRead, Write};

use anelm_model::encoder::{pool, Pooling};
use anyhow::{Context, Result};

use super::common::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The texts; none reads one text per line from standard input.
    pub texts: Vec<String>,
    /// How a chat model's token vectors are pooled: mean, last or cls [default: as its
    /// configuration says, else mean]; an embedding model pools as its configuration says.
    #[arg(long)]
    pub pooling: Option<Pooling>,
}

pub fn run(a: Args) -> Result<()> {
    let texts = if a.texts.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<std::io::Result<Vec<_>>>()
            .context("reading texts from standard input")?
    } else {
        a.texts.clone()
    };
    let mut out = std::io::stdout().lock();
    if let Some(path) = a.model.encoder_path()? {
        let (runner, tokenizer) = a.model.load_encoder(&path)?;
        for text in &texts {
            let ids = tokenizer.encode(text, true, false)?;
            let v = runner.embed(&ids).map_err(anyhow::Error::msg)?;
            writeln!(out, "{}", serde_json::to_string(&v)?)?;
        }
        return Ok(());
    }
    let loaded = a.model.load()?;
    let tokenizer = super::common::tokenizer(&loaded)?.clone();
    let max = loaded.model.max_positions();
    let mut exec = a.model.executor(&loaded, max)?;
    let configured = anelm_model::encoder::configured_pooling(&loaded.model.source)?;
    let pooling = a.pooling.or(configured.map(|(p, _)| p)).unwrap_or_default();
    let mut hidden = Vec::new();
    for text in &texts {
        let ids = tokenizer.encode(text, true, false)?;
        if ids.is_empty() || ids.len() > max {
            anyhow::bail!("'{text}': {} tokens; an input needs 1 to {max}", ids.len());
        }
        let mut state = exec.new_state(ids.len())?;
        exec.hidden_states(state.as_mut(), &ids, &mut hidden)?;
        let v = pool(&hidden, hidden.len() / ids.len(), pooling, true);
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    }
    Ok(())
}
