//! Greedy decoding: the measuring tool (`anelm eval --greedy`) and the default of `anelm run`.

use anelm_model::{Executor, Logits};

use crate::error::Result;
use crate::session::Session;

/// Index of the largest logit; ties go to the lowest id, as llama.cpp's greedy sampler does.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Generates up to `max_new` tokens after `prompt`, stopping after any id in `stop` (which is
/// included in the result). `on_token` sees each token as it is chosen.
pub fn generate_greedy(
    exec: &mut dyn Executor,
    session: &mut Session,
    prompt: &[u32],
    max_new: usize,
    stop: &[u32],
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    let mut logits = Vec::new();
    session.prefill(exec, prompt, &mut logits)?;
    let mut out = Vec::with_capacity(max_new);
    while out.len() < max_new {
        let next = argmax(&logits);
        out.push(next);
        on_token(next);
        if stop.contains(&next) || out.len() == max_new {
            break;
        }
        session.run(exec, &[next], Logits::Last, &mut logits)?;
    }
    Ok(out)
}
