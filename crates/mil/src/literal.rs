//! Constant values: inline literals (scalars, small tensors) and blob-backed weight tensors.

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::types::TensorType;
use half::f16;
use std::sync::Arc;

/// Typed element storage of an inline literal, row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    Bool(Vec<bool>),
    Str(Vec<String>),
    F16(Vec<f16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl Elements {
    pub fn dtype(&self) -> DType {
        match self {
            Elements::Bool(_) => DType::Bool,
            Elements::Str(_) => DType::String,
            Elements::F16(_) => DType::Fp16,
            Elements::F32(_) => DType::Fp32,
            Elements::F64(_) => DType::Fp64,
            Elements::I8(_) => DType::Int8,
            Elements::I16(_) => DType::Int16,
            Elements::I32(_) => DType::Int32,
            Elements::I64(_) => DType::Int64,
            Elements::U8(_) => DType::Uint8,
            Elements::U16(_) => DType::Uint16,
            Elements::U32(_) => DType::Uint32,
            Elements::U64(_) => DType::Uint64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Elements::Bool(v) => v.len(),
            Elements::Str(v) => v.len(),
            Elements::F16(v) => v.len(),
            Elements::F32(v) => v.len(),
            Elements::F64(v) => v.len(),
            Elements::I8(v) => v.len(),
            Elements::I16(v) => v.len(),
            Elements::I32(v) => v.len(),
            Elements::I64(v) => v.len(),
            Elements::U8(v) => v.len(),
            Elements::U16(v) => v.len(),
            Elements::U32(v) => v.len(),
            Elements::U64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Integer view (None for floats, bools and strings).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            Elements::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::I64(v) => v.clone(),
            Elements::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Elements::U64(v) => v.iter().map(|&x| x as i64).collect(),
            _ => return None,
        })
    }

    /// Numeric view as f64 (None for bools and strings).
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        Some(match self {
            Elements::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Elements::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Elements::F64(v) => v.clone(),
            other => other.to_i64s()?.into_iter().map(|x| x as f64).collect(),
        })
    }
}

/// Where the bytes of a blob-backed constant are.
#[derive(Debug, Clone)]
pub enum BlobSource {
    /// A reference as written in MIL text / protobuf, not loaded (e.g. a parsed program).
    File { path: String, offset: u64 },
    /// The data itself. Consts holding the same `Arc` share one blob record when written.
    Data(Arc<WeightData>),
}

impl PartialEq for BlobSource {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (BlobSource::File { path: a, offset: x }, BlobSource::File { path: b, offset: y }) => {
                a == b && x == y
            }
            (BlobSource::Data(a), BlobSource::Data(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }
}

/// A MIL constant value.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// Written inline: `int32(1)`, `tensor<int32, [4]>([0, 0, 0, 0])`.
    Immediate { ty: TensorType, data: Elements },
    /// Weight bytes in blob storage: `tensor<fp16, [...]>(BLOBFILE(path = ..., offset = ...))`.
    Blob { ty: TensorType, source: BlobSource },
}

impl Literal {
    /// An inline literal; checks that the element count and dtype match `ty`.
    pub fn immediate(ty: TensorType, data: Elements) -> Result<Literal> {
        if data.dtype() != ty.dtype {
            return Err(MilError::invalid(format!(
                "literal of type {ty} holds {} elements",
                data.dtype()
            )));
        }
        if data.len() != ty.numel() {
            return Err(MilError::invalid(format!(
                "literal of type {ty} needs {} elements, has {}",
                ty.numel(),
                data.len()
            )));
        }
        Ok(Literal::Immediate { ty, data })
    }

    fn scalar_of(data: Elements) -> Literal {
        Literal::Immediate {
            ty: TensorType::scalar(data.dtype()),
            data,
        }
    }

    fn vector_of(data: Elements) -> Literal {
        Literal::Immediate {
            ty: TensorType::new(data.dtype(), [data.len()]),
            data,
        }
    }

    pub fn i32(v: i32) -> Literal {
        Self::scalar_of(Elements::I32(vec![v]))
    }

