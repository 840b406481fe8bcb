//! The multiply-accumulate core of `conv` (1×1) and `matmul`: `y = A · B` with the ANE's numerics
//! ([`super::numerics`]). A is fp16 `[m, k]` (weights, or an activation operand converted once);
//! B holds fp16 values as f32, `[k, ldb]` with `n` live columns — the planar `[1, C, 1, W]`
//! layout of an activation, so the columns are tokens.
//!
//! Every product is rounded to fp16 and flushed below 2^-14 before it is added to an f32
//! accumulator — modelled exactly, lane by lane. Two vectorised forms (AVX-512, and AVX2 with
//! F16C for the x86-64 machines without it) share one definition with the scalar reference: many
//! columns are vectorised along the columns (each lane sums its products in channel order,
//! bit-identical to the reference); a few columns are vectorised along the channels (16
//! interleaved partial sums, so only the f32 summation order differs from the reference — the
//! AVX2 form keeps the same 16 sums in two registers and adds them up in the same order, so both
//! instruction sets give the same bits). Rows are spread over threads.

use half::f16;
use rayon::prelude::*;

use super::numerics::{finish, product, PARTIAL_CHECK_EVERY, PARTIAL_LIMIT};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Columns from which the vectorised forms run along the columns (below: along the channels).
/// The same for every instruction set, so that a product has the same bits on every machine.
#[cfg(target_arch = "x86_64")]
const COLUMN_FORM_FROM: usize = 16;

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
    form(Form::best(), a, m, k, b, ldb, n, y, ldy)
}

/// Which code computes a block of rows: the scalar definition or a vectorised form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    Reference,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Form {
    /// The fastest form this CPU runs (detected once).
    fn best() -> Form {
        static BEST: std::sync::OnceLock<Form> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if avx512::available() {
                    return Form::Avx512;
                }
                if avx2::available() {
                    return Form::Avx2;
                }
            }
            Form::Reference
        })
    }

    /// Every form this CPU runs (for tests).
    #[cfg(test)]
    fn available() -> Vec<Form> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut v = vec![Form::Reference];
        #[cfg(target_arch = "x86_64")]
        {
            if avx2::available() {
                v.push(Form::Avx2);
            }
            if avx512::available() {
                v.push(Form::Avx512);
            }
        }
        v
    }
}

#[allow(clippy::too_many_arguments)]
fn form(
    form: Form,
    a: &[f16],
    m: usize,
    k: usize,
    b: &[f32],
    ldb: usize,
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    // SAFETY (each arm): the form's features were detected at run time; sizes were checked by
    // `gemm`.
    match form {
        Form::Reference => gemm_reference(a, m, k, b, ldb, n, y, ldy),
        #[cfg(target_arch = "x86_64")]
        Form::Avx2 => unsafe {
            if n >= COLUMN_FORM_FROM {
                avx2::by_columns(a, m, k, b, ldb, n, y, ldy);
            } else {
                avx2::by_channels(a, m, k, b, ldb, n, y, ldy);
            }
        },
        #[cfg(target_arch = "x86_64")]
        Form::Avx512 => unsafe {
            if n >= COLUMN_FORM_FROM {
                avx512::by_columns(a, m, k, b, ldb, n, y, ldy);
            } else {
                avx512::by_channels(a, m, k, b, ldb, n, y, ldy);
            }
        },
    }
}

/// Rows `o0..o0 + rows` of A widened to f32 into `ws`, `k` values each; the rest of `ws` (a
/// register block's rows past the end of A) zero.
#[cfg(target_arch = "x86_64")]
fn widen_rows(a: &[f16], k: usize, o0: usize, rows: usize, ws: &mut [f32]) {
    for (r, w) in ws.chunks_exact_mut(k).enumerate() {
        if r < rows {
            let src = &a[(o0 + r) * k..(o0 + r + 1) * k];
            w.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
        } else {
            w.fill(0.0);
        }
    }
}

