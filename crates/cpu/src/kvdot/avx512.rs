//! The AVX-512 attention products: sixteen accumulators in flight (heads × keys for the
//! scores, heads × column blocks for the mix), and the scores' sixteen horizontal sums done
//! together by one transposing tree instead of one at a time.
//!
//! Every score is the same tree of additions over its sixteen lanes whichever key, head or
//! group size it comes with, so a score's bits depend on the query and the key alone (prefill
//! and decode agree). The mix is the AVX2 loop's arithmetic sixteen lanes wide: the same bits.

use std::arch::x86_64::*;

use crate::kvblock::KvBlock;

/// The most query heads per KV head these loops take.
pub const MAX_GROUP: usize = 16;

/// The blocks a run of `n` rows of `hd` values `stride` blocks apart spans.
fn span<B: KvBlock>(n: usize, stride: usize, hd: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n - 1) * stride + hd.div_ceil(B::N)
    }
}

/// The sums of the lanes of each of `a`'s sixteen vectors, as one vector: lane `4r + c` holds
/// the sum of `a[4c + r]` (see [`lane`]). Each sum is `((v_i + v_{i+8}) + (v_{i+4} + v_{i+12}))` paired the
/// same way down to one value, whatever the other vectors hold.
#[inline(always)]
unsafe fn sums(a: &[__m512; 16]) -> __m512 {
    // v_i + v_{i+8}: two vectors' eight partial sums per vector.
    let b: [__m512; 8] = std::array::from_fn(|k| {
        let (x, y) = (a[2 * k], a[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    });
    // + the partial four apart: four vectors' four per vector.
    let c: [__m512; 4] = std::array::from_fn(|m| {
        let (x, y) = (b[2 * m], b[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    });
    // + the partial two apart: two per vector, in 64-bit pairs.
    let d: [__m512; 2] = std::array::from_fn(|p| {
        let (x, y) = (_mm512_castps_pd(c[2 * p]), _mm512_castps_pd(c[2 * p + 1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
        )
    });
    // The last pair: one per vector.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(d[0], d[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(d[0], d[1]),
    )
}

/// The vector whose sum [`sums`] puts in lane `l` (and the other way round).
const fn lane(l: usize) -> usize {
    4 * (l % 4) + l / 4
}

/// As [`super::scores`]; `hd` a multiple of 16, `g ≤ MAX_GROUP`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
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
    assert!(hd.is_multiple_of(16) && (1..=MAX_GROUP).contains(&g));
    assert!(q.len() >= g * hd && s.len() >= g * n && k.len() >= span::<B>(n, stride, hd));
    // Keys by runs of K, as many as leave no accumulator idle (the tree's cost is shared by
    // `K · g` scores); the rest one by one.
    macro_rules! runs_of {
        ($k:literal, $g:literal) => {{
            let mut j = 0;
            while j + $k <= n {
                scores_of::<B, $k, $g>(q, g, hd, k, stride, n, j, scale, s);
                j += $k;
            }
            j
        }};
    }
    let j = match g {
        1 => runs_of!(16, 1),
        2 => runs_of!(8, 2),
        3 => runs_of!(5, 3),
        4 => runs_of!(4, 4),
        5..=8 => runs_of!(2, 8),
        _ => 0,
    };
    for j in j..n {
        scores_of::<B, 1, 16>(q, g, hd, k, stride, n, j, scale, s);
    }
}

/// The scores of keys `j..j + K` for `g ≤ G` heads (`K · G = 16` or fewer keys). Head `h`'s
/// score of key `c` accumulates in the vector whose sum lands in lane `h·K + c`, so that a
/// head's `K` scores come out side by side.
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
    let kj: [*const B; K] = std::array::from_fn(|c| k.as_ptr().add((j + c) * stride));
    let mut acc = [_mm512_setzero_ps(); 16];
    for i in (0..hd).step_by(16) {
        let k16: [__m512; K] = std::array::from_fn(|c| B::load16(kj[c], i));
        for h in (0..G).take(g) {
            let qh = _mm512_loadu_ps(q.as_ptr().add(h * hd + i));
            for (c, &kc) in k16.iter().enumerate() {
                let a = lane(h * K + c);
                acc[a] = _mm512_fmadd_ps(qh, kc, acc[a]);
            }
        }
    }
    let mut out = [0f32; 16];
    _mm512_storeu_ps(
        out.as_mut_ptr(),
        _mm512_mul_ps(_mm512_set1_ps(scale), sums(&acc)),
    );
    for h in (0..G).take(g) {
        s.get_unchecked_mut(h * n + j..h * n + j + K)
            .copy_from_slice(&out[h * K..h * K + K]);
    }
}

/// As [`super::to_f32`]; `hd` a multiple of 16.
///
/// # Safety
/// As [`scores`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn to_f32<B: KvBlock>(k: &[B], stride: usize, n: usize, hd: usize, out: &mut [f32]) {
    assert!(hd.is_multiple_of(16) && k.len() >= span::<B>(n, stride, hd) && out.len() >= n * hd);
    let o = out.as_mut_ptr();
    for j in 0..n {
        let row = k.as_ptr().add(j * stride);
        for i in (0..hd).step_by(16) {
            _mm512_storeu_ps(o.add(j * hd + i), B::load16(row, i));
        }
    }
}

/// As [`super::mix`]; `hd` a multiple of 16, `g ≤ MAX_GROUP`.
///
/// # Safety
/// As [`scores`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
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
    assert!(hd.is_multiple_of(16) && (1..=MAX_GROUP).contains(&g));
    assert!(p.len() >= g * n && out.len() >= g * hd && v.len() >= span::<B>(n, stride, hd));
    let mut i = 0;
    match g {
        1..=4 => {
            while i + 64 <= hd {
                mix_of::<B, 4, 4>(p, g, hd, v, stride, n, i, out);
                i += 64;
            }
        }
        5..=8 => {
            while i + 32 <= hd {
                mix_of::<B, 2, 8>(p, g, hd, v, stride, n, i, out);
                i += 32;
            }
        }
        _ => {}
    }
    for i in (i..hd).step_by(16) {
        mix_of::<B, 1, 16>(p, g, hd, v, stride, n, i, out);
    }
}

/// Columns `i..i + 16C` of the mix for `g ≤ G` heads.
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
    let mut acc = [[_mm512_setzero_ps(); G]; C];
    for (c, a) in acc.iter_mut().enumerate() {
        for (h, a) in a.iter_mut().enumerate().take(g) {
            *a = _mm512_loadu_ps(o.add(h * hd + i + 16 * c));
        }
    }
    for j in 0..n {
        let vj = v.as_ptr().add(j * stride);
        let v16: [__m512; C] = std::array::from_fn(|c| B::load16(vj, i + 16 * c));
        for h in (0..G).take(g) {
            let ph = _mm512_set1_ps(*p.get_unchecked(h * n + j));
            for c in 0..C {
                acc[c][h] = _mm512_fmadd_ps(ph, v16[c], acc[c][h]);
            }
        }
    }
    for (c, a) in acc.iter().enumerate() {
        for (h, a) in a.iter().enumerate().take(g) {
            _mm512_storeu_ps(o.add(h * hd + i + 16 * c), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each vector's lanes summed by the tree the doc states, in the lane [`lane`] names.
    #[test]
    fn sixteen_sums_at_once_are_each_vectors_tree_sum() {
        if !crate::Isa::available().contains(&crate::Isa::Avx512) {
            return;
        }
        let x: Vec<[f32; 16]> = (0..16)
            .map(|v| std::array::from_fn(|i| ((v * 37 + i * 11) % 17) as f32 * 0.37 - 1.3))
            .collect();
        let tree = |v: &[f32; 16]| {
            let x: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
            let y: [f32; 4] = std::array::from_fn(|i| x[i] + x[i + 4]);
            let z: [f32; 2] = std::array::from_fn(|i| y[i] + y[i + 2]);
            z[0] + z[1]
        };
        let mut got = [0f32; 16];
        // SAFETY: AVX-512 is there.
        unsafe {
            let a: [__m512; 16] = std::array::from_fn(|v| _mm512_loadu_ps(x[v].as_ptr()));
            _mm512_storeu_ps(got.as_mut_ptr(), sums16(&a));
        }
        for (l, g) in got.iter().enumerate() {
            assert_eq!(g.to_bits(), tree(&x[lane(l)]).to_bits(), "lane {l}");
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn sums16(a: &[__m512; 16]) -> __m512 {
        sums(a)
    }
}
