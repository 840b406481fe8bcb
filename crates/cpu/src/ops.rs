//! Row operations of the forward pass, in f32: norms, RoPE, the output gate, soft-capping.

use anelm_model::plan::{Norm, NormKind, Rope, RopePairing};

/// `Σ f(v)` with eight partial sums, so that LLVM vectorises it.
fn sum8(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            acc[k] += f(c[k]);
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|&v| f(v)).sum::<f32>()
}

pub fn norm_row(norm: &Norm, row: &mut [f32]) {
    let n = row.len() as f32;
    match norm.kind {
        NormKind::Rms => {
            let ss = sum8(row, |v| v * v);
            let inv = 1.0 / (ss / n + norm.eps).sqrt();
            for (v, w) in row.iter_mut().zip(&norm.weight) {
                *v = (*v * inv) * w;
            }
        }
        NormKind::Layer => {
            let mean = sum8(row, |v| v) / n;
            let var = sum8(row, |v| (v - mean) * (v - mean)) / n;
            let inv = 1.0 / (var + norm.eps).sqrt();
            for (v, w) in row.iter_mut().zip(&norm.weight) {
                *v = (*v - mean) * inv * w;
            }
        }
    }
    if let Some(b) = &norm.bias {
        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
}

/// Rotates the first `rope.dims` values of `head` by the angles whose cos/sin are given.
pub fn rope_head(rope: &Rope, head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = rope.dims / 2;
    match rope.pairing {
        RopePairing::HalfSplit => {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = b * cos[i] + a * sin[i];
            }
        }
        RopePairing::Adjacent => {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos[i] - b * sin[i];
                head[2 * i + 1] = b * cos[i] + a * sin[i];
            }
        }
    }
}

/// `out *= sigmoid(z)`: the attention output gate (one gate value per element of a head).
pub fn output_gate(out: &mut [f32], z: &[f32]) {
    out.iter_mut()
        .zip(z)
        .for_each(|(o, g)| *o /= 1.0 + (-g).exp());
}

/// `x = cap * tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_and_layer_norm() {
        let n = Norm {
            kind: NormKind::Rms,
            eps: 0.0,
            weight: vec![1.0, 2.0],
            bias: None,
        };
        let mut r = [3.0, 4.0];
        norm_row(&n, &mut r);
        let rms = (12.5f32).sqrt();
        assert!((r[0] - 3.0 / rms).abs() < 1e-6 && (r[1] - 8.0 / rms).abs() < 1e-6);
        let l = Norm {
            kind: NormKind::Layer,
            eps: 0.0,
            weight: vec![1.0, 1.0],
            bias: Some(vec![0.5, 0.5]),
        };
        let mut r = [1.0, 3.0];
        norm_row(&l, &mut r);
        assert_eq!(r, [-0.5, 1.5]);
    }

    #[test]
    fn rope_pairings_rotate_the_right_pairs() {
        let mk = |pairing| Rope {
            dims: 4,
            pairing,
            inv_freq: vec![1.0, 1.0],
            mscale: 1.0,
        };
        let (c, s) = ([0.0, 0.0], [1.0, 1.0]); // 90 degrees
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope_head(&mk(RopePairing::HalfSplit), &mut h, &c, &s);
        assert_eq!(h, [-3.0, -4.0, 1.0, 2.0]);
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope_head(&mk(RopePairing::Adjacent), &mut h, &c, &s);
        assert_eq!(h, [-2.0, 1.0, -4.0, 3.0]);
    }

    #[test]
    fn softcap_bounds_values() {
        let mut x = [0.0, 1.0, 1000.0, -1000.0];
        softcap(&mut x, 30.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 30.0 * (1.0f32 / 30.0).tanh()).abs() < 1e-7);
        assert!(x[2] <= 30.0 && x[3] >= -30.0);
    }
}