/// The `n` live columns of B (`k` values each) as contiguous vectors `stride` apart (the room
/// past `k` zero), for the channel forms.
#[cfg(target_arch = "x86_64")]
fn gather_columns(b: &[f32], ldb: usize, n: usize, k: usize, stride: usize) -> Vec<f32> {
    let mut cols = vec![0f32; n * stride];
    for c in 0..k {
        for j in 0..n {
            cols[j * stride + c] = b[c * ldb + j];
        }
    }
    cols
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

    /// `form`'s result and the reference's.
    fn run_form(
        f: Form,
        m: usize,
        k: usize,
        n: usize,
        ldb: usize,
        scale: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let a: Vec<f16> = fp16s(m * k, 1, 0.5)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let b = fp16s(k * ldb, 2, scale);
        let mut fast = vec![7f32; m * ldb];
        let mut slow = vec![7f32; m * ldb];
        form(f, &a, m, k, &b, ldb, n, &mut fast, ldb);
        gemm_reference(&a, m, k, &b, ldb, n, &mut slow, ldb);
        (fast, slow)
    }

    #[test]
    fn every_form_this_cpu_runs_keeps_the_contract() {
        let forms = Form::available();
        println!("forms: {forms:?}");
        #[cfg(target_arch = "x86_64")]
        assert!(
            forms.contains(&Form::Avx2),
            "every x86-64 machine we test on has AVX2 and F16C"
        );
        for f in forms {
            for (m, k, n) in [(37, 130, 64), (8, 64, 16), (5, 576, 33), (130, 200, 17)] {
                let (fast, slow) = run_form(f, m, k, n, 64, 4.0);
                assert_eq!(fast, slow, "{f:?} m {m} k {k} n {n}");
            }
            for (m, k, n) in [(37, 130, 1), (64, 576, 3), (9, 1536, 15), (6, 17, 9)] {
                let (fast, slow) = run_form(f, m, k, n, 64, 4.0);
                // The channel forms of every instruction set give the same bits.
                #[cfg(target_arch = "x86_64")]
                if f != Form::Reference {
                    let (avx2, _) = run_form(Form::Avx2, m, k, n, 64, 4.0);
                    assert_eq!(fast, avx2, "{f:?} m {m} k {k} n {n}");
                }
                for (i, (a, s)) in fast.iter().zip(&slow).enumerate() {
                    let tol = 2e-3 * s.abs().max(1.0);
                    assert!(
                        (a - s).abs() <= tol,
                        "{f:?} m {m} k {k} n {n} at {i}: {a} vs {s}"
                    );
                    if i % 64 >= n {
                        assert_eq!(*a, 7.0, "{f:?}: columns past n are left alone");
                    }
                }
            }
            // Flushing and the partial limit, in both forms.
            let a = vec![f16::from_f32(0.01); 512];
            let b = vec![f16::from_f32(0.001).to_f32(); 512 * 16];
            let mut y = [1f32; 16];
            for n in [1, 16] {
                form(f, &a, 1, 512, &b, n, n, &mut y, n);
                assert!(y[..n].iter().all(|&v| v == 0.0), "{f:?} n {n}: flushed");
            }
            let a: Vec<f16> = (0..1000)
                .map(|i| f16::from_f32(if i < 600 { 8.0 } else { -8.0 }))
                .collect();
            for n in [1, 16] {
                let b = vec![8f32; 1000 * n];
                let mut y = vec![1f32; n];
                form(f, &a, 1, 1000, &b, n, n, &mut y, n);
                assert!(y.iter().all(|&v| v == 0.0), "{f:?} n {n}: {y:?}");
            }
            // Infinities and NaN pass through the products as the reference's do.
            let a = vec![f16::from_f32(1.0); 40];
            let mut b = vec![1f32; 40 * 16];
            b[3 * 16] = f32::INFINITY;
            b[5 * 16 + 1] = f32::NAN;
            for n in [2, 16] {
                let (mut y, mut r) = (vec![0f32; 16], vec![0f32; 16]);
                form(f, &a, 1, 40, &b, 16, n, &mut y, 16);
                gemm_reference(&a, 1, 40, &b, 16, n, &mut r, 16);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y[..n]), bits(&r[..n]), "{f:?} n {n}");
            }
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
