//! Elementwise math over f32 rows: exp (for softmax), SiLU and tanh-GELU gates, and the dot /
//! axpy of f32 queries with f16 or f32 cache rows. Scalar references and AVX2 versions; exp is
//! the same polynomial in both, so they agree bit for bit (f32 `mul_add` is the FMA).
//!
//! exp(x) = 2ⁿ · e^r with n = round(x / ln 2) and |r| ≤ ln 2 / 2; e^r by its Taylor series to
//! degree 7, whose truncation error (< 6e-9 relative) is below f32 rounding.

use half::f16;

use crate::simd::Isa;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n · LN2_HI` is exact for |n| < 2^8.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Below this exp underflows to 0; above `MAX` it overflows.
const MIN: f32 = -87.336_55;
const MAX: f32 = 88.376_26;
const TAYLOR: [f32; 8] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
];

pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < MIN {
        return 0.0;
    }
    let x = x.min(MAX);
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = TAYLOR[7];
    for c in TAYLOR[..7].iter().rev() {
        p = p.mul_add(r, *c);
    }
    // 2^n as two factors so that n = 128 (x near MAX) does not overflow the exponent field.
    let h = (n as i32) / 2;
    let pow = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    p * pow(h) * pow(n as i32 - h)
}

/// The gate activations over a row, in place: `g[i] = act(g[i]) * u[i]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Silu,
    GeluTanh,
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)

/// SiLU is `x / (1 + e^-x)`; tanh-GELU is `0.5 x (1 + tanh(y)) = x / (1 + e^(-2y))` with
/// `y = sqrt(2/pi) (x + 0.044715 x³)`, which has no cancellation near 0.
pub fn activate(act: Gate, x: f32) -> f32 {
    let z = match act {
        Gate::Silu => -x,
        Gate::GeluTanh => -2.0 * GELU_C * (x + 0.044715 * x * x * x),
    };
    x / (1.0 + exp(z))
}

/// `g = act(g) * u` (or just `act(g)` without `u`).
pub fn gate(isa: Isa, act: Gate, g: &mut [f32], u: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: Avx2 or better was detected.
        unsafe { x86::gate(act, g, u) };
        return;
    }
    let _ = isa;
    match u {
        Some(u) => g
            .iter_mut()
            .zip(u)
            .for_each(|(g, u)| *g = activate(act, *g) * u),
        None => g.iter_mut().for_each(|g| *g = activate(act, *g)),
    }
}

/// In-place softmax; returns the row's maximum and the sum of `exp(x - max)`, with which
/// softmaxes of parts of a row combine.
pub fn softmax(isa: Isa, x: &mut [f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: Avx2 or better was detected.
        return unsafe { x86::softmax(x) };
    }
    let _ = isa;
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = exp(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
    (max, sum)
}

/// A KV cache element: f32, or f16 (half the memory and bandwidth, 11 significant bits).
pub trait KvElem: Copy + Send + Sync + 'static {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// `dst[i] = from_f32(src[i])`, a row at a time (the cache writes of every token).
    fn from_f32_slice(dst: &mut [Self], src: &[f32]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &x)| *d = Self::from_f32(x));
    }
    /// Scores of `g` query heads (`q`: `g × hd`) against the keys at `k[j * stride..][..hd]` for
    /// `j < n`: `s[h * n + j] = scale · q_h · k_j`. Each key is read once for all the heads.
    #[allow(clippy::too_many_arguments)]
    fn scores(
        isa: Isa,
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[Self],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        let _ = isa;
        for h in 0..g {
            for j in 0..n {
                let kj = &k[j * stride..j * stride + hd];
                s[h * n + j] = scale
                    * q[h * hd..(h + 1) * hd]
                        .iter()
                        .zip(kj)
                        .map(|(a, b)| a * b.to_f32())
                        .sum::<f32>();
            }
        }
    }

    /// `out_h = Σ_j p[h * n + j] · v_j` for the `g` heads (`out`: `g × hd`), `v_j` at
    /// `v[j * stride..][..hd]`.
    #[allow(clippy::too_many_arguments)]
    fn mix(
        isa: Isa,
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[Self],
        stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        let _ = isa;
        out[..g * hd].fill(0.0);
        for h in 0..g {
            for j in 0..n {
                let w = p[h * n + j];
                out[h * hd..(h + 1) * hd]
                    .iter_mut()
                    .zip(&v[j * stride..j * stride + hd])
                    .for_each(|(o, v)| *o += w * v.to_f32());
            }
        }
    }
}

