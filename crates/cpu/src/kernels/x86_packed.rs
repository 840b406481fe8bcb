//! The kernels of the sixteen-row packed layout ([`super::packed`]): AVX-512 VNNI holds a
//! group's sixteen rows in one register, AVX2 in two of eight read together. Both keep each
//! row's sums in its own 32-bit lane, so no block needs a horizontal sum, and both take up to
//! eight input rows per call (AVX2 in passes of up to six over a group's blocks).

use std::arch::x86_64::*;

use super::packed::{Layout, ROWS};
use crate::q8::Q8Row;
use crate::simd::Isa;

/// Block columns ahead of the packed kernel's reads that it prefetches.
const PREFETCH_COLUMNS: usize = 8;

/// A block column's bytes and the number of groups in `data`, the call's shapes checked.
#[inline(always)]
fn shape<const T: usize>(
    data: &[u8],
    nb: usize,
    lay: Layout,
    xs: &[Q8Row<'_>],
    out: &[f32],
) -> (usize, usize) {
    let col = lay.column();
    let groups = data.len() / (nb * col);
    debug_assert!(
        ROWS == 16
            && data.len() == groups * nb * col
            && xs.len() == T
            && out.len() == T * ROWS * groups
            && xs
                .iter()
                .all(|x| x.qs.len() == nb * 32 && x.d.len() == nb && x.s.len() == nb)
    );
    (col, groups)
}

/// Each input row's block scales and block sums.
#[inline(always)]
fn scales<const T: usize>(xs: &[Q8Row<'_>]) -> ([*const f32; T], [*const f32; T]) {
    (
        std::array::from_fn(|t| xs[t].d.as_ptr()),
        std::array::from_fn(|t| xs[t].s.as_ptr()),
    )
}

/// The AVX-512 kernel of the sixteen-row packed layout (see `packed.rs`) over consecutive groups
/// of `nb` block columns: `out[t * 16 * groups + 16 * g + r]` = row `r` of group `g` · `xs[t]`.
/// Each row's sums sit in its own 32-bit lane: a block column of an input row is eight VNNI
/// instructions (two independent chains of four) against four activation bytes broadcast from
/// memory, a conversion, a multiply and two multiply-adds; a token's sums do not depend on how
/// many other tokens share the call.
#[inline(always)]
unsafe fn sixteen<const HAS_M: bool, const FIVE: bool, const EIGHT: bool, const T: usize>(
    data: &[u8],
    nb: usize,
    lay: Layout,
    xs: &[Q8Row<'_>],
    out: &mut [f32],
) {
    let (col, groups) = shape::<T>(data, nb, lay, xs, out);
    let xq: [*const i32; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const i32);
    let (xd, xsum) = scales::<T>(xs);
    let nib = _mm512_set1_epi8(0xf);
    let (m_at, masks_at, q_at) = (lay.m_at(), lay.masks_at(), lay.quants_at());
    for gi in 0..groups {
        let mut acc = [_mm512_setzero_ps(); T];
        let g = data.as_ptr().add(gi * nb * col);
        for b in 0..nb {
            let p = g.add(b * col);
            // The hardware's streamer stops at each 4 KiB page; compute and the reads from
            // L3 overlap only when the columns ahead are asked for in time.
            let ahead = p.wrapping_add(PREFETCH_COLUMNS * col);
            for line in (0..col).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
            let m = if HAS_M {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.add(m_at) as *const __m256i))
            } else {
                _mm512_mul_ps(d, _mm512_set1_ps(lay.offset))
            };
            // w[j] holds values 4j..4j + 4 of every row.
            let q = p.add(q_at);
            let w: [__m512i; 8] = if EIGHT {
                std::array::from_fn(|j| _mm512_loadu_si512(q.add(64 * j) as *const _))
            } else {
                let mut w = [_mm512_setzero_si512(); 8];
                for k in 0..4 {
                    let v = _mm512_loadu_si512(q.add(64 * k) as *const _);
                    w[k] = _mm512_and_si512(v, nib);
                    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                }
                if FIVE {
                    let high = _mm512_set1_epi8(0x10);
                    let planes = _mm512_loadu_si512(p.add(masks_at) as *const _);
                    for (j, wj) in w.iter_mut().enumerate() {
                        let k = _mm512_test_epi8_mask(planes, _mm512_set1_epi8((1u8 << j) as i8));
                        *wj = _mm512_mask_add_epi8(*wj, k, *wj, high);
                    }
                }
                w
            };
            for t in 0..T {
                let x = xq[t].add(b * 8);
                let mut s0 = _mm512_setzero_si512();
                let mut s1 = _mm512_setzero_si512();
                for j in 0..4 {
                    s0 =
                        _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(x.add(j).read_unaligned()));
                    s1 = _mm512_dpbusd_epi32(
                        s1,
                        w[j + 4],
                        _mm512_set1_epi32(x.add(j + 4).read_unaligned()),
                    );
                }
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                let a = _mm512_fmadd_ps(s, _mm512_mul_ps(d, _mm512_set1_ps(*xd[t].add(b))), acc[t]);
                acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(*xsum[t].add(b)), a);
            }
        }
        for (t, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add((t * groups + gi) * ROWS), *a);
        }
    }
}

