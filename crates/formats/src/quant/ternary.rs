//! Ternary types (BitNet b1.58, TriLM): 256 weights in {-1, 0, 1} times one f16 scale.

use super::f16_at;
use super::k_quants::QK_K;

pub const TQ1_0_BYTES: usize = 54;
pub const TQ2_0_BYTES: usize = 66;

/// Trit `n` (0 = most significant) of a byte packing five base-3 digits as a fixed-point fraction
/// of 243: multiplying by 3^n (mod 256) brings trit `n` to the top, and `* 3 >> 8` reads it.
#[inline(always)]
fn trit(byte: u8, n: u32) -> i32 {
    let q = byte.wrapping_mul(3u8.pow(n));
    i32::from((u16::from(q) * 3) >> 8)
}

/// `block_tq1_0`: `qs` 48 bytes at 0..48 (five trits each), `qh` 4 bytes at 48..52 (four trits
/// each), `d` f16 at 52..54. Weight order: trit `n` of `qs[m]` for m < 32 is weight `32 * n + m`;
/// of `qs[32 + m]` (m < 16) weight `160 + 16 * n + m`; of `qh[m]` weight `240 + 4 * n + m`.
/// Weight = (trit - 1) * d.
pub fn dequantize_tq1_0(b: &[u8; TQ1_0_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 52);
    // (first byte, bytes per run, trits per byte, first weight)
    for (start, len, trits, first) in [(0, 32, 5, 0), (32, 16, 5, 160), (48, 4, 4, 240)] {
        for n in 0..trits {
            let out = &mut y[first + len * n as usize..][..len];
            for (v, &q) in out.iter_mut().zip(&b[start..start + len]) {
                *v = (trit(q, n) - 1) as f32 * d;
            }
        }
    }
}

/// `block_tq2_0`: `qs` 64 bytes of 2-bit values at 0..64, `d` f16 at 64..66. Weight
/// `128 * h + 32 * p + m` is bits `2 * p..` of `qs[32 * h + m]`. Weight = (q - 1) * d.
pub fn dequantize_tq2_0(b: &[u8; TQ2_0_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 64);
    for (run, out) in y.chunks_exact_mut(32).enumerate() {
        let (half, plane) = (run / 4, run % 4);
        for (v, &q) in out.iter_mut().zip(&b[32 * half..32 * half + 32]) {
            *v = (i32::from((q >> (2 * plane)) & 3) - 1) as f32 * d;
        }
    }
}