    pub fn bool(v: bool) -> Literal {
        Self::scalar_of(Elements::Bool(vec![v]))
    }

    pub fn string(v: impl Into<String>) -> Literal {
        Self::scalar_of(Elements::Str(vec![v.into()]))
    }

    pub fn f16(v: f32) -> Literal {
        Self::scalar_of(Elements::F16(vec![f16::from_f32(v)]))
    }

    pub fn f32(v: f32) -> Literal {
        Self::scalar_of(Elements::F32(vec![v]))
    }

    pub fn u64(v: u64) -> Literal {
        Self::scalar_of(Elements::U64(vec![v]))
    }

    pub fn i8(v: i8) -> Literal {
        Self::scalar_of(Elements::I8(vec![v]))
    }

    pub fn u8(v: u8) -> Literal {
        Self::scalar_of(Elements::U8(vec![v]))
    }

    /// A scalar of a float dtype (fp16 or fp32), as ops like `mul(x, y=scale)` need.
    pub fn float(dtype: DType, v: f32) -> Result<Literal> {
        match dtype {
            DType::Fp16 => Ok(Self::f16(v)),
            DType::Fp32 => Ok(Self::f32(v)),
            DType::Fp64 => Ok(Self::scalar_of(Elements::F64(vec![v as f64]))),
            other => Err(MilError::invalid(format!("{other} is not a float dtype"))),
        }
    }

    /// A 1-D int32 tensor (`tensor<int32, [n]>([...])`).
    pub fn i32s(v: impl Into<Vec<i32>>) -> Literal {
        Self::vector_of(Elements::I32(v.into()))
    }

    /// A blob-backed constant holding `data`; checks dtype and size against `ty`.
    pub fn weight(ty: TensorType, data: Arc<WeightData>) -> Result<Literal> {
        if data.dtype() != ty.dtype || data.len() != ty.numel() {
            return Err(MilError::invalid(format!(
                "weight data ({} x {}) does not fit type {ty}",
                data.len(),
                data.dtype()
            )));
        }
        Ok(Literal::Blob {
            ty,
            source: BlobSource::Data(data),
        })
    }

    /// A 1-D blob-backed constant of all of `data` (a per-channel scale or zero point).
    pub fn weight_vector(data: Arc<WeightData>) -> Literal {
        Literal::Blob {
            ty: TensorType::new(data.dtype(), [data.len()]),
            source: BlobSource::Data(data),
        }
    }

    pub fn ty(&self) -> &TensorType {
        match self {
            Literal::Immediate { ty, .. } | Literal::Blob { ty, .. } => ty,
        }
    }

    pub fn elements(&self) -> Option<&Elements> {
        match self {
            Literal::Immediate { data, .. } => Some(data),
            Literal::Blob { .. } => None,
        }
    }

    /// Integers of an inline integer literal.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        self.elements()?.to_i64s()
    }

    /// The single integer of an inline integer scalar (or 1-element tensor).
    pub fn to_i64(&self) -> Option<i64> {
        match self.to_i64s()?.as_slice() {
            [v] => Some(*v),
            _ => None,
        }
    }

    pub fn to_f64(&self) -> Option<f64> {
        match self.elements()?.to_f64s()?.as_slice() {
            [v] => Some(*v),
            _ => None,
        }
    }

    pub fn to_bool(&self) -> Option<bool> {
        match self.elements()? {
            Elements::Bool(v) if v.len() == 1 => Some(v[0]),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self.elements()? {
            Elements::Str(v) if v.len() == 1 => Some(&v[0]),
            _ => None,
        }
    }

    /// Every element as f32, for inline numeric literals and loaded blobs alike (what the
    /// simulator reads); None for strings, bools and unloaded blob references.
    pub fn values_f32(&self) -> Option<Vec<f32>> {
        match self {
            Literal::Immediate { data, .. } => {
                Some(data.to_f64s()?.into_iter().map(|v| v as f32).collect())
            }
            Literal::Blob {
                source: BlobSource::Data(d),
                ..
            } => Some(d.to_f32()),
            Literal::Blob { .. } => None,
        }
    }

    /// The weight data of a loaded blob constant.
    pub fn weight_data(&self) -> Option<&Arc<WeightData>> {
        match self {
            Literal::Blob {
                source: BlobSource::Data(d),
                ..
            } => Some(d),
            _ => None,
        }
    }
}

