//! The AVX-512 forms of [`super::gemm`]: 16 lanes of f32, fp16 through `vcvtps2ph`.

use std::arch::x86_64::*;

use half::f16;

use super::avx2::hsum16;
use super::{finish, gather_columns, widen_rows, PARTIAL_CHECK_EVERY, PARTIAL_LIMIT};

pub const LANES: usize = 16;
/// Rows per register block of the column form.
const R: usize = 4;
/// Vectors of columns per register block of the column form (64 columns).
const V: usize = 4;
const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

pub fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

/// `acc += fp16(p)` unless the rounded product is subnormal or zero (flush).
#[inline(always)]
unsafe fn accumulate(acc: __m512, p: __m512) -> __m512 {
    let h = _mm512_cvtps_ph::<RNE>(p);
    let normal = _mm256_test_epi16_mask(h, _mm256_set1_epi16(0x7C00));
    _mm512_mask_add_ps(acc, normal, acc, _mm512_cvtph_ps(h))
}

/// The sum of the 16 lanes in [`hsum16`]'s order (so both forms give the same bits).
#[inline(always)]
unsafe fn reduce(a: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
    hsum16(_mm512_castps512_ps256(a), hi)
}

#[inline(always)]
unsafe fn reached_limit(acc: __m512) -> __mmask16 {
    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(acc), _mm512_set1_ps(PARTIAL_LIMIT))
}

/// The fp16 results: 0 where a partial reached the limit (or the sum is NaN).
#[inline(always)]
unsafe fn results(acc: __m512, over: __mmask16) -> __m512 {
    let bad = over | reached_limit(acc) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(acc, acc);
    _mm512_maskz_mov_ps(!bad, _mm512_cvtph_ps(_mm512_cvtps_ph::<RNE>(acc)))
}

fn mask(live: usize) -> __mmask16 {
    if live >= LANES {
        0xFFFF
    } else {
        ((1u32 << live) - 1) as __mmask16
    }
}

/// Many columns: lanes are columns; a block is R rows × V·16 columns.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
            let masks: [__mmask16; V] =
                std::array::from_fn(|v| mask(n.saturating_sub(j0 + v * LANES)));
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            let mut over = [[0 as __mmask16; V]; R];
            for c in 0..k {
                let bp = b.as_ptr().add(c * ldb + j0);
                let xv: [__m512; V] = std::array::from_fn(|v| {
                    if masks[v] == 0 {
                        _mm512_setzero_ps()
                    } else {
                        _mm512_maskz_loadu_ps(masks[v], bp.add(v * LANES))
                    }
                });
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let wb = _mm512_set1_ps(*ws.get_unchecked(r * k + c));
                    for (a, x) in acc_r.iter_mut().zip(&xv) {
                        *a = accumulate(*a, _mm512_mul_ps(wb, *x));
                    }
                }
                if (c + 1) % PARTIAL_CHECK_EVERY == 0 {
                    for (acc_r, over_r) in acc.iter().zip(over.iter_mut()) {
                        for (a, o) in acc_r.iter().zip(over_r.iter_mut()) {
                            *o |= reached_limit(*a);
                        }
                    }
                }
            }
            for r in 0..rows {
                for v in 0..V {
                    if masks[v] != 0 {
                        let out = y.as_mut_ptr().add((o0 + r) * ldy + j0 + v * LANES);
                        _mm512_mask_storeu_ps(out, masks[v], results(acc[r][v], over[r][v]));
                    }
                }
            }
        }
    }
}

/// Few columns: lanes are channels; each column's live values are first gathered into a
/// contiguous vector.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
    let cols = gather_columns(b, ldb, n, k, k);
    let chunks = k.div_ceil(LANES);
    let check_every = PARTIAL_CHECK_EVERY / LANES;
    // While every lane is below 2^11 the 16-lane sum is below 2^15: the exact (and dearer)
    // horizontal sum is only needed past that.
    let lane_limit = _mm512_set1_ps(PARTIAL_LIMIT / LANES as f32);
    // Rows in blocks of R share each load of the input column.
    for o0 in (0..m).step_by(R) {
        let rows = R.min(m - o0);
        let row = |r: usize| a.as_ptr().add((o0 + r.min(rows - 1)) * k) as *const i16;
        for j in 0..n {
            let x = cols.as_ptr().add(j * k);
            let mut acc = [_mm512_setzero_ps(); R];
            let mut over = [false; R];
            for ch in 0..chunks {
                let live = mask(k - ch * LANES);
                let xv = _mm512_maskz_loadu_ps(live, x.add(ch * LANES));
                for (r, a) in acc.iter_mut().enumerate() {
                    let w = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, row(r).add(ch * LANES)));
                    *a = accumulate(*a, _mm512_mul_ps(w, xv));
                }
                if (ch + 1) % check_every == 0 {
                    for (a, o) in acc.iter().zip(over.iter_mut()) {
                        if _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(*a), lane_limit) != 0 {
                            *o |= reduce(*a).abs() >= PARTIAL_LIMIT;
                        }
                    }
                }
            }
            for r in 0..rows {
                y[(o0 + r) * ldy + j] = finish(reduce(acc[r]), over[r]);
            }
        }
    }
}
