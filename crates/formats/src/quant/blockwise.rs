//! The integer-block types as what they are: small integers with a scale (and an additive bias)
//! per sub-block, so that a back end with blockwise integer weights (the ANE's
//! `constexpr_blockwise_shift_scale`) can hold the file's own numbers instead of dequantised ones.
//!
//! Every weight of a decomposed row is `scale[b] * q + bias[b]` in f32 with the operations and
//! operand order of [`super::dequantize`] — bit for bit the dequantised value (tested for every
//! type here). Scales and biases are the f32 values ggml forms (`d`, `d * sc`, `m`, `-dmin * mn`).

use super::{f16_at, k_quants, u32_at};
use crate::error::Result;
use crate::GgmlType;

/// One row of a block type as integers, per-sub-block scales and biases.
#[derive(Clone, Debug, PartialEq)]
pub struct IntRow {
    /// Weights per sub-block (16 or 32).
    pub block: usize,
    /// One integer per weight.
    pub ints: Vec<i8>,
    /// One scale per sub-block.
    pub scales: Vec<f32>,
    /// One additive term per sub-block; None for the types that have none (all zero).
    pub biases: Option<Vec<f32>>,
}

impl IntRow {
    /// The weights, `scale * q + bias` in f32 (ggml's own operations).
    pub fn values(&self) -> Vec<f32> {
        self.ints
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let b = i / self.block;
                let v = self.scales[b] * f32::from(q);
                match &self.biases {
                    Some(m) => v + m[b],
                    None => v,
                }
            })
            .collect()
    }

    /// The smallest and largest integer the row holds.
    pub fn int_range(&self) -> (i8, i8) {
        self.ints
            .iter()
            .fold((i8::MAX, i8::MIN), |(lo, hi), &q| (lo.min(q), hi.max(q)))
    }
}

/// What a type's integer blocks look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntForm {
    /// Weights per sub-block.
    pub block: usize,
    /// The smallest and largest integer it can hold.
    pub lo: i8,
    pub hi: i8,
    /// Whether its sub-blocks add a bias (`_1` types, Q2_K, Q4_K, Q5_K).
    pub biased: bool,
}

/// The integer form of the types [`decompose_row`] handles.
pub fn int_form(dtype: GgmlType) -> Option<IntForm> {
    use GgmlType::*;
    let (block, lo, hi, biased) = match dtype {
        Q4_0 => (32, -8, 7, false),
        Q4_1 => (32, 0, 15, true),
        Q5_0 => (32, -16, 15, false),
        Q5_1 => (32, 0, 31, true),
        Q8_0 | Q8_1 => (32, -128, 127, false),
        Q2K => (16, 0, 3, true),
        Q3K => (16, -4, 3, false),
        Q4K => (32, 0, 15, true),
        Q5K => (32, 0, 31, true),
        Q6K => (16, -32, 31, false),
        _ => return None,
    };
    Some(IntForm {
        block,
        lo,
        hi,
        biased,
    })
}

/// A row being built, sub-block by sub-block.
struct Out {
    row: IntRow,
}

impl Out {
    fn new(block: usize, n: usize, biased: bool) -> Out {
        Out {
            row: IntRow {
                block,
                ints: Vec::with_capacity(n),
                scales: Vec::with_capacity(n / block),
                biases: biased.then(|| Vec::with_capacity(n / block)),
            },
        }
    }

    fn push(&mut self, scale: f32, bias: f32, ints: impl IntoIterator<Item = i8>) {
        self.row.scales.push(scale);
        if let Some(b) = &mut self.row.biases {
            b.push(bias);
        }
        self.row.ints.extend(ints);
    }
}

/// The 32 nibbles of a legacy block in weight order (low nibbles are weights 0..16).
fn nibbles(qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    (0..32).map(move |i| if i < 16 { qs[i] & 0xf } else { qs[i - 16] >> 4 })
}

/// The 32 five-bit values of a Q5 block.
fn five_bits(qs: &[u8], qh: u32) -> impl Iterator<Item = u8> + '_ {
    nibbles(qs)
        .enumerate()
        .map(move |(i, n)| n | ((((qh >> i) & 1) as u8) << 4))
}

