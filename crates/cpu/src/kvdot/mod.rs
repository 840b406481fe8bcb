//! The two products of attention with the cache, for every [`KvBlock`] format: scores (queries
//! dotted with key rows) and the mix (value rows weighted by the probabilities). One scalar
//! reference, an AVX2 loop over the format's eight-value loads and an AVX-512 one over its
//! sixteen-value loads, tested against each other.

use crate::kvblock::KvBlock;
use crate::simd::Isa;

#[cfg(target_arch = "x86_64")]
mod avx512;

/// Scores of `g` query heads (`q`: `g × hd`) against the keys whose rows start at
/// `k[j * stride..]` (`stride` in blocks) for `j < n`: `s[h * n + j] = scale · q_h · k_j`.
/// Each key is read once for all the heads.
#[allow(clippy::too_many_arguments)]
pub fn scores<B: KvBlock>(
    isa: Isa,
    q: &[f32],
    g: usize,
    hd: usize,
    k: &[B],
    stride: usize,
    n: usize,
    scale: f32,
    s: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && hd.is_multiple_of(16) && g <= avx512::MAX_GROUP {
        // SAFETY: AVX-512 (with AVX2, FMA, F16C) was detected; the ranges are checked inside.
        unsafe { avx512::scores::<B>(q, g, hd, k, stride, n, scale, s) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && hd.is_multiple_of(8) && g <= x86::MAX_GROUP {
        // SAFETY: Avx2 or better (with F16C) was detected; the ranges are checked inside.
        unsafe { x86::scores::<B>(q, g, hd, k, stride, n, scale, s) };
        return;
    }
    let _ = isa;
    scalar_scores(q, g, hd, k, stride, n, scale, s);
}

/// `out_h += Σ_j p[h * n + j] · v_j` for the `g` heads (`out`: `g × hd`), the row of `v_j`
/// starting at `v[j * stride..]` (`stride` in blocks), `j` in order.
#[allow(clippy::too_many_arguments)]
pub fn mix<B: KvBlock>(
    isa: Isa,
    p: &[f32],
    g: usize,
    hd: usize,
    v: &[B],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && hd.is_multiple_of(16) && g <= avx512::MAX_GROUP {
        // SAFETY: as in `scores`.
        unsafe { avx512::mix::<B>(p, g, hd, v, stride, n, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && hd.is_multiple_of(8) && g <= x86::MAX_GROUP {
        // SAFETY: as in `scores`.
        unsafe { x86::mix::<B>(p, g, hd, v, stride, n, out) };
        return;
    }
    let _ = isa;
    scalar_mix(p, g, hd, v, stride, n, out);
}

/// Rows `j < n` of `hd` values (row `j` starting at `k[j * stride..]`) as f32 into `out`
/// (`n × hd`), exactly the values the products read from them.
pub fn to_f32<B: KvBlock>(isa: Isa, k: &[B], stride: usize, n: usize, hd: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && hd.is_multiple_of(16) {
        // SAFETY: as in `scores`.
        unsafe { avx512::to_f32::<B>(k, stride, n, hd, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && hd.is_multiple_of(8) {
        // SAFETY: as in `scores`.
        unsafe { x86::to_f32::<B>(k, stride, n, hd, out) };
        return;
    }
    let _ = isa;
    for (j, o) in out[..n * hd].chunks_exact_mut(hd).enumerate() {
        B::dequantize(&k[j * stride..], o);
    }
}

/// The reference of [`scores`].
#[allow(clippy::too_many_arguments)]
pub fn scalar_scores<B: KvBlock>(
    q: &[f32],
    g: usize,
    hd: usize,
    k: &[B],
    stride: usize,
    n: usize,
    scale: f32,
    s: &mut [f32],
) {
    for h in 0..g {
        for j in 0..n {
            let kj = &k[j * stride..];
            s[h * n + j] = scale
                * q[h * hd..(h + 1) * hd]
                    .iter()
                    .enumerate()
                    .map(|(i, a)| a * B::value(kj, i))
                    .sum::<f32>();
        }
    }
}

/// The reference of [`mix`].
#[allow(clippy::too_many_arguments)]
pub fn scalar_mix<B: KvBlock>(
    p: &[f32],
    g: usize,
    hd: usize,
    v: &[B],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    for h in 0..g {
        for j in 0..n {
            let (w, vj) = (p[h * n + j], &v[j * stride..]);
            out[h * hd..(h + 1) * hd]
                .iter_mut()
                .enumerate()
                .for_each(|(i, o)| *o += w * B::value(vj, i));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::KvBlock;

    /// The sums of the lanes of each of `a`'s eight vectors, as one vector: lane `l` holds the
    /// sum of `a[SUMS_OF[l]]`. Each sum is `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`,
    /// the order of a lone horizontal sum (extract the high half, add, `movehl`, `movehdup`), so
    /// a score's bits do not depend on which vector of the eight it was accumulated in.
    #[inline(always)]
    unsafe fn sums(a: &[__m256; 8]) -> __m256 {
        // v_i + v_{i+4}: two vectors' four partial sums per vector.
        let c: [__m256; 4] = std::array::from_fn(|k| {
            let (x, y) = (a[2 * k], a[2 * k + 1]);
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(x, y),
                _mm256_permute2f128_ps::<0x31>(x, y),
            )
        });
        // (p0 + p2, p1 + p3) of each.
        let d: [__m256; 2] = std::array::from_fn(|k| {
            let (x, y) = (c[2 * k], c[2 * k + 1]);
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
            )
        });
        // The last pair.
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(d[0], d[1]),
            _mm256_shuffle_ps::<0b11_01_11_01>(d[0], d[1]),
        )
    }

    /// Which of [`sums`]' vectors each of its lanes sums.
    const SUMS_OF: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

    /// The most query heads per KV head the vector attention takes (larger groups use scalar).
    pub const MAX_GROUP: usize = 8;

    /// Groups this small take two keys (scores) or two column blocks (mix) per step: one FMA
    /// chain per head leaves the FMA units half idle waiting on the chain's latency, and two
    /// per head still fit the sixteen registers.
    const PAIR_GROUP: usize = MAX_GROUP / 2;
    /// Groups this small take four keys per step of the scores.
    const QUAD_GROUP: usize = MAX_GROUP / 4;

    /// The blocks a run of `n` rows of `hd` values `stride` blocks apart spans.
    fn span<B: KvBlock>(n: usize, stride: usize, hd: usize) -> usize {
        if n == 0 {
            0
        } else {
            (n - 1) * stride + hd.div_ceil(B::N)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores<B: KvBlock>(
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[B],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        assert!(q.len() >= g * hd && s.len() >= g * n && k.len() >= span::<B>(n, stride, hd));
        let mut j = 0;
        if g <= QUAD_GROUP {
            while j + 4 <= n {
                scores_of::<B, 4, QUAD_GROUP>(q, g, hd, k, stride, n, j, scale, s);
                j += 4;
            }
        } else if g <= PAIR_GROUP {
            while j + 2 <= n {
                scores_of::<B, 2, PAIR_GROUP>(q, g, hd, k, stride, n, j, scale, s);
                j += 2;
            }
        }
        for j in j..n {
            scores_of::<B, 1, MAX_GROUP>(q, g, hd, k, stride, n, j, scale, s);
        }
    }

    /// The scores of keys `j..j + K` for `g ≤ G` heads (`K · G = 8`): key `c` of head `h`
    /// accumulates in vector `c · G + h`, and one [`sums`] tree sums all eight.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_of<B: KvBlock, const K: usize, const G: usize>(
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[B],
        stride: usize,
        n: usize,
        j: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        debug_assert!(K * G == 8);
        let kj: [*const B; K] = std::array::from_fn(|c| k.as_ptr().add((j + c) * stride));
        let mut acc = [_mm256_setzero_ps(); 8];
        for i in (0..hd).step_by(8) {
            let k8: [__m256; K] = std::array::from_fn(|c| B::load8(kj[c], i));
            for h in (0..G).take(g) {
                let qh = _mm256_loadu_ps(q.as_ptr().add(h * hd + i));
                for c in 0..K {
                    acc[c * G + h] = _mm256_fmadd_ps(qh, k8[c], acc[c * G + h]);
                }
            }
        }
        let mut out = [0f32; 8];
        _mm256_storeu_ps(
            out.as_mut_ptr(),
            _mm256_mul_ps(_mm256_set1_ps(scale), sums(&acc)),
        );
        for (l, &v) in SUMS_OF.iter().enumerate() {
            let (c, h) = (v / G, v % G);
            if h < g {
                *s.get_unchecked_mut(h * n + j + c) = out[l];
            }
        }
    }

    /// As [`super::to_f32`]; `hd` a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn to_f32<B: KvBlock>(k: &[B], stride: usize, n: usize, hd: usize, out: &mut [f32]) {
        assert!(k.len() >= span::<B>(n, stride, hd) && out.len() >= n * hd);
        let o = out.as_mut_ptr();
        for j in 0..n {
            let row = k.as_ptr().add(j * stride);
            for i in (0..hd).step_by(8) {
                _mm256_storeu_ps(o.add(j * hd + i), B::load8(row, i));
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mix<B: KvBlock>(
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[B],
        stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        assert!(p.len() >= g * n && out.len() >= g * hd && v.len() >= span::<B>(n, stride, hd));
        // Eight FMA chains or more where the group allows: fewer leave the units waiting on
        // a chain's latency. Each column's chain is the same whatever the step takes with it.
        let mut i = 0;
        match g {
            1..=2 => {
                while i + 32 <= hd {
                    mix_of::<B, 4, 2>(p, g, hd, v, stride, n, i, out);
                    i += 32;
                }
            }
            3 => {
                while i + 32 <= hd {
                    mix_of::<B, 4, 3>(p, g, hd, v, stride, n, i, out);
                    i += 32;
                }
            }
            4 => {
                while i + 16 <= hd {
                    mix_of::<B, 2, PAIR_GROUP>(p, g, hd, v, stride, n, i, out);
                    i += 16;
                }
            }
            _ => {}
        }
        for i in (i..hd).step_by(8) {
            mix_of::<B, 1, MAX_GROUP>(p, g, hd, v, stride, n, i, out);
        }
    }

    /// Columns `i..i + 8C` of the mix for `g ≤ G` heads.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn mix_of<B: KvBlock, const C: usize, const G: usize>(
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[B],
        stride: usize,
        n: usize,
        i: usize,
        out: &mut [f32],
    ) {
        let o = out.as_mut_ptr();
        let mut acc = [[_mm256_setzero_ps(); G]; C];
        for (c, a) in acc.iter_mut().enumerate() {
            for (h, a) in a.iter_mut().enumerate().take(g) {
                *a = _mm256_loadu_ps(o.add(h * hd + i + 8 * c));
            }
        }
        for j in 0..n {
            let vj = v.as_ptr().add(j * stride);
            if C > G {
                // More column blocks than heads: the heads' weights stay in registers while
                // the blocks are loaded one at a time (12 accumulators fit beside them).
                let ph: [__m256; G] =
                    std::array::from_fn(|h| _mm256_set1_ps(*p.get_unchecked(h.min(g - 1) * n + j)));
                for (c, a) in acc.iter_mut().enumerate() {
                    let v8 = B::load8(vj, i + 8 * c);
                    for h in (0..G).take(g) {
                        a[h] = _mm256_fmadd_ps(ph[h], v8, a[h]);
                    }
                }
            } else {
                let v8: [__m256; C] = std::array::from_fn(|c| B::load8(vj, i + 8 * c));
                for h in (0..G).take(g) {
                    let ph = _mm256_set1_ps(*p.get_unchecked(h * n + j));
                    for c in 0..C {
                        acc[c][h] = _mm256_fmadd_ps(ph, v8[c], acc[c][h]);
                    }
                }
            }
        }
        for (c, a) in acc.iter().enumerate() {
            for (h, a) in a.iter().enumerate().take(g) {
                _mm256_storeu_ps(o.add(h * hd + i + 8 * c), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use proptest::prelude::*;

    use super::*;
    use crate::kvblock::{BlockQ4_0, BlockQ8_0};

    /// The rows of `x` (`n` rows of `stride` blocks) in format `B`.
    fn rows<B: KvBlock>(x: &[f32]) -> Vec<B> {
        let mut r = vec![B::ZERO; x.len() / B::N];
        B::quantize(&mut r, x);
        r
    }

    /// Every ISA's scores and mix over `B` against the scalar reference over the same rows.
    #[allow(clippy::too_many_arguments)]
    fn check<B: KvBlock>(
        q: &[f32],
        g: usize,
        hd: usize,
        x: &[f32],
        stride_values: usize,
        n: usize,
    ) -> Result<(), TestCaseError> {
        let (r, stride) = (rows::<B>(x), stride_values / B::N);
        let mut want = vec![0f32; g * n];
        scalar_scores(q, g, hd, &r, stride, n, 0.125, &mut want);
        let mut wmix = vec![0f32; g * hd];
        scalar_mix(&want, g, hd, &r, stride, n, &mut wmix);
        let mut wf32 = vec![0f32; n * hd];
        for (j, o) in wf32.chunks_exact_mut(hd).enumerate() {
            B::dequantize(&r[j * stride..], o);
        }
        for isa in Isa::available() {
            let mut f = vec![0f32; n * hd];
            to_f32(isa, &r, stride, n, hd, &mut f);
            prop_assert!(
                f.iter().zip(&wf32).all(|(a, w)| a.to_bits() == w.to_bits()),
                "{:?} to_f32",
                isa
            );
            let mut s = vec![0f32; g * n];
            scores(isa, q, g, hd, &r, stride, n, 0.125, &mut s);
            for (a, w) in s.iter().zip(&want) {
                prop_assert!(
                    (a - w).abs() <= 1e-5 * hd as f32 * w.abs().max(1.0),
                    "{:?}: {} vs {}",
                    isa,
                    a,
                    w
                );
            }
            // A score's bits are its query's and key's alone: key by key, the same bits as
            // in a run of any length (so decode and prefill agree).
            for j in 0..n {
                let mut one = vec![0f32; g];
                scores(isa, q, g, hd, &r[j * stride..], stride, 1, 0.125, &mut one);
                for h in 0..g {
                    prop_assert_eq!(
                        one[h].to_bits(),
                        s[h * n + j].to_bits(),
                        "{:?} key {} head {}",
                        isa,
                        j,
                        h
                    );
                }
            }
            let mut m = vec![0f32; g * hd];
            mix(isa, &want, g, hd, &r, stride, n, &mut m);
            for (a, w) in m.iter().zip(&wmix) {
                prop_assert!(
                    (a - w).abs() <= 1e-5 * n as f32 * w.abs().max(1.0),
                    "{:?} mix: {} vs {}",
                    isa,
                    a,
                    w
                );
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn simd_attention_scores_and_mix_match_scalar(seed in any::<u64>(), g in 1usize..18, hd32 in 1usize..9, n in 1usize..40) {
            let hd = 32 * hd32;
            let stride = hd * 2 + 32;
            let mut x = seed | 1;
            let mut rnd = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0 };
            let q: Vec<f32> = (0..g * hd).map(|_| rnd() * 3.0).collect();
            let k: Vec<f32> = (0..n * stride).map(|_| rnd()).collect();
            check::<f32>(&q, g, hd, &k, stride, n)?;
            check::<f16>(&q, g, hd, &k, stride, n)?;
            check::<BlockQ8_0>(&q, g, hd, &k, stride, n)?;
            check::<BlockQ4_0>(&q, g, hd, &k, stride, n)?;
        }
    }
}
