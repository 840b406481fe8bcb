//! `anelm perplexity`: perplexity of a text exactly as llama.cpp's llama-perplexity computes it —
//! the whole text tokenized (BOS per the model), cut into chunks of `--ctx` tokens (the rest
//! dropped), each chunk's first token replaced by BOS when the model adds one, the KV cache
//! cleared per chunk, and the second half of each chunk scored: logits at positions
//! ctx/2 .. ctx-2 predicting the next token.

use anelm_model::Logits;
use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::common::{tokenizer, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score.
    #[arg(short, long)]
    pub file: std::path::PathBuf,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 256)]
    pub ctx: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct PerplexityJson {
    ppl: f64,
    n_scored: usize,
    n_chunks: usize,
}

/// Negative log-likelihood of `target` under `logits` (log-sum-exp in f64).
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

pub fn run(a: Args) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    if a.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let loaded = a.model.load()?;
    let tok = tokenizer(&loaded)?;
    if a.ctx > loaded.model.max_positions() {
        bail!(
            "--ctx {} exceeds the model's context ({})",
            a.ctx,
            loaded.model.max_positions()
        );
    }
    let tokens = tok.encode(&text, true, false)?;
    let n_chunks = tokens.len() / a.ctx;
    if n_chunks == 0 {
        bail!(
            "{}: {} tokens is less than one chunk of {}",
            a.file.display(),
            tokens.len(),
            a.ctx
        );
    }
    let mut exec = a.model.executor(&loaded, a.ctx)?;
    let vocab = exec.vocab_size();
    let first = a.ctx / 2;
    let (mut sum, mut n_scored) = (0f64, 0usize);
    let mut logits = Vec::new();
    for c in 0..n_chunks {
        let mut chunk = tokens[c * a.ctx..(c + 1) * a.ctx].to_vec();
        if tok.add_bos() {
            chunk[0] = tok
                .bos()
                .context("the model adds BOS but has no BOS token")?;
        }
        let mut state = exec.new_state(a.ctx)?;
        exec.forward(
            state.as_mut(),
            &chunk,
            Logits::Tail(a.ctx - first),
            &mut logits,
        )?;
        for pos in first..a.ctx - 1 {
            let row = &logits[(pos - first) * vocab..(pos - first + 1) * vocab];
            sum += nll(row, chunk[pos + 1]);
            n_scored += 1;
        }
        if !a.json {
            eprint!("[{}]{:.4} ", c + 1, (sum / n_scored as f64).exp());
        }
    }
    let ppl = (sum / n_scored as f64).exp();
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&PerplexityJson {
                ppl,
                n_scored,
                n_chunks
            })?
        );
    } else {
        eprintln!();
        println!(
            "perplexity {ppl:.4} over {n_scored} scored tokens in {n_chunks} chunks of {}",
            a.ctx
        );
    }
    Ok(())
}
