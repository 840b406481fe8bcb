//! The multiply-accumulate core of `conv` (1×1) and `matmul`: `y = A · B` with the ANE's numerics
//! ([`super::numerics`]). A is fp16 `[m, k]` (weights, or an activation operand converted once);
//! B holds fp16 values as f32, `[k, ldb]` with `n` live columns — the planar `[1, C, 1, W]`
//! layout of an activation, so the columns are tokens.
//!
//! Every product is rounded to fp16 and flushed below 2^-14 before it is added to an f32
//! accumulator — modelled exactly, lane by lane. Two vectorised forms (AVX-512) share one
//! definition with the scalar reference: many columns are vectorised along the columns (each
//! lane sums its products in channel order, bit-identical to the reference); a few columns are
//! vectorised along the channels (lanes hold interleaved partial sums, so only the f32 summation
//! order differs). Rows are spread over threads.

use half::f16;
use rayon::prelude::*;

use super::numerics::{finish, product, PARTIAL_CHECK_EVERY, PARTIAL_LIMIT};

/// Rows of `y` one parallel task computes (at least).
const ROWS_PER_TASK: usize = 16;

/// `y[o*ldy + j] = Σ_c a[o*k + c] · b[c*ldb + j]` for `o < m`, `j < n`; other elements of `y`
/// are left as they are.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    a: &[f16],
    m: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    assert!(
        a.len() >= m * k && n <= ldb && n <= ldy,
        "gemm operand sizes"
    );
    assert!(
        k == 0 || b.len() >= (k - 1) * ldb + n,
        "gemm operand B size"
    );
    assert!(m == 0 || y.len() >= (m - 1) * ldy + n, "gemm output size");
    if m == 0 || n == 0 {
        return;
    }
    let rows = ROWS_PER_TASK.max(m.div_ceil(rayon::current_num_threads() * 4));
    let y = &mut y[..(m - 1) * ldy + n];
    // Each task gets whole rows of y: chunks of `rows * ldy` elements (the last may be short).
    y.par_chunks_mut(rows * ldy)
        .enumerate()
        .for_each(|(t, ys)| {
            let o0 = t * rows;
            let mr = rows.min(m - o0);
            gemm_rows(&a[o0 * k..(o0 + mr) * k], mr, k, b, ldb, n, ys, ldy);
        });
}

#[allow(clippy::too_many_arguments)]
fn gemm_rows(
    a: &[f16],
    m: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the features were detected at run time; sizes were checked by `gemm`.
        unsafe {
            if n >= x86::LANES {
                x86::by_columns(a, m, k, b, ldb, n, y, ldy);
            } else {
                x86::by_channels(a, m, k, b, ldb, n, y, ldy);
            }
        }
        return;
    }
    gemm_reference(a, m, k, b, ldb, n, y, ldy);
}

