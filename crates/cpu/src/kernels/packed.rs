//! Weights of the 32-value types repacked at load, four rows interleaved, for AVX-512: the
//! quants of one block of four rows fill one 512-bit register (a 128-bit lane per row), so a
//! single VNNI instruction multiplies four rows by one block of activations, and the four rows'
//! scales convert in one instruction. The bytes are the same as in the file, rearranged (with
//! Q8_0's signed quants biased by 128 and the fifth bits of Q5 regrouped as byte masks): packing
//! loses nothing, and the packed matrix replaces the mapped one in memory.
//!
//! Layout: groups of four rows (the last padded with zero rows), each a run of block columns:
//! `d` (4 × f16), `m` (4 × f16, Q4_1/Q5_1 only), the fifth-bit masks (Q5: two u64, bit `16r + j`
//! of the first for value `j` of row `r`, of the second for value `j + 16`), then the quants:
//! Q4/Q5 four rows × 16 nibble bytes; Q8_0 four rows × the first 16 values, then four rows × the
//! last 16 (each `q + 128`).

use anelm_formats::GgmlType;

use super::bytes;

/// Rows per group.
pub const ROWS: usize = 4;

/// A repacked matrix, where it lies in memory.
#[derive(Clone, Copy)]
pub struct Packed<'a> {
    pub dtype: GgmlType,
    /// 32-value blocks per row.
    pub blocks: usize,
    pub data: &'a [u8],
}

/// How a type's block column is laid out.
#[derive(Clone, Copy)]
pub struct Layout {
    /// `m` is stored (else it is `offset · d`).
    pub has_m: bool,
    pub offset: f32,
    pub five: bool,
    pub eight: bool,
    /// Bytes of one block of one row in the file.
    pub block: usize,
}

impl Layout {
    pub fn of(t: GgmlType) -> Option<Layout> {
        let l = |has_m, offset, five, eight, block| {
            Some(Layout {
                has_m,
                offset,
                five,
                eight,
                block,
            })
        };
        match t {
            GgmlType::Q4_0 => l(false, -8.0, false, false, bytes::Q4_0),
            GgmlType::Q4_1 => l(true, 0.0, false, false, bytes::Q4_1),
            GgmlType::Q5_0 => l(false, -16.0, true, false, bytes::Q5_0),
            GgmlType::Q5_1 => l(true, 0.0, true, false, bytes::Q5_1),
            GgmlType::Q8_0 => l(false, -128.0, false, true, bytes::Q8_0),
            _ => None,
        }
    }

    /// Bytes of one block column of a group (the same as four file blocks).
    pub fn column(self) -> usize {
        ROWS * self.block
    }

    pub fn m_at(self) -> usize {
        8
    }

    pub fn masks_at(self) -> usize {
        if self.has_m {
            16
        } else {
            8
        }
    }

    pub fn quants_at(self) -> usize {
        self.masks_at() + if self.five { 16 } else { 0 }
    }
}

/// Bytes of the packed copy of a `rows` × `blocks` matrix of type `t` (None: `t` has no packed
/// layout).
pub fn packed_len(t: GgmlType, rows: usize, blocks: usize) -> Option<usize> {
    Some(rows.div_ceil(ROWS) * blocks * Layout::of(t)?.column())
}

