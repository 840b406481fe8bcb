//! Weights of the 32-value types repacked at load, sixteen rows interleaved, for x86 (AVX2 reads
//! the layout as two halves of eight rows, see `x86_packed`): each
//! 32-bit lane of a 512-bit register holds four quants of one of sixteen rows, so one VNNI
//! instruction adds four products to each of sixteen rows' sums, against four activations
//! broadcast from memory; a block's sums need no horizontal reduction, and per input row a block
//! column costs eight such instructions and three float ones for all sixteen rows. The bytes are
//! the same as in the file, rearranged (with Q8_0's signed quants biased by 128 and the fifth
//! bits of Q5 regrouped as byte masks): packing loses nothing, and the packed matrix replaces the
//! mapped one in memory.
//!
//! Layout: groups of sixteen rows (the last padded with zero rows), each a run of block columns:
//! `d` (16 × f16), `m` (16 × f16, Q4_1/Q5_1 only), the fifth bits (Q5: 64 bytes of bit planes,
//! bit `j` of byte `4r + i` for value `4j + i` of row `r` — byte `x` lines up with byte `x` of
//! every quant chunk, so chunk `j`'s fifth bits are one AND and one shift away, or one test
//! into an AVX-512 mask), then the quants in chunks of 64 bytes,
//! bytes `4r..4r + 4` of a chunk from row `r`: Q4/Q5 four chunks, chunk `k` of file bytes
//! `4k..4k + 4` (values `4k + i` in the low nibbles, `16 + 4k + i` in the high ones); Q8_0 eight
//! chunks, chunk `j` of values `4j..4j + 4` (each `q + 128`).

use anelm_formats::GgmlType;

use super::bytes;
use crate::simd::Isa;

/// Rows per group.
pub const ROWS: usize = 16;

/// Input rows per kernel call: a token's eight weight registers and the row's sums for eight
/// tokens fit the 32 vector registers, and a batched decode step of up to eight sequences
/// unpacks each weight block once.
pub const MAX_TOKENS: usize = 8;

/// A repacked matrix, where it lies in memory.
#[derive(Clone, Copy)]
pub struct Packed<'a> {
    /// The instruction set whose kernel reads it.
    pub isa: Isa,
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

    /// Bytes of one block column of a group (the same as [`ROWS`] file blocks).
    pub fn column(self) -> usize {
        ROWS * self.block
    }

    pub fn m_at(self) -> usize {
        2 * ROWS
    }

    pub fn masks_at(self) -> usize {
        if self.has_m {
            4 * ROWS
        } else {
            2 * ROWS
        }
    }

    pub fn quants_at(self) -> usize {
        self.masks_at() + if self.five { 64 } else { 0 }
    }

    /// The chunk of item `v` of row `lane` (a value for Q8_0 and the fifth bits, a nibble byte
    /// for Q4/Q5) and its byte in the chunk (for the fifth bits: the chunk is the bit, in the
    /// byte of the planes).
    fn place(lane: usize, v: usize) -> (usize, usize) {
        (v / 4, 4 * lane + v % 4)
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
            let qs_src = lay.block - if lay.eight { 32 } else { 16 };
            let qh_at = if lay.has_m { 4 } else { 2 };
            if lay.five {
                let qh = u32::from_le_bytes(blk[qh_at..qh_at + 4].try_into().expect("4 bytes"));
                for v in (0..32).filter(|v| qh >> v & 1 == 1) {
                    let (j, at) = Layout::place(lane, v);
                    col[lay.masks_at() + at] |= 1 << j;
                }
            }
            let q = lay.quants_at();
            if lay.eight {
                for (v, &x) in blk[qs_src..qs_src + 32].iter().enumerate() {
                    let (j, at) = Layout::place(lane, v);
                    col[q + 64 * j + at] = x ^ 0x80;
                }
            } else {
                for (b, &x) in blk[qs_src..qs_src + 16].iter().enumerate() {
                    let (k, at) = Layout::place(lane, b);
                    col[q + 64 * k + at] = x;
                }
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
        let qh_at = if lay.has_m { 4 } else { 2 };
        if lay.five {
            let mut qh = 0u32;
            for v in 0..32 {
                let (j, at) = Layout::place(lane, v);
                qh |= u32::from(col[lay.masks_at() + at] >> j & 1) << v;
            }
            blk[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
        }
        let q = lay.quants_at();
        if lay.eight {
            let qs = lay.block - 32;
            for (v, x) in blk[qs..].iter_mut().enumerate() {
                let (j, at) = Layout::place(lane, v);
                *x = col[q + 64 * j + at] ^ 0x80;
            }
        } else {
            let qs = lay.block - 16;
            for (b, x) in blk[qs..].iter_mut().enumerate() {
                let (k, at) = Layout::place(lane, b);
                *x = col[q + 64 * k + at];
            }
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
