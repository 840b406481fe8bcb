//! 4-bit codebook types: each nibble indexes a fixed table of 16 integers, scaled per block.
//! IQ4_NL and IQ4_XS use a non-linear table; MXFP4 uses the FP4 (E2M1) values with a power-of-two
//! (E8M0) block scale. Nibble order as in the legacy types: byte `j` of a 16-byte run holds weight
//! `j` in its low nibble and weight `j + 16` in its high nibble.

use super::{f16_at, u16_at};

pub const IQ4_NL_BYTES: usize = 18;
pub const IQ4_XS_BYTES: usize = 136;
pub const MXFP4_BYTES: usize = 17;
/// Weights per block of IQ4_NL and MXFP4 (IQ4_XS has 256: [`super::k_quants::QK_K`]).
pub const QK: usize = 32;

/// ggml's `kvalues_iq4nl`.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `kvalues_mxfp4`: the E2M1 values doubled, so that they are integers (the block scale is
/// halved to match).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Writes `scale * table[nibble]` for the 32 weights packed in the 16 bytes `qs`.
#[inline(always)]
fn nibbles_times(qs: &[u8], table: &[i8; 16], scale: f32, y: &mut [f32]) {
    let (lo, hi) = y.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi).zip(qs) {
        *l = scale * f32::from(table[usize::from(q & 0xf)]);
        *h = scale * f32::from(table[usize::from(q >> 4)]);
    }
}

/// `block_iq4_nl`: `d` f16 at 0..2, `qs` 16 bytes of nibbles at 2..18. Weight = d * table[q].
pub fn dequantize_iq4_nl(b: &[u8; IQ4_NL_BYTES], y: &mut [f32; QK]) {
    nibbles_times(&b[2..18], &IQ4_VALUES, f16_at(b, 0), y);
}

/// `block_iq4_xs` (256 weights): `d` f16 at 0..2, `scales_h` u16 at 2..4, `scales_l` 4 bytes at
/// 4..8, `qs` 128 bytes at 8..136. Sub-block `s` (32 weights, bytes `8 + 16 * s..`) has the 6-bit
/// scale `ls` = nibble `s % 2` of `scales_l[s / 2]` | bits `2 * s..` of `scales_h` << 4.
/// Weight = (d * (ls - 32)) * table[q].
pub fn dequantize_iq4_xs(b: &[u8; IQ4_XS_BYTES], y: &mut [f32; super::k_quants::QK_K]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let low = (b[4 + sub / 2] >> (4 * (sub % 2))) & 0xf;
        let high = ((scales_h >> (2 * sub)) & 3) as u8;
        let ls = i32::from(low | (high << 4));
        let dl = d * (ls - 32) as f32;
        nibbles_times(&b[8 + 16 * sub..][..16], &IQ4_VALUES, dl, out);
    }
}

/// Half the E8M0 scale `2^(e - 127)` as an f32 (ggml's `GGML_E8M0_TO_FP32_HALF`), built from bits
/// so that e = 0 and 1 give the subnormals 2^-128 and 2^-127 exactly. e = 255 (NaN in the OCP
/// spec) gives 2^127, as in ggml.
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `block_mxfp4`: `e` E8M0 scale byte at 0, `qs` 16 bytes of nibbles at 1..17.
/// Weight = table[q] * (2^(e - 127) / 2).
pub fn dequantize_mxfp4(b: &[u8; MXFP4_BYTES], y: &mut [f32; QK]) {
    nibbles_times(&b[1..17], &MXFP4_VALUES, e8m0_to_f32_half(b[0]), y);
}
