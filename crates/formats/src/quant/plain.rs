//! The unquantised element types, one little-endian value per element: F32, F16, BF16, F64, and
//! the integer types I8, I16, I32, I64, which convert as numeric casts (round to nearest f32).
//! Each function converts as many whole elements as both slices hold; [`super::dequantize`]
//! checks the lengths first.

use half::f16;

use super::for_each_block;

/// Converts each `W`-byte element of `src` with `f`.
fn convert<const W: usize>(src: &[u8], dst: &mut [f32], f: impl Fn([u8; W]) -> f32) {
    for_each_block(src, dst, |b: &[u8; W], y: &mut [f32; 1]| y[0] = f(*b));
}

pub fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, f32::from_le_bytes);
}

/// Exact widening (ggml's `GGML_FP16_TO_FP32`).
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b| f16::from_le_bytes(b).to_f32());
}

/// bf16 is the high half of an f32: ggml's `GGML_BF16_TO_FP32` shifts the bits into place, which
/// also keeps NaN payloads as they are.
pub fn bf16_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b| {
        f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
    });
}

pub fn f64_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b| f64::from_le_bytes(b) as f32);
}

pub fn i8_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b: [u8; 1]| f32::from(b[0] as i8));
}

pub fn i16_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b| f32::from(i16::from_le_bytes(b)));
}

pub fn i32_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b| i32::from_le_bytes(b) as f32);
}

pub fn i64_to_f32(src: &[u8], dst: &mut [f32]) {
    convert(src, dst, |b| i64::from_le_bytes(b) as f32);
}