/// Chunk `j`'s fifth bits (Q5) as 0x10 in each byte, from one half's bit planes (bit `j` of
/// byte `x` belongs to byte `x` of chunk `j`).
#[inline(always)]
unsafe fn fifth(planes: __m256i, j: usize) -> __m256i {
    let bit = _mm256_and_si256(planes, _mm256_set1_epi8((1u8 << j) as i8));
    // Within each byte: bit j to bit 4.
    if j < 4 {
        _mm256_sll_epi16(bit, _mm_cvtsi32_si128(4 - j as i32))
    } else {
        _mm256_srl_epi16(bit, _mm_cvtsi32_si128(j as i32 - 4))
    }
}

/// The AVX2 kernel of the same layout over one group, its sixteen rows as two registers of eight
/// read together, so that each activation broadcast feeds both. Without VNNI, a chunk of four
/// values per row is `maddubs` (u8 × i8 → pairs of i16) against the broadcast activations; the
/// i16 sums of four chunks (Q5: weights ≤ 31, activations ≤ 127 in magnitude) or eight (Q4: ≤ 15)
/// cannot overflow, so one `madd` widens them to 32 bits. Q8_0's quants are signed again and
/// their signs moved onto the activations, as in the row kernel. At most four input rows, six
/// for Q4 (their sums for both halves fill the registers; the float sums wait in `out`).
///
/// Against reading the two halves one after the other (alternating in one process, one thread,
/// 1536 × 2304, AVX2-only Zen 3), in passes of four: 6–18 % less time for Q4 at one to eight
/// rows, 10–23 % for Q8_0, 2–10 % for Q5 at one or two; the same sums to the bit. Q4's five and
/// six rows in one pass rather than four and the rest: 5–14 % and 9–11 % less. Q8_0 by nibbles
/// of the biased quants instead of signs (no `sign` per token, twice the `maddubs`) took
/// 0.92–1.13 of the half-by-half time, signs 0.77–0.90: the kernel is bound by all its vector
/// operations, not by the multiplies alone.
#[inline(always)]
unsafe fn wide<const HAS_M: bool, const FIVE: bool, const EIGHT: bool, const T: usize>(
    g: *const u8,
    nb: usize,
    lay: Layout,
    xq: [*const i32; T],
    xd: [*const f32; T],
    xsum: [*const f32; T],
    out: [*mut f32; T],
) {
    let col = lay.column();
    let nib = _mm256_set1_epi8(0xf);
    let ones = _mm256_set1_epi16(1);
    let (m_at, masks_at, q_at) = (lay.m_at(), lay.masks_at(), lay.quants_at());
    // The sums live in `out` (eight registers too many to keep).
    for o in out {
        _mm256_storeu_ps(o, _mm256_setzero_ps());
        _mm256_storeu_ps(o.add(8), _mm256_setzero_ps());
    }
    for b in 0..nb {
        let p = g.add(b * col);
        let ahead = p.wrapping_add(PREFETCH_COLUMNS * col);
        for line in (0..col).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
        }
        let q = p.add(q_at);
        let load = |at: usize| _mm256_loadu_si256(q.add(at) as *const __m256i);
        let mut s = [[_mm256_setzero_si256(); 2]; T];
        if EIGHT {
            let bias = _mm256_set1_epi8(-128);
            for j in 0..8 {
                let w0 = _mm256_xor_si256(load(64 * j), bias);
                let w1 = _mm256_xor_si256(load(64 * j + 32), bias);
                let (aw0, aw1) = (_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1));
                for t in 0..T {
                    let a = _mm256_set1_epi32(xq[t].add(8 * b + j).read_unaligned());
                    let p0 = _mm256_maddubs_epi16(aw0, _mm256_sign_epi8(a, w0));
                    let p1 = _mm256_maddubs_epi16(aw1, _mm256_sign_epi8(a, w1));
                    s[t][0] = _mm256_add_epi32(s[t][0], _mm256_madd_epi16(p0, ones));
                    s[t][1] = _mm256_add_epi32(s[t][1], _mm256_madd_epi16(p1, ones));
                }
            }
        } else {
            let mut s16 = [[_mm256_setzero_si256(); 2]; T];
            let planes = [0, 32].map(|h| {
                if FIVE {
                    _mm256_loadu_si256(p.add(masks_at + h) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                }
            });
            for j in 0..8 {
                // j < 4: low nibbles of chunk j; j ≥ 4: high nibbles of chunk j - 4.
                let (v0, v1) = (load(64 * (j % 4)), load(64 * (j % 4) + 32));
                let (mut w0, mut w1) = if j < 4 {
                    (_mm256_and_si256(v0, nib), _mm256_and_si256(v1, nib))
                } else {
                    (
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v0), nib),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v1), nib),
                    )
                };
                if FIVE {
                    w0 = _mm256_or_si256(w0, fifth(planes[0], j));
                    w1 = _mm256_or_si256(w1, fifth(planes[1], j));
                }
                for t in 0..T {
                    let a = _mm256_set1_epi32(xq[t].add(8 * b + j).read_unaligned());
                    s16[t][0] = _mm256_add_epi16(s16[t][0], _mm256_maddubs_epi16(w0, a));
                    s16[t][1] = _mm256_add_epi16(s16[t][1], _mm256_maddubs_epi16(w1, a));
                }
                // Q5's i16 sums hold four chunks; Q4's all eight.
                if j == 7 || (FIVE && j == 3) {
                    for t in 0..T {
                        for h in 0..2 {
                            s[t][h] = _mm256_add_epi32(s[t][h], _mm256_madd_epi16(s16[t][h], ones));
                            s16[t][h] = _mm256_setzero_si256();
                        }
                    }
                }
            }
        }
        let d0 = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let d1 = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
        let (m0, m1) = if HAS_M {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(m_at) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(m_at + 16) as *const __m128i)),
            )
        } else {
            let o = _mm256_set1_ps(lay.offset);
            (_mm256_mul_ps(d0, o), _mm256_mul_ps(d1, o))
        };
        let (d, m) = ([d0, d1], [m0, m1]);
        for t in 0..T {
            let dx = _mm256_set1_ps(*xd[t].add(b));
            let sx = _mm256_set1_ps(*xsum[t].add(b));
            for h in 0..2 {
                let o = out[t].add(8 * h);
                let a = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(s[t][h]),
                    _mm256_mul_ps(d[h], dx),
                    _mm256_loadu_ps(o),
                );
                _mm256_storeu_ps(
                    o,
                    if EIGHT {
                        a
                    } else {
                        _mm256_fmadd_ps(m[h], sx, a)
                    },
                );
            }
        }
    }
}

