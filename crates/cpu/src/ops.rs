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
    let (shift, scale) = norm_stats(norm, row);
    for (v, w) in row.iter_mut().zip(&norm.weight) {
        *v = ((*v - shift) * scale) * w;
    }
    if let Some(b) = &norm.bias {
        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
}

/// `dst = norm(src)`: what [`norm_row`] makes of a copy of `src`, bit for bit, without the copy
/// (a decode step normed every row twice a layer on each thread after copying it).
pub fn norm_into(norm: &Norm, src: &[f32], dst: &mut [f32]) {
    let (shift, scale) = norm_stats(norm, src);
    for ((d, &v), w) in dst.iter_mut().zip(src).zip(&norm.weight) {
        *d = ((v - shift) * scale) * w;
    }
    if let Some(b) = &norm.bias {
        dst.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
}

/// What a norm makes of each value `v` of `row`: `(v − shift) · scale · w` (then `+ b`); RMS
/// norm shifts by zero, which leaves every value as it is.
fn norm_stats(norm: &Norm, row: &[f32]) -> (f32, f32) {
    let n = row.len() as f32;
    match norm.kind {
        NormKind::Rms => {
            let ss = sum8(row, |v| v * v);
            (0.0, 1.0 / (ss / n + norm.eps).sqrt())
        }
        NormKind::Layer => {
            let mean = sum8(row, |v| v) / n;
            let var = sum8(row, |v| (v - mean) * (v - mean)) / n;
            (mean, 1.0 / (var + norm.eps).sqrt())
        }
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

/// The orthonormal Walsh–Hadamard transform of `x` in place (Sylvester order, `H / sqrt(n)`,
/// its own inverse), `x.len()` a power of two: spreads a few large values over all of them.
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for block in x.chunks_exact_mut(2 * h) {
            let (a, b) = block.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b) {
                (*u, *v) = (*u + *v, *u - *v);
            }
        }
        h *= 2;
    }
    let scale = (n as f32).sqrt().recip();
    x.iter_mut().for_each(|v| *v *= scale);
}

/// Rotations of attention for a quantised KV cache (llama.cpp's attention rotation, its PR
/// 21038): keys and queries by the Hadamard transform over blocks of `k` values (the largest
/// power of two from 64 on dividing the head), values over blocks of 64 and the output back —
/// scores and outputs unchanged, but an outlier channel no longer sets a block's scale alone.
/// None where the cache is not quantised or the head is not a multiple of 64.
pub fn attention_rotations(
    head_dim: usize,
    k_quantized: bool,
    v_quantized: bool,
) -> (Option<usize>, Option<usize>) {
    if !head_dim.is_multiple_of(64) {
        return (None, None);
    }
    let mut k = 64;
    while head_dim.is_multiple_of(2 * k) {
        k *= 2;
    }
    (k_quantized.then_some(k), v_quantized.then_some(64))
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
    #[test]
    fn hadamard_is_an_orthonormal_involution_that_spreads_a_spike() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let mut y = x.clone();
        hadamard(&mut y);
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm(&x) - norm(&y)).abs() < 1e-4);
        hadamard(&mut y);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5));
        let mut spike = vec![0f32; 64];
        spike[5] = 8.0;
        hadamard(&mut spike);
        assert!(
            spike.iter().all(|v| (v.abs() - 1.0).abs() < 1e-6),
            "{spike:?}"
        );
    }

    #[test]
    fn rotations_only_for_quantised_caches_of_whole_blocks() {
        assert_eq!(attention_rotations(64, true, true), (Some(64), Some(64)));
        assert_eq!(attention_rotations(128, true, false), (Some(128), None));
        assert_eq!(attention_rotations(192, false, true), (None, Some(64)));
        assert_eq!(attention_rotations(256, true, true), (Some(256), Some(64)));
        assert_eq!(attention_rotations(80, true, true), (None, None));
        assert_eq!(attention_rotations(64, false, false), (None, None));
    }

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
