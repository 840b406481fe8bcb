//! The weights the products read, copied at load into one region of anonymous memory on huge
//! pages. Decode streams every weight once per token; from the file's mapping, on 4 KiB pages,
//! every page is a TLB miss. Matrices with a packed kernel on the instruction set are stored
//! packed ([`crate::kernels::packed`]), the other mapped ones as in the file. The mapped pages
//! of each matrix are given back as it is copied, so the process's resident size does not
//! double; a matrix the model holds in its own memory (converted at load) is read in place
//! unless it is packed, as copying it would. Copies are found by the bytes they copy, so two
//! weights over the same bytes (a token embedding tied to the output head) share one, and the
//! embedding's rows are read from it rather than fault the mapped pages back in.

use std::collections::HashMap;
use std::ops::Range;

use anelm_model::Weight;

use crate::kernels::packed::{pack_into, packed_len, unpack_row, Packed};
use crate::mem::{file_mappings, mapped, release, Region};
use crate::simd::Isa;

/// Copies start on a cache line.
const ALIGN: usize = 64;
/// Bytes copied before the mapped pages behind them are given back (a multiple of any page size).
const COPY_PIECE: usize = 8 << 20;

pub struct Resident {
    region: Region,
    /// Where each weight's copy lies, by the bytes it copies.
    at: HashMap<Key, Placed>,
    isa: Isa,
}

struct Placed {
    bytes: Range<usize>,
    /// Packed: the number of 32-value blocks per row.
    packed_blocks: Option<usize>,
}

/// What a product reads of one weight.
pub struct View<'a> {
    /// The rows as in the file (the copy, or the mapping for a packed or uncopied weight).
    pub bytes: &'a [u8],
    pub packed: Option<Packed<'a>>,
}

/// The address and length of a weight's bytes, and its rows (one copy per distinct matrix).
type Key = (usize, usize, usize);

fn key(w: &Weight) -> Key {
    (w.bytes().as_ptr() as usize, w.bytes().len(), w.rows)
}

impl Resident {
    /// Copies the mapped `weights` (each matrix once, however often listed), packing the 32-value types
    /// when `pack` is set and the instruction set has a packed kernel (AVX2 or AVX-512).
    pub fn new<'w>(weights: impl IntoIterator<Item = &'w Weight>, isa: Isa, pack: bool) -> Self {
        let packs = |w: &Weight| {
            let blocks = w.cols / 32;
            (pack && isa.has_avx2() && w.rows > 0)
                .then(|| packed_len(w.dtype, w.rows, blocks).map(|len| (blocks, len)))
                .flatten()
        };
        let maps = file_mappings();
        let mut at = HashMap::new();
        let mut plan = Vec::new();
        let mut end = 0;
        for w in weights {
            let packed = packs(w);
            if at.contains_key(&key(w)) || (packed.is_none() && !mapped(w.bytes(), &maps)) {
                continue;
            }
            let len = packed.map_or(w.bytes().len(), |p| p.1);
            let bytes = end..end + len;
            end = (end + len).next_multiple_of(ALIGN);
            at.insert(
                key(w),
                Placed {
                    bytes: bytes.clone(),
                    packed_blocks: packed.map(|p| p.0),
                },
            );
            plan.push((w, bytes));
        }
        let mut region = Region::new(end, true);
        for (w, bytes) in plan {
            let (src, dst) = (w.bytes(), &mut region[bytes]);
            let rb = src.len() / w.rows.max(1);
            match at[&key(w)].packed_blocks {
                Some(blocks) => pack_into(
                    w.dtype,
                    w.rows,
                    blocks,
                    |r| &src[r * rb..(r + 1) * rb],
                    dst,
                    |rows| release(&src[..rows * rb], &maps),
                ),
                None => {
                    // In pieces, each given back as soon as it is copied: copied whole, a large
                    // matrix (Gemma 3's 178 MB embedding) would be resident twice at the peak.
                    for (d, s) in dst.chunks_mut(COPY_PIECE).zip(src.chunks(COPY_PIECE)) {
                        d.copy_from_slice(s);
                        release(s, &maps);
                    }
                }
            }
        }
        Resident { region, at, isa }
    }

    /// The copy of `w`, or `w` itself where it has none.
    pub fn view<'a>(&'a self, w: &'a Weight) -> View<'a> {
        match self.at.get(&key(w)) {
            None => View {
                bytes: w.bytes(),
                packed: None,
            },
            Some(c) => {
                let bytes = &self.region[c.bytes.clone()];
                match c.packed_blocks {
                    None => View {
                        bytes,
                        packed: None,
                    },
                    Some(blocks) => View {
                        bytes: w.bytes(),
                        packed: Some(Packed {
                            isa: self.isa,
                            dtype: w.dtype,
                            blocks,
                            data: bytes,
                        }),
                    },
                }
            }
        }
    }
}

