//! Elementwise math over f32 rows: exp (for softmax), SiLU and tanh-GELU gates. Scalar
//! references and AVX2 versions (exp also sixteen lanes wide for AVX-512's softmax); exp is the
//! same polynomial in all, so they agree bit for bit (f32 `mul_add` is the FMA).
//!
//! exp(x) = 2ⁿ · e^r with n = round(x / ln 2) and |r| ≤ ln 2 / 2; e^r by its Taylor series to
//! degree 7, whose truncation error (< 6e-9 relative) is below f32 rounding.

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
        // SAFETY: Avx2 or better was detected (AVX-512 where `isa` says so).
        return unsafe { x86::softmax(x, isa == Isa::Avx512) };
    }
    let _ = isa;
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_shift(isa, x, max);
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
    (max, sum)
}

/// `x[i] = exp(x[i] - m)` in place; returns their sum (softmax before its normalisation).
pub fn exp_shift(isa: Isa, x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: AVX-512 was detected.
        return unsafe { x86::exp_shift16(x, m) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: Avx2 or better was detected.
        return unsafe { x86::exp_shift(x, m) };
    }
    let _ = isa;
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = exp(*v - m);
        sum += *v;
    }
    sum
}

/// The largest of `x` (-inf for none).
pub fn max(isa: Isa, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: Avx2 or better was detected.
        return unsafe { x86::max(x) };
    }
    let _ = isa;
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        exp8_of::<true>(x)
    }

    /// [`exp8`]; `ANY`: of any input, else of inputs at most 0 (or NaN) only, such as a
    /// softmax's shifted scores. There `n ≥ -126` where the result is not flushed to 0 (below
    /// `MIN`), so `2^n` is one normal float: `p · 2^n` rounds once, as `p · 2^h · 2^(n-h)` does
    /// (its first product is exact) — the same bits without the split or the clamp at `MAX`.
    #[inline(always)]
    unsafe fn exp8_of<const ANY: bool>(x: __m256) -> __m256 {
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(MIN));
        let x = if ANY {
            _mm256_min_ps(x, _mm256_set1_ps(MAX))
        } else {
            x
        };
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
        let pow = |e: __m256i| {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                e,
                _mm256_set1_epi32(127),
            )))
        };
        let y = if ANY {
            // h = trunc(n / 2), as the scalar code's integer division.
            let h = _mm256_srai_epi32::<1>(_mm256_add_epi32(ni, _mm256_srli_epi32::<31>(ni)));
            _mm256_mul_ps(_mm256_mul_ps(p, pow(h)), pow(_mm256_sub_epi32(ni, h)))
        } else {
            _mm256_mul_ps(p, pow(ni))
        };
        let y = _mm256_andnot_ps(under, y);
        _mm256_blendv_ps(y, x, nan)
    }

    /// [`exp8`] over sixteen lanes: the same operations, the same bits.
    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(MIN));
        let x = _mm512_min_ps(x, _mm512_set1_ps(MAX));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let neg = _mm512_sub_ps(_mm512_setzero_ps(), n);
        let r = _mm512_fmadd_ps(
            neg,
            _mm512_set1_ps(LN2_LO),
            _mm512_fmadd_ps(neg, _mm512_set1_ps(LN2_HI), x),
        );
        let mut p = _mm512_set1_ps(TAYLOR[7]);
        for c in TAYLOR[..7].iter().rev() {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let ni = _mm512_cvtps_epi32(n);
        let h = _mm512_srai_epi32::<1>(_mm512_add_epi32(ni, _mm512_srli_epi32::<31>(ni)));
        let pow = |e: __m512i| {
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                e,
                _mm512_set1_epi32(127),
            )))
        };
        let y = _mm512_mul_ps(_mm512_mul_ps(p, pow(h)), pow(_mm512_sub_epi32(ni, h)));
        let y = _mm512_maskz_mov_ps(!under, y);
        _mm512_mask_blend_ps(nan, y, x)
    }

    /// [`exp_shift`] with [`exp16`]: the sum still runs over eight lanes in [`exp_shift`]'s
    /// order, so the two give the same bits.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn exp_shift16(x: &mut [f32], m: f32) -> f32 {
        let n16 = x.len() / 16 * 16;
        let p = x.as_mut_ptr();
        let vm = _mm512_set1_ps(m);
        let mut vsum = _mm256_setzero_ps();
        for i in (0..n16).step_by(16) {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), vm));
            _mm512_storeu_ps(p.add(i), e);
            vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
            vsum = _mm256_add_ps(vsum, _mm512_extractf32x8_ps::<1>(e));
        }
        let n8 = x.len() / 8 * 8;
        if n16 < n8 {
            let e = exp8(_mm256_sub_ps(
                _mm256_loadu_ps(p.add(n16)),
                _mm256_set1_ps(m),
            ));
            _mm256_storeu_ps(p.add(n16), e);
            vsum = _mm256_add_ps(vsum, e);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), vsum);
        let mut sum: f32 = lanes.iter().sum();
        for v in &mut x[n8..] {
            *v = exp(*v - m);
            sum += *v;
        }
        sum
    }

    /// For the tests: exp over sixteen lanes.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn exp_lanes16(x: [f32; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        _mm512_storeu_ps(out.as_mut_ptr(), exp16(_mm512_loadu_ps(x.as_ptr())));
        out
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
    pub unsafe fn max(x: &[f32]) -> f32 {
        let n8 = x.len() / 8 * 8;
        let p = x.as_ptr();
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..n8).step_by(8) {
            vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(p.add(i)));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
        lanes
            .iter()
            .chain(&x[n8..])
            .copied()
            .fold(f32::NEG_INFINITY, f32::max)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_shift(x: &mut [f32], m: f32) -> f32 {
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let vm = _mm256_set1_ps(m);
        let mut vsum = _mm256_setzero_ps();
        for i in (0..n8).step_by(8) {
            let d = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vm);
            // A softmax's `m` is the maximum: every lane at most 0, the short form.
            let above = _mm256_cmp_ps::<_CMP_GT_OQ>(d, _mm256_setzero_ps());
            let e = if _mm256_movemask_ps(above) == 0 {
                exp8_of::<false>(d)
            } else {
                exp8(d)
            };
            _mm256_storeu_ps(p.add(i), e);
            vsum = _mm256_add_ps(vsum, e);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), vsum);
        let mut sum: f32 = lanes.iter().sum();
        for v in &mut x[n8..] {
            *v = exp(*v - m);
            sum += *v;
        }
        sum
    }

    /// `wide`: the CPU has AVX-512 (the same bits either way).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax(x: &mut [f32], wide: bool) -> (f32, f32) {
        let max = max(x);
        let sum = if wide {
            exp_shift16(x, max)
        } else {
            exp_shift(x, max)
        };
        let n8 = x.len() / 8 * 8;
        let p = x.as_mut_ptr();
        let inv = _mm256_set1_ps(1.0 / sum);
        for i in (0..n8).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
        }
        for v in &mut x[n8..] {
            *v *= 1.0 / sum;
        }
        (max, sum)
    }

    /// For the tests: exp over eight lanes.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_lanes(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), exp8(_mm256_loadu_ps(x.as_ptr())));
        out
    }

    /// For the tests: the short form of exp over eight lanes at most 0.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_lanes_nonpositive(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0f32; 8];
        _mm256_storeu_ps(
            out.as_mut_ptr(),
            exp8_of::<false>(_mm256_loadu_ps(x.as_ptr())),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    use proptest::prelude::*;

    use super::*;

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

    /// The short form of the SIMD exp (inputs at most 0, a softmax's) against the scalar exp,
    /// bit for bit: a sweep of the negative floats down to -110 by their bit patterns (every
    /// 997th), the ends around `MIN` where results turn subnormal and then 0, and the specials.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_short_exp_matches_scalar_over_the_nonpositive_floats() {
        if !Isa::available().contains(&Isa::Avx2) {
            eprintln!("skipped: this CPU has no AVX2, the short exp is its form");
            return;
        }
        let end = (-110f32).to_bits();
        let mut xs: Vec<f32> = ((-0f32).to_bits()..end)
            .step_by(997)
            .map(f32::from_bits)
            .collect();
        let near =
            |v: f32| (-40..=40).map(move |k| f32::from_bits((v.to_bits() as i64 + k) as u32));
        xs.extend(
            near(MIN)
                .chain(near(-87.0))
                .chain(near(-0.5 * std::f32::consts::LN_2)),
        );
        xs.extend([
            0.0,
            -0.0,
            -1e-30,
            -1e-45,
            -103.9,
            -104.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        xs.retain(|v| v.is_nan() || *v <= 0.0);
        while !xs.len().is_multiple_of(8) {
            xs.push(-1.0);
        }
        for chunk in xs.chunks_exact(8) {
            let x: [f32; 8] = chunk.try_into().expect("eight lanes");
            // SAFETY: Avx2 is available.
            let got = unsafe { x86::exp_lanes_nonpositive(x) };
            for (g, v) in got.iter().zip(x) {
                assert_eq!(g.to_bits(), exp(v).to_bits(), "exp({v:e})");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    proptest! {
        #[test]
        fn the_short_exp_of_nonpositive_inputs_matches_scalar_bitwise(x in prop::array::uniform8(-110f32..=0f32)) {
            prop_assume!(Isa::available().contains(&Isa::Avx2));
            // SAFETY: Avx2 is available.
            let got = unsafe { x86::exp_lanes_nonpositive(x) };
            for (g, v) in got.iter().zip(x) {
                prop_assert_eq!(g.to_bits(), exp(v).to_bits(), "exp({})", v);
            }
        }

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
        fn wide_exp_matches_scalar_bitwise(x in prop::array::uniform16(-100f32..100f32)) {
            // The AVX-512 kernel is checked where the CPU has it (not every x86-64 machine we
            // test on does); rejecting every case would abort the property test.
            if !Isa::available().contains(&Isa::Avx512) {
                return Ok(());
            }
            // SAFETY: AVX-512 is available.
            let got = unsafe { x86::exp_lanes16(x) };
            for (g, v) in got.iter().zip(x) {
                prop_assert_eq!(g.to_bits(), exp(v).to_bits(), "exp({})", v);
            }
        }

        #[test]
        fn exp_shift_gives_the_same_bits_on_every_vector_width(v in prop::collection::vec(-30f32..30f32, 0..90), m in -5f32..5f32) {
            let isas: Vec<Isa> = Isa::available().into_iter().filter(|i| i.has_avx2()).collect();
            let runs: Vec<(Vec<u32>, u32)> = isas.iter().map(|&isa| {
                let mut x = v.clone();
                let sum = exp_shift(isa, &mut x, m);
                (x.iter().map(|f| f.to_bits()).collect(), sum.to_bits())
            }).collect();
            for (isa, r) in isas.iter().zip(&runs) {
                prop_assert_eq!(r, &runs[0], "{:?}", isa);
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
    }
}
