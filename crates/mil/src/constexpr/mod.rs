//! Compressed weights: the MIL constexpr ops that keep a model file's own int8/int4/palettised
//! numbers in the program (instead of fp16 copies), type-checked, built and evaluated here.
//!
//! Ops (semantics, dtypes and shape rules from coremltools 9.0's op definitions):
//! - `constexpr_affine_dequantize` (iOS16+; dialect B's only one): `scale * (q - zero_point)`,
//!   int8/uint8 `q`, scale/zero point scalars or vectors along `axis`;
//! - `constexpr_blockwise_shift_scale` (iOS18): `scale * (data - offset)` per block, block sizes
//!   `data.shape / scale.shape`; data int4/uint4/int8/uint8/fp16/fp32, offset of data's
//!   integer dtype or a float;
//! - `constexpr_lut_to_dense` (iOS18): `lut[group][index]`, indices uint1/2/3/4/6/8, one
//!   palette of `2^bits` entries (scalars or vectors) per group of indices.
//!
//! The chains of coremltools' joint compression type-check and evaluate: an int8 palette
//! expanded by `lut_to_dense` then dequantised by `blockwise_shift_scale` (`data` a constexpr
//! output), and an int8 palette dequantised first (`lut` a constexpr output).
//!
//! ```
//! use anelm_mil::{constexpr, DType, FunctionBuilder, Opset, TensorType, WeightData};
//! use std::sync::Arc;
//! # fn main() -> anelm_mil::Result<()> {
//! let mut f = FunctionBuilder::new("main", Opset::Ios18);
//! // 2 rows x 4 columns, int8 in blocks of 2 columns: w = scale * q
//! let q = Arc::new(WeightData::i8(&[1, -2, 3, 4, 5, 6, -7, 8]));
//! let s = Arc::new(WeightData::f16_from_f32(&[0.5, 1.0, 2.0, 0.25]));
//! let w = f.blockwise_weight("w", TensorType::fp16([2, 4]), q, s, None, &[2, 2])?;
//! assert_eq!(
//!     constexpr::dense_f32(f.function(), w)?,
//!     vec![0.5, -1.0, 3.0, 4.0, 10.0, 12.0, -1.75, 2.0]
//! );
//! # Ok(()) }
//! ```

mod build;
mod eval;
mod infer;

pub use eval::dense_f32;
pub(crate) use infer::{infer_affine_dequantize, infer_blockwise_shift_scale, infer_lut_to_dense};

/// Whether `op_type` is one of the constexpr ops this crate evaluates.
pub fn is_evaluated(op_type: &str) -> bool {
    matches!(
        op_type,
        "constexpr_affine_dequantize"
            | "constexpr_blockwise_shift_scale"
            | "constexpr_lut_to_dense"
    )
}