/// The AVX2 kernel for Q5 with more than two input rows: a group as two halves of eight rows,
/// each a pass over the group's block columns (the second reads them from cache), since both
/// halves' 16-bit and 32-bit sums of three or more rows do not fit the sixteen registers (passes
/// of two rows of [`wide`], which unpack each block again, measured slower at four and eight).
#[inline(always)]
unsafe fn halves<const HAS_M: bool, const T: usize>(
    data: &[u8],
    nb: usize,
    lay: Layout,
    xs: &[Q8Row<'_>],
    out: &mut [f32],
) {
    let (col, groups) = shape::<T>(data, nb, lay, xs, out);
    let xq: [*const i32; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const i32);
    let (xd, xsum) = scales::<T>(xs);
    let nib = _mm256_set1_epi8(0xf);
    let ones = _mm256_set1_epi16(1);
    let (m_at, masks_at, q_at) = (lay.m_at(), lay.masks_at(), lay.quants_at());
    for gi in 0..groups {
        let g = data.as_ptr().add(gi * nb * col);
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let p = g.add(b * col);
                if h == 0 {
                    let ahead = p.wrapping_add(PREFETCH_COLUMNS * col);
                    for line in (0..col).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                    }
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * h) as *const __m128i));
                let m = if HAS_M {
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(m_at + 16 * h) as *const __m128i))
                } else {
                    _mm256_mul_ps(d, _mm256_set1_ps(lay.offset))
                };
                // w[j] holds values 4j..4j + 4 of the half's rows.
                let q = p.add(q_at + 32 * h);
                let mut w = [_mm256_setzero_si256(); 8];
                for k in 0..4 {
                    let v = _mm256_loadu_si256(q.add(64 * k) as *const __m256i);
                    w[k] = _mm256_and_si256(v, nib);
                    w[k + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                }
                let planes = _mm256_loadu_si256(p.add(masks_at + 32 * h) as *const __m256i);
                for (j, wj) in w.iter_mut().enumerate() {
                    *wj = _mm256_or_si256(*wj, fifth(planes, j));
                }
                for t in 0..T {
                    let x = xq[t].add(b * 8);
                    let a = |j: usize| _mm256_set1_epi32(x.add(j).read_unaligned());
                    // Q5's i16 sums hold four chunks.
                    let chain = |j0: usize| {
                        let s = (j0 + 1..j0 + 4)
                            .fold(_mm256_maddubs_epi16(w[j0], a(j0)), |s, j| {
                                _mm256_add_epi16(s, _mm256_maddubs_epi16(w[j], a(j)))
                            });
                        _mm256_madd_epi16(s, ones)
                    };
                    let s = _mm256_add_epi32(chain(0), chain(4));
                    let s = _mm256_cvtepi32_ps(s);
                    let a =
                        _mm256_fmadd_ps(s, _mm256_mul_ps(d, _mm256_set1_ps(*xd[t].add(b))), acc[t]);
                    acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(*xsum[t].add(b)), a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add((t * groups + gi) * ROWS + 8 * h), *a);
            }
        }
    }
}

