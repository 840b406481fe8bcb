//! The simulator: executes MIL functions on the CPU with the ANE's numerics, so that the very
//! programs the ANE would compile — same ops, same weight blobs — run and are checked on Linux.
//!
//! ```
//! use anelm_mil::sim::{Simulator, Tensor};
//! use anelm_mil::{FunctionBuilder, Opset, TensorType, WeightData};
//! # fn main() -> anelm_mil::Result<()> {
//! let mut f = FunctionBuilder::new("main", Opset::Ios18);
//! let x = f.input("x", TensorType::fp16([1, 2, 1, 64]))?;
//! let w = f.weight("w", TensorType::fp16([1, 2, 1, 1]), WeightData::f16_from_f32(&[0.5, 2.0]))?;
//! let y = f.name_next("y").conv1x1(x, w)?;
//! f.output(y)?;
//! let sim = Simulator::new(&f.finish()?)?;
//! assert_eq!(sim.column_width(), Some(64));
//! // Column-independent programs may run on the live columns only (here 1 of 64).
//! let out = sim.run(vec![Tensor::fp16([1, 2, 1, 1], vec![2.0, 3.0])?])?;
//! assert_eq!(out[0].floats()?, &[7.0]);
//! # Ok(()) }
//! ```
//!
//! What is modelled (FACTS §3.6b, measured by H3 on M3 Ultra):
//! - fp16 storage: every fp16 value an op produces is rounded to fp16 (ties to even); overflow
//!   gives ±inf.
//! - `conv` (1×1) and `matmul`: each product of two fp16 operands rounded to fp16, flushed to 0
//!   when below 2^-14 (6.10e-5); products summed in an f32 accumulator; a partial sum reaching
//!   2^15 makes that output 0 — checked after every 64 products and at the end, since the
//!   hardware's order is unknown; the sum rounded to fp16 ([`numerics`], [`mac`]).
//!
//! What is not: the accumulator is f32 (the hardware's is described as "fp32-class exact");
//! outputs round ties to even (H3 saw ties rounded up); transcendental functions, softmax,
//! layer_norm and reductions are computed in f32 and rounded once (the ANE's internal
//! precision and function approximations are unknown); no timing, no memory limits, no
//! compiler rejections (see [`crate::lint`] for reported failures).
//!
//! Supported ops: conv (1×1, stride 1, one group, optional bias), matmul, the elementwise
//! unary/binary/compare/logical ops and select, reductions and reduce_argmax, softmax,
//! layer_norm, reshape / expand_dims / squeeze, transpose, concat, split, slice_by_size,
//! slice_by_index, slice_update (constant or runtime bounds), cast; and as operands of any of
//! them the outputs of `constexpr_affine_dequantize`, `constexpr_blockwise_shift_scale` and
//! `constexpr_lut_to_dense`, dequantised once when the function is prepared and rounded once to
//! fp16 (the ANE taken to read decompressed fp16 weights; unverified on hardware). Anything else
//! is an error naming the op when the function is prepared.

mod dequant;
pub mod elementwise;
pub mod linalg;
pub mod mac;
pub mod numerics;
mod program;
pub mod reduce;
pub mod shape;
mod tensor;

pub use program::Simulator;
pub use tensor::{strides, Data, Tensor};
