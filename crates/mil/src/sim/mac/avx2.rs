//! The AVX2 forms of [`super::gemm`] (with F16C for the fp16 rounding and FMA-free products):
//! 8 lanes of f32. The column form is bit-identical to the reference; the channel form keeps the
//! AVX-512 form's 16 interleaved partial sums as two registers, so it gives that form's bits.

use std::arch::x86_64::*;

use half::f16;

use super::{finish, gather_columns, widen_rows, PARTIAL_CHECK_EVERY, PARTIAL_LIMIT};

pub const LANES: usize = 8;
/// Partial sums of the channel form (as AVX-512's one register).
const SUMS: usize = 16;
/// Rows per register block of the column form.
const R: usize = 4;
/// Vectors of columns per register block of the column form (16 columns).
const V: usize = 2;
/// Round to nearest even (F16C takes the mode in three bits, without the no-exception flag).
const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;
/// The smallest normal fp16, 2^-14: smaller rounded products are flushed.
const MIN_NORMAL: f32 = 6.103_515_6e-5;

pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// The sum of 16 lanes held as two halves, in a fixed tree order: lanes i and i + 8, then
/// i and i + 4, then i and i + 2, then 0 and 1.
#[inline(always)]
pub unsafe fn hsum16(lo: __m256, hi: __m256) -> f32 {
    let s = _mm256_add_ps(lo, hi);
    let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps::<1>(d, d)))
}

#[inline(always)]
unsafe fn abs(x: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), x)
}

/// `acc += fp16(p)` unless the rounded product is subnormal or zero (flush); infinities and NaN
/// are added, as the reference adds them. `acc` is never -0 (it starts at +0 and only exact
/// cancellations reach 0), so adding +0 for a flushed product leaves it as skipping would.
#[inline(always)]
unsafe fn accumulate(acc: __m256, p: __m256) -> __m256 {
    let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<RNE>(p));
    let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(abs(r), _mm256_set1_ps(MIN_NORMAL));
    _mm256_add_ps(acc, _mm256_and_ps(r, keep))
}

/// All-ones lanes where a partial sum reached the limit.
#[inline(always)]
unsafe fn reached_limit(acc: __m256) -> __m256 {
    _mm256_cmp_ps::<_CMP_GE_OQ>(abs(acc), _mm256_set1_ps(PARTIAL_LIMIT))
}

/// The fp16 results: 0 where a partial reached the limit (or the sum is NaN).
#[inline(always)]
unsafe fn results(acc: __m256, over: __m256) -> __m256 {
    let bad = _mm256_or_ps(
        _mm256_or_ps(over, reached_limit(acc)),
        _mm256_cmp_ps::<_CMP_UNORD_Q>(acc, acc),
    );
    let rounded = _mm256_cvtph_ps(_mm256_cvtps_ph::<RNE>(acc));
    _mm256_andnot_ps(bad, rounded)
}

/// All-ones in the first `live` of 8 lanes (for masked loads and stores).
#[inline(always)]
unsafe fn mask(live: usize) -> __m256i {
    let live = live.min(LANES) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(live),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Many columns: lanes are columns; a block is R rows × V·8 columns.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn by_columns(
    a: &[f16],
    m: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    let mut ws = vec![0f32; R * k];
    for o0 in (0..m).step_by(R) {
        let rows = R.min(m - o0);
        widen_rows(a, k, o0, rows, &mut ws);
        for j0 in (0..n).step_by(V * LANES) {
            let lives: [usize; V] = std::array::from_fn(|v| n.saturating_sub(j0 + v * LANES));
            let masks: [__m256i; V] = std::array::from_fn(|v| mask(lives[v]));
            let mut acc = [[_mm256_setzero_ps(); V]; R];
            let mut over = [[_mm256_setzero_ps(); V]; R];
            for c in 0..k {
                let bp = b.as_ptr().add(c * ldb + j0);
                let xv: [__m256; V] = std::array::from_fn(|v| match lives[v] {
                    0 => _mm256_setzero_ps(),
                    l if l >= LANES => _mm256_loadu_ps(bp.add(v * LANES)),
                    _ => _mm256_maskload_ps(bp.add(v * LANES), masks[v]),
                });
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let wb = _mm256_set1_ps(*ws.get_unchecked(r * k + c));
                    for (a, x) in acc_r.iter_mut().zip(&xv) {
                        *a = accumulate(*a, _mm256_mul_ps(wb, *x));
                    }
                }
                if (c + 1) % PARTIAL_CHECK_EVERY == 0 {
                    for (acc_r, over_r) in acc.iter().zip(over.iter_mut()) {
                        for (a, o) in acc_r.iter().zip(over_r.iter_mut()) {
                            *o = _mm256_or_ps(*o, reached_limit(*a));
                        }
                    }
                }
            }
            for r in 0..rows {
                for v in 0..V {
                    if lives[v] > 0 {
                        let out = y.as_mut_ptr().add((o0 + r) * ldy + j0 + v * LANES);
                        _mm256_maskstore_ps(out, masks[v], results(acc[r][v], over[r][v]));
                    }
                }
            }
        }
    }
}

