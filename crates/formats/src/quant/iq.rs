//! The "i-quants" with lattice codebooks: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.
//! Each group of 8 (IQ2, IQ1) or 4 (IQ3) weights is one row of a fixed grid ([`super::iq_tables`],
//! ggml-common.h's `iq*_grid`), chosen by an index; IQ2/IQ3 add a sign per weight, IQ1 a shift
//! `delta`. All are 256-weight super-blocks of eight 32-weight sub-blocks.

use super::iq_tables::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::k_quants::QK_K;
use super::{f16_at, u16_at, u32_at};

pub const IQ2_XXS_BYTES: usize = 66;
pub const IQ2_XS_BYTES: usize = 74;
pub const IQ2_S_BYTES: usize = 82;
pub const IQ3_XXS_BYTES: usize = 98;
pub const IQ3_S_BYTES: usize = 110;
pub const IQ1_S_BYTES: usize = 50;
pub const IQ1_M_BYTES: usize = 56;

/// ggml's `ksigns_iq2xs`: 7 stored sign bits plus an eighth that makes the count of negative signs
/// even.
pub const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8
            | if (i as u8).count_ones() % 2 == 1 {
                0x80
            } else {
                0
            };
        i += 1;
    }
    t
};

/// ggml's `IQ1S_DELTA`.
pub const IQ1S_DELTA: f32 = 0.125;

/// `scale * grid[j] * (±1)` for the 8 (or 4) values of a grid row, with the sign of value `j` in
/// bit `j` of `signs` (as ggml: `db * grid[j] * (signs & kmask_iq2xs[j] ? -1.f : 1.f)`).
#[inline(always)]
fn signed_row(row: &[u8], signs: u8, scale: f32, y: &mut [f32]) {
    for (j, (v, &g)) in y.iter_mut().zip(row).enumerate() {
        let sign = if (signs >> j) & 1 == 1 { -1.0 } else { 1.0 };
        *v = scale * f32::from(g) * sign;
    }
}

/// The scale of a 2-bit i-quant sub-block (or half sub-block) with 4-bit scale `s`:
/// `d * (0.5 + s) * 0.25`.
#[inline(always)]
fn iq2_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// `block_iq2_xxs`: `d` f16 at 0..2, then per sub-block `s` 8 bytes at `2 + 8 * s`: 4 grid indices
/// (one byte per 8 weights, into `iq2xxs_grid`) and a u32 holding four 7-bit sign indices (bits
/// `7 * l..`, into [`KSIGNS`]) and the 4-bit scale (bits 28..32).
pub fn dequantize_iq2_xxs(b: &[u8; IQ2_XXS_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let at = 2 + 8 * sub;
        let aux = u32_at(b, at + 4);
        let db = iq2_scale(d, aux >> 28);
        for (l, row_out) in out.chunks_exact_mut(8).enumerate() {
            let row = IQ2XXS_GRID[usize::from(b[at + l])].to_le_bytes();
            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
            signed_row(&row, signs, db, row_out);
        }
    }
}

/// `block_iq2_xs`: `d` f16 at 0..2, `qs` 32 u16 at 2..66 (per 8 weights: grid index in bits 0..9
/// into `iq2xs_grid`, sign index in bits 9..16), `scales` 8 bytes at 66..74 (two 4-bit scales per
/// sub-block: low nibble for its first 16 weights, high for the last 16).
pub fn dequantize_iq2_xs(b: &[u8; IQ2_XS_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let sc = b[66 + sub];
        let db = [
            iq2_scale(d, u32::from(sc & 0xf)),
            iq2_scale(d, u32::from(sc >> 4)),
        ];
        for (l, row_out) in out.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (4 * sub + l));
            let row = IQ2XS_GRID[usize::from(q & 511)].to_le_bytes();
            signed_row(&row, KSIGNS[usize::from(q >> 9)], db[l / 2], row_out);
        }
    }
}

/// `block_iq2_s`: `d` f16 at 0..2, `qs` 32 bytes at 2..34 (low 8 bits of each grid index into
/// `iq2s_grid`), `signs` 32 bytes at 34..66 (one byte of explicit signs per 8 weights), `qh` 8
/// bytes at 66..74 (bits `2 * l..` of `qh[s]` are bits 8..10 of index `l` of sub-block `s`),
/// `scales` 8 bytes at 74..82 (as IQ2_XS).
pub fn dequantize_iq2_s(b: &[u8; IQ2_S_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let sc = b[74 + sub];
        let db = [
            iq2_scale(d, u32::from(sc & 0xf)),
            iq2_scale(d, u32::from(sc >> 4)),
        ];
        let qh = usize::from(b[66 + sub]);
        for (l, row_out) in out.chunks_exact_mut(8).enumerate() {
            let index = usize::from(b[2 + 4 * sub + l]) | (((qh >> (2 * l)) & 3) << 8);
            let row = IQ2S_GRID[index].to_le_bytes();
            signed_row(&row, b[34 + 4 * sub + l], db[l / 2], row_out);
        }
    }
}

