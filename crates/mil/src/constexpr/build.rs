//! Builder calls for compressed weights: the op-level constexpr calls, and the conveniences the
//! ANE lowering uses to put a file's own quantised numbers into a program in one call each.

use crate::builder::{Arg, FunctionBuilder, Outputs};
use crate::error::{MilError, Result};
use crate::ir::{Operation, ValueId};
use crate::literal::{Literal, WeightData};
use crate::types::TensorType;
use std::sync::Arc;

impl FunctionBuilder {
    /// `constexpr_affine_dequantize` in the attribute form of MAD's hardware-proven program
    /// (FACTS §1.3): `scale * (quantized - zero_point)`, scale and zero point scalars or vectors
    /// along `axis` (inline or blob literals).
    pub fn affine_dequantize(
        &mut self,
        name: &str,
        quantized: Literal,
        zero_point: Literal,
        scale: Literal,
        axis: i32,
    ) -> Result<ValueId> {
        let op = Operation {
            op_type: "constexpr_affine_dequantize".into(),
            inputs: Vec::new(),
            attributes: vec![
                ("axis".into(), Literal::i32(axis)),
                ("quantized_data".into(), quantized),
                ("scale".into(), scale),
                ("zero_point".into(), zero_point),
            ],
            name: Some(name.to_string()),
            outputs: Vec::new(),
        };
        Ok(self.push(op, Outputs::Infer(vec![name.to_string()]))?[0])
    }

    /// `constexpr_blockwise_shift_scale(data, scale[, offset])` over compile-time operands (OMX
    /// form, FACTS §5); `data` may itself be a constexpr output (a palettised int8 tensor).
    pub fn blockwise_shift_scale(
        &mut self,
        data: ValueId,
        scale: ValueId,
        offset: Option<ValueId>,
    ) -> Result<ValueId> {
        let mut args = vec![("data", data.into()), ("scale", scale.into())];
        if let Some(o) = offset {
            args.push(("offset", o.into()));
        }
        self.op1("constexpr_blockwise_shift_scale", args)
    }

    /// `constexpr_lut_to_dense(indices, lut[, vector_axis])` (iOS18); `lut` may itself be a
    /// constexpr output (an int8 palette dequantised by `constexpr_blockwise_shift_scale`).
    pub fn lut_to_dense(
        &mut self,
        indices: ValueId,
        lut: ValueId,
        vector_axis: Option<i32>,
    ) -> Result<ValueId> {
        let mut args = vec![("indices", indices.into()), ("lut", lut.into())];
        if let Some(a) = vector_axis {
            args.push(("vector_axis", Arg::Const(Literal::i32(a))));
        }
        self.op1("constexpr_lut_to_dense", args)
    }

    /// The weight `ty` (fp16 or fp32: the scale's dtype; shape of the dense result) as
    /// `scale * (data - offset)` blockwise. Creates blob consts `<name>_data` (`ty`'s shape,
    /// `data`'s dtype: int4/uint4/int8/uint8/fp16/fp32), `<name>_scale` and `<name>_offset`
    /// (shape `scale_shape`, which has `ty`'s rank and divides it dim by dim; an integer offset
    /// has data's dtype), then the op named `name`. On error nothing is added.
    pub fn blockwise_weight(
        &mut self,
        name: &str,
        ty: TensorType,
        data: Arc<WeightData>,
        scale: Arc<WeightData>,
        offset: Option<Arc<WeightData>>,
        scale_shape: &[usize],
    ) -> Result<ValueId> {
        self.atomically(|b| {
            let d = b.named_weight(name, "data", ty.with_dtype(data.dtype()), data)?;
            let sty = TensorType::new(scale.dtype(), scale_shape);
            let s = b.named_weight(name, "scale", sty, scale)?;
            let o = match offset {
                Some(o) => {
                    let oty = TensorType::new(o.dtype(), scale_shape);
                    Some(b.named_weight(name, "offset", oty, o)?)
                }
                None => None,
            };
            let w = b.name_next(name).blockwise_shift_scale(d, s, o)?;
            b.expect_type(w, &ty)
        })
        .map_err(|e| e.context(format!("blockwise weight {name}")))
    }

    /// The weight `ty` as `lut[group][indices]` (`constexpr_lut_to_dense`, scalar palettes):
    /// `indices` (uint1/2/3/4/6/8) has `ty`'s shape, `lut` has shape `lut_shape` =
    /// `[groups along each dim of ty..., 2^bits, 1]` and `ty`'s dtype. Creates blob consts
    /// `<name>_indices` and `<name>_lut`, then the op named `name`. On error nothing is added.
    pub fn lut_weight(
        &mut self,
        name: &str,
        ty: TensorType,
        indices: Arc<WeightData>,
        lut: Arc<WeightData>,
        lut_shape: &[usize],
    ) -> Result<ValueId> {
        self.atomically(|b| {
            if lut_shape.last().is_some_and(|&v| v != 1) {
                return Err(MilError::invalid(format!(
                    "lut shape {lut_shape:?}: lut_weight builds scalar palettes (last dim 1); \
                     use lut_to_dense with a vector_axis for vector palettes"
                )));
            }
            let i = b.named_weight(name, "indices", ty.with_dtype(indices.dtype()), indices)?;
            let lty = TensorType::new(lut.dtype(), lut_shape);
            let l = b.named_weight(name, "lut", lty, lut)?;
            let w = b.name_next(name).lut_to_dense(i, l, None)?;
            b.expect_type(w, &ty)
        })
        .map_err(|e| e.context(format!("lut weight {name}")))
    }

    /// The weight `ty` as iOS16 `constexpr_affine_dequantize` (attribute form, the one op
    /// dialect B has): int8/uint8 `data` of `ty`'s shape in a blob; `zero_point`
    /// (int8/uint8/fp32) and `scale` (`ty`'s dtype) are scalars or vectors along `axis` —
    /// e.g. `Literal::i8(0)`, or [`Literal::weight_vector`] for a per-channel blob.
    pub fn affine_weight(
        &mut self,
        name: &str,
        ty: TensorType,
        data: Arc<WeightData>,
        zero_point: Literal,
        scale: Literal,
        axis: i32,
    ) -> Result<ValueId> {
        self.atomically(|b| {
            let q = Literal::weight(ty.with_dtype(data.dtype()), data)?;
            let w = b.affine_dequantize(name, q, zero_point, scale, axis)?;
            b.expect_type(w, &ty)
        })
        .map_err(|e| e.context(format!("affine weight {name}")))
    }

    /// A blob const named `<base>_<part>` (or a fresh variant when taken).
    fn named_weight(
        &mut self,
        base: &str,
        part: &str,
        ty: TensorType,
        data: Arc<WeightData>,
    ) -> Result<ValueId> {
        let n = self.unique_from(&format!("{base}_{part}"));
        let lit = Literal::weight(ty, data).map_err(|e| e.context(part))?;
        self.constant(&n, lit)
    }

    fn expect_type(&self, v: ValueId, ty: &TensorType) -> Result<ValueId> {
        let got = self.type_of(v)?;
        if got != ty {
            return Err(MilError::invalid(format!(
                "the op gives {got}, the weight was declared {ty}"
            )));
        }
        Ok(v)
    }
}