/// The packed little-endian bytes of one weight tensor, as stored in a blob record.
///
/// Sub-byte types (int4, uint4, ...) are packed low bits first: element `i` occupies bits
/// `[i*b, (i+1)*b)` of the byte stream (coremltools' `bitorder="little"` packing).
#[derive(Debug, Clone, PartialEq)]
pub struct WeightData {
    dtype: DType,
    len: usize,
    bytes: Vec<u8>,
}

impl WeightData {
    /// Raw constructor: `bytes` must hold exactly `len` packed elements of `dtype`.
    pub fn from_bytes(dtype: DType, len: usize, bytes: Vec<u8>) -> Result<WeightData> {
        if dtype.blob_code().is_none() {
            return Err(MilError::invalid(format!(
                "{dtype} cannot be stored in a weight blob"
            )));
        }
        if bytes.len() != dtype.packed_bytes(len) {
            return Err(MilError::invalid(format!(
                "{len} {dtype} elements need {} bytes, got {}",
                dtype.packed_bytes(len),
                bytes.len()
            )));
        }
        Ok(WeightData { dtype, len, bytes })
    }

    pub fn f16(values: &[f16]) -> WeightData {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        WeightData {
            dtype: DType::Fp16,
            len: values.len(),
            bytes,
        }
    }

    /// fp16 weights rounded from f32 values.
    pub fn f16_from_f32(values: &[f32]) -> WeightData {
        let bytes = values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        WeightData {
            dtype: DType::Fp16,
            len: values.len(),
            bytes,
        }
    }

    pub fn f32(values: &[f32]) -> WeightData {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        WeightData {
            dtype: DType::Fp32,
            len: values.len(),
            bytes,
        }
    }

    pub fn i8(values: &[i8]) -> WeightData {
        let bytes = values.iter().map(|&v| v as u8).collect();
        WeightData {
            dtype: DType::Int8,
            len: values.len(),
            bytes,
        }
    }

    pub fn u8(values: &[u8]) -> WeightData {
        WeightData {
            dtype: DType::Uint8,
            len: values.len(),
            bytes: values.to_vec(),
        }
    }

    pub fn i32(values: &[i32]) -> WeightData {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        WeightData {
            dtype: DType::Int32,
            len: values.len(),
            bytes,
        }
    }

    /// Packs values in [-8, 7] as int4, two per byte, low nibble first.
    pub fn int4(values: &[i8]) -> Result<WeightData> {
        Self::pack(DType::Int4, values)
    }

    /// Packs values in [0, 15] as uint4, two per byte, low nibble first.
    pub fn uint4(values: &[u8]) -> Result<WeightData> {
        Self::pack(DType::Uint4, values)
    }

