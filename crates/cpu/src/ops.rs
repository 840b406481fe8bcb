//! Elementwise and row operations of the forward pass, in f32.

use anelm_model::plan::{Activation, Norm, NormKind, Rope, RopePairing};

/// Applies `norm` to each row of `x` (rows of `norm.weight.len()` values) in place.
pub fn norm_rows(norm: &Norm, x: &mut [f32]) {
    let n = norm.weight.len();
    for row in x.chunks_exact_mut(n) {
        norm_row(norm, row);
    }
}

pub fn norm_row(norm: &Norm, row: &mut [f32]) {
    let n = row.len() as f32;
    match norm.kind {
        NormKind::Rms => {
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / n + norm.eps).sqrt();
            for (v, w) in row.iter_mut().zip(&norm.weight) {
                *v = (*v * inv) * w;
            }
        }
        NormKind::Layer => {
            let mean = row.iter().sum::<f32>() / n;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
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

pub fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            const C: f32 = 0.797_884_6; // sqrt(2/pi)
            0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
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

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `x = cap * tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise and hide FMA latency.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = 0.0;
    for v in acc {
        s += v;
    }
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_and_layer_norm() {
        let n = Norm { kind: NormKind::Rms, eps: 0.0, weight: vec![1.0, 2.0], bias: None };
        let mut r = [3.0, 4.0];
        norm_row(&n, &mut r);
        let rms = (12.5f32).sqrt();
        assert!((r[0] - 3.0 / rms).abs() < 1e-6 && (r[1] - 8.0 / rms).abs() < 1e-6);
        let l = Norm { kind: NormKind::Layer, eps: 0.0, weight: vec![1.0, 1.0], bias: Some(vec![0.5, 0.5]) };
        let mut r = [1.0, 3.0];
        norm_row(&l, &mut r);
        assert_eq!(r, [-0.5, 1.5]);
    }

    #[test]
    fn rope_pairings_rotate_the_right_pairs() {
        let mk = |pairing| Rope { dims: 4, pairing, inv_freq: vec![1.0, 1.0], mscale: 1.0 };
        let (c, s) = ([0.0, 0.0], [1.0, 1.0]); // 90 degrees
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope_head(&mk(RopePairing::HalfSplit), &mut h, &c, &s);
        assert_eq!(h, [-3.0, -4.0, 1.0, 2.0]);
        let mut h = [1.0, 2.0, 3.0, 4.0];
        rope_head(&mk(RopePairing::Adjacent), &mut h, &c, &s);
        assert_eq!(h, [-2.0, 1.0, -4.0, 3.0]);
    }

    #[test]
    fn softmax_sums_to_one_and_dot_matches() {
        let mut x = [1.0, 2.0, 3.0, 1000.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6 && x[3] > 0.999);
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        assert_eq!(dot(&a, &a), (0..19).map(|i| (i * i) as f32).sum::<f32>());
    }
}