/// The AVX2 kernel over every group: [`wide`], the input rows in passes of at most four (Q4: six
/// at once where there are no more; Q5: two, and [`halves`] for more than two).
#[inline(always)]
unsafe fn avx2<const HAS_M: bool, const FIVE: bool, const EIGHT: bool, const T: usize>(
    data: &[u8],
    nb: usize,
    lay: Layout,
    xs: &[Q8Row<'_>],
    out: &mut [f32],
) {
    if FIVE && T > 2 {
        return halves::<HAS_M, T>(data, nb, lay, xs, out);
    }
    let (col, groups) = shape::<T>(data, nb, lay, xs, out);
    let o = out.as_mut_ptr();
    for gi in 0..groups {
        let g = data.as_ptr().add(gi * nb * col);
        macro_rules! pass {
            ($from:expr, $n:literal) => {{
                let xq: [*const i32; $n] =
                    std::array::from_fn(|t| xs[$from + t].qs.as_ptr() as *const i32);
                let xd = std::array::from_fn(|t| xs[$from + t].d.as_ptr());
                let xsum = std::array::from_fn(|t| xs[$from + t].s.as_ptr());
                let out = std::array::from_fn(|t| o.add((($from + t) * groups + gi) * ROWS));
                wide::<HAS_M, FIVE, EIGHT, $n>(g, nb, lay, xq, xd, xsum, out)
            }};
        }
        // Q4 fits six rows' 16-bit sums in the registers: up to six in one pass, more in
        // passes of four and the rest (six and one, or six and two, measured slower).
        let most = match (FIVE, EIGHT) {
            (true, _) => 2,
            (_, true) => 4,
            _ if T <= 6 => 6,
            _ => 4,
        };
        let mut from = 0;
        while from < T {
            let n = most.min(T - from);
            match n {
                1 => pass!(from, 1),
                2 => pass!(from, 2),
                3 => pass!(from, 3),
                4 => pass!(from, 4),
                5 => pass!(from, 5),
                _ => pass!(from, 6),
            }
            from += n;
        }
    }
}

/// An entry point per instruction set, with its features, dispatching on the type's layout and
/// the number of input rows so that each combination gets its own unrolled body.
macro_rules! entry {
    ($name:ident, $body:ident, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(data: &[u8], blocks: usize, lay: Layout, xs: &[Q8Row<'_>], out: &mut [f32]) {
            macro_rules! by_rows {
                ($m:literal, $f:literal, $e:literal) => {
                    match xs.len() {
                        1 => $body::<$m, $f, $e, 1>(data, blocks, lay, xs, out),
                        2 => $body::<$m, $f, $e, 2>(data, blocks, lay, xs, out),
                        3 => $body::<$m, $f, $e, 3>(data, blocks, lay, xs, out),
                        4 => $body::<$m, $f, $e, 4>(data, blocks, lay, xs, out),
                        5 => $body::<$m, $f, $e, 5>(data, blocks, lay, xs, out),
                        6 => $body::<$m, $f, $e, 6>(data, blocks, lay, xs, out),
                        7 => $body::<$m, $f, $e, 7>(data, blocks, lay, xs, out),
                        _ => $body::<$m, $f, $e, 8>(data, blocks, lay, xs, out),
                    }
                };
            }
            match (lay.has_m, lay.five, lay.eight) {
                (false, false, false) => by_rows!(false, false, false),
                (true, false, false) => by_rows!(true, false, false),
                (false, true, false) => by_rows!(false, true, false),
                (true, true, false) => by_rows!(true, true, false),
                _ => by_rows!(false, false, true),
            }
        }
    };
}

entry!(
    avx512_dot,
    sixteen,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);
entry!(avx2_dot, avx2, "avx2,fma,f16c");

/// The packed kernel of `isa` for `lay`'s type over whole groups of `blocks` block columns (one
/// call per run of groups, not per group: a group of a decode row is only a few hundred cycles
/// of work): `out[t * 16 * groups + 16 * g + r]` = row `r` of group `g` · `xs[t]`.
///
/// # Safety
/// The CPU must have `isa` (AVX2 or AVX-512: [`Isa::has_avx2`]); `xs.len()` in
/// `1..=`[`super::packed::MAX_TOKENS`], and `out.len()` is `xs.len()` times the rows of the
/// groups.
pub unsafe fn packed_dot(
    isa: Isa,
    data: &[u8],
    blocks: usize,
    lay: Layout,
    xs: &[Q8Row<'_>],
    out: &mut [f32],
) {
    match isa {
        Isa::Avx512 => avx512_dot(data, blocks, lay, xs, out),
        _ => avx2_dot(data, blocks, lay, xs, out),
    }
}
