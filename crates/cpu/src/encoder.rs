//! The forward pass of an encoder ([`anelm_model::encoder`]): one text at a time, every token
//! attending to every other, no cache. Its products run on the decoder's quantised kernels
//! (with f32 activations) and thread pool; attention is split over heads.

use std::sync::Arc;

use anelm_model::encoder::{pool, Encoder, Gelu};
use anelm_model::plan::Linear;

use crate::kernels::select_exact;
use crate::matmul::{matmul, Input, Product};
use crate::ops::norm_row;
use crate::pool::Pool;
use crate::shared::SharedSlice;
use crate::simd::Isa;

pub struct EncoderRunner {
    enc: Arc<Encoder>,
    pool: Pool,
    isa: Isa,
}

impl EncoderRunner {
    /// A runner on `threads` threads (0: one per core).
    pub fn new(enc: Arc<Encoder>, threads: usize) -> EncoderRunner {
        let n = if threads == 0 {
            crate::pool::physical_cores()
        } else {
            threads
        };
        EncoderRunner {
            enc,
            pool: Pool::new(n),
            isa: Isa::detect_cached(),
        }
    }

    pub fn encoder(&self) -> &Encoder {
        &self.enc
    }

    /// The last hidden state of every token of one text (`hidden` floats per token); the error
    /// is one line for the user (no tokens, too many, an id outside the vocabulary).
    pub fn hidden(&self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        let e = &*self.enc;
        let (n, h) = (tokens.len(), e.hidden);
        if n == 0 {
            return Err("no tokens to embed".into());
        }
        if n > e.max_positions {
            return Err(format!(
                "{n} tokens are more than the model's {} positions",
                e.max_positions
            ));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= e.vocab_size) {
            return Err(format!(
                "token id {bad} is outside the vocabulary (size {})",
                e.vocab_size
            ));
        }
        let mut x = vec![0f32; n * h];
        for (t, (row, &id)) in x.chunks_exact_mut(h).zip(tokens).enumerate() {
            e.word
                .dequantize_row(id as usize, row)
                .map_err(|err| err.to_string())?;
            let pos = &e.position[t * h..(t + 1) * h];
            row.iter_mut().zip(pos).for_each(|(v, p)| *v += p);
            norm_row(&e.embed_norm, row);
        }
        for l in &e.layers {
            let q = self.linear(&l.q, &x, n);
            let k = self.linear(&l.k, &x, n);
            let v = self.linear(&l.v, &x, n);
            let a = self.attend(&q, &k, &v, n);
            let o = self.linear(&l.o, &a, n);
            residual_norm(&mut x, &o, h, &l.attn_norm);
            let mut u = self.linear(&l.up, &x, n);
            match e.gelu {
                Gelu::Erf => u.iter_mut().for_each(|v| *v = gelu_erf(*v)),
                Gelu::Tanh => u.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
            }
            let d = self.linear(&l.down, &u, n);
            residual_norm(&mut x, &d, h, &l.ffn_norm);
        }
        Ok(x)
    }

    /// One text's embedding: its tokens' last hidden states pooled as the model says and, if
    /// it says so, scaled to unit length.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        let hidden = self.hidden(tokens)?;
        let e = &*self.enc;
        Ok(pool(&hidden, e.hidden, e.pooling, e.normalize))
    }

    /// `x Wᵀ + b` for the `n` rows of `x`, on every thread.
    fn linear(&self, lin: &Linear, x: &[f32], n: usize) -> Vec<f32> {
        let w = &lin.weight;
        let mut out = vec![0f32; n * w.rows];
        {
            let shared = SharedSlice::new(&mut out);
            let product = Product {
                kernel: select_exact(w.dtype, self.isa),
                w,
                bias: lin.bias.as_deref(),
                input: Input::F32(x),
                out: &shared,
                bytes: w.bytes(),
                packed: None,
            };
            self.pool.run(|ctx| {
                let mut scratch = Vec::new();
                matmul(ctx, &[product], n, &mut scratch, 1, |_, _| {});
            });
        }
        out
    }

    /// Softmax attention of every token over all `n`, head by head across the threads.
    fn attend(&self, q: &[f32], k: &[f32], v: &[f32], n: usize) -> Vec<f32> {
        let e = &*self.enc;
        let (h, heads) = (e.hidden, e.n_heads);
        let hd = h / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; n * h];
        {
            let shared = SharedSlice::new(&mut out);
            self.pool.run(|ctx| {
                let mut scores = vec![0f32; n];
                ctx.chunks(heads * n, |c| {
                    let (head, t) = (c / n, c % n);
                    let cols = head * hd..(head + 1) * hd;
                    let qt = &q[t * h..][cols.clone()];
                    for (s, score) in scores.iter_mut().enumerate() {
                        let ks = &k[s * h..][cols.clone()];
                        *score = qt.iter().zip(ks).map(|(a, b)| a * b).sum::<f32>() * scale;
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0.0;
                    scores.iter_mut().for_each(|s| {
                        *s = (*s - max).exp();
                        sum += *s;
                    });
                    // SAFETY: chunk (head, t) is the only one writing these columns of row t.
                    let o = unsafe { shared.range_mut(t * h + cols.start..t * h + cols.end) };
                    o.fill(0.0);
                    for (s, &p) in scores.iter().enumerate() {
                        let vs = &v[s * h..][cols.clone()];
                        o.iter_mut().zip(vs).for_each(|(a, b)| *a += p / sum * b);
                    }
                });
            });
        }
        out
    }
}

/// `x = norm(x + y)`, row by row.
fn residual_norm(x: &mut [f32], y: &[f32], h: usize, norm: &anelm_model::plan::Norm) {
    for (row, add) in x.chunks_exact_mut(h).zip(y.chunks_exact(h)) {
        row.iter_mut().zip(add).for_each(|(a, b)| *a += b);
        norm_row(norm, row);
    }
}

/// `x Φ(x)` with the exact normal CDF.
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))
}

/// The tanh approximation of GELU.
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// The error function in f64 (W. J. Cody's rational approximations as given by Numerical
/// Recipes' `erfc` Chebyshev fit, relative error below 1.2e-7 everywhere), returned in f32.
pub fn erf(x: f32) -> f32 {
    let z = (x as f64).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    let r = 1.0 - erfc;
    (if x >= 0.0 { r } else { -r }) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f64),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-1.5, -0.966_105_146_475_310_7),
            (2.5, 0.999_593_047_982_555),
            (4.0, 0.999_999_984_582_742_1),
        ] {
            assert!((erf(x) as f64 - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
        }
    }
}
