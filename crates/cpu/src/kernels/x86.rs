//! AVX2 and AVX-512 kernels. Each kernel is written once, generic over [`Ops`] (the few
//! operations where the two instruction sets differ) and over the number of input rows `T`; the
//! `avx2` and `avx512` modules instantiate them inside `#[target_feature]` functions, where the
//! `#[inline(always)]` bodies are compiled with those features.
//!
//! Blocks are read in place (unaligned loads); each 32 weights become 32 unsigned bytes `u` with
//! `w = d · u + m` (Q8_0 keeps signed bytes and moves their signs onto the activations), and an
//! 8-bit dot product gives eight 32-bit partial sums per 32 weights.

use std::arch::x86_64::*;

use super::{bytes, k4_scales_mins};
use crate::q8::{Q8Row, QK_K};

/// The operations AVX2 and AVX-512 VNNI do differently.
///
/// # Safety
/// Every method needs the CPU features of its implementation (see the `isa_module!` uses).
#[allow(clippy::missing_safety_doc)]
pub trait Ops {
    /// `acc + Σ u·x` over each group of four bytes (u unsigned, x signed).
    unsafe fn dot(acc: __m256i, u: __m256i, x: __m256i) -> __m256i;
    /// `acc + Σ (u·x) · sc` over each pair of bytes, `sc` the i16 scale of the pair.
    unsafe fn dot_scaled(acc: __m256i, u: __m256i, x: __m256i, sc: __m256i) -> __m256i;
    /// Byte `i` is `v` where bit `i` of `bits` is set, else 0.
    unsafe fn bits_to_bytes(bits: u32, v: i8) -> __m256i;

    /// The Q6_K kernel: by default the 256-bit one, written with the operations above. (Q4_K
    /// and Q5_K measured slower in 512-bit registers, so they keep theirs.)
    #[inline(always)]
    unsafe fn q6_k<const T: usize>(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32])
    where
        Self: Sized,
    {
        q6k::<Self, T>(row, xs, out)
    }
}

pub struct Avx2;
pub struct Avx512;

impl Ops for Avx2 {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
        // u ≤ 255 and |x| ≤ 127 keep each i16 pair sum below 2^15 for every type here.
        _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)),
        )
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, u: __m256i, x: __m256i, sc: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), sc))
    }
    #[inline(always)]
    unsafe fn bits_to_bytes(bits: u32, v: i8) -> __m256i {
        // Byte i takes byte i/8 of `bits`, keeps bit i%8, and compares it with that bit.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi64x(
                0,
                0x0101_0101_0101_0101,
                0x0202_0202_0202_0202,
                0x0303_0303_0303_0303,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(v))
    }
}

