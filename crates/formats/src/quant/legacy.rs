//! The original ggml types: 32 weights per block with one f16 scale `d` (and, for the `_1`
//! variants, an f16 offset `m`). Nibble order in every 4- and 5-bit type: byte `j` of `qs` holds
//! weight `j` in its low nibble and weight `j + 16` in its high nibble.

use super::{f16_at, u32_at};

/// Weights per block of every type here (ggml's `QK4_0`, `QK4_1`, `QK5_0`, `QK5_1`, `QK8_0`,
/// `QK8_1`).
pub const QK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;
pub const Q8_1_BYTES: usize = 36;

/// `block_q4_0`: `d` f16 at 0..2, `qs` 16 bytes of nibbles at 2..18.
/// Weight = (nibble - 8) * d.
pub fn dequantize_q4_0(b: &[u8; Q4_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for j in 0..QK / 2 {
        let q = b[2 + j];
        y[j] = (i32::from(q & 0xf) - 8) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// `block_q4_1`: `d` f16 at 0..2, `m` f16 at 2..4, `qs` nibbles at 4..20.
/// Weight = nibble * d + m.
pub fn dequantize_q4_1(b: &[u8; Q4_1_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for j in 0..QK / 2 {
        let q = b[4 + j];
        y[j] = f32::from(q & 0xf) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit value of weight `j` (0..16) and of weight `j + 16`: the nibbles of `q` with bits `j`
/// and `j + 16` of `qh` on top.
#[inline(always)]
fn five_bit_pair(q: u8, qh: u32, j: usize) -> (u8, u8) {
    let hi0 = ((qh >> j) & 1) as u8;
    let hi1 = ((qh >> (j + 16)) & 1) as u8;
    ((q & 0xf) | (hi0 << 4), (q >> 4) | (hi1 << 4))
}

/// `block_q5_0`: `d` f16 at 0..2, `qh` u32 at 2..6 (bit `i` is the fifth bit of weight `i`), `qs`
/// nibbles at 6..22. Weight = (5-bit value - 16) * d.
pub fn dequantize_q5_0(b: &[u8; Q5_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    for j in 0..QK / 2 {
        let (q0, q1) = five_bit_pair(b[6 + j], qh, j);
        y[j] = (i32::from(q0) - 16) as f32 * d;
        y[j + 16] = (i32::from(q1) - 16) as f32 * d;
    }
}

/// `block_q5_1`: `d` f16 at 0..2, `m` f16 at 2..4, `qh` u32 at 4..8, `qs` nibbles at 8..24.
/// Weight = 5-bit value * d + m.
pub fn dequantize_q5_1(b: &[u8; Q5_1_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32_at(b, 4);
    for j in 0..QK / 2 {
        let (q0, q1) = five_bit_pair(b[8 + j], qh, j);
        y[j] = f32::from(q0) * d + m;
        y[j + 16] = f32::from(q1) * d + m;
    }
}

/// `block_q8_0`: `d` f16 at 0..2, `qs` 32 i8 at 2..34. Weight = q * d.
pub fn dequantize_q8_0(b: &[u8; Q8_0_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (j, v) in y.iter_mut().enumerate() {
        *v = f32::from(b[2 + j] as i8) * d;
    }
}

/// `block_q8_1`: `d` f16 at 0..2, `s` f16 at 2..4 (`d` times the sum of the quants, used by dot
/// products only), `qs` 32 i8 at 4..36. Weight = q * d. ggml has no `dequantize_row_q8_1` (Q8_1
/// only ever holds activations); this is the definition.
pub fn dequantize_q8_1(b: &[u8; Q8_1_BYTES], y: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (j, v) in y.iter_mut().enumerate() {
        *v = f32::from(b[4 + j] as i8) * d;
    }
}
