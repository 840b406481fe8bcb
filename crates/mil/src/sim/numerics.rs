//! The ANE's fp16 arithmetic as the simulator models it (FACTS §3.6b, H3's differential probes on
//! M3 Ultra): fp16 operands; each product rounded to fp16 and flushed to zero when it falls
//! below the smallest normal fp16 (2^-14 ≈ 6.10e-5); an fp32-class accumulator; a running partial
//! sum reaching 2^15 makes the result 0; fp16 results.

use half::f16;

/// Products below this magnitude (the smallest normal fp16, 2^-14) are flushed to zero.
pub const FLUSH_BELOW: f32 = 6.103_515_6e-5;
/// A running partial sum of this magnitude (2^15) or more makes a dot product return 0.
pub const PARTIAL_LIMIT: f32 = 32768.0;
/// The partial sum is checked against [`PARTIAL_LIMIT`] after every this many products (and at
/// the end). The hardware's accumulation order is not known; this is our fixed choice.
pub const PARTIAL_CHECK_EVERY: usize = 64;
/// The largest finite fp16.
pub const FP16_MAX: f32 = 65504.0;

/// `v` rounded to the nearest fp16 (ties to even), as f32. Overflow gives ±inf; fp16
/// subnormals are kept (only products are flushed).
#[inline]
pub fn round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Rounds every value to fp16 in place.
pub fn round_in_place(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the feature was detected at run time.
        unsafe { x86::round_in_place(v) };
        return;
    }
    v.iter_mut().for_each(|x| *x = round(*x));
}

/// One product as the ANE's multiply-accumulate sees it: rounded to fp16, flushed below 2^-14.
#[inline]
pub fn product(a: f32, b: f32) -> f32 {
    // Two fp16 values multiply exactly in f32 (11 + 11 significant bits ≤ 24).
    let p = round(a * b);
    if p.abs() < FLUSH_BELOW {
        0.0
    } else {
        p
    }
}

/// The fp16 result of a dot product whose partials were checked: 0 when a partial reached
/// 2^15, otherwise the sum rounded to fp16.
#[inline]
pub fn finish(sum: f32, overflowed: bool) -> f32 {
    if overflowed || sum.abs() >= PARTIAL_LIMIT || sum.is_nan() {
        0.0
    } else {
        round(sum)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "f16c")]
    pub unsafe fn round_in_place(v: &mut [f32]) {
        let mut chunks = v.chunks_exact_mut(8);
        for c in &mut chunks {
            let x = _mm256_loadu_ps(c.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
        for x in chunks.into_remainder() {
            *x = super::round(*x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_ieee_fp16() {
        assert_eq!(round(1.0 + 1.0 / 4096.0), 1.0, "half an ulp ties to even");
        assert_eq!(round(1.0 + 3.0 / 4096.0), 1.0 + 4.0 / 4096.0);
        assert_eq!(round(70000.0), f32::INFINITY);
        assert_eq!(
            round(1e-6),
            f16::from_f32(1e-6).to_f32(),
            "subnormal results are kept"
        );
        let mut v: Vec<f32> = (0..100)
            .map(|i| (i as f32 * 0.377).sin() * 1000.0 + 1e-3)
            .collect();
        let want: Vec<f32> = v.iter().map(|&x| round(x)).collect();
        round_in_place(&mut v);
        assert_eq!(v, want);
    }

    #[test]
    fn products_round_and_flush() {
        assert_eq!(product(0.01, 0.001), 0.0, "1e-5 is below 2^-14");
        assert_eq!(product(1.0, FLUSH_BELOW), FLUSH_BELOW);
        let (a, b) = (round(1.1), round(1.3));
        assert_eq!(product(a, b), round(a * b));
        assert_ne!(
            a * b,
            round(a * b),
            "the exact product needs more than 11 bits"
        );
        assert_eq!(finish(40000.0, false), 0.0);
        assert_eq!(finish(1.0, true), 0.0);
        assert_eq!(finish(-3.0, false), -3.0);
    }
}