impl Resident {
    /// Row `r` of `w` in the file's layout, read from `w`'s copy where it has one (unpacked into
    /// `buf` if packed), else from `w` itself.
    pub fn row<'a>(&'a self, w: &'a Weight, r: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
        let view = self.view(w);
        let rb = w.row_bytes();
        match view.packed {
            None => &view.bytes[r * rb..(r + 1) * rb],
            Some(p) => {
                buf.resize(rb, 0);
                unpack_row(&p, r, buf);
                buf
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_formats::GgmlType;

    #[test]
    fn weights_in_the_models_memory_are_read_in_place_unless_packed() {
        let f32w = Weight::from_f32("w", 2, 32, &[0.5; 64]);
        // Two rows of one Q8_0 block each: scale 1.0 (f16 0x3c00), quants 0..31.
        let block: Vec<u8> = [0x00, 0x3c].into_iter().chain(0..32u8).collect();
        let q8 = Weight::from_bytes("q", GgmlType::Q8_0, 2, 32, [block.clone(), block].concat());
        for isa in Isa::available() {
            let r = Resident::new([&f32w, &q8, &f32w], isa, true);
            let (vf, vq) = (r.view(&f32w), r.view(&q8));
            assert_eq!(vf.bytes.as_ptr(), f32w.bytes().as_ptr(), "{isa:?}");
            assert!(vf.packed.is_none());
            assert_eq!(vq.bytes.as_ptr(), q8.bytes().as_ptr());
            match vq.packed {
                Some(p) => {
                    assert!(isa.has_avx2());
                    assert_eq!((p.dtype, p.blocks), (GgmlType::Q8_0, 1));
                    // One group: the two rows and zero rows.
                    let rows = crate::kernels::packed::ROWS;
                    assert_eq!(p.data.len(), rows * q8.bytes().len() / 2);
                    assert_eq!(&p.data[..2], &[0x00, 0x3c]);
                }
                None => assert!(!isa.has_avx2()),
            }
        }
        let unpacked = Resident::new([&q8], Isa::Avx512, false);
        assert!(unpacked.view(&q8).packed.is_none());
    }

    #[test]
    fn rows_read_back_as_in_the_file_packed_or_not() {
        // Four Q8_0 rows of two blocks, each block its own scale and quants.
        let row = |r: u8| -> Vec<u8> {
            (0..2u8)
                .flat_map(|b| {
                    [r, 0x3c]
                        .into_iter()
                        .chain((0..32u8).map(move |j| j ^ (r + b)))
                })
                .collect()
        };
        let q8 = Weight::from_bytes("q", GgmlType::Q8_0, 3, 64, (0..3).flat_map(row).collect());
        for isa in Isa::available() {
            for pack in [true, false] {
                let r = Resident::new([&q8], isa, pack);
                let mut buf = Vec::new();
                for i in 0..3 {
                    assert_eq!(r.row(&q8, i, &mut buf), q8.row(i), "{isa:?} pack {pack}");
                }
            }
        }
    }
}
