//! Router near-ties in fused chunks. The graph picks a mixture's experts from fp16
//! probabilities, so where the top-k boundary is closer than fp16 resolves the device may pick
//! otherwise than f32 would — and a flipped expert moves the output by a whole expert. After
//! each evaluation the host reads every mixture's router logits; at a near-tie it recomputes
//! the router in f32 from the chunk's own normed input (as the projection strategy routes
//! every token) and, where that choice differs, evaluates the chunk again with it forced
//! (`route{l}`), earliest layer first, until every choice stands.

use anelm_cpu::moe::route;
use anelm_model::plan::{Ffn, Moe};
use anelm_model::Model;

use crate::device::{Device, KernelIo};
use crate::error::Result;
use crate::planar::{gather, scatter};

/// A top-k boundary whose logits are closer than this (relative to the largest |logit|, at
/// least 1) is rechecked in f32: well above fp16's 1e-3 and the router input's own error.
pub const ROUTE_MARGIN: f32 = 2e-2;

/// Whether the `top_k` boundary of `logits` is a near-tie.
pub fn near_tie(logits: &[f32], top_k: usize) -> bool {
    if top_k == 0 || top_k >= logits.len() {
        return false;
    }
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let scale = sorted.iter().fold(1f32, |m, v| m.max(v.abs()));
    sorted[top_k - 1] - sorted[top_k] < ROUTE_MARGIN * scale
}

/// The experts the CPU engine picks for the normed input `xn`, in f32: a mask over experts.
pub fn f32_choice(moe: &Moe, xn: &[f32], row: &mut Vec<f32>) -> Result<Vec<bool>> {
    let ne = moe.experts.len();
    row.resize(xn.len(), 0.0);
    let mut logits = vec![0f32; ne];
    for (e, l) in logits.iter_mut().enumerate() {
        moe.router.dequantize_row(e, row)?;
        *l = row.iter().zip(xn).map(|(a, b)| a * b).sum();
    }
    let (mut probs, mut picked) = (Vec::new(), Vec::new());
    route(&logits, moe.top_k, moe.norm_top_k, &mut probs, &mut picked);
    let mut mask = vec![false; ne];
    picked.iter().for_each(|&(e, _)| mask[e] = true);
    Ok(mask)
}

/// The forced choices of one mixture: `[n][E]`, 0 where the graph chooses, else `-E` for an
/// expert forced in and `+E` for one forced out (added to its rank).
struct Forced {
    layer: usize,
    experts: usize,
    table: Vec<f32>,
    set: Vec<bool>,
}

/// A chunk just evaluated: its device, kernel, bound buffers and their layout.
pub struct Evaluated<'a, D: Device> {
    pub device: &'a mut D,
    pub kernel: &'a D::Kernel,
    pub binding: &'a mut D::Binding,
    pub io: &'a KernelIo,
}

/// The forced choices a chunk settled, per layer: `[n][E]` as `route{l}` takes them (the later
/// parts of a mixture split across chunks take the same).
pub type Settled = Vec<(usize, Vec<f32>)>;

