//! Quantisers for activations, bit-exact with ggml's `quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref`: the CPU kernels quantise an input row once
//! and then take integer dot products with the weight blocks (Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL
//! weights, Q8_1 for Q4_1/Q5_1, Q8_K for the k- and i-quants).
//!
//! The blocks are typed and `#[repr(C)]` with ggml's layout; `to_bytes` gives the GGUF encoding.

use half::f16;

use super::k_quants::{Q8_K_BYTES, QK_K};
use super::legacy::{Q8_0_BYTES, Q8_1_BYTES, QK};
use crate::error::{FormatError, Result};
use crate::GgmlType;

/// ggml's `block_q8_0`: 32 values `d * qs[j]`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// ggml's `block_q8_1`: 32 values `d * qs[j]`, with `s` = `d * sum(qs)` for the Q4_1/Q5_1 dot
/// products' offset term.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// ggml's `block_q8_K`: 256 values `d * qs[j]` (`d` is an f32 here), with the sum of every 16
/// quants in `bsums`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

/// The largest |x|, as ggml's `MAX(amax, fabsf(v))` loop computes it.
fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(
        0.0,
        |amax: f32, v| if amax > v.abs() { amax } else { v.abs() },
    )
}

/// Scale `amax / 127` and its inverse (0 when the scale is 0), as the Q8_0 and Q8_1 references.
fn q8_scale(x: &[f32]) -> (f32, f32) {
    let d = abs_max(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

impl BlockQ8_0 {
    /// Quantises 32 values: `d = amax / 127`, `q = round(x / d)` (half away from zero).
    pub fn quantize(x: &[f32; QK]) -> Self {
        let (d, id) = q8_scale(x);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs: std::array::from_fn(|j| (x[j] * id).round() as i8),
        }
    }

    pub fn to_bytes(&self) -> [u8; Q8_0_BYTES] {
        let mut b = [0u8; Q8_0_BYTES];
        b[..2].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in b[2..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        b
    }
}

impl BlockQ8_1 {
    /// Quantises 32 values as [`BlockQ8_0::quantize`], plus `s = f16(sum(q) * d)`.
    pub fn quantize(x: &[f32; QK]) -> Self {
        let (d, id) = q8_scale(x);
        let qs: [i8; QK] = std::array::from_fn(|j| (x[j] * id).round() as i8);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }

    pub fn to_bytes(&self) -> [u8; Q8_1_BYTES] {
        let mut b = [0u8; Q8_1_BYTES];
        b[..2].copy_from_slice(&self.d.to_le_bytes());
        b[2..4].copy_from_slice(&self.s.to_le_bytes());
        for (o, &q) in b[4..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        b
    }
}

/// ggml's `nearest_int`: round to nearest, ties to even, by adding 1.5 * 2^23 so that the f32
/// addition does the rounding. Valid for |f| < 2^22.
fn nearest_int(f: f32) -> i32 {
    let bits = (f + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

impl BlockQ8K {
    /// Quantises 256 values: with `max` the value of largest magnitude (the first such),
    /// `iscale = -127 / max`, `q = min(127, nearest_int(iscale * x))` and `d = 1 / iscale` (so `d`
    /// has the opposite sign of `max`). An all-zero block gives `d = 0` and zero quants.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return BlockQ8K {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; QK_K / 16],
            };
        }
        let iscale = -127.0 / max;
        let qs: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
        let bsums =
            std::array::from_fn(|g| qs[16 * g..16 * g + 16].iter().map(|&q| i16::from(q)).sum());
        BlockQ8K {
            d: 1.0 / iscale,
            qs,
            bsums,
        }
    }

    pub fn to_bytes(&self) -> [u8; Q8_K_BYTES] {
        let mut b = [0u8; Q8_K_BYTES];
        b[..4].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in b[4..4 + QK_K].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        for (o, s) in b[4 + QK_K..].chunks_exact_mut(2).zip(self.bsums) {
            o.copy_from_slice(&s.to_le_bytes());
        }
        b
    }
}

/// Quantises the row `x` into `out`, one block per `N` values; `x` must hold exactly `out.len()`
/// blocks.
fn quantize_row<const N: usize, B>(
    dtype: GgmlType,
    x: &[f32],
    out: &mut [B],
    f: impl Fn(&[f32; N]) -> B,
) -> Result<()> {
    if x.len() != out.len() * N {
        return Err(FormatError::BadQuantLength {
            dtype,
            len: out.len() * dtype.block_bytes(),
            n: x.len(),
        });
    }
    let mut rest = x;
    for o in out {
        if let Some((block, tail)) = rest.split_first_chunk::<N>() {
            *o = f(block);
            rest = tail;
        }
    }
    Ok(())
}

/// Quantises `x` to Q8_0 (ggml's `quantize_row_q8_0_ref`); `x.len()` must be `32 * out.len()`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> Result<()> {
    quantize_row(GgmlType::Q8_0, x, out, BlockQ8_0::quantize)
}

/// Quantises `x` to Q8_1 (ggml's `quantize_row_q8_1_ref`); `x.len()` must be `32 * out.len()`.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) -> Result<()> {
    quantize_row(GgmlType::Q8_1, x, out, BlockQ8_1::quantize)
}

/// Quantises `x` to Q8_K (ggml's `quantize_row_q8_K_ref`); `x.len()` must be `256 * out.len()`.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) -> Result<()> {
    quantize_row(GgmlType::Q8K, x, out, BlockQ8K::quantize)
}
