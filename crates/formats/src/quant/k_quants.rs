//! The k-quants: 256-weight super-blocks split into sub-blocks of 16 or 32 weights, each with a
//! small integer scale (and min) that an f16 super-block scale turns into f32.
//!
//! Bit-plane order shared by Q2_K, Q3_K (2-bit planes) and Q4_K, Q5_K, Q6_K (nibbles): each half
//! (Q2_K, Q3_K, Q6_K: 128 weights) or quarter (Q4_K, Q5_K: 64 weights) of the super-block reads
//! one run of 32 quant bytes, shifting through its planes: weight `32 * p + l` of the run is in
//! plane `p` of byte `l`.

use super::f16_at;

/// Weights per super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
pub const Q8_K_BYTES: usize = 292;

/// `block_q2_K`: `scales` 16 bytes at 0..16 (low nibble: scale, high nibble: min of each group of
/// 16 weights), `qs` 64 bytes of 2-bit quants at 16..80, `d` f16 at 80..82, `dmin` f16 at 82..84.
/// Weight = (d * scale) * q - (dmin * min).
pub fn dequantize_q2_k(b: &[u8; Q2_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (group, out) in y.chunks_exact_mut(16).enumerate() {
        let sc = b[group];
        let dl = d * f32::from(sc & 0xf);
        let ml = dmin * f32::from(sc >> 4);
        // 128 weights per half; within it, 32 per 2-bit plane.
        let (half, plane, first) = (group / 8, (group % 8) / 2, 16 * (group % 2));
        let qs = &b[16 + 32 * half + first..][..16];
        for (v, &q) in out.iter_mut().zip(qs) {
            *v = dl * f32::from((q >> (2 * plane)) & 3) - ml;
        }
    }
}

/// The 16 six-bit scales of a Q3_K block, from its 12 `scales` bytes: the low 4 bits of scale `j`
/// are nibble `j / 8` of byte `j % 8`, the high 2 bits are bits `2 * (j / 4)..` of byte
/// `8 + j % 4`.
pub fn q3_k_scales(scales: &[u8]) -> [u8; 16] {
    std::array::from_fn(|j| {
        let low = (scales[j % 8] >> (4 * (j / 8))) & 0xf;
        let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        low | (high << 4)
    })
}

/// `block_q3_K`: `hmask` 32 bytes at 0..32 (the third bit of each quant: weight `32 * p + l` of a
/// 128-weight half `h` is bit `4 * h + p` of byte `l`), `qs` 64 bytes of 2-bit planes at 32..96,
/// `scales` 12 bytes at 96..108 (see [`q3_k_scales`]), `d` f16 at 108..110.
/// Weight = (d * (scale - 32)) * (q - (hmask bit ? 0 : 4)).
pub fn dequantize_q3_k(b: &[u8; Q3_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 108);
    let scales = q3_k_scales(&b[96..108]);
    for (group, out) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(scales[group] as i8 - 32);
        let (half, plane, first) = (group / 8, (group % 8) / 2, 16 * (group % 2));
        let qs = &b[32 + 32 * half + first..][..16];
        let hmask = &b[first..][..16];
        let hbit = 4 * half + plane;
        for ((v, &q), &h) in out.iter_mut().zip(qs).zip(hmask) {
            let low = i32::from((q >> (2 * plane)) & 3);
            let offset = if (h >> hbit) & 1 == 1 { 0 } else { 4 };
            *v = dl * (low - offset) as f32;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K or Q5_K block, from its 12 `scales` bytes
/// (ggml's `get_scale_min_k4`): sub-blocks 0..4 keep 6-bit values in bytes `j` and `j + 4`; 4..8
/// put their low 4 bits in byte `j + 4` and their high 2 bits in the top of bytes `j - 4` / `j`.
#[inline(always)]
pub fn k4_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// `block_q4_K`: `d` f16 at 0..2, `dmin` f16 at 2..4, `scales` 12 bytes at 4..16 (see
/// [`k4_scale_min`]), `qs` 128 bytes at 16..144: the 64 weights of quarter `k` are the low then the
/// high nibbles of bytes `32 * k..32 * k + 32`. Weight = (d * scale) * q - (dmin * min) per
/// 32-weight sub-block.
pub fn dequantize_q4_k(b: &[u8; Q4_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k4_scale_min(scales, sub);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        let shift = 4 * (sub % 2);
        let qs = &b[16 + 32 * (sub / 2)..][..32];
        for (v, &q) in out.iter_mut().zip(qs) {
            *v = d1 * f32::from((q >> shift) & 0xf) - m1;
        }
    }
}

/// `block_q5_K`: `d` f16 at 0..2, `dmin` f16 at 2..4, `scales` 12 bytes at 4..16 (see
/// [`k4_scale_min`]), `qh` 32 bytes at 16..48 (bit `s` of byte `l` is the fifth bit of weight `l`
/// of sub-block `s`), `qs` 128 bytes at 48..176 laid out as in Q4_K.
/// Weight = (d * scale) * q - (dmin * min).
pub fn dequantize_q5_k(b: &[u8; Q5_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k4_scale_min(scales, sub);
        let d1 = d * f32::from(sc);
        let m1 = dmin * f32::from(m);
        let shift = 4 * (sub % 2);
        let qs = &b[48 + 32 * (sub / 2)..][..32];
        for ((v, &q), &h) in out.iter_mut().zip(qs).zip(qh) {
            let q5 = ((q >> shift) & 0xf) | (((h >> sub) & 1) << 4);
            *v = d1 * f32::from(q5) - m1;
        }
    }
}

/// `block_q6_K`: `ql` 128 bytes at 0..128 (low 4 bits), `qh` 64 bytes at 128..192 (high 2 bits),
/// `scales` 16 i8 at 192..208 (one per 16 weights), `d` f16 at 208..210. In 128-weight half `h`,
/// weight `32 * p + l` takes nibble `p / 2` of `ql[64 * h + 32 * (p % 2) + l]` and bits `2 * p..`
/// of `qh[32 * h + l]`. Weight = (d * scale) * (q - 32).
pub fn dequantize_q6_k(b: &[u8; Q6_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 208);
    for (group, out) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(b[192 + group] as i8);
        let (half, plane, first) = (group / 8, (group % 8) / 2, 16 * (group % 2));
        let ql = &b[64 * half + 32 * (plane % 2) + first..][..16];
        let qh = &b[128 + 32 * half + first..][..16];
        let shift = 4 * (plane / 2);
        for ((v, &lo), &hi) in out.iter_mut().zip(ql).zip(qh) {
            let q = ((lo >> shift) & 0xf) | (((hi >> (2 * plane)) & 3) << 4);
            *v = dl * f32::from(q as i8 - 32);
        }
    }
}

/// `block_q8_K` (activations for the k-quant dot products): `d` f32 at 0..4, `qs` 256 i8 at
/// 4..260, `bsums` 16 i16 at 260..292 (sum of each 16 quants; not needed here). Weight = d * q.
pub fn dequantize_q8_k(b: &[u8; Q8_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (j, v) in y.iter_mut().enumerate() {
        *v = d * f32::from(b[4 + j] as i8);
    }
}
