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
            s: if with_s {
                vec![0.0; n / block]
            } else {
                Vec::new()
            },
            sums: if with_sums {
                vec![0; n / 16]
            } else {
                Vec::new()
            },
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
            Q8Row {
                qs: &self.qs[r * c..(r + 1) * c],
                d: &self.d[r * nb(QK)..(r + 1) * nb(QK)],
                s: &self.s[r * nb(QK)..(r + 1) * nb(QK)],
                sums: &[],
            }
        }
    }

    /// Quantises `x` (`cols` values) into row `r`.
    pub fn quantize_row(&mut self, r: usize, x: &[f32]) {
        let c = self.cols;
        let qs = &mut self.qs[r * c..(r + 1) * c];
        match self.kind {
            ActKind::Q8K => {
                let (nd, ns) = (c / QK_K, c / 16);
                quantize_k(
                    x,
                    qs,
                    &mut self.d[r * nd..(r + 1) * nd],
                    &mut self.sums[r * ns..(r + 1) * ns],
                );
            }
            ActKind::Q8B32 => {
                let nd = c / QK;
                quantize_b32(
                    x,
                    qs,
                    &mut self.d[r * nd..(r + 1) * nd],
                    &mut self.s[r * nd..(r + 1) * nd],
                );
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
    #[cfg(target_arch = "x86_64")]
    if crate::simd::Isa::detect_cached().has_avx2() {
        // SAFETY: AVX2 is available.
        unsafe { x86::quantize_b32(x, qs, d, s) };
        return;
    }
    quantize_b32_scalar(x, qs, d, s);
}

pub fn quantize_b32_scalar(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (((x, q), d), s) in x
        .chunks_exact(QK)
        .zip(qs.chunks_exact_mut(QK))
        .zip(d.iter_mut())
        .zip(s.iter_mut())
    {
        *d = quantize_block(x, q);
        *s = *d * q.iter().map(|&v| i32::from(v)).sum::<i32>() as f32;
    }
}

/// Q8K: per 256 values `d`, and the sum of every 16 quants.
pub fn quantize_k(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::Isa::detect_cached().has_avx2() {
        // SAFETY: AVX2 is available.
        unsafe { x86::quantize_k(x, qs, d, sums) };
        return;
    }
    quantize_k_scalar(x, qs, d, sums);
}

pub fn quantize_k_scalar(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i16]) {
    for ((x, q), d) in x
        .chunks_exact(QK_K)
        .zip(qs.chunks_exact_mut(QK_K))
        .zip(d.iter_mut())
    {
        *d = quantize_block(x, q);
    }
    for (s, q) in sums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| i16::from(v)).sum();
    }
}

/// The same quantisers with AVX2: the same f32 operations and rounding, so the same bytes.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{QK, QK_K};

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    }

    /// Quantises `x` (a multiple of 32 values) with one scale; returns the scale and, per 16
    /// values, the sum of the quants.
    #[inline(always)]
    unsafe fn block(x: &[f32], q: &mut [i8], sums16: &mut [i32]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut vmax = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())));
        }
        let m = _mm_max_ps(
            _mm256_castps256_ps128(vmax),
            _mm256_extractf128_ps::<1>(vmax),
        );
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        if amax == 0.0 {
            q.fill(0);
            sums16.fill(0);
            return 0.0;
        }
        let id = _mm256_set1_ps(127.0 / amax);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (i, (c, o)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
            let v: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr().add(8 * k)), id))
            });
            sums16[2 * i] = hsum_i32(_mm256_add_epi32(v[0], v[1]));
            sums16[2 * i + 1] = hsum_i32(_mm256_add_epi32(v[2], v[3]));
            let w = _mm256_packs_epi16(
                _mm256_packs_epi32(v[0], v[1]),
                _mm256_packs_epi32(v[2], v[3]),
            );
            _mm256_storeu_si256(
                o.as_mut_ptr() as *mut __m256i,
                _mm256_permutevar8x32_epi32(w, order),
            );
        }
        amax / 127.0
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_b32(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        let mut sums = [0i32; 2];
        for (((x, q), d), s) in x
            .chunks_exact(QK)
            .zip(qs.chunks_exact_mut(QK))
            .zip(d.iter_mut())
            .zip(s.iter_mut())
        {
            *d = block(x, q, &mut sums);
            *s = *d * (sums[0] + sums[1]) as f32;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_k(x: &[f32], qs: &mut [i8], d: &mut [f32], sums: &mut [i16]) {
        let mut s = [0i32; QK_K / 16];
        for (((x, q), d), out) in x
            .chunks_exact(QK_K)
            .zip(qs.chunks_exact_mut(QK_K))
            .zip(d.iter_mut())
            .zip(sums.chunks_exact_mut(QK_K / 16))
        {
            *d = block(x, q, &mut s);
            for (o, v) in out.iter_mut().zip(s) {
                *o = v as i16;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantised_values_are_within_half_a_step() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        for kind in [ActKind::Q8B32, ActKind::Q8K] {
            let mut b = Q8Buf::new(kind, 2, 512);
            b.quantize_row(1, &x);
            let r = b.row(1);
            let block = if kind == ActKind::Q8K { QK_K } else { QK };
            for (i, &v) in x.iter().enumerate() {
                let d = r.d[i / block];
                assert!(
                    (f32::from(r.qs[i]) * d - v).abs() <= d * 0.5 + 1e-7,
                    "{kind:?} {i}"
                );
            }
            if kind == ActKind::Q8K {
                assert_eq!(
                    r.sums[3],
                    r.qs[48..64].iter().map(|&q| i16::from(q)).sum::<i16>()
                );
            } else {
                let sum: i32 = r.qs[32..64].iter().map(|&q| i32::from(q)).sum();
                assert_eq!(r.s[1], r.d[1] * sum as f32);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn simd_quantisers_give_the_scalar_bytes(x in proptest::collection::vec(-50f32..50f32, 256..=256), zero_first in proptest::bool::ANY) {
            let mut x = x;
            if zero_first {
                x[..32].fill(0.0);
            }
            let (mut qa, mut qb) = (vec![0i8; 256], vec![0i8; 256]);
            let (mut da, mut db, mut sa, mut sb) = (vec![0f32; 8], vec![0f32; 8], vec![0f32; 8], vec![0f32; 8]);
            quantize_b32(&x, &mut qa, &mut da, &mut sa);
            quantize_b32_scalar(&x, &mut qb, &mut db, &mut sb);
            proptest::prop_assert_eq!((&qa, &da, &sa), (&qb, &db, &sb));
            let (mut ka, mut kb, mut dka, mut dkb) = (vec![0i16; 16], vec![0i16; 16], vec![0f32; 1], vec![0f32; 1]);
            quantize_k(&x, &mut qa, &mut dka, &mut ka);
            quantize_k_scalar(&x, &mut qb, &mut dkb, &mut kb);
            proptest::prop_assert_eq!((&qa, &dka, &ka), (&qb, &dkb, &kb));
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
