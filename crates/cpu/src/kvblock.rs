//! The element formats of the KV cache — f32, f16, and ggml's q8_0 and q4_0 blocks of 32 values
//! (an f16 scale and 8- or 4-bit integers) — behind one trait, so that one attention loop reads
//! them all: each has its quantisation, a scalar read (the reference) and an eight-value load.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

/// A block of `N` cache values. A cache row (one position's keys or values) is a run of
/// blocks; a head starts on a block boundary (its dimension is a multiple of `N`).
pub trait KvBlock: Copy + Send + Sync + 'static {
    /// Values per block.
    const N: usize;
    const ZERO: Self;
    /// `dst` = `src` in this format (`src.len() == dst.len() * N`).
    fn quantize(dst: &mut [Self], src: &[f32]);
    /// Value `i` of the row that starts at `row[0]`: the reference of [`KvBlock::load8`].
    fn value(row: &[Self], i: usize) -> f32;
    /// `out[i]` = value `i` of the row that starts at `row[0]`, as [`KvBlock::value`] gives it,
    /// bit for bit (so a row read back as f32 gives the same products as the row itself).
    fn dequantize(row: &[Self], out: &mut [f32]) {
        out.iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = Self::value(row, i));
    }
    /// Values `i .. i + 8` of the row that starts at `row` (`i` a multiple of 8), as
    /// [`KvBlock::value`] gives them, bit for bit.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C and the row holds value `i + 7`; inline only into functions
    /// compiled with those features.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(row: *const Self, i: usize) -> __m256;
    /// Values `i .. i + 16` (`i` a multiple of 16), as [`KvBlock::load8`] gives them twice.
    ///
    /// # Safety
    /// As [`KvBlock::load8`], with AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(row: *const Self, i: usize) -> __m512;
}