/// Settles the router near-ties of the chunk holding `layers` just evaluated over `n` columns
/// (the choices in `given` already forced): returns how many times it evaluated the chunk
/// again, and the choices forced. Only columns marked in `live` count: an idle slot of a batch
/// function routes a zero input, whose experts all tie, and must not cost an evaluation.
pub fn settle_routes<D: Device>(
    chunk: Evaluated<'_, D>,
    model: &Model,
    layers: std::ops::Range<usize>,
    live: &[bool],
    given: &Settled,
) -> Result<(usize, Settled)> {
    let n = live.len();
    let Evaluated {
        device,
        kernel,
        binding,
        io,
    } = chunk;
    let mut forced: Vec<Forced> = layers
        .filter_map(|li| match &model.layers[li].ffn {
            Ffn::Moe(m) => {
                let ne = m.experts.len();
                // Choices forced before this evaluation (the executor's forced routes) stand.
                let table = (given.iter().find(|(l, _)| *l == li))
                    .map_or_else(|| vec![0.0; n * ne], |(_, t)| t.clone());
                let set = (0..n)
                    .map(|t| table[t * ne..(t + 1) * ne].iter().any(|&v| v != 0.0))
                    .collect();
                Some(Forced {
                    layer: li,
                    experts: ne,
                    table,
                    set,
                })
            }
            _ => None,
        })
        .collect();
    let h = model.config.hidden_size;
    let (mut row, mut xn) = (Vec::new(), vec![0f32; h]);
    let mut again = 0;
    // Each round fixes the earliest layer whose choice differs; layers before it keep theirs.
    for _ in 0..=forced.len() {
        let mut changed = false;
        for fc in &mut forced {
            let Ffn::Moe(moe) = &model.layers[fc.layer].ffn else {
                unreachable!("only mixtures are kept")
            };
            let ne = fc.experts;
            let (mut logits, mut sel) = (vec![0f32; n * ne], vec![0f32; n * ne]);
            read(
                device,
                binding,
                io,
                &format!("rl{}", fc.layer),
                n,
                &mut logits,
            )?;
            read(device, binding, io, &format!("rs{}", fc.layer), n, &mut sel)?;
            for t in 0..n {
                if fc.set[t] || !live[t] || !near_tie(&logits[t * ne..(t + 1) * ne], moe.top_k) {
                    continue;
                }
                let i = output(io, &format!("rx{}", fc.layer))?;
                let l = &io.outputs[i];
                device.read_output(binding, i, |b| gather(l, b, t..t + 1, &mut xn, h, 0));
                let want = f32_choice(moe, &xn, &mut row)?;
                let has = sel[t * ne..(t + 1) * ne].iter().map(|&s| s > 0.5);
                if want.iter().copied().ne(has) {
                    for (e, &w) in want.iter().enumerate() {
                        fc.table[t * ne + e] = if w { -(ne as f32) } else { ne as f32 };
                    }
                    fc.set[t] = true;
                    changed = true;
                }
            }
            if changed {
                break;
            }
        }
        if !changed {
            break;
        }
        for fc in &forced {
            let name = format!("route{}", fc.layer);
            let i = (io.inputs.iter().position(|l| l.name == name))
                .ok_or_else(|| crate::error::AneError::Unsupported(format!("no input {name}")))?;
            let l = io.inputs[i].clone();
            let ones = vec![1f32; n];
            device.write_input(binding, i, |b| scatter(&l, &fc.table, n, &ones, b));
        }
        device.evaluate(kernel, binding, n)?;
        again += 1;
    }
    let settled = (forced.into_iter())
        .filter(|fc| fc.set.iter().any(|&s| s))
        .map(|fc| (fc.layer, fc.table))
        .collect();
    Ok((again, settled))
}

fn output(io: &KernelIo, name: &str) -> Result<usize> {
    io.output(name)
        .ok_or_else(|| crate::error::AneError::Unsupported(format!("the device reports no {name}")))
}

fn read<D: Device>(
    device: &D,
    binding: &D::Binding,
    io: &KernelIo,
    name: &str,
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let i = output(io, name)?;
    let l = &io.outputs[i];
    let ld = l.channels;
    device.read_output(binding, i, |b| gather(l, b, 0..n, out, ld, 0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_ties_are_the_close_boundaries() {
        assert!(near_tie(&[3.0, 1.0, 0.995, -2.0], 2));
        assert!(!near_tie(&[3.0, 1.0, 0.9, -2.0], 2));
        // The boundary, not the top: k = 1 looks at the first two.
        assert!(!near_tie(&[3.0, 1.0, 0.999, -2.0], 1));
        assert!(!near_tie(&[1.0, 1.0], 2), "every expert picked");
        // Relative to the largest magnitude.
        assert!(near_tie(&[100.0, 50.0, 49.0], 2));
    }
}