/// Few columns: lanes are channels (16 partial sums in two registers); each column's values are
/// first gathered into a contiguous vector padded with zeros to whole chunks of 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn by_channels(
    a: &[f16],
    m: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    let chunks = k.div_ceil(SUMS);
    let kp = chunks * SUMS;
    let cols = gather_columns(b, ldb, n, k, kp);
    // The last chunk of each weight row, zero-padded (a zero weight's product is flushed).
    let tail = k - (chunks - 1) * SUMS;
    let check_every = PARTIAL_CHECK_EVERY / SUMS;
    // While every lane is below 2^11 the 16-lane sum is below 2^15: the exact (and dearer)
    // horizontal sum is only needed past that.
    let lane_limit = _mm256_set1_ps(PARTIAL_LIMIT / SUMS as f32);
    for o0 in (0..m).step_by(R) {
        let rows = R.min(m - o0);
        let row = |r: usize| a.as_ptr().add((o0 + r.min(rows - 1)) * k) as *const u16;
        let mut last = [[0u16; SUMS]; R];
        for (r, l) in last.iter_mut().enumerate() {
            std::ptr::copy_nonoverlapping(row(r).add((chunks - 1) * SUMS), l.as_mut_ptr(), tail);
        }
        let weights = |r: usize, ch: usize| -> (__m256, __m256) {
            let p = if ch + 1 == chunks {
                last[r].as_ptr()
            } else {
                row(r).add(ch * SUMS)
            };
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(LANES) as *const __m128i)),
            )
        };
        for j in 0..n {
            let x = cols.as_ptr().add(j * kp);
            let mut acc = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
            let mut over = [false; R];
            for ch in 0..chunks {
                let (xl, xh) = (
                    _mm256_loadu_ps(x.add(ch * SUMS)),
                    _mm256_loadu_ps(x.add(ch * SUMS + LANES)),
                );
                for (r, (lo, hi)) in acc.iter_mut().enumerate() {
                    let (wl, wh) = weights(r, ch);
                    *lo = accumulate(*lo, _mm256_mul_ps(wl, xl));
                    *hi = accumulate(*hi, _mm256_mul_ps(wh, xh));
                }
                if (ch + 1) % check_every == 0 {
                    for (&(lo, hi), o) in acc.iter().zip(over.iter_mut()) {
                        let big = _mm256_or_ps(
                            _mm256_cmp_ps::<_CMP_GE_OQ>(abs(lo), lane_limit),
                            _mm256_cmp_ps::<_CMP_GE_OQ>(abs(hi), lane_limit),
                        );
                        if _mm256_movemask_ps(big) != 0 {
                            *o |= hsum16(lo, hi).abs() >= PARTIAL_LIMIT;
                        }
                    }
                }
            }
            for r in 0..rows {
                let (lo, hi) = acc[r];
                y[(o0 + r) * ldy + j] = finish(hsum16(lo, hi), over[r]);
            }
        }
    }
}