/// Row `src` (whole blocks of `dtype`, `n` weights) as integers with scales and biases; None for
/// the types that are not integers times a per-block scale (floats, codebooks, lattices).
pub fn decompose_row(dtype: GgmlType, src: &[u8], n: usize) -> Option<Result<IntRow>> {
    let form = int_form(dtype)?;
    if dtype.bytes_for(n) != Some(src.len()) {
        return Some(Err(crate::error::FormatError::BadQuantLength {
            dtype,
            len: src.len(),
            n,
        }));
    }
    use GgmlType::*;
    let mut out = Out::new(form.block, n, form.biased);
    for b in src.chunks_exact(dtype.block_bytes()) {
        match dtype {
            Q4_0 => out.push(f16_at(b, 0), 0.0, nibbles(&b[2..18]).map(|q| q as i8 - 8)),
            Q4_1 => out.push(
                f16_at(b, 0),
                f16_at(b, 2),
                nibbles(&b[4..20]).map(|q| q as i8),
            ),
            Q5_0 => out.push(
                f16_at(b, 0),
                0.0,
                five_bits(&b[6..22], u32_at(b, 2)).map(|q| q as i8 - 16),
            ),
            Q5_1 => out.push(
                f16_at(b, 0),
                f16_at(b, 2),
                five_bits(&b[8..24], u32_at(b, 4)).map(|q| q as i8),
            ),
            Q8_0 => out.push(f16_at(b, 0), 0.0, b[2..34].iter().map(|&q| q as i8)),
            Q8_1 => out.push(f16_at(b, 0), 0.0, b[4..36].iter().map(|&q| q as i8)),
            Q2K => {
                let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
                for g in 0..16 {
                    let sc = b[g];
                    let (half, plane, first) = (g / 8, (g % 8) / 2, 16 * (g % 2));
                    let qs = &b[16 + 32 * half + first..][..16];
                    out.push(
                        d * f32::from(sc & 0xf),
                        -(dmin * f32::from(sc >> 4)),
                        qs.iter().map(|&q| ((q >> (2 * plane)) & 3) as i8),
                    );
                }
            }
            Q3K => {
                let d = f16_at(b, 108);
                let scales = k_quants::q3_k_scales(&b[96..108]);
                for (g, &sc) in scales.iter().enumerate() {
                    let (half, plane, first) = (g / 8, (g % 8) / 2, 16 * (g % 2));
                    let qs = &b[32 + 32 * half + first..][..16];
                    let hmask = &b[first..][..16];
                    let hbit = 4 * half + plane;
                    out.push(
                        d * f32::from(sc as i8 - 32),
                        0.0,
                        qs.iter().zip(hmask).map(|(&q, &h)| {
                            let low = ((q >> (2 * plane)) & 3) as i8;
                            low - if (h >> hbit) & 1 == 1 { 0 } else { 4 }
                        }),
                    );
                }
            }
            Q4K | Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let five = dtype == Q5K;
                let (qh, qs0) = if five {
                    (&b[16..48], 48)
                } else {
                    (&b[0..0], 16)
                };
                for sub in 0..8 {
                    let (sc, m) = k_quants::k4_scale_min(scales, sub);
                    let shift = 4 * (sub % 2);
                    let qs = &b[qs0 + 32 * (sub / 2)..][..32];
                    out.push(
                        d * f32::from(sc),
                        -(dmin * f32::from(m)),
                        qs.iter().enumerate().map(|(l, &q)| {
                            let hi = if five { ((qh[l] >> sub) & 1) << 4 } else { 0 };
                            (((q >> shift) & 0xf) | hi) as i8
                        }),
                    );
                }
            }
            Q6K => {
                let d = f16_at(b, 208);
                for g in 0..16 {
                    let (half, plane, first) = (g / 8, (g % 8) / 2, 16 * (g % 2));
                    let ql = &b[64 * half + 32 * (plane % 2) + first..][..16];
                    let qh = &b[128 + 32 * half + first..][..16];
                    let shift = 4 * (plane / 2);
                    out.push(
                        d * f32::from(b[192 + g] as i8),
                        0.0,
                        ql.iter().zip(qh).map(|(&lo, &hi)| {
                            (((lo >> shift) & 0xf) | (((hi >> (2 * plane)) & 3) << 4)) as i8 - 32
                        }),
                    );
                }
            }
            _ => unreachable!("int_form covers exactly these types"),
        }
    }
    Some(Ok(out.row))
}

/// `n_blocks` pseudo-random blocks of `dtype` whose f16 fields are finite (|v| < 2): test data
/// for code that reads blocks (here and in the ANE lowering's tests).
pub fn sample_blocks(dtype: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut b: Vec<u8> = (0..n_blocks * dtype.block_bytes())
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect();
    let fields: &[usize] = match dtype {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    for blk in b.chunks_exact_mut(dtype.block_bytes()) {
        for &f in fields {
            blk[f + 1] &= 0b1011_1111; // exponent < 16: finite, |v| < 2
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    #[test]
    fn values_are_the_dequantised_weights_bit_for_bit() {
        use GgmlType::*;
        for dtype in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K] {
            let IntForm {
                block,
                lo,
                hi,
                biased,
            } = int_form(dtype).unwrap();
            for seed in 0..4 {
                let src = sample_blocks(dtype, 3, seed);
                let n = 3 * dtype.block_elems();
                let row = decompose_row(dtype, &src, n).unwrap().unwrap();
                assert_eq!(row.block, block);
                assert_eq!(row.biases.is_some(), biased);
                assert_eq!(row.ints.len(), n);
                let (a, b) = row.int_range();
                assert!(a >= lo && b <= hi, "{dtype}: {a}..{b} outside {lo}..{hi}");
                let mut want = vec![0f32; n];
                dequantize(dtype, &src, &mut want).unwrap();
                let got = row.values();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{dtype} weight {i}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn other_types_and_bad_lengths() {
        assert!(decompose_row(GgmlType::F16, &[0; 64], 32).is_none());
        assert!(decompose_row(GgmlType::IQ4NL, &[0; 18], 32).is_none());
        let e = decompose_row(GgmlType::Q8_0, &[0; 33], 32).unwrap();
        assert!(e.is_err());
    }
}
