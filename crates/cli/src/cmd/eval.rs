//! `anelm eval`: a measuring tool. One forward pass over the prompt gives the argmax at every
//! position and the last logits; `--greedy N` then decodes exactly N tokens (no EOS stop).

use anelm_engine::{argmax, Session};
use anelm_model::Logits;
use anyhow::Result;
use serde::Serialize;

use super::common::{ModelArgs, PromptArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Greedy tokens to decode after the prompt.
    #[arg(long, default_value_t = 0)]
    pub greedy: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct EvalJson {
    prompt_ids: Vec<u32>,
    argmax: Vec<u32>,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
}

pub fn run(a: Args) -> Result<()> {
    let loaded = a.model.load()?;
    let prompt = a.prompt.ids(&loaded)?;
    let capacity = prompt.len() + a.greedy;
    if capacity > loaded.model.max_positions() {
        anyhow::bail!(
            "prompt ({}) + greedy ({}) tokens exceed the context ({})",
            prompt.len(),
            a.greedy,
            loaded.model.max_positions()
        );
    }
    let mut exec = a.model.executor(&loaded, capacity)?;
    let vocab = exec.vocab_size();
    let mut session = Session::new(exec.as_ref(), capacity)?;
    let mut logits = Vec::new();
    session.run(exec.as_mut(), &prompt, Logits::All, &mut logits)?;
    let per_position: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
    let last_logits = logits[(prompt.len() - 1) * vocab..].to_vec();
    let mut greedy = Vec::with_capacity(a.greedy);
    let mut next = *per_position.last().expect("prompt is not empty");
    for i in 0..a.greedy {
        greedy.push(next);
        if i + 1 < a.greedy {
            session.run(exec.as_mut(), &[next], Logits::Last, &mut logits)?;
            next = argmax(&logits);
        }
    }
    let out = EvalJson {
        prompt_ids: prompt,
        argmax: per_position,
        last_logits,
        greedy,
    };
    if a.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        let mut top: Vec<(usize, f32)> = out.last_logits.iter().copied().enumerate().collect();
        top.sort_by(|x, y| y.1.total_cmp(&x.1));
        println!("prompt ids: {:?}", out.prompt_ids);
        println!("argmax per position: {:?}", out.argmax);
        for (id, l) in top.iter().take(10) {
            let piece = loaded
                .tokenizer
                .as_ref()
                .map(|t| String::from_utf8_lossy(&t.token_to_piece(*id as u32)).into_owned());
            println!("  {id:>7} {l:>10.4} {:?}", piece.unwrap_or_default());
        }
        if !out.greedy.is_empty() {
            println!("greedy: {:?}", out.greedy);
        }
    }
    Ok(())
}
