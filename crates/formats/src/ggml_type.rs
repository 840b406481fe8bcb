//! The ggml tensor element types, with their ids as stored in GGUF and their block geometry.

use std::fmt;

/// A ggml tensor type. Discriminants are the ids GGUF stores (ggml.h `enum ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ2XXS = 16,
    IQ2XS = 17,
    IQ3XXS = 18,
    IQ1S = 19,
    IQ4NL = 20,
    IQ3S = 21,
    IQ2S = 22,
    IQ4XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
}

impl GgmlType {
    /// Every type this enum knows, in id order.
    pub const ALL: [GgmlType; 32] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q8K,
        Self::IQ2XXS,
        Self::IQ2XS,
        Self::IQ3XXS,
        Self::IQ1S,
        Self::IQ4NL,
        Self::IQ3S,
        Self::IQ2S,
        Self::IQ4XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
    ];

    /// The type with GGUF id `id`, if ggml defines one (ids 4, 5 and 31–33, 36–38 were removed).
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_elems(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4NL | MXFP4 => 32,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S
            | IQ4XS | IQ1M | TQ1_0 | TQ2_0 => 256,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            F64 | I64 => 8,
            I8 => 1,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2K => 84,
            Q3K => 110,
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            Q8K => 292,
            IQ2XXS => 66,
            IQ2XS => 74,
            IQ3XXS => 98,
            IQ1S => 50,
            IQ4NL => 18,
            IQ3S => 110,
            IQ2S => 82,
            IQ4XS => 136,
            IQ1M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
        }
    }

    /// Bytes needed for `n_elems` elements, or `None` if `n_elems` is not a whole number of blocks.
    pub fn bytes_for(self, n_elems: usize) -> Option<usize> {
        let be = self.block_elems();
        if !n_elems.is_multiple_of(be) {
            return None;
        }
        (n_elems / be).checked_mul(self.block_bytes())
    }

    /// True for the block-quantised types (everything but the plain float and integer types).
    pub fn is_quantized(self) -> bool {
        use GgmlType::*;
        !matches!(self, F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64)
    }

    /// ggml's name for the type (`q4_K`, `f16`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            IQ2XXS => "iq2_xxs",
            IQ2XS => "iq2_xs",
            IQ3XXS => "iq3_xxs",
            IQ1S => "iq1_s",
            IQ4NL => "iq4_nl",
            IQ3S => "iq3_s",
            IQ2S => "iq2_s",
            IQ4XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
    }

    #[test]
    fn k_quant_sizes_match_their_layouts() {
        // Q4_K: d, dmin (2 x f16) + 12 scale bytes + 128 nibble bytes.
        assert_eq!(GgmlType::Q4K.block_bytes(), 2 + 2 + 12 + 128);
        // Q6_K: 128 low-nibble bytes + 64 high-bit bytes + 16 scales + f16 d.
        assert_eq!(GgmlType::Q6K.block_bytes(), 128 + 64 + 16 + 2);
        // Q8_K: f32 d + 256 quants + 16 i16 block sums.
        assert_eq!(GgmlType::Q8K.block_bytes(), 4 + 256 + 32);
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
    }
}
