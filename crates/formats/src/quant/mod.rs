//! Dequantisation of every ggml type to f32, bit-exact with ggml.

use half::{bf16, f16};

use crate::error::{FormatError, Result};
use crate::GgmlType;

/// Dequantises `src` (whole blocks of `dtype`) into `dst`; `dst.len()` elements are produced.
pub fn dequantize(dtype: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if dtype.bytes_for(dst.len()) != Some(src.len()) {
        return Err(FormatError::BadQuantLength { dtype, len: src.len(), n: dst.len() });
    }
    match dtype {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        _ => return Err(FormatError::UnsupportedDequant { dtype }),
    }
    Ok(())
}
