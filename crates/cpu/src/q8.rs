//! Activations quantised to 8 bits for the integer dot products, in two block shapes:
//! - [`ActKind::Q8B32`] for the 32-weight types (Q4_0 … Q8_0): per 32 values an f32 scale `d` and
//!   `s = d * Σq` (the sum carries the weight offsets of Q4_1/Q5_1);
//! - [`ActKind::Q8K`] for the k-quants: per 256 values an f32 scale, and the sum of every 16
//!   quants (the k-quants' per-sub-block minimums multiply it).
//!
//! `q = round_half_even(x * 127 / amax)`, the rounding of the SIMD float-to-int conversions, so
//! any vectorised quantiser produces the same bytes. Scales stay f32 (ggml rounds Q8_0's to f16).

use crate::kernels::QK;

/// How a kernel wants its input rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActKind {
    /// Plain f32 (unquantised weights, and the dequantise-tile fallback).
    #[default]
    F32,
    Q8B32,
    Q8K,
}

/// Values per scale of the k-quant activations.
pub const QK_K: usize = 256;

/// Quantised rows, preallocated for a number of rows of `cols` values.
#[derive(Default)]
pub struct Q8Buf {
    pub kind: ActKind,
    pub cols: usize,
    pub qs: Vec<i8>,
    /// One per block (32 or 256 values).
    pub d: Vec<f32>,
    /// Q8B32: `d * Σq` per block.
    pub s: Vec<f32>,
    /// Q8K: `Σq` of every 16 values.
    pub sums: Vec<i16>,
}

/// One quantised row as the kernels read it.
#[derive(Clone, Copy)]
pub struct Q8Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub sums: &'a [i16],
}

impl Q8Buf {
    /// Room for `rows` rows of `cols` values of `kind` (cols a multiple of its block).
    pub fn new(kind: ActKind, rows: usize, cols: usize) -> Q8Buf {
        let (block, with_s, with_sums) = match kind {
            ActKind::F32 => return Q8Buf::default(),
            ActKind::Q8B32 => (QK, true, false),
            ActKind::Q8K => (QK_K, false, true),
        };
        let n = rows * cols;
        Q8Buf {
            kind,
            cols,
            qs: vec![0; n],
            d: vec![0.0; n / block],
            s: if with_s { vec![0.0; n / block] } else { Vec::new() },
            sums: if with_sums { vec![0; n / 16] } else { Vec::new() },
        }
    }

    pub fn row(&self, r: usize) -> Q8Row<'_> {
        let c = self.cols;
        let nb = |block: usize| c / block;
        if self.kind == ActKind::Q8K {
            Q8Row {
                qs: &self.qs[r * c..(r + 1) * c],
                d: &self.d[r * nb(QK_K)..(r + 1) * nb(QK_K)],
                s: &[],
                sums: &self.sums[r * nb(16)..(r + 1) * nb(16)],
            }
        } else {
            Q8Row { qs: &self.qs[r * c..(r + 1) * c], d: &self.d[r * nb(QK)..(r + 1) * nb(QK)], s: &self.s[r * nb(QK)..(r + 1) * nb(QK)], sums: &[] }
        }
    }

    /// Quantises `x` (`cols` values) into row `r`.
    pub fn quantize_row(&mut self, r: usize, x: &[f32]) {
        let c = self.cols;
        let qs = &mut self.qs[r * c..(r + 1) * c];
        match self.kind {
            ActKind::Q8K => {
                let (nd, ns) = (c / QK_K, c / 16);
                quantize_k(x, qs, &mut self.d[r * nd..(r + 1) * nd], &mut self.sums[r * ns..(r + 1) * ns]);
            }
            ActKind::Q8B32 => {
                let nd = c / QK;
                quantize_b32(x, qs, &mut self.d[r * nd..(r + 1) * nd], &mut self.s[r * nd..(r + 1) * nd]);
            }
            ActKind::F32 => {}
        }
    }
}

/// Quantises one block: returns its scale; `q` receives the quants.
#[inline]
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let id = 127.0 / amax;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    amax / 127.0
}

/// Q8B32: per 32 values, `d` and `s = d * Σq`.
pub fn quantize_b32(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((x, q), d), s) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(d.iter_mut()).zip(s.iter_mut()) {
        *d = quantize_block(x, q);
        *s = *d * q.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
    }
}

/// Q8K: per 256 values `d`, and the sum of every 16 quants.
pub fn quantize_k(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i16]) {
    for ((x, q), d) in x.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K)).zip(d.iter_mut()) {
        *d = quantize_block(x, q);
    }
    for (s, q) in sums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| i16::from(v)).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantised_values_are_within_half_a_step() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        for kind in [ActKind::Q8B32, ActKind::Q8K] {
            let mut b = Q8Buf::new(kind, 2, 512);
            b.quantize_row(1, &x);
            let r = b.row(1);
            let block = if kind == ActKind::Q8K { QK_K } else { QK };
            for (i, &v) in x.iter().enumerate() {
                let d = r.d[i / block];
                assert!((f32::from(r.qs[i]) * d - v).abs() <= d * 0.5 + 1e-7, "{kind:?} {i}");
            }
            if kind == ActKind::Q8K {
                assert_eq!(r.sums[3], r.qs[48..64].iter().map(|&q| i16::from(q)).sum::<i16>());
            } else {
                let sum: i32 = r.qs[32..64].iter().map(|&q| i32::from(q)).sum();
                assert_eq!(r.s[1], r.d[1] * sum as f32);
            }
        }
    }

    #[test]
    fn zero_blocks_have_zero_scale() {
        let mut b = Q8Buf::new(ActKind::Q8B32, 1, 64);
        b.quantize_row(0, &[0.0; 64]);
        assert_eq!(b.row(0).d, &[0.0, 0.0]);
        assert!(b.row(0).qs.iter().all(|&q| q == 0));
    }
}
