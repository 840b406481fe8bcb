//! MIL element types and their three numberings: the text spelling, the protobuf
//! `MILSpec.DataType` code (COREML.md §3) and the weight-blob `BlobDataType` code (FACTS §2).

use std::fmt;

/// The element type of a MIL tensor (scalars are rank-0 tensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    String,
    Fp16,
    Fp32,
    Fp64,
    Bf16,
    Int4,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint1,
    Uint2,
    Uint3,
    Uint4,
    Uint6,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
}

/// (dtype, text name, protobuf DataType, blob code or 0 when not storable, bits per element).
/// One row per dtype, in declaration order: every conversion below reads this table.
const TABLE: &[(DType, &str, i32, u32, u32)] = &[
    (DType::Bool, "bool", 1, 0, 8),
    (DType::String, "string", 2, 0, 0),
    (DType::Fp16, "fp16", 10, 1, 16),
    (DType::Fp32, "fp32", 11, 2, 32),
    (DType::Fp64, "fp64", 12, 0, 64),
    (DType::Bf16, "bf16", 13, 5, 16),
    (DType::Int4, "int4", 25, 8, 4),
    (DType::Int8, "int8", 21, 4, 8),
    (DType::Int16, "int16", 22, 6, 16),
    (DType::Int32, "int32", 23, 14, 32),
    (DType::Int64, "int64", 24, 0, 64),
    (DType::Uint1, "uint1", 37, 9, 1),
    (DType::Uint2, "uint2", 36, 10, 2),
    (DType::Uint3, "uint3", 39, 12, 3),
    (DType::Uint4, "uint4", 35, 11, 4),
    (DType::Uint6, "uint6", 38, 13, 6),
    (DType::Uint8, "uint8", 31, 3, 8),
    (DType::Uint16, "uint16", 32, 7, 16),
    (DType::Uint32, "uint32", 33, 15, 32),
    (DType::Uint64, "uint64", 34, 0, 64),
];

impl DType {
    fn row(self) -> &'static (DType, &'static str, i32, u32, u32) {
        // Rows are in declaration order (checked by a unit test).
        &TABLE[self as usize]
    }

    /// Spelling in MIL text (`fp16`, `int32`, ...).
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Parses a MIL text dtype name.
    pub fn from_name(s: &str) -> Option<DType> {
        TABLE.iter().find(|r| r.1 == s).map(|r| r.0)
    }

    /// `CoreML.Specification.MILSpec.DataType` enum value.
    pub fn proto_code(self) -> i32 {
        self.row().2
    }

    pub fn from_proto_code(code: i32) -> Option<DType> {
        TABLE.iter().find(|r| r.2 == code).map(|r| r.0)
    }

    /// `BlobDataType` code of the weight-blob metadata, if this dtype can live in a blob file.
    pub fn blob_code(self) -> Option<u32> {
        match self.row().3 {
            0 => None,
            c => Some(c),
        }
    }

    pub fn from_blob_code(code: u32) -> Option<DType> {
        TABLE.iter().find(|r| r.3 == code && code != 0).map(|r| r.0)
    }

    /// Bits per element (0 for strings).
    pub fn bits(self) -> u32 {
        self.row().4
    }

    /// Bytes needed for `n` packed elements (sub-byte types packed, rounded up).
    pub fn packed_bytes(self, n: usize) -> usize {
        n.saturating_mul(self.bits() as usize).div_ceil(8)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::Fp16 | DType::Fp32 | DType::Fp64 | DType::Bf16)
    }

    pub fn is_int(self) -> bool {
        !self.is_float() && !matches!(self, DType::Bool | DType::String)
    }

    pub fn is_sub_byte(self) -> bool {
        self.bits() < 8 && self != DType::String
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every dtype, in table order (tests and property generators walk it).
pub fn all_dtypes() -> impl Iterator<Item = DType> {
    TABLE.iter().map(|r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_every_numbering() {
        assert_eq!(all_dtypes().count(), TABLE.len());
        for d in all_dtypes() {
            assert_eq!(d.row().0, d, "{d:?} has no table row");
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_proto_code(d.proto_code()), Some(d));
            if let Some(c) = d.blob_code() {
                assert_eq!(DType::from_blob_code(c), Some(d));
            }
        }
    }

    #[test]
    fn codes_match_the_format_documents() {
        // COREML.md §3 DataType enum and FACTS §2 BlobDataType.
        assert_eq!(DType::Fp16.proto_code(), 10);
        assert_eq!(DType::Uint64.proto_code(), 34);
        assert_eq!(DType::Fp16.blob_code(), Some(1));
        assert_eq!(DType::Int8.blob_code(), Some(4));
        assert_eq!(DType::Uint8.blob_code(), Some(3));
        assert_eq!(DType::Int4.blob_code(), Some(8));
        assert_eq!(DType::Int32.blob_code(), Some(14));
        assert_eq!(DType::Int64.blob_code(), None);
        assert_eq!(DType::Int4.packed_bytes(3), 2);
    }
}