/// `block_iq3_xxs`: `d` f16 at 0..2, `qs` 64 bytes at 2..66 (one `iq3xxs_grid` index per 4
/// weights), then one u32 per sub-block at `66 + 4 * s`: four 7-bit sign indices (bits `7 * l..`,
/// into [`KSIGNS`], each covering 8 weights) and the 4-bit scale (bits 28..32).
/// Weight = (d * (0.5 + scale) * 0.5) * grid * sign.
pub fn dequantize_iq3_xxs(b: &[u8; IQ3_XXS_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * sub);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, eight) in out.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
            let (first, second) = eight.split_at_mut(4);
            let at = 2 + 8 * sub + 2 * l;
            signed_row(
                &IQ3XXS_GRID[usize::from(b[at])].to_le_bytes(),
                signs,
                db,
                first,
            );
            signed_row(
                &IQ3XXS_GRID[usize::from(b[at + 1])].to_le_bytes(),
                signs >> 4,
                db,
                second,
            );
        }
    }
}

/// `block_iq3_s`: `d` f16 at 0..2, `qs` 64 bytes at 2..66 (low 8 bits of one `iq3s_grid` index per
/// 4 weights), `qh` 8 bytes at 66..74 (bit `i` of `qh[s]` is bit 8 of index `i` of sub-block `s`),
/// `signs` 32 bytes at 74..106 (explicit, one byte per 8 weights), `scales` 4 bytes at 106..110
/// (nibble `s % 2` of byte `s / 2`). Weight = (d * (1 + 2 * scale)) * grid * sign.
pub fn dequantize_iq3_s(b: &[u8; IQ3_S_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let scale = (b[106 + sub / 2] >> (4 * (sub % 2))) & 0xf;
        let db = d * (1 + 2 * i32::from(scale)) as f32;
        let qh = usize::from(b[66 + sub]);
        for (i, four) in out.chunks_exact_mut(4).enumerate() {
            let index = usize::from(b[2 + 8 * sub + i]) | (((qh >> i) & 1) << 8);
            let signs = b[74 + 4 * sub + i / 2] >> (4 * (i % 2));
            signed_row(&IQ3S_GRID[index].to_le_bytes(), signs, db, four);
        }
    }
}

/// `dl * (grid[j] + delta)` for the 8 values (-1, 0 or 1) of an `iq1s_grid` row.
#[inline(always)]
fn shifted_row(index: usize, delta: f32, dl: f32, y: &mut [f32]) {
    for (v, g) in y.iter_mut().zip(IQ1S_GRID[index].to_le_bytes()) {
        *v = dl * (f32::from(g as i8) + delta);
    }
}

/// `block_iq1_s`: `d` f16 at 0..2, `qs` 32 bytes at 2..34 (low 8 bits of one `iq1s_grid` index per
/// 8 weights), `qh` 8 u16 at 34..50, one per sub-block: bits `3 * l..3 * l + 3` are bits 8..11 of
/// index `l`, bits 12..15 the 3-bit scale, bit 15 the sign of delta.
/// Weight = (d * (2 * scale + 1)) * (grid + delta).
pub fn dequantize_iq1_s(b: &[u8; IQ1_S_BYTES], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let qh = usize::from(u16_at(b, 34 + 2 * sub));
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for (l, row_out) in out.chunks_exact_mut(8).enumerate() {
            let index = usize::from(b[2 + 4 * sub + l]) | (((qh >> (3 * l)) & 7) << 8);
            shifted_row(index, delta, dl, row_out);
        }
    }
}

/// `block_iq1_m`: `qs` 32 bytes at 0..32 (low 8 bits of one `iq1s_grid` index per 8 weights),
/// `qh` 16 bytes at 32..48 (nibble `l % 2` of `qh[2 * s + l / 2]` for row `l` of sub-block `s`:
/// bits 0..3 are bits 8..11 of the index, bit 3 the sign of delta), `scales` 4 u16 at 48..56:
/// 3-bit scales, one per 16 weights, in bits 0..12 (sub-block `s` uses bits `6 * (s % 2)..` of
/// u16 `s / 2`, the first three bits for rows 0..2, the next three for rows 2..4), and the f16
/// super-block scale split over the four top nibbles (u16 `k` holds bits `4 * k..4 * k + 4`).
/// Weight = (d * (2 * scale + 1)) * (grid + delta).
pub fn dequantize_iq1_m(b: &[u8; IQ1_M_BYTES], y: &mut [f32; QK_K]) {
    let sc: [u16; 4] = std::array::from_fn(|k| u16_at(b, 48 + 2 * k));
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = half::f16::from_bits(d_bits).to_f32();
    for (sub, out) in y.chunks_exact_mut(32).enumerate() {
        let s = usize::from(sc[sub / 2]) >> (6 * (sub % 2));
        let dl = [
            d * (2 * (s & 7) + 1) as f32,
            d * (2 * ((s >> 3) & 7) + 1) as f32,
        ];
        for (l, row_out) in out.chunks_exact_mut(8).enumerate() {
            let nibble = usize::from(b[32 + 2 * sub + l / 2] >> (4 * (l % 2))) & 0xf;
            let index = usize::from(b[4 * sub + l]) | ((nibble & 7) << 8);
            let delta = if nibble & 8 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            shifted_row(index, delta, dl[l / 2], row_out);
        }
    }
}