    /// Integer values (any integer element type that fits `i64`) stored as `dtype`: one of the
    /// sub-byte types (int4, uint1/2/3/4/6) packed LSB-first exactly as coremltools'
    /// `pack_elements_into_bits` (element `i` in bits `[i*b, (i+1)*b)`, the last byte padded
    /// with zero bits), or int8/uint8/int16/uint16/int32/uint32 little-endian. A value outside
    /// `dtype`'s range is an error naming it.
    ///
    /// ```
    /// use anelm_mil::{DType, WeightData};
    /// let w = WeightData::pack(DType::Uint4, &[1u8, 15, 3]).unwrap();
    /// assert_eq!(w.as_bytes(), &[0xF1, 0x03]);
    /// assert_eq!(w.to_i64s().unwrap(), vec![1, 15, 3]);
    /// assert!(WeightData::pack(DType::Uint2, &[4u8]).is_err());
    /// ```
    pub fn pack<T: Copy + Into<i64>>(dtype: DType, values: &[T]) -> Result<WeightData> {
        let (lo, hi) = int_range(dtype).ok_or_else(|| {
            MilError::invalid(format!(
                "{dtype} is not an integer type a weight blob holds"
            ))
        })?;
        if let Some(v) = values
            .iter()
            .map(|&v| v.into())
            .find(|v| *v < lo || *v > hi)
        {
            return Err(MilError::invalid(format!(
                "{dtype} value {v} out of range [{lo}, {hi}]"
            )));
        }
        let bits = dtype.bits() as usize;
        let mut bytes = vec![0u8; dtype.packed_bytes(values.len())];
        if bits >= 8 {
            let n = bits / 8;
            for (chunk, &v) in bytes.chunks_exact_mut(n).zip(values) {
                chunk.copy_from_slice(&v.into().to_le_bytes()[..n]);
            }
        } else {
            let mask = (1u16 << bits) - 1;
            for (i, &v) in values.iter().enumerate() {
                let field = (v.into() as u16) & mask;
                let bit = i * bits;
                let w = field << (bit % 8);
                bytes[bit / 8] |= w as u8;
                if bit % 8 + bits > 8 {
                    bytes[bit / 8 + 1] |= (w >> 8) as u8;
                }
            }
        }
        Ok(WeightData {
            dtype,
            len: values.len(),
            bytes,
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The packed little-endian bytes (what a blob record holds).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Element `i` as an unsigned bit field of `bits` (< 8) bits: a 16-bit little-endian window
    /// holds any field, since it starts at most 7 bits into its first byte.
    fn bit_field(&self, i: usize, bits: usize) -> u32 {
        let bit = i * bits;
        let lo = self.bytes[bit / 8] as u16;
        let hi = self.bytes.get(bit / 8 + 1).copied().unwrap_or(0) as u16;
        (((lo | (hi << 8)) >> (bit % 8)) & ((1 << bits) - 1)) as u32
    }

    /// Every element of an integer dtype, exactly (None for float dtypes).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        self.map_ints(|v| v)
    }

    /// Every element of an integer dtype through `f`, without an intermediate vector.
    pub(crate) fn map_ints<T>(&self, f: impl Fn(i64) -> T) -> Option<Vec<T>> {
        let b = &self.bytes;
        Some(match self.dtype {
            DType::Int8 => b.iter().map(|&v| f(v as i8 as i64)).collect(),
            DType::Uint8 => b.iter().map(|&v| f(v as i64)).collect(),
            DType::Int16 => b
                .chunks_exact(2)
                .map(|c| f(i16::from_le_bytes([c[0], c[1]]) as i64))
                .collect(),
            DType::Uint16 => b
                .chunks_exact(2)
                .map(|c| f(u16::from_le_bytes([c[0], c[1]]) as i64))
                .collect(),
            DType::Int32 => b
                .chunks_exact(4)
                .map(|c| f(i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64))
                .collect(),
            DType::Uint32 => b
                .chunks_exact(4)
                .map(|c| f(u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64))
                .collect(),
            DType::Int4 => (0..self.len)
                .map(|i| f(((self.bit_field(i, 4) as i64) ^ 8) - 8))
                .collect(),
            d if d.is_sub_byte() => {
                let bits = d.bits() as usize;
                (0..self.len)
                    .map(|i| f(self.bit_field(i, bits) as i64))
                    .collect()
            }
            _ => return None,
        })
    }

    /// Every element converted to f32 (the simulator's view of any numeric weight).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.bytes;
        match self.dtype {
            DType::Fp16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::Bf16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::Fp32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            _ => self.map_ints(|v| v as f32).unwrap_or_default(),
        }
    }
}

/// The value range of an integer dtype a weight blob holds.
fn int_range(dtype: DType) -> Option<(i64, i64)> {
    match dtype {
        DType::Int4 => Some((-8, 7)),
        DType::Int8 => Some((i8::MIN as i64, i8::MAX as i64)),
        DType::Int16 => Some((i16::MIN as i64, i16::MAX as i64)),
        DType::Int32 => Some((i32::MIN as i64, i32::MAX as i64)),
        DType::Uint1 | DType::Uint2 | DType::Uint3 | DType::Uint4 | DType::Uint6 => {
            Some((0, (1 << dtype.bits()) - 1))
        }
        DType::Uint8 => Some((0, u8::MAX as i64)),
        DType::Uint16 => Some((0, u16::MAX as i64)),
        DType::Uint32 => Some((0, u32::MAX as i64)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_packs_low_nibble_first_and_decodes_signed() {
        let w = WeightData::int4(&[1, -2, 7]).unwrap();
        assert_eq!(w.as_bytes(), &[0xE1, 0x07]);
        assert_eq!(w.to_f32(), vec![1.0, -2.0, 7.0]);
        assert!(WeightData::int4(&[8]).is_err());
    }

    #[test]
    fn sub_byte_packing_is_coremltools_lsb_first() {
        // Golden bytes from coremltools 9.0 `optimize._utils.pack_elements_into_bits`.
        let cases: [(DType, &[i64], &[u8]); 5] = [
            (
                DType::Uint3,
                &[1, 2, 3, 4, 5, 6, 7, 0, 1],
                &[209, 88, 31, 1],
            ),
            (DType::Int4, &[1, -2, 7, -8, 0], &[225, 135, 0]),
            (DType::Uint6, &[63, 1, 32, 5, 0], &[127, 0, 22, 0]),
            (DType::Uint1, &[1, 0, 1, 1, 0, 0, 0, 1, 1], &[0x8D, 0x01]),
            (DType::Uint2, &[3, 0, 2, 1, 1], &[0x63, 0x01]),
        ];
        for (d, values, bytes) in cases {
            let w = WeightData::pack(d, values).unwrap();
            assert_eq!(w.as_bytes(), bytes, "{d}");
            assert_eq!(w.to_i64s().unwrap(), values, "{d}");
            let back = WeightData::from_bytes(d, values.len(), bytes.to_vec()).unwrap();
            assert_eq!(back, w);
        }
        let w = WeightData::pack(DType::Int16, &[-2i16, 300]).unwrap();
        assert_eq!(w.as_bytes(), &[0xFE, 0xFF, 0x2C, 0x01]);
        assert_eq!(w.to_f32(), vec![-2.0, 300.0]);
        assert!(WeightData::f16_from_f32(&[1.0]).to_i64s().is_none());
    }

    #[test]
    fn uint4_and_fp16_decode() {
        let w = WeightData::uint4(&[15, 0, 3]).unwrap();
        assert_eq!(w.as_bytes(), &[0x0F, 0x03]);
        assert_eq!(w.to_f32(), vec![15.0, 0.0, 3.0]);
        let h = WeightData::f16_from_f32(&[1.0, -0.5]);
        assert_eq!(h.as_bytes(), &[0x00, 0x3C, 0x00, 0xB8]);
        assert_eq!(h.to_f32(), vec![1.0, -0.5]);
    }

    #[test]
    fn from_bytes_checks_size_and_dtype() {
        assert!(WeightData::from_bytes(DType::Fp16, 3, vec![0; 5]).is_err());
        assert!(WeightData::from_bytes(DType::Int64, 1, vec![0; 8]).is_err());
        assert!(WeightData::from_bytes(DType::Uint4, 3, vec![0; 2]).is_ok());
    }

    #[test]
    fn immediate_checks_count_and_dtype() {
        assert!(Literal::immediate(TensorType::int32([2]), Elements::I32(vec![1])).is_err());
        assert!(Literal::immediate(TensorType::int32([1]), Elements::F32(vec![1.0])).is_err());
        assert_eq!(Literal::i32s([3, 4]).to_i64s(), Some(vec![3, 4]));
        assert_eq!(Literal::f16(0.5).values_f32(), Some(vec![0.5]));
        let w = Literal::weight(TensorType::int8([2]), Arc::new(WeightData::i8(&[-3, 4]))).unwrap();
        assert_eq!(w.values_f32(), Some(vec![-3.0, 4.0]));
        assert_eq!(Literal::string("x").values_f32(), None);
    }
}
