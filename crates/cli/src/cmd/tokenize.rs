//! `anelm tokenize`: the model tokenizer's ids and pieces for a text.

use anyhow::Result;
use serde::Serialize;

use super::common::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Parse special-token text (like `<|im_start|>`) into special tokens.
    #[arg(long)]
    pub special: bool,
    /// Add the model's BOS/EOS tokens as its tokenizer settings say.
    #[arg(long)]
    pub add_special: bool,
    #[arg(long)]
    pub json: bool,
    pub text: String,
}

#[derive(Serialize)]
struct TokenizeJson {
    ids: Vec<u32>,
    pieces: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    // The tokenizer alone: a vocabulary-only GGUF is enough.
    let side = a.model.load_text_side()?;
    let tok = side.tokenizer()?;
    let ids = tok.encode(&a.text, a.add_special, a.special)?;
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(&tok.token_to_piece(id)).into_owned())
        .collect();
    if a.json {
        println!("{}", serde_json::to_string(&TokenizeJson { ids, pieces })?);
    } else {
        for (id, p) in ids.iter().zip(&pieces) {
            println!("{id:>7} {p:?}");
        }
    }
    Ok(())
}
