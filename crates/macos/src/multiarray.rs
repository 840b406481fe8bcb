//! Core ML's `MLMultiArray` as plain data: describing a planar `[1, C, 1, W]` buffer to it (shape
//! and strides in elements, so an input array wraps the device's buffer without a copy), and
//! copying a prediction's output array, whatever its element type and strides, into a planar
//! buffer.

use half::f16;

use crate::error::{MacError, Result};
use crate::layout::ElemType;

/// A planar buffer: element (c, w) at byte `c * channel_stride + w * dtype.bytes()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planar {
    pub dtype: ElemType,
    pub channels: usize,
    pub width: usize,
    pub channel_stride: usize,
}

impl Planar {
    /// Bytes the buffer spans.
    pub fn bytes(&self) -> usize {
        self.channels * self.channel_stride
    }

    /// Writes channel-major values (`values[c * width + w]`) into `out`; padding is untouched.
    pub fn write_f32(&self, values: &[f32], out: &mut [u8]) -> Result<()> {
        self.check(values.len(), out.len())?;
        let e = self.dtype.bytes();
        for (i, &v) in values.iter().enumerate() {
            let to = &mut out[(i / self.width) * self.channel_stride + (i % self.width) * e..][..e];
            match self.dtype {
                ElemType::Fp16 => to.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
                ElemType::Fp32 => to.copy_from_slice(&v.to_le_bytes()),
            }
        }
        Ok(())
    }

    /// Reads the buffer as channel-major values.
    pub fn read_f32(&self, bytes: &[u8]) -> Result<Vec<f32>> {
        self.check(self.channels * self.width, bytes.len())?;
        let t = ArrayType::of(self.dtype);
        let e = self.dtype.bytes();
        Ok((0..self.channels * self.width)
            .map(|i| {
                t.read(&bytes[(i / self.width) * self.channel_stride + (i % self.width) * e..][..e])
            })
            .collect())
    }

    fn check(&self, values: usize, bytes: usize) -> Result<()> {
        if values != self.channels * self.width
            || bytes < self.bytes()
            || self.channel_stride < self.width * self.dtype.bytes()
        {
            return Err(MacError::Invalid(format!("{values} values in a buffer of {bytes} bytes do not fit [1, {}, 1, {}] with channel stride {}", self.channels, self.width, self.channel_stride)));
        }
        Ok(())
    }
}

/// `MLMultiArrayDataType` (an `NSInteger` enum: kind bits | element bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayType {
    Float16,
    Float32,
    Float64,
    Int32,
}

impl ArrayType {
    pub fn raw(self) -> i64 {
        match self {
            ArrayType::Float16 => 0x10000 | 16,
            ArrayType::Float32 => 0x10000 | 32,
            ArrayType::Float64 => 0x10000 | 64,
            ArrayType::Int32 => 0x20000 | 32,
        }
    }

    pub fn from_raw(v: i64) -> Option<ArrayType> {
        [
            ArrayType::Float16,
            ArrayType::Float32,
            ArrayType::Float64,
            ArrayType::Int32,
        ]
        .into_iter()
        .find(|t| t.raw() == v)
    }

    pub fn bytes(self) -> usize {
        match self {
            ArrayType::Float16 => 2,
            ArrayType::Float32 | ArrayType::Int32 => 4,
            ArrayType::Float64 => 8,
        }
    }

    pub fn of(t: ElemType) -> ArrayType {
        match t {
            ElemType::Fp16 => ArrayType::Float16,
            ElemType::Fp32 => ArrayType::Float32,
        }
    }

    fn read(self, b: &[u8]) -> f32 {
        match self {
            ArrayType::Float16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
            ArrayType::Float32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            ArrayType::Float64 => {
                f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
            }
            ArrayType::Int32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
        }
    }
}

/// Shape `[1, C, 1, W]` and strides in elements that make an `MLMultiArray` over a planar
/// buffer.
pub fn planar_view(p: &Planar) -> Result<(Vec<usize>, Vec<usize>)> {
    let e = p.dtype.bytes();
    if !p.channel_stride.is_multiple_of(e) || p.channel_stride < p.width * e {
        return Err(MacError::Invalid(format!(
            "channel stride {} bytes cannot hold {} {:?} values in whole elements",
            p.channel_stride, p.width, p.dtype
        )));
    }
    let cs = p.channel_stride / e;
    Ok((
        vec![1, p.channels, 1, p.width],
        vec![p.channels * cs, cs, cs, 1],
    ))
}

/// A strided array as a prediction returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayDesc {
    pub dtype: ArrayType,
    pub shape: Vec<usize>,
    /// In elements, as `-[MLMultiArray strides]` gives them.
    pub strides: Vec<i64>,
}

impl ArrayDesc {
    /// Bytes from the data pointer to the end of the last element.
    pub fn extent(&self) -> Result<usize> {
        if self.shape.len() != self.strides.len() {
            return Err(MacError::Invalid(format!(
                "array of shape {:?} has strides {:?}",
                self.shape, self.strides
            )));
        }
        if self.shape.contains(&0) {
            return Ok(0);
        }
        let mut last = 0usize;
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let s = usize::try_from(s)
                .map_err(|_| MacError::Invalid(format!("negative stride in {:?}", self.strides)))?;
            last += (n - 1) * s;
        }
        Ok((last + 1) * self.dtype.bytes())
    }
}