impl KvElem for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    #[cfg(target_arch = "x86_64")]
    fn scores(
        isa: Isa,
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[f32],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        if isa.has_avx2() && hd.is_multiple_of(8) && g <= x86::MAX_GROUP {
            // SAFETY: Avx2 or better was detected; the ranges are checked inside.
            unsafe { x86::scores_f32(q, g, hd, k, stride, n, scale, s) };
        } else {
            scalar_scores(q, g, hd, k, stride, n, scale, s);
        }
    }
    #[cfg(target_arch = "x86_64")]
    fn mix(
        isa: Isa,
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[f32],
        stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        if isa.has_avx2() && hd.is_multiple_of(8) && g <= x86::MAX_GROUP {
            // SAFETY: as above.
            unsafe { x86::mix_f32(p, g, hd, v, stride, n, out) };
        } else {
            scalar_mix(p, g, hd, v, stride, n, out);
        }
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn from_f32_slice(dst: &mut [Self], src: &[f32]) {
        // half converts slices with F16C where the CPU has it, eight values an instruction.
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
    #[cfg(target_arch = "x86_64")]
    fn scores(
        isa: Isa,
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[f16],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        if isa.has_avx2() && hd.is_multiple_of(8) && g <= x86::MAX_GROUP {
            // SAFETY: Avx2 or better was detected; the ranges are checked inside.
            unsafe { x86::scores_f16(q, g, hd, k, stride, n, scale, s) };
        } else {
            scalar_scores(q, g, hd, k, stride, n, scale, s);
        }
    }
    #[cfg(target_arch = "x86_64")]
    fn mix(
        isa: Isa,
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[f16],
        stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        if isa.has_avx2() && hd.is_multiple_of(8) && g <= x86::MAX_GROUP {
            // SAFETY: as above.
            unsafe { x86::mix_f16(p, g, hd, v, stride, n, out) };
        } else {
            scalar_mix(p, g, hd, v, stride, n, out);
        }
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// The trait's default `scores`, callable from the overriding impls.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
fn scalar_scores<E: KvElem>(
    q: &[f32],
    g: usize,
    hd: usize,
    k: &[E],
    stride: usize,
    n: usize,
    scale: f32,
    s: &mut [f32],
) {
    for h in 0..g {
        for j in 0..n {
            let kj = &k[j * stride..j * stride + hd];
            s[h * n + j] = scale
                * q[h * hd..(h + 1) * hd]
                    .iter()
                    .zip(kj)
                    .map(|(a, b)| a * b.to_f32())
                    .sum::<f32>();
        }
    }
}

/// The trait's default `mix`.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
fn scalar_mix<E: KvElem>(
    p: &[f32],
    g: usize,
    hd: usize,
    v: &[E],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    out[..g * hd].fill(0.0);
    for h in 0..g {
        for j in 0..n {
            let w = p[h * n + j];
            out[h * hd..(h + 1) * hd]
                .iter_mut()
                .zip(&v[j * stride..j * stride + hd])
                .for_each(|(o, v)| *o += w * v.to_f32());
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::*;

    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(MIN));
        let x = _mm256_min_ps(x, _mm256_set1_ps(MAX));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let neg = _mm256_sub_ps(_mm256_setzero_ps(), n);
        let r = _mm256_fmadd_ps(
            neg,
            _mm256_set1_ps(LN2_LO),
            _mm256_fmadd_ps(neg, _mm256_set1_ps(LN2_HI), x),
        );
        let mut p = _mm256_set1_ps(TAYLOR[7]);
        for c in TAYLOR[..7].iter().rev() {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let ni = _mm256_cvtps_epi32(n);
        // h = trunc(n / 2), as the scalar code's integer division.
        let h = _mm256_srai_epi32::<1>(_mm256_add_epi32(ni, _mm256_srli_epi32::<31>(ni)));
        let pow = |e: __m256i| {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                e,
                _mm256_set1_epi32(127),
            )))
        };
        let y = _mm256_mul_ps(_mm256_mul_ps(p, pow(h)), pow(_mm256_sub_epi32(ni, h)));
        let y = _mm256_andnot_ps(under, y);
        _mm256_blendv_ps(y, x, nan)
    }

    /// Scalar tail of a vector loop: the scalar path gives the same bits.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gate(act: Gate, g: &mut [f32], u: Option<&[f32]>) {
        let n8 = g.len() / 8 * 8;
        let p = g.as_mut_ptr();
        for i in (0..n8).step_by(8) {
            let x = _mm256_loadu_ps(p.add(i));
            let z = match act {
                Gate::Silu => _mm256_sub_ps(_mm256_setzero_ps(), x),
                Gate::GeluTanh => {
                    let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                    let inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(0.044715), x3));
                    _mm256_mul_ps(_mm256_set1_ps(-2.0 * GELU_C), inner)
                }
            };
            let mut y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), exp8(z)));
            if let Some(u) = u {
                y = _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr().add(i)));
            }
            _mm256_storeu_ps(p.add(i), y);
        }
        for i in n8..g.len() {
            g[i] = activate(act, g[i]) * u.map_or(1.0, |u| u[i]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax(x: &mut [f32]) -> (f32, f32) {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..n8).step_by(8) {
            vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(p.add(i)));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
        let max = lanes
            .iter()
            .chain(&x[n8..])
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let vm = _mm256_set1_ps(max);
        let mut vsum = _mm256_setzero_ps();
        for i in (0..n8).step_by(8) {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vm));
            _mm256_storeu_ps(p.add(i), e);
            vsum = _mm256_add_ps(vsum, e);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), vsum);
        let mut sum: f32 = lanes.iter().sum();
        for v in &mut x[n8..] {
            *v = exp(*v - max);
            sum += *v;
        }
        let inv = _mm256_set1_ps(1.0 / sum);
        for i in (0..n8).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
        }
        for v in &mut x[n8..] {
            *v *= 1.0 / sum;
        }
        (max, sum)
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The most query heads per KV head the vector attention takes (larger groups use scalar).
    pub const MAX_GROUP: usize = 8;

    /// Groups this small take two keys (scores) or two column blocks (mix) per step: one FMA
    /// chain per head leaves the FMA units half idle waiting on the chain's latency, and two
    /// per head still fit the sixteen registers.
    const PAIR_GROUP: usize = MAX_GROUP / 2;

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores<E>(
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[E],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
        load: impl Fn(*const E) -> __m256,
    ) {
        assert!(
            q.len() >= g * hd && s.len() >= g * n && (n == 0 || k.len() >= (n - 1) * stride + hd)
        );
        let mut j = 0;
        if g <= PAIR_GROUP {
            while j + 2 <= n {
                scores_of::<E, 2, PAIR_GROUP>(q, g, hd, k, stride, n, j, scale, s, &load);
                j += 2;
            }
        }
        for j in j..n {
            scores_of::<E, 1, MAX_GROUP>(q, g, hd, k, stride, n, j, scale, s, &load);
        }
    }

    /// The scores of keys `j..j + K` for `g ≤ G` heads.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_of<E, const K: usize, const G: usize>(
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[E],
        stride: usize,
        n: usize,
        j: usize,
        scale: f32,
        s: &mut [f32],
        load: &impl Fn(*const E) -> __m256,
    ) {
        let kj: [*const E; K] = std::array::from_fn(|c| k.as_ptr().add((j + c) * stride));
        let mut acc = [[_mm256_setzero_ps(); G]; K];
        for i in (0..hd).step_by(8) {
            let k8: [__m256; K] = std::array::from_fn(|c| load(kj[c].add(i)));
            for h in (0..G).take(g) {
                let qh = _mm256_loadu_ps(q.as_ptr().add(h * hd + i));
                for c in 0..K {
                    acc[c][h] = _mm256_fmadd_ps(qh, k8[c], acc[c][h]);
                }
            }
        }
        for (c, a) in acc.iter().enumerate() {
            for (h, a) in a.iter().enumerate().take(g) {
                s[h * n + j + c] = scale * hsum(*a);
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mix<E>(
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[E],
        stride: usize,
        n: usize,
        out: &mut [f32],
        load: impl Fn(*const E) -> __m256,
    ) {
        assert!(
            p.len() >= g * n && out.len() >= g * hd && (n == 0 || v.len() >= (n - 1) * stride + hd)
        );
        let mut i = 0;
        if g <= PAIR_GROUP {
            while i + 16 <= hd {
                mix_of::<E, 2, PAIR_GROUP>(p, g, hd, v, stride, n, i, out, &load);
                i += 16;
            }
        }
        for i in (i..hd).step_by(8) {
            mix_of::<E, 1, MAX_GROUP>(p, g, hd, v, stride, n, i, out, &load);
        }
    }

    /// Columns `i..i + 8C` of the mix for `g ≤ G` heads.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn mix_of<E, const C: usize, const G: usize>(
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[E],
        stride: usize,
        n: usize,
        i: usize,
        out: &mut [f32],
        load: &impl Fn(*const E) -> __m256,
    ) {
        let mut acc = [[_mm256_setzero_ps(); G]; C];
        for j in 0..n {
            let vj = v.as_ptr().add(j * stride + i);
            let v8: [__m256; C] = std::array::from_fn(|c| load(vj.add(8 * c)));
            for h in (0..G).take(g) {
                let ph = _mm256_set1_ps(*p.get_unchecked(h * n + j));
                for c in 0..C {
                    acc[c][h] = _mm256_fmadd_ps(ph, v8[c], acc[c][h]);
                }
            }
        }
        for (c, a) in acc.iter().enumerate() {
            for (h, a) in a.iter().enumerate().take(g) {
                _mm256_storeu_ps(out.as_mut_ptr().add(h * hd + i + 8 * c), *a);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores_f16(
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[f16],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        scores(q, g, hd, k, stride, n, scale, s, |p| {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        })
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scores_f32(
        q: &[f32],
        g: usize,
        hd: usize,
        k: &[f32],
        stride: usize,
        n: usize,
        scale: f32,
        s: &mut [f32],
    ) {
        scores(q, g, hd, k, stride, n, scale, s, |p| _mm256_loadu_ps(p))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mix_f16(
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[f16],
        stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        mix(p, g, hd, v, stride, n, out, |x| {
            _mm256_cvtph_ps(_mm_loadu_si128(x as *const __m128i))
        })
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn mix_f32(
        p: &[f32],
        g: usize,
        hd: usize,
        v: &[f32],
        stride: usize,
        n: usize,
        out: &mut [f32],
    ) {
        mix(p, g, hd, v, stride, n, out, |x| _mm256_loadu_ps(x))
    }

    /// For the tests: exp over eight lanes.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_lanes(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), exp8(_mm256_loadu_ps(x.as_ptr())));
        out
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn f16_rows_convert_like_single_values() {
        // Odd length: the vector body and the tail; values that round, overflow and underflow.
        let src: Vec<f32> = (0..37)
            .map(|i| (i as f32 - 18.0) * 0.1003 * 10f32.powi(i % 7 - 3))
            .chain([70000.0, -1e-9, 65519.0, f32::NAN])
            .collect();
        let mut row = vec![f16::ZERO; src.len()];
        f16::from_f32_slice(&mut row, &src);
        for (r, &x) in row.iter().zip(&src) {
            assert_eq!(r.to_bits(), f16::from_f32(x).to_bits(), "{x}");
        }
    }

    #[test]
    fn exp_is_accurate_and_handles_the_ends() {
        for i in -1990..2020 {
            let x = i as f32 * 0.0437;
            let (got, want) = (exp(x), (x as f64).exp());
            assert!(
                ((got as f64 - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(88.3).is_finite());
    }

    #[cfg(target_arch = "x86_64")]
    proptest! {
        #[test]
        fn simd_exp_matches_scalar_bitwise(x in prop::array::uniform8(-100f32..100f32)) {
            prop_assume!(Isa::available().contains(&Isa::Avx2));
            // SAFETY: Avx2 is available.
            let got = unsafe { x86::exp_lanes(x) };
            for (g, v) in got.iter().zip(x) {
                prop_assert_eq!(g.to_bits(), exp(v).to_bits(), "exp({})", v);
            }
        }

        #[test]
        fn simd_gate_and_softmax_match_scalar(v in prop::collection::vec(-30f32..30f32, 1..70), silu in any::<bool>()) {
            let act = if silu { Gate::Silu } else { Gate::GeluTanh };
            let u: Vec<f32> = v.iter().map(|x| x * 0.5 - 1.0).collect();
            for isa in Isa::available() {
                let mut a = v.clone();
                gate(isa, act, &mut a, Some(&u));
                let mut b = v.clone();
                gate(Isa::Scalar, act, &mut b, Some(&u));
                for (x, y) in a.iter().zip(&b) {
                    prop_assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{:?} gate {} vs {}", isa, x, y);
                }
                let mut a = v.clone();
                let (ma, sa) = softmax(isa, &mut a);
                let mut b = v.clone();
                let (mb, sb) = softmax(Isa::Scalar, &mut b);
                for (x, y) in a.iter().zip(&b) {
                    prop_assert!((x - y).abs() <= 1e-6, "{:?} softmax {} vs {}", isa, x, y);
                }
                prop_assert_eq!(ma, mb);
                prop_assert!((sa - sb).abs() <= 1e-5 * sb, "{:?} softmax sum {} vs {}", isa, sa, sb);
            }
        }

        #[test]
        fn simd_attention_scores_and_mix_match_scalar(seed in any::<u64>(), g in 1usize..6, hd8 in 1usize..10, n in 1usize..40) {
            let hd = 8 * hd8;
            let stride = hd * 2 + 8;
            let mut x = seed | 1;
            let mut rnd = move || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0 };
            let q: Vec<f32> = (0..g * hd).map(|_| rnd() * 3.0).collect();
            let k16: Vec<f16> = (0..n * stride).map(|_| f16::from_f32(rnd())).collect();
            let k32: Vec<f32> = k16.iter().map(|v| v.to_f32()).collect();
            let mut want = vec![0f32; g * n];
            scalar_scores(&q, g, hd, &k32, stride, n, 0.125, &mut want);
            let mut wmix = vec![0f32; g * hd];
            scalar_mix(&want, g, hd, &k32, stride, n, &mut wmix);
            for isa in Isa::available() {
                let (mut a, mut b) = (vec![0f32; g * n], vec![0f32; g * n]);
                f16::scores(isa, &q, g, hd, &k16, stride, n, 0.125, &mut a);
                f32::scores(isa, &q, g, hd, &k32, stride, n, 0.125, &mut b);
                for ((a, b), w) in a.iter().zip(&b).zip(&want) {
                    prop_assert!((a - w).abs() <= 1e-5 * (hd as f32) && (b - w).abs() <= 1e-5 * (hd as f32), "{:?}: {} {} vs {}", isa, a, b, w);
                }
                let (mut ma, mut mb) = (vec![0f32; g * hd], vec![0f32; g * hd]);
                f16::mix(isa, &want, g, hd, &k16, stride, n, &mut ma);
                f32::mix(isa, &want, g, hd, &k32, stride, n, &mut mb);
                for ((a, b), w) in ma.iter().zip(&mb).zip(&wmix) {
                    prop_assert!((a - w).abs() <= 1e-5 * (n as f32) && (b - w).abs() <= 1e-5 * (n as f32), "{:?} mix: {} {} vs {}", isa, a, b, w);
                }
            }
        }
    }
}