impl Ops for Avx512 {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, x)
    }
    #[inline(always)]
    unsafe fn dot_scaled(acc: __m256i, u: __m256i, x: __m256i, sc: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, x), sc)
    }
    #[inline(always)]
    unsafe fn bits_to_bytes(bits: u32, v: i8) -> __m256i {
        _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(v))
    }
    #[inline(always)]
    unsafe fn q6_k<const T: usize>(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
        q6k_wide::<T>(row, xs, out)
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The two fp16 values at `p` (reads 4 bytes). One 32-bit load into a zeroed register: reading
/// the halves one at a time, LLVM inserts each into whatever register is free (`vpinsrw`), which
/// chains every block's scale load to the previous block's arithmetic through that register.
#[inline(always)]
unsafe fn f16_pair(p: *const u8) -> (f32, f32) {
    let bits = std::ptr::read_unaligned(p as *const i32);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The 32 nibbles of 16 bytes as bytes: low nibbles (values 0..16) first, then high ones.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let hi = _mm_srli_epi16::<4>(q);
    _mm256_and_si256(_mm256_set_m128i(hi, q), _mm256_set1_epi8(0xf))
}

/// A 32-weight block type: `unpack` gives the bytes `u`, `d` and `m` with `w = d · u + m`.
trait Legacy {
    const BYTES: usize;
    /// `u` holds signed weights (Q8_0), and `m` is 0.
    const SIGNED: bool;
    unsafe fn unpack<O: Ops>(b: *const u8) -> (__m256i, f32, f32);
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q5_1;
struct Q8_0;

impl Legacy for Q4_0 {
    const BYTES: usize = bytes::Q4_0;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack<O: Ops>(b: *const u8) -> (__m256i, f32, f32) {
        // The scale is followed by the block's data: reading 4 bytes stays inside it.
        let d = f16_pair(b).0;
        (nibbles(b.add(2)), d, -8.0 * d)
    }
}

impl Legacy for Q4_1 {
    const BYTES: usize = bytes::Q4_1;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack<O: Ops>(b: *const u8) -> (__m256i, f32, f32) {
        let (d, m) = f16_pair(b);
        (nibbles(b.add(4)), d, m)
    }
}

impl Legacy for Q5_0 {
    const BYTES: usize = bytes::Q5_0;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack<O: Ops>(b: *const u8) -> (__m256i, f32, f32) {
        let d = f16_pair(b).0;
        let qh = std::ptr::read_unaligned(b.add(2) as *const u32);
        (
            _mm256_or_si256(nibbles(b.add(6)), O::bits_to_bytes(qh, 0x10)),
            d,
            -16.0 * d,
        )
    }
}

impl Legacy for Q5_1 {
    const BYTES: usize = bytes::Q5_1;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn unpack<O: Ops>(b: *const u8) -> (__m256i, f32, f32) {
        let qh = std::ptr::read_unaligned(b.add(4) as *const u32);
        let (d, m) = f16_pair(b);
        (
            _mm256_or_si256(nibbles(b.add(8)), O::bits_to_bytes(qh, 0x10)),
            d,
            m,
        )
    }
}

impl Legacy for Q8_0 {
    const BYTES: usize = bytes::Q8_0;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn unpack<O: Ops>(b: *const u8) -> (__m256i, f32, f32) {
        (load(b.add(2)), f16_pair(b).0, 0.0)
    }
}

#[inline(always)]
unsafe fn legacy<B: Legacy, O: Ops, const T: usize>(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    let nb = row.len() / B::BYTES;
    debug_assert!(
        xs.len() == T
            && xs
                .iter()
                .all(|x| x.qs.len() == nb * 32 && x.d.len() == nb && x.s.len() == nb)
    );
    let p = row.as_ptr();
    let xq: [*const u8; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const u8);
    let xd: [*const f32; T] = std::array::from_fn(|t| xs[t].d.as_ptr());
    let xs_: [*const f32; T] = std::array::from_fn(|t| xs[t].s.as_ptr());
    let mut acc = [_mm256_setzero_ps(); T];
    let mut off = [0f32; T];
    for b in 0..nb {
        let (u, d, m) = B::unpack::<O>(p.add(b * B::BYTES));
        // Q8_0: |w| against x with w's sign (no activation is -128, so the sign flip is exact).
        let au = if B::SIGNED { _mm256_sign_epi8(u, u) } else { u };
        for t in 0..T {
            let mut x = load(xq[t].add(b * 32));
            if B::SIGNED {
                x = _mm256_sign_epi8(x, u);
            }
            let s = O::dot(_mm256_setzero_si256(), au, x);
            acc[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(s),
                _mm256_set1_ps(d * *xd[t].add(b)),
                acc[t],
            );
            if !B::SIGNED {
                off[t] += m * *xs_[t].add(b);
            }
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]) + off[t];
    }
}

/// Bit `j` of every byte of `qh`, as 0x10 (the fifth bit of a Q5_K weight).
#[inline(always)]
unsafe fn fifth_bit(qh: __m256i, j: usize) -> __m256i {
    let bit = _mm256_set1_epi8(1 << j);
    _mm256_and_si256(
        _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
        _mm256_set1_epi8(0x10),
    )
}

/// The eight mins of a Q4_K/Q5_K block as i16, each twice: a min serves the two 16-value
/// activation sums of its sub-block.
#[inline(always)]
unsafe fn k4_mins16(mn: [u8; 8]) -> __m256i {
    let m = _mm_loadl_epi64(mn.as_ptr() as *const __m128i);
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m))
}