/// An array's buffer as `-[MLMultiArray getMutableBytesWithHandler:]` hands it over: its size
/// and the strides the handler reports, which are the real ones (Apple: the `strides`
/// property may differ from the buffer's layout until it is accessed through the handler).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedArray {
    pub array: ArrayDesc,
    /// Bytes the handler says the buffer holds.
    pub size: usize,
}

impl ArrayDesc {
    /// The array of `shape` as the handler describes it: `strides` (in elements) and `size`
    /// (bytes) from the handler; its elements must lie inside those bytes.
    pub fn locked(
        dtype: ArrayType,
        shape: Vec<usize>,
        strides: Vec<i64>,
        size: isize,
    ) -> Result<LockedArray> {
        let size = usize::try_from(size)
            .map_err(|_| MacError::Invalid(format!("the array handler reports {size} bytes")))?;
        let array = ArrayDesc {
            dtype,
            shape,
            strides,
        };
        let extent = array.extent()?;
        if extent > size {
            return Err(MacError::Invalid(format!(
                "array of shape {:?} with strides {:?} spans {extent} bytes, but its buffer holds {size}",
                array.shape, array.strides
            )));
        }
        Ok(LockedArray { array, size })
    }
}

/// Copies a `[1, C, 1, W]` array of `src` (its bytes from the data pointer on) into the planar
/// buffer `out` laid out as `dst`, converting the element type.
pub fn copy_into_planar(src: &ArrayDesc, bytes: &[u8], dst: &Planar, out: &mut [u8]) -> Result<()> {
    let want = [1, dst.channels, 1, dst.width];
    if src.shape != want {
        return Err(MacError::Invalid(format!(
            "output array has shape {:?}, [1, {}, 1, {}] expected",
            src.shape, dst.channels, dst.width
        )));
    }
    let extent = src.extent()?;
    if bytes.len() < extent || out.len() < dst.bytes() {
        return Err(MacError::Invalid(format!(
            "array needs {extent} bytes (has {}), buffer {} (has {})",
            bytes.len(),
            dst.bytes(),
            out.len()
        )));
    }
    let (se, de) = (src.dtype.bytes(), dst.dtype.bytes());
    let (sc, sw) = (src.strides[1] as usize, src.strides[3] as usize);
    for c in 0..dst.channels {
        for w in 0..dst.width {
            let at = (c * sc + w * sw) * se;
            let v = src.dtype.read(&bytes[at..at + se]);
            let to = &mut out[c * dst.channel_stride + w * de..][..de];
            match dst.dtype {
                ElemType::Fp16 => to.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
                ElemType::Fp32 => to.copy_from_slice(&v.to_le_bytes()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_type_codes_are_core_mls() {
        // MLMultiArrayDataType: Float16 65552, Float32 65568, Double 65600, Int32 131104
        // (the ArrayFeatureType values of COREML.md §3 use the same numbers).
        let raw: Vec<i64> = [
            ArrayType::Float16,
            ArrayType::Float32,
            ArrayType::Float64,
            ArrayType::Int32,
        ]
        .iter()
        .map(|t| t.raw())
        .collect();
        assert_eq!(raw, [65552, 65568, 65600, 131104]);
        assert_eq!(ArrayType::from_raw(65568), Some(ArrayType::Float32));
        assert_eq!(
            ArrayType::from_raw(131080),
            None,
            "Int8 arrays are not read"
        );
    }

    #[test]
    fn planar_buffers_are_described_in_elements() {
        let p = Planar {
            dtype: ElemType::Fp16,
            channels: 3,
            width: 17,
            channel_stride: 64,
        };
        assert_eq!(
            planar_view(&p).unwrap(),
            (vec![1, 3, 1, 17], vec![96, 32, 32, 1])
        );
        assert!(planar_view(&Planar {
            channel_stride: 33,
            ..p
        })
        .is_err());
        assert!(
            planar_view(&Planar {
                channel_stride: 32,
                ..p
            })
            .is_err(),
            "17 fp16 values do not fit 32 bytes"
        );
    }

    #[test]
    fn handler_strides_and_size_describe_the_buffer() {
        // A [1, 2, 1, 3] fp16 output whose rows the device padded to 32 elements: the handler's
        // strides say so (the strides property might still say packed [6, 3, 3, 1]).
        let mut bytes = [0u8; 2 * 32 * 2];
        for (c, w, v) in [(0, 0, 1.0f32), (0, 2, 3.0), (1, 0, -1.0), (1, 2, 0.5)] {
            bytes[(c * 32 + w) * 2..][..2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        let l = ArrayDesc::locked(
            ArrayType::Float16,
            vec![1, 2, 1, 3],
            vec![64, 32, 32, 1],
            128,
        )
        .unwrap();
        let dst = Planar {
            dtype: ElemType::Fp32,
            channels: 2,
            width: 3,
            channel_stride: 12,
        };
        let mut out = vec![0u8; 24];
        copy_into_planar(&l.array, &bytes[..l.size], &dst, &mut out).unwrap();
        assert_eq!(dst.read_f32(&out).unwrap(), [1.0, 0.0, 3.0, -1.0, 0.0, 0.5]);
        // Strides that reach past the bytes the handler gave: an error, never a read past them.
        let e = ArrayDesc::locked(
            ArrayType::Float16,
            vec![1, 2, 1, 3],
            vec![64, 32, 32, 1],
            64,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("spans 70 bytes, but its buffer holds 64"), "{e}");
        assert!(
            ArrayDesc::locked(ArrayType::Float16, vec![1, 1, 1, 1], vec![1, 1, 1, 1], -1).is_err()
        );
        assert!(
            ArrayDesc::locked(ArrayType::Float16, vec![1, 2, 1, 3], vec![64, 32, 1], 128).is_err(),
            "a stride per dimension"
        );
    }

    #[test]
    fn copies_strided_fp32_output_into_padded_fp16_rows() {
        // Core ML returned [1, 2, 1, 3] fp32 with its own padding: channel stride 4 elements.
        let vals = [[1.0f32, 2.0, 3.0, 99.0], [-1.0, 0.5, 0.25, 99.0]];
        let bytes: Vec<u8> = vals
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let src = ArrayDesc {
            dtype: ArrayType::Float32,
            shape: vec![1, 2, 1, 3],
            strides: vec![8, 4, 4, 1],
        };
        assert_eq!(src.extent().unwrap(), (4 + 2 + 1) * 4);
        let dst = Planar {
            dtype: ElemType::Fp16,
            channels: 2,
            width: 3,
            channel_stride: 64,
        };
        let mut out = vec![0xAAu8; 128];
        copy_into_planar(&src, &bytes, &dst, &mut out).unwrap();
        let at = |c: usize, w: usize| {
            f16::from_le_bytes([out[c * 64 + w * 2], out[c * 64 + w * 2 + 1]]).to_f32()
        };
        assert_eq!(
            [at(0, 0), at(0, 1), at(0, 2), at(1, 0), at(1, 1), at(1, 2)],
            [1.0, 2.0, 3.0, -1.0, 0.5, 0.25]
        );
        assert_eq!(out[6], 0xAA, "padding is left alone");
    }

    #[test]
    fn copies_fp16_and_converts_to_fp32() {
        let bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        let src = ArrayDesc {
            dtype: ArrayType::Float16,
            shape: vec![1, 2, 1, 1],
            strides: vec![2, 1, 1, 1],
        };
        let dst = Planar {
            dtype: ElemType::Fp32,
            channels: 2,
            width: 1,
            channel_stride: 64,
        };
        let mut out = vec![0u8; 128];
        copy_into_planar(&src, &bytes, &dst, &mut out).unwrap();
        assert_eq!(f32::from_le_bytes(out[64..68].try_into().unwrap()), -2.0);
    }

    #[test]
    fn planar_values_round_trip_through_padded_rows() {
        let p = Planar {
            dtype: ElemType::Fp16,
            channels: 2,
            width: 3,
            channel_stride: 64,
        };
        let mut buf = vec![0xEEu8; 128];
        p.write_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.5], &mut buf)
            .unwrap();
        assert_eq!(p.read_f32(&buf).unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        assert_eq!(&buf[64..66], &f16::from_f32(4.0).to_le_bytes());
        assert_eq!(buf[6], 0xEE, "padding untouched");
        let q = Planar {
            dtype: ElemType::Fp32,
            ..p
        };
        q.write_f32(&[0.1; 6], &mut buf).unwrap();
        assert_eq!(q.read_f32(&buf).unwrap(), [0.1; 6]);
        assert!(p.write_f32(&[0.0; 5], &mut buf).is_err());
        assert!(p.read_f32(&buf[..100]).is_err());
    }

    #[test]
    fn rejects_shapes_and_short_buffers() {
        let dst = Planar {
            dtype: ElemType::Fp16,
            channels: 2,
            width: 3,
            channel_stride: 64,
        };
        let src = ArrayDesc {
            dtype: ArrayType::Float32,
            shape: vec![2, 3],
            strides: vec![3, 1],
        };
        let e = copy_into_planar(&src, &[0; 24], &dst, &mut [0; 128])
            .unwrap_err()
            .to_string();
        assert!(e.contains("shape [2, 3]"), "{e}");
        let src = ArrayDesc {
            dtype: ArrayType::Float32,
            shape: vec![1, 2, 1, 3],
            strides: vec![6, 3, 3, 1],
        };
        assert!(copy_into_planar(&src, &[0; 20], &dst, &mut [0; 128]).is_err());
        let neg = ArrayDesc {
            dtype: ArrayType::Float32,
            shape: vec![1, 2, 1, 3],
            strides: vec![6, -3, 3, 1],
        };
        assert!(neg.extent().is_err());
    }
}