/// Packs the matrix whose row `r` is `row(r)` into `data` ([`packed_len`] zeroed bytes).
/// `done(r)` hears when rows `..r` have been read, so that their memory can be given back.
pub fn pack_into<'a>(
    t: GgmlType,
    rows: usize,
    blocks: usize,
    row: impl Fn(usize) -> &'a [u8],
    data: &mut [u8],
    mut done: impl FnMut(usize),
) {
    let lay = Layout::of(t).expect("pack_into takes the types packed_len accepts");
    debug_assert_eq!(Some(data.len()), packed_len(t, rows, blocks));
    for r in 0..rows {
        let (g, lane) = (r / ROWS, r % ROWS);
        let src = row(r);
        for b in 0..blocks {
            let blk = &src[b * lay.block..(b + 1) * lay.block];
            let col = &mut data[(g * blocks + b) * lay.column()..][..lay.column()];
            col[2 * lane..2 * lane + 2].copy_from_slice(&blk[0..2]);
            if lay.has_m {
                col[lay.m_at() + 2 * lane..][..2].copy_from_slice(&blk[2..4]);
            }
            let qs_src = if lay.five {
                lay.block - 16
            } else {
                lay.block - if lay.eight { 32 } else { 16 }
            };
            if lay.five {
                let qh_at = if lay.has_m { 4 } else { 2 };
                let qh = u32::from_le_bytes([
                    blk[qh_at],
                    blk[qh_at + 1],
                    blk[qh_at + 2],
                    blk[qh_at + 3],
                ]);
                for (half, bits) in [qh & 0xffff, qh >> 16].into_iter().enumerate() {
                    let at = lay.masks_at() + 8 * half;
                    let mut mask = u64::from_le_bytes(col[at..at + 8].try_into().expect("8 bytes"));
                    mask |= u64::from(bits) << (16 * lane);
                    col[at..at + 8].copy_from_slice(&mask.to_le_bytes());
                }
            }
            let q = lay.quants_at();
            if lay.eight {
                for (j, &v) in blk[qs_src..qs_src + 32].iter().enumerate() {
                    col[q + 64 * (j / 16) + 16 * lane + j % 16] = v ^ 0x80;
                }
            } else {
                col[q + 16 * lane..q + 16 * lane + 16].copy_from_slice(&blk[qs_src..qs_src + 16]);
            }
        }
        if (r + 1) % 1024 == 0 || r + 1 == rows {
            done(r + 1);
        }
    }
}

/// Row `r` of the packed matrix `p` as the file stores it (`dst`: one row's bytes): the inverse
/// of [`pack_into`], for readers of single rows (a token embedding tied to the output head).
pub fn unpack_row(p: &Packed<'_>, r: usize, dst: &mut [u8]) {
    let lay = Layout::of(p.dtype).expect("packed matrices have a layout");
    debug_assert_eq!(dst.len(), p.blocks * lay.block);
    let (g, lane) = (r / ROWS, r % ROWS);
    for (b, blk) in dst.chunks_exact_mut(lay.block).enumerate() {
        let col = &p.data[(g * p.blocks + b) * lay.column()..][..lay.column()];
        blk[0..2].copy_from_slice(&col[2 * lane..2 * lane + 2]);
        if lay.has_m {
            blk[2..4].copy_from_slice(&col[lay.m_at() + 2 * lane..][..2]);
        }
        if lay.five {
            let mut qh = 0u32;
            for half in 0..2 {
                let at = lay.masks_at() + 8 * half;
                let mask = u64::from_le_bytes(col[at..at + 8].try_into().expect("8 bytes"));
                qh |= (((mask >> (16 * lane)) & 0xffff) as u32) << (16 * half);
            }
            let qh_at = if lay.has_m { 4 } else { 2 };
            blk[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
        }
        let q = lay.quants_at();
        if lay.eight {
            let qs = lay.block - 32;
            for (j, v) in blk[qs..].iter_mut().enumerate() {
                *v = col[q + 64 * (j / 16) + 16 * lane + j % 16] ^ 0x80;
            }
        } else {
            let qs = lay.block - 16;
            blk[qs..].copy_from_slice(&col[q + 16 * lane..q + 16 * lane + 16]);
        }
    }
}

/// The packed copy of a matrix in a new buffer (None: `t` has no packed layout).
pub fn pack<'a>(
    t: GgmlType,
    rows: usize,
    blocks: usize,
    row: impl Fn(usize) -> &'a [u8],
    done: impl FnMut(usize),
) -> Option<Vec<u8>> {
    let mut data = vec![0u8; packed_len(t, rows, blocks)?];
    pack_into(t, rows, blocks, row, &mut data, done);
    Some(data)
}