/// Q4_K (`FIVE = false`) and Q5_K: per super-block, eight 32-weight sub-blocks with 6-bit scales
/// and mins; the scaled integer sums and the mins times the activation sums stay in integers.
#[inline(always)]
unsafe fn k4<O: Ops, const FIVE: bool, const T: usize>(
    row: &[u8],
    xs: &[Q8Row<'_>],
    out: &mut [f32],
) {
    let bb = if FIVE { bytes::Q5_K } else { bytes::Q4_K };
    let qs_at = if FIVE { 48 } else { 16 };
    let nsb = row.len() / bb;
    debug_assert!(
        xs.len() == T
            && xs
                .iter()
                .all(|x| x.qs.len() == nsb * QK_K && x.d.len() == nsb && x.sums.len() == nsb * 16)
    );
    let xq: [*const u8; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const u8);
    let xd: [*const f32; T] = std::array::from_fn(|t| xs[t].d.as_ptr());
    let xsum: [*const i16; T] = std::array::from_fn(|t| xs[t].sums.as_ptr());
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nsb {
        let sb = &row[i * bb..(i + 1) * bb];
        let sp = sb.as_ptr();
        let (d, dmin) = f16_pair(sp);
        let (sc, mn) = k4_scales_mins(&sb[4..16]);
        let mins16 = k4_mins16(mn);
        let qh = if FIVE {
            load(sp.add(16))
        } else {
            _mm256_setzero_si256()
        };
        let mut isc = [_mm256_setzero_si256(); T];
        for k in 0..4 {
            let q = load(sp.add(qs_at + 32 * k));
            let mut lo = _mm256_and_si256(q, _mm256_set1_epi8(0xf));
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), _mm256_set1_epi8(0xf));
            if FIVE {
                lo = _mm256_or_si256(lo, fifth_bit(qh, 2 * k));
                hi = _mm256_or_si256(hi, fifth_bit(qh, 2 * k + 1));
            }
            let (s_lo, s_hi) = (
                _mm256_set1_epi16(i16::from(sc[2 * k])),
                _mm256_set1_epi16(i16::from(sc[2 * k + 1])),
            );
            for t in 0..T {
                let x = xq[t].add(i * QK_K + 64 * k);
                isc[t] = O::dot_scaled(isc[t], lo, load(x), s_lo);
                isc[t] = O::dot_scaled(isc[t], hi, load(x.add(32)), s_hi);
            }
        }
        for t in 0..T {
            let dx = *xd[t].add(i);
            let sums = _mm256_loadu_si256(xsum[t].add(16 * i) as *const __m256i);
            let imin = _mm256_madd_epi16(mins16, sums);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isc[t]), _mm256_set1_ps(d * dx), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_set1_ps(dmin * dx), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
}

/// Q6_K: sixteen 16-weight groups with i8 scales, weights `d · sc · (u − 32)`; the `− 32` is
/// applied through the activation sums.
#[inline(always)]
unsafe fn q6k<O: Ops, const T: usize>(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    let nsb = row.len() / bytes::Q6_K;
    debug_assert!(
        xs.len() == T
            && xs
                .iter()
                .all(|x| x.qs.len() == nsb * QK_K && x.d.len() == nsb && x.sums.len() == nsb * 16)
    );
    let xq: [*const u8; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const u8);
    let xd: [*const f32; T] = std::array::from_fn(|t| xs[t].d.as_ptr());
    let xsum: [*const i16; T] = std::array::from_fn(|t| xs[t].sums.as_ptr());
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nsb {
        let sp = row.as_ptr().add(i * bytes::Q6_K);
        // d closes the block: the 4 bytes before its end hold the last two scales and d.
        let d = f16_pair(sp.add(206)).1;
        let scales = sp.add(192) as *const i8;
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales as *const __m128i));
        let mut isc = [_mm256_setzero_si256(); T];
        for c in 0..8 {
            let (half, plane) = (c / 4, c % 4);
            let ql = load(sp.add(64 * half + 32 * (plane % 2)));
            let lo = if plane < 2 {
                ql
            } else {
                _mm256_srli_epi16::<4>(ql)
            };
            let lo = _mm256_and_si256(lo, _mm256_set1_epi8(0xf));
            let qh = load(sp.add(128 + 32 * half));
            let hi = _mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * plane as i32)),
                _mm256_set1_epi8(3),
            );
            let u = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hi));
            let scv = _mm256_set_m128i(
                _mm_set1_epi16(i16::from(*scales.add(2 * c + 1))),
                _mm_set1_epi16(i16::from(*scales.add(2 * c))),
            );
            for t in 0..T {
                isc[t] = O::dot_scaled(isc[t], u, load(xq[t].add(i * QK_K + 32 * c)), scv);
            }
        }
        for t in 0..T {
            let sums = _mm256_loadu_si256(xsum[t].add(16 * i) as *const __m256i);
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, sums));
            let tot = _mm256_sub_epi32(isc[t], offset);
            acc[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(tot),
                _mm256_set1_ps(d * *xd[t].add(i)),
                acc[t],
            );
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
}