impl KvBlock for f32 {
    const N: usize = 1;
    const ZERO: f32 = 0.0;
    fn quantize(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }
    fn value(row: &[f32], i: usize) -> f32 {
        row[i]
    }
    fn dequantize(row: &[f32], out: &mut [f32]) {
        out.copy_from_slice(&row[..out.len()]);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const f32, i: usize) -> __m256 {
        _mm256_loadu_ps(row.add(i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(row: *const f32, i: usize) -> __m512 {
        _mm512_loadu_ps(row.add(i))
    }
}

impl KvBlock for f16 {
    const N: usize = 1;
    const ZERO: f16 = f16::ZERO;
    fn quantize(dst: &mut [f16], src: &[f32]) {
        // half converts slices with F16C where the CPU has it, eight values an instruction.
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
    fn value(row: &[f16], i: usize) -> f32 {
        row[i].to_f32()
    }
    fn dequantize(row: &[f16], out: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(&row[..out.len()], out);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const f16, i: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(row.add(i) as *const __m128i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(row: *const f16, i: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(row.add(i) as *const __m256i))
    }
}

/// ggml's `block_q8_0`: value `i` is `d · qs[i]`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}

/// ggml's `block_q4_0`: value `i < 16` is `d · (low nibble of qs[i] - 8)`, value `i + 16` the
/// same of the high nibble.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}

/// The scale as eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale8(d: f16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(d.to_bits() as i16))
}

/// The scale as sixteen lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale16(d: f16) -> __m512 {
    _mm512_set1_ps(d.to_f32())
}

impl KvBlock for BlockQ8_0 {
    const N: usize = 32;
    const ZERO: BlockQ8_0 = BlockQ8_0 {
        d: f16::ZERO,
        qs: [0; 32],
    };
    /// As ggml's `quantize_row_q8_0_ref`: `d = max|x| / 127`, `qs = round(x / d)`.
    fn quantize(dst: &mut [BlockQ8_0], src: &[f32]) {
        assert_eq!(src.len(), dst.len() * 32, "q8_0 rows are whole blocks");
        for (b, x) in dst.iter_mut().zip(src.chunks_exact(32)) {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b.d = f16::from_f32(d);
            b.qs.iter_mut()
                .zip(x)
                .for_each(|(q, v)| *q = (v * id).round() as i8);
        }
    }
    fn value(row: &[BlockQ8_0], i: usize) -> f32 {
        let b = &row[i / 32];
        b.d.to_f32() * b.qs[i % 32] as f32
    }
    fn dequantize(row: &[BlockQ8_0], out: &mut [f32]) {
        for (o, b) in out.chunks_mut(32).zip(row) {
            let d = b.d.to_f32();
            o.iter_mut()
                .zip(&b.qs)
                .for_each(|(o, &q)| *o = d * q as f32);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const BlockQ8_0, i: usize) -> __m256 {
        let b = &*row.add(i / 32);
        let q = _mm_loadl_epi64(b.qs.as_ptr().add(i % 32) as *const __m128i);
        _mm256_mul_ps(scale8(b.d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(row: *const BlockQ8_0, i: usize) -> __m512 {
        let b = &*row.add(i / 32);
        let q = _mm_loadu_si128(b.qs.as_ptr().add(i % 32) as *const __m128i);
        _mm512_mul_ps(scale16(b.d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)))
    }
}

impl KvBlock for BlockQ4_0 {
    const N: usize = 32;
    const ZERO: BlockQ4_0 = BlockQ4_0 {
        d: f16::ZERO,
        qs: [0; 16],
    };
    /// As ggml's `quantize_row_q4_0_ref`: `d = -m / 8` for the value `m` of largest
    /// magnitude, `q = min(15, trunc(x / d + 8.5))`.
    fn quantize(dst: &mut [BlockQ4_0], src: &[f32]) {
        assert_eq!(src.len(), dst.len() * 32, "q4_0 rows are whole blocks");
        for (b, x) in dst.iter_mut().zip(src.chunks_exact(32)) {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            b.d = f16::from_f32(d);
            let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
            for j in 0..16 {
                b.qs[j] = q(x[j]) | (q(x[j + 16]) << 4);
            }
        }
    }
    fn value(row: &[BlockQ4_0], i: usize) -> f32 {
        let (b, o) = (&row[i / 32], i % 32);
        let nib = if o < 16 {
            b.qs[o] & 15
        } else {
            b.qs[o - 16] >> 4
        };
        b.d.to_f32() * (nib as i32 - 8) as f32
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const BlockQ4_0, i: usize) -> __m256 {
        let (b, o) = (&*row.add(i / 32), i % 32);
        let mut q = _mm_loadl_epi64(b.qs.as_ptr().add(o % 16) as *const __m128i);
        if o >= 16 {
            q = _mm_srli_epi16::<4>(q);
        }
        let q = _mm_and_si128(q, _mm_set1_epi8(15));
        let v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(q), _mm256_set1_epi32(8));
        _mm256_mul_ps(scale8(b.d), _mm256_cvtepi32_ps(v))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(row: *const BlockQ4_0, i: usize) -> __m512 {
        let (b, o) = (&*row.add(i / 32), i % 32);
        let mut q = _mm_loadu_si128(b.qs.as_ptr() as *const __m128i);
        if o >= 16 {
            q = _mm_srli_epi16::<4>(q);
        }
        let q = _mm_and_si128(q, _mm_set1_epi8(15));
        let v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(q), _mm512_set1_epi32(8));
        _mm512_mul_ps(scale16(b.d), _mm512_cvtepi32_ps(v))
    }
}

/// A cache in every format: `$name<F32, F16, Q8_0, Q4_0>` for owned vectors, slices, ...
macro_rules! each_format {
    ($x:expr, $enum:ident, $v:ident => $body:expr) => {
        match $x {
            $enum::F32($v) => $body,
            $enum::F16($v) => $body,
            $enum::Q8_0($v) => $body,
            $enum::Q4_0($v) => $body,
        }
    };
}
pub(crate) use each_format;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seed: u32, n: usize) -> Vec<f32> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// ggml's bytes for `row(7, 64) * 3`, from gguf-py's `quants.quantize` (its numpy port of
    /// ggml's reference quantisation): the first block of each.
    #[test]
    fn blocks_quantize_as_ggml_does() {
        let x: Vec<f32> = row(7, 64).iter().map(|v| v * 3.0).collect();
        let mut q8 = [BlockQ8_0::ZERO; 2];
        BlockQ8_0::quantize(&mut q8, &x);
        let mut q4 = [BlockQ4_0::ZERO; 2];
        BlockQ4_0::quantize(&mut q4, &x);
        for (i, v) in x.iter().enumerate() {
            let d8 = q8[i / 32].d.to_f32().abs();
            let d4 = q4[i / 32].d.to_f32().abs();
            assert!(
                (BlockQ8_0::value(&q8, i) - v).abs() <= 0.5 * d8 * 1.01,
                "q8_0 {i}"
            );
            assert!(
                (BlockQ4_0::value(&q4, i) - v).abs() <= 0.5 * d4 * 1.01 + 1e-6,
                "q4_0 {i}"
            );
        }
        // The value of largest magnitude is exact in q4_0 (it is -8 · d).
        let big = (0..32)
            .max_by(|&a, &b| x[a].abs().total_cmp(&x[b].abs()))
            .unwrap();
        assert!((BlockQ4_0::value(&q4, big) - x[big]).abs() <= x[big].abs() * 1e-3);
        assert_eq!(GGML_Q8_0, bytes_of(&q8[0]), "q8_0 block 0");
        assert_eq!(GGML_Q4_0, bytes_of(&q4[0]), "q4_0 block 0");
    }

    fn bytes_of<T>(b: &T) -> Vec<u8> {
        // SAFETY: the blocks are repr(C) plain data without padding.
        unsafe { std::slice::from_raw_parts(b as *const T as *const u8, size_of::<T>()).to_vec() }
    }

    const GGML_Q8_0: &[u8] = &[
        11, 38, 129, 157, 103, 55, 42, 253, 144, 176, 222, 149, 101, 166, 238, 10, 225, 81, 58,
        100, 243, 229, 160, 10, 106, 71, 149, 3, 217, 26, 197, 254, 180, 30,
    ];
    const GGML_Q4_0: &[u8] = &[
        255, 53, 192, 226, 126, 107, 43, 152, 241, 195, 22, 129, 110, 162, 71, 137, 54, 173,
    ];

    #[test]
    fn f16_rows_convert_like_single_values() {
        // Odd length: the vector body and the tail; values that round, overflow and underflow.
        let src: Vec<f32> = (0..37)
            .map(|i| (i as f32 - 18.0) * 0.1003 * 10f32.powi(i % 7 - 3))
            .chain([70000.0, -1e-9, 65519.0, f32::NAN])
            .collect();
        let mut row = vec![f16::ZERO; src.len()];
        f16::quantize(&mut row, &src);
        for (r, &x) in row.iter().zip(&src) {
            assert_eq!(r.to_bits(), f16::from_f32(x).to_bits(), "{x}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn eight_value_loads_equal_the_scalar_reads() {
        if !std::is_x86_feature_detected!("avx2") || !std::is_x86_feature_detected!("f16c") {
            return;
        }
        fn check<B: KvBlock>(x: &[f32]) {
            let mut r = vec![B::ZERO; x.len() / B::N];
            B::quantize(&mut r, x);
            for i in (0..x.len()).step_by(8) {
                let mut got = [0f32; 8];
                // SAFETY: AVX2 and F16C were detected; the row holds `x.len()` values.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), B::load8(r.as_ptr(), i)) };
                for (l, g) in got.iter().enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        B::value(&r, i + l).to_bits(),
                        "value {}",
                        i + l
                    );
                }
            }
        }
        let x = row(11, 96);
        check::<f32>(&x);
        check::<f16>(&x);
        check::<BlockQ8_0>(&x);
        check::<BlockQ4_0>(&x);
    }
}
