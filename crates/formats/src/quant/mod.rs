//! Dequantisation of every ggml type to f32, bit-exact with ggml's reference `dequantize_row_*`
//! (ggml-quants.c), and the quantisers the CPU kernels use for activations (Q8_0, Q8_1, Q8_K).
//!
//! Exactness: each weight is computed with the f32 operations of the C reference, in its order
//! (Q4_K, for instance, forms `d * scale` and `dmin * min` first, then `d1 * q - m1`). Rust never
//! fuses a multiply with an add, so every operation rounds once, as in the reference built without
//! FMA contraction and as in gguf-py's numpy dequantisers, which the tests compare against bit for
//! bit. fp16 and bf16 fields widen to f32 exactly.
//!
//! One module per block family; each documents its block layouts and has a per-block function
//! (`&[u8; BYTES]` in, `&mut [f32; ELEMS]` out) that the CPU kernels reuse:
//! - [`plain`]: F32, F16, BF16, F64 and the integer types (numeric casts)
//! - [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32 weights per block)
//! - [`k_quants`]: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K (256-weight super-blocks)
//! - [`codebook`]: IQ4_NL, IQ4_XS, MXFP4 (4-bit indices into a 16-entry table)
//! - [`iq`]: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (lattice codebooks)
//! - [`ternary`]: TQ1_0, TQ2_0
//! - [`blockwise`]: the integer-block types as integers, scales and biases (for blockwise back ends)
//! - [`activation`]: Q8_0, Q8_1 and Q8_K quantisers (ggml's `quantize_row_*_ref`)

pub mod activation;
pub mod blockwise;
pub mod codebook;
pub mod iq;
mod iq_tables;
pub mod k_quants;
pub mod legacy;
pub mod plain;
pub mod ternary;

use half::f16;

use crate::error::{FormatError, Result};
use crate::GgmlType;

/// Dequantises `src` (whole blocks of `dtype`) into `dst`; `dst.len()` elements are produced.
pub fn dequantize(dtype: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if dtype.bytes_for(dst.len()) != Some(src.len()) {
        return Err(FormatError::BadQuantLength {
            dtype,
            len: src.len(),
            n: dst.len(),
        });
    }
    use GgmlType::*;
    match dtype {
        F32 => plain::f32_to_f32(src, dst),
        F16 => plain::f16_to_f32(src, dst),
        BF16 => plain::bf16_to_f32(src, dst),
        F64 => plain::f64_to_f32(src, dst),
        I8 => plain::i8_to_f32(src, dst),
        I16 => plain::i16_to_f32(src, dst),
        I32 => plain::i32_to_f32(src, dst),
        I64 => plain::i64_to_f32(src, dst),
        Q4_0 => for_each_block(src, dst, legacy::dequantize_q4_0),
        Q4_1 => for_each_block(src, dst, legacy::dequantize_q4_1),
        Q5_0 => for_each_block(src, dst, legacy::dequantize_q5_0),
        Q5_1 => for_each_block(src, dst, legacy::dequantize_q5_1),
        Q8_0 => for_each_block(src, dst, legacy::dequantize_q8_0),
        Q8_1 => for_each_block(src, dst, legacy::dequantize_q8_1),
        Q2K => for_each_block(src, dst, k_quants::dequantize_q2_k),
        Q3K => for_each_block(src, dst, k_quants::dequantize_q3_k),
        Q4K => for_each_block(src, dst, k_quants::dequantize_q4_k),
        Q5K => for_each_block(src, dst, k_quants::dequantize_q5_k),
        Q6K => for_each_block(src, dst, k_quants::dequantize_q6_k),
        Q8K => for_each_block(src, dst, k_quants::dequantize_q8_k),
        IQ4NL => for_each_block(src, dst, codebook::dequantize_iq4_nl),
        IQ4XS => for_each_block(src, dst, codebook::dequantize_iq4_xs),
        MXFP4 => for_each_block(src, dst, codebook::dequantize_mxfp4),
        IQ2XXS => for_each_block(src, dst, iq::dequantize_iq2_xxs),
        IQ2XS => for_each_block(src, dst, iq::dequantize_iq2_xs),
        IQ2S => for_each_block(src, dst, iq::dequantize_iq2_s),
        IQ3XXS => for_each_block(src, dst, iq::dequantize_iq3_xxs),
        IQ3S => for_each_block(src, dst, iq::dequantize_iq3_s),
        IQ1S => for_each_block(src, dst, iq::dequantize_iq1_s),
        IQ1M => for_each_block(src, dst, iq::dequantize_iq1_m),
        TQ1_0 => for_each_block(src, dst, ternary::dequantize_tq1_0),
        TQ2_0 => for_each_block(src, dst, ternary::dequantize_tq2_0),
    }
    Ok(())
}

/// Runs `f` on each `B`-byte block of `src` and its `N`-float slot in `dst`, in order. The caller
/// has checked that both hold the same number of whole blocks.
fn for_each_block<const B: usize, const N: usize>(
    mut src: &[u8],
    mut dst: &mut [f32],
    f: impl Fn(&[u8; B], &mut [f32; N]),
) {
    while let (Some((block, src_rest)), Some((out, dst_rest))) = (
        src.split_first_chunk::<B>(),
        std::mem::take(&mut dst).split_first_chunk_mut::<N>(),
    ) {
        f(block, out);
        src = src_rest;
        dst = dst_rest;
    }
}

/// The little-endian u16 at `b[at..at + 2]`.
#[inline(always)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian u32 at `b[at..at + 4]`.
#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The f16 at `b[at..at + 2]`, widened exactly (ggml's `GGML_FP16_TO_FP32`).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16_at(b, at)).to_f32()
}

#[cfg(test)]
mod tests;