/// The sixteen i32 lanes of `isc` added pairwise into eight (the two halves).
#[inline(always)]
unsafe fn fold512(isc: __m512i) -> __m256i {
    _mm256_add_epi32(
        _mm512_castsi512_si256(isc),
        _mm512_extracti64x4_epi64::<1>(isc),
    )
}

/// The 128-bit lane of each i16 element: the 16-value group of a 64-value Q6_K span it scales.
const LANE_OF_I16: [i16; 32] = {
    let mut a = [0i16; 32];
    let mut e = 0;
    while e < 32 {
        a[e] = (e / 8) as i16;
        e += 1;
    }
    a
};

/// Q6_K in 512-bit registers (AVX-512 VNNI): 64 consecutive values per register (two of
/// [`q6k`]'s 32-value planes, which share their low-nibble bytes), with the four 16-value groups'
/// scales one per 128-bit lane.
#[inline(always)]
unsafe fn q6k_wide<const T: usize>(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
    let nsb = row.len() / bytes::Q6_K;
    debug_assert!(
        xs.len() == T
            && xs
                .iter()
                .all(|x| x.qs.len() == nsb * QK_K && x.d.len() == nsb && x.sums.len() == nsb * 16)
    );
    let xq: [*const u8; T] = std::array::from_fn(|t| xs[t].qs.as_ptr() as *const u8);
    let xd: [*const f32; T] = std::array::from_fn(|t| xs[t].d.as_ptr());
    let xsum: [*const i16; T] = std::array::from_fn(|t| xs[t].sums.as_ptr());
    let lane = _mm512_loadu_si512(LANE_OF_I16.as_ptr() as *const _);
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nsb {
        let sp = row.as_ptr().add(i * bytes::Q6_K);
        // d closes the block: the 4 bytes before its end hold the last two scales and d.
        let d = f16_pair(sp.add(206)).1;
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sp.add(192) as *const __m128i));
        let sc32 = _mm512_castsi256_si512(sc16);
        let mut isc = [_mm512_setzero_si512(); T];
        for p in 0..4 {
            // Values 64p..64p+64 are planes 2(p%2) and 2(p%2)+1 of half p/2: the low (p even)
            // or high nibbles of its 64 `ql` bytes, and bits 2·plane of its 32 `qh` bytes.
            let (half, plane) = (p / 2, 2 * (p % 2));
            let ql = _mm512_loadu_si512(sp.add(64 * half) as *const _);
            let lo = if plane == 0 {
                ql
            } else {
                _mm512_srli_epi16::<4>(ql)
            };
            let lo = _mm512_and_si512(lo, _mm512_set1_epi8(0xf));
            let qh = _mm512_broadcast_i64x4(load(sp.add(128 + 32 * half)));
            let shift = _mm512_mask_blend_epi16(
                0xffff_0000,
                _mm512_set1_epi16(2 * plane as i16),
                _mm512_set1_epi16(2 * plane as i16 + 2),
            );
            let hi = _mm512_and_si512(_mm512_srlv_epi16(qh, shift), _mm512_set1_epi8(3));
            let u = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(hi));
            let scv = _mm512_permutexvar_epi16(
                _mm512_add_epi16(lane, _mm512_set1_epi16(4 * p as i16)),
                sc32,
            );
            for t in 0..T {
                let x = _mm512_loadu_si512(xq[t].add(i * QK_K + 64 * p) as *const _);
                isc[t] = _mm512_dpwssd_epi32(isc[t], _mm512_maddubs_epi16(u, x), scv);
            }
        }
        for t in 0..T {
            let sums = _mm256_loadu_si256(xsum[t].add(16 * i) as *const __m256i);
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, sums));
            let tot = _mm256_sub_epi32(fold512(isc[t]), offset);
            acc[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(tot),
                _mm256_set1_ps(d * *xd[t].add(i)),
                acc[t],
            );
        }
    }
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
}

/// Eight weights of a float type widened to f32.
trait Widen {
    const W: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    fn one(b: &[u8]) -> f32;
}

struct F32;
struct F16;
struct Bf16;

