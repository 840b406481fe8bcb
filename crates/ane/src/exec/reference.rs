//! The projections computed in f32 straight from the LayerPlan (weights dequantised row by row,
//! exact activations): what every kernel is checked against.

use std::sync::Arc;

use anelm_model::plan::{Activation, Ffn, Linear};
use anelm_model::{Model, Weight};
use rayon::prelude::*;

use super::Projections;
use crate::error::{AneError, Result};
use crate::lower::Projection;
use crate::support::{mixer_inputs, mixer_output, mixture, unsupported};

pub struct ReferenceProjections {
    model: Arc<Model>,
}

impl ReferenceProjections {
    pub fn new(model: Arc<Model>) -> ReferenceProjections {
        ReferenceProjections { model }
    }
}

/// `out[t * ld + first + r] = Σ_c w[r, c] x[t, c] (+ b[r])` for the `n` rows of `x`.
fn product(
    w: &Weight,
    bias: Option<&[f32]>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    ld: usize,
    first: usize,
) -> Result<()> {
    const ROWS: usize = 64;
    let cols = w.cols;
    let blocks: Vec<Vec<f32>> = (0..w.rows.div_ceil(ROWS))
        .into_par_iter()
        .map(|b| -> Result<Vec<f32>> {
            let rows = b * ROWS..((b + 1) * ROWS).min(w.rows);
            let mut row = vec![0f32; cols];
            let mut res = Vec::with_capacity(rows.len() * n);
            for r in rows {
                w.dequantize_row(r, &mut row)?;
                let b = bias.map_or(0.0, |b| b[r]);
                res.extend((0..n).map(|t| {
                    row.iter()
                        .zip(&x[t * cols..(t + 1) * cols])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        + b
                }));
            }
            Ok(res)
        })
        .collect::<Result<_>>()?;
    for (b, block) in blocks.iter().enumerate() {
        for (i, vals) in block.chunks_exact(n).enumerate() {
            for (t, &v) in vals.iter().enumerate() {
                out[t * ld + first + b * ROWS + i] = v;
            }
        }
    }
    Ok(())
}

fn linear(l: &Linear, x: &[f32], n: usize, out: &mut [f32], ld: usize, first: usize) -> Result<()> {
    product(&l.weight, l.bias.as_deref(), x, n, out, ld, first)
}

/// `down(act(gate x) * up x)` of the `n` rows of `x`.
fn gated(
    act: Activation,
    gate: &Linear,
    up: &Linear,
    down: &Linear,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let f = gate.out_features();
    let (mut g, mut u) = (vec![0f32; n * f], vec![0f32; n * f]);
    linear(gate, x, n, &mut g, f, 0)?;
    linear(up, x, n, &mut u, f, 0)?;
    g.iter_mut()
        .zip(&u)
        .for_each(|(g, u)| *g = activation(act, *g) * u);
    linear(down, &g, n, out, down.out_features(), 0)
}

/// The activations exactly as transformers defines them.
pub fn activation(act: Activation, g: f32) -> f32 {
    match act {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => {
            0.5 * g
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
        }
    }
}

impl Projections for ReferenceProjections {
    fn project(&mut self, p: Projection, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let m = &*self.model;
        let layer = |i: usize| {
            m.layers
                .get(i)
                .ok_or_else(|| AneError::Unsupported(format!("no layer {i}")))
        };
        match p {
            Projection::Qkv(i) => {
                let ls = mixer_inputs(layer(i)?);
                let ld: usize = ls.iter().map(|l| l.out_features()).sum();
                let mut first = 0;
                for l in ls {
                    linear(l, x, n, out, ld, first)?;
                    first += l.out_features();
                }
                Ok(())
            }
            Projection::O(i) => {
                let o = mixer_output(layer(i)?);
                linear(o, x, n, out, o.out_features(), 0)
            }
            Projection::Ffn(i) => match &layer(i)?.ffn {
                Ffn::Gated {
                    act,
                    gate,
                    up,
                    down,
                } => gated(*act, gate, up, down, x, n, out),
                Ffn::Plain { act, up, down } => {
                    let f = up.out_features();
                    let mut u = vec![0f32; n * f];
                    linear(up, x, n, &mut u, f, 0)?;
                    u.iter_mut().for_each(|v| *v = activation(*act, *v));
                    linear(down, &u, n, out, down.out_features(), 0)
                }
                Ffn::Moe(_) => Err(unsupported(i, "a mixture as one FFN kernel")),
            },
            Projection::Expert(i, e) => {
                let m = mixture(layer(i)?, i)?;
                let mlp = m
                    .experts
                    .get(e)
                    .ok_or_else(|| AneError::Unsupported(format!("layer {i}: no expert {e}")))?;
                gated(m.act, &mlp.gate, &mlp.up, &mlp.down, x, n, out)
            }
            Projection::Shared(i) => {
                let m = mixture(layer(i)?, i)?;
                let s = m
                    .shared
                    .as_ref()
                    .ok_or_else(|| AneError::Unsupported(format!("layer {i}: no shared expert")))?;
                gated(m.act, &s.mlp.gate, &s.mlp.up, &s.mlp.down, x, n, out)
            }
            Projection::Head => product(&m.lm_head, None, x, n, out, m.lm_head.rows, 0),
        }
    }
}