/// The definition: products in channel order, the partial checked every
/// [`PARTIAL_CHECK_EVERY`] products and at the end.
#[allow(clippy::too_many_arguments)]
pub fn gemm_reference(
    a: &[f16],
    m: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    for o in 0..m {
        let row = &a[o * k..(o + 1) * k];
        for j in 0..n {
            let mut sum = 0f32;
            let mut over = false;
            for (c, w) in row.iter().enumerate() {
                sum += product(w.to_f32(), b[c * ldb + j]);
                if (c + 1) % PARTIAL_CHECK_EVERY == 0 {
                    over |= sum.abs() >= PARTIAL_LIMIT;
                }
            }
            y[o * ldy + j] = finish(sum, over);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

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
            for (r, w) in ws.chunks_exact_mut(k).enumerate() {
                if r < rows {
                    let src = &a[(o0 + r) * k..(o0 + r + 1) * k];
                    w.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
                } else {
                    w.fill(0.0);
                }
            }
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
        let mut cols = vec![0f32; n * k];
        for c in 0..k {
            for j in 0..n {
                cols[j * k + c] = b[c * ldb + j];
            }
        }
        let chunks = k.div_ceil(LANES);
        let check_every = PARTIAL_CHECK_EVERY / LANES;
        for o in 0..m {
            let row = a.as_ptr().add(o * k) as *const u16;
            for j in 0..n {
                let x = cols.as_ptr().add(j * k);
                let mut acc = _mm512_setzero_ps();
                let mut over = false;
                for ch in 0..chunks {
                    let live = mask(k - ch * LANES);
                    let w = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                        live,
                        row.add(ch * LANES) as *const i16,
                    ));
                    let xv = _mm512_maskz_loadu_ps(live, x.add(ch * LANES));
                    acc = accumulate(acc, _mm512_mul_ps(w, xv));
                    if (ch + 1) % check_every == 0 {
                        over |= _mm512_reduce_add_ps(acc).abs() >= PARTIAL_LIMIT;
                    }
                }
                y[o * ldy + j] = finish(_mm512_reduce_add_ps(acc), over);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp16s(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let t = ((i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503))
                    >> 8) as f32
                    / (1u32 << 24) as f32;
                f16::from_f32((t - 0.5) * scale).to_f32()
            })
            .collect()
    }

    fn run(m: usize, k: usize, n: usize, ldb: usize, scale: f32) -> (Vec<f32>, Vec<f32>) {
        let a: Vec<f16> = fp16s(m * k, 1, 0.5)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let b = fp16s(k * ldb, 2, scale);
        let mut fast = vec![7f32; m * ldb];
        let mut slow = vec![7f32; m * ldb];
        gemm(&a, m, k, &b, ldb, n, &mut fast, ldb);
        gemm_reference(&a, m, k, &b, ldb, n, &mut slow, ldb);
        (fast, slow)
    }

    #[test]
    fn column_form_is_bit_identical_to_the_reference() {
        for (m, k, n) in [(37, 130, 64), (8, 64, 16), (5, 576, 33), (130, 200, 17)] {
            let (fast, slow) = run(m, k, n, 64, 4.0);
            assert_eq!(fast, slow, "m {m} k {k} n {n}");
        }
    }

    #[test]
    fn channel_form_differs_only_in_summation_order() {
        for (m, k, n) in [(37, 130, 1), (64, 576, 3), (9, 1536, 15)] {
            let (fast, slow) = run(m, k, n, 64, 4.0);
            for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
                let tol = 2e-3 * s.abs().max(1.0);
                assert!((f - s).abs() <= tol, "m {m} k {k} n {n} at {i}: {f} vs {s}");
            }
            let untouched = fast
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 64 >= n)
                .all(|(_, &v)| v == 7.0);
            assert!(untouched, "columns past n are left alone");
        }
    }

    #[test]
    fn tiny_products_are_flushed_and_large_partials_give_zero() {
        // Every product is 1e-5 (< 2^-14): the exact sum would be 1e-5 * 512.
        let a = vec![f16::from_f32(0.01); 512];
        let b = vec![f16::from_f32(0.001).to_f32(); 512];
        let mut y = [1f32];
        gemm(&a, 1, 512, &b, 1, 1, &mut y, 1);
        assert_eq!(y[0], 0.0);
        // 1000 products of 64: the partial passes 2^15 at product 512, the sum ends near 0.
        let a: Vec<f16> = (0..1000)
            .map(|i| f16::from_f32(if i < 600 { 8.0 } else { -8.0 }))
            .collect();
        for n in [1, 16] {
            let b = vec![8f32; 1000 * n];
            let mut y = vec![1f32; n];
            gemm(&a, 1, 1000, &b, n, n, &mut y, n);
            assert!(y.iter().all(|&v| v == 0.0), "n {n}: {y:?}");
        }
        let a = vec![f16::from_f32(8.0); 100];
        let b = vec![8f32; 100];
        let mut y = [0f32];
        gemm(&a, 1, 100, &b, 1, 1, &mut y, 1);
        assert_eq!(y[0], 6400.0, "below the limit the sum is exact");
    }
}