impl Widen for F32 {
    const W: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p as *const f32)
    }
    fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Widen for F16 {
    const W: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    fn one(b: &[u8]) -> f32 {
        half::f16::from_le_bytes([b[0], b[1]]).to_f32()
    }
}

impl Widen for Bf16 {
    const W: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(p as *const __m128i),
        )))
    }
    fn one(b: &[u8]) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
    }
}

#[inline(always)]
unsafe fn float<L: Widen, const T: usize>(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    let n = row.len() / L::W;
    debug_assert!(xs.len() == T && xs.iter().all(|x| x.len() == n));
    let p = row.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    let n16 = n / 16 * 16;
    for i in (0..n16).step_by(16) {
        let w0 = L::load8(p.add(i * L::W));
        let w1 = L::load8(p.add((i + 8) * L::W));
        for t in 0..T {
            let x = xs[t].as_ptr().add(i);
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.add(8)), acc[t][1]);
        }
    }
    for t in 0..T {
        let mut s = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
        for i in n16..n {
            s += L::one(&row[i * L::W..]) * xs[t][i];
        }
        out[t] = s;
    }
}

#[inline(always)]
unsafe fn q4_0_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    legacy::<Q4_0, O, T>(r, x, o)
}
#[inline(always)]
unsafe fn q4_1_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    legacy::<Q4_1, O, T>(r, x, o)
}
#[inline(always)]
unsafe fn q5_0_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    legacy::<Q5_0, O, T>(r, x, o)
}
#[inline(always)]
unsafe fn q5_1_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    legacy::<Q5_1, O, T>(r, x, o)
}
#[inline(always)]
unsafe fn q8_0_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    legacy::<Q8_0, O, T>(r, x, o)
}
#[inline(always)]
unsafe fn q4_k_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    k4::<O, false, T>(r, x, o)
}
#[inline(always)]
unsafe fn q5_k_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    k4::<O, true, T>(r, x, o)
}
#[inline(always)]
unsafe fn q6_k_<O: Ops, const T: usize>(r: &[u8], x: &[Q8Row<'_>], o: &mut [f32]) {
    O::q6_k::<T>(r, x, o)
}

/// One `#[target_feature]` entry point per kernel and instruction set, dispatching on the
/// number of input rows so that each `T` gets its own unrolled body.
macro_rules! isa_module {
    ($module:ident, $ops:ty, $features:literal) => {
        pub mod $module {
            use super::*;
            isa_module!(@q8 $ops, $features, q4_0 q4_0_, q4_1 q4_1_, q5_0 q5_0_, q5_1 q5_1_, q8_0 q8_0_, q4_k q4_k_, q5_k q5_k_, q6_k q6_k_);
            isa_module!(@float $features, f32 F32, f16 F16, bf16 Bf16);
        }
    };
    (@q8 $ops:ty, $features:literal, $($name:ident $imp:ident),*) => {
        $(
            /// # Safety
            /// The CPU must have the module's features; `xs.len() == out.len()` in `1..=4`.
            #[target_feature(enable = $features)]
            pub unsafe fn $name(row: &[u8], xs: &[Q8Row<'_>], out: &mut [f32]) {
                match xs.len() {
                    1 => $imp::<$ops, 1>(row, xs, out),
                    2 => $imp::<$ops, 2>(row, xs, out),
                    3 => $imp::<$ops, 3>(row, xs, out),
                    _ => $imp::<$ops, 4>(row, xs, out),
                }
            }
        )*
    };
    (@float $features:literal, $($name:ident $ty:ident),*) => {
        $(
            /// # Safety
            /// The CPU must have the module's features; `xs.len() == out.len()` in `1..=4`.
            #[target_feature(enable = $features)]
            pub unsafe fn $name(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
                match xs.len() {
                    1 => float::<$ty, 1>(row, xs, out),
                    2 => float::<$ty, 2>(row, xs, out),
                    3 => float::<$ty, 3>(row, xs, out),
                    _ => float::<$ty, 4>(row, xs, out),
                }
            }
        )*
    };
}

isa_module!(avx2, Avx2, "avx2,fma,f16c");
isa_module!(
    avx512,
    Avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// The f32-activation kernel for `name` ("f32", "f16" or "bf16"); AVX2 serves both levels.
pub fn f32_kernel(name: &str) -> super::F32Kernel {
    match name {
        "f16" => avx2::f16,
        "bf16" => avx2::bf16,
        _ => avx2::f32,
    }
}
