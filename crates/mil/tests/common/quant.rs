//! One 1×1 conv per compressed-weight form (the forms the ANE lowering emits), each with its
//! dense fp16 weights computed here by the op's definition, independently of the crate.

use anelm_mil::{DType, FunctionBuilder, Literal, Opset, Program, Result, TensorType, WeightData};
use half::f16;
use std::sync::Arc;

pub const COUT: usize = 64;
pub const CIN: usize = 128;
pub const BLOCK: usize = 32;
/// Rows per palette group.
pub const ROWS_PER_LUT: usize = 16;
const GROUPS: usize = COUT / ROWS_PER_LUT;
const NB: usize = CIN / BLOCK;

/// A conv program whose weight is compressed, and the dense fp16 weight it stands for.
pub struct Form {
    pub name: &'static str,
    pub program: Program,
    /// `[COUT, CIN]` row-major, fp16 values (as f32).
    pub dense: Vec<f32>,
}

/// Deterministic integers in `[lo, hi]`.
pub fn ints(n: usize, seed: u64, lo: i64, hi: i64) -> Vec<i64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (s % (hi - lo + 1) as u64) as i64
        })
        .collect()
}

fn fp16_round(v: f64) -> f32 {
    f16::from_f64(v).to_f32()
}

/// fp16 scales in (0, 1/32]: small multiples of 2^-10.
fn scales(n: usize, seed: u64) -> Vec<f32> {
    ints(n, seed, 1, 32)
        .into_iter()
        .map(|v| v as f32 / 1024.0)
        .collect()
}

fn wd<T: Copy + Into<i64>>(d: DType, v: &[T]) -> Arc<WeightData> {
    Arc::new(WeightData::pack(d, v).unwrap())
}

fn as_i8(v: &[i64]) -> Vec<i8> {
    v.iter().map(|&x| x as i8).collect()
}

fn as_u8(v: &[i64]) -> Vec<u8> {
    v.iter().map(|&x| x as u8).collect()
}

/// `scale[r, c / BLOCK] * (q[r, c] - offset[r, c / BLOCK])` rounded once to fp16.
fn blockwise_dense(q: &[f64], scale: &[f32], offset: Option<&[f64]>) -> Vec<f32> {
    (0..COUT * CIN)
        .map(|i| {
            let b = i / CIN * NB + i % CIN / BLOCK;
            let o = offset.map_or(0.0, |o| o[b]);
            fp16_round(scale[b] as f64 * (q[i] - o))
        })
        .collect()
}

/// `lut[r / ROWS_PER_LUT][idx[r, c]]`.
fn lut_dense(idx: &[i64], lut: &[f64]) -> Vec<f64> {
    (0..COUT * CIN)
        .map(|i| lut[i / CIN / ROWS_PER_LUT * 16 + idx[i] as usize])
        .collect()
}

fn weight_ty() -> TensorType {
    TensorType::fp16([COUT, CIN, 1, 1])
}

const SCALE_SHAPE: [usize; 4] = [COUT, NB, 1, 1];
const LUT_SHAPE: [usize; 6] = [GROUPS, 1, 1, 1, 16, 1];

/// `y = conv1x1(x, w)` with `w` built by `weight`.
pub fn conv_program(
    opset: Opset,
    width: usize,
    weight: impl FnOnce(&mut FunctionBuilder) -> Result<anelm_mil::ValueId>,
) -> Result<Program> {
    let mut f = FunctionBuilder::new("main", opset);
    let x = f.input("x", TensorType::fp16([1, CIN, 1, width]))?;
    let w = weight(&mut f)?;
    let y = f.name_next("y").conv1x1(x, w)?;
    f.output(y)?;
    Ok(Program::single(f.finish()?))
}

/// The same conv with plain fp16 weights.
pub fn dense_program(dense: &[f32], width: usize) -> Program {
    conv_program(Opset::Ios18, width, |f| {
        f.weight("w", weight_ty(), WeightData::f16_from_f32(dense))
    })
    .unwrap()
}

/// Every iOS18 form: blockwise int8 / int4 / uint4, palettes, and both joint chains.
pub fn ios18_forms(width: usize) -> Vec<Form> {
    let n = COUT * CIN;
    let mut out = Vec::new();
    let o18 = Opset::Ios18;

    // int8, blocks of 32 along the input channels, fp16 scale and fractional fp16 offset
    let q = ints(n, 1, -128, 127);
    let s = scales(COUT * NB, 2);
    let off: Vec<f64> = ints(COUT * NB, 3, -6, 6)
        .iter()
        .map(|&v| v as f64 / 2.0)
        .collect();
    let off32: Vec<f32> = off.iter().map(|&v| v as f32).collect();
    let qf: Vec<f64> = q.iter().map(|&v| v as f64).collect();
    out.push(Form {
        name: "int8_block32_fp16_offset",
        dense: blockwise_dense(&qf, &s, Some(&off)),
        program: conv_program(o18, width, |f| {
            f.blockwise_weight(
                "w",
                weight_ty(),
                wd(DType::Int8, &as_i8(&q)),
                Arc::new(WeightData::f16_from_f32(&s)),
                Some(Arc::new(WeightData::f16_from_f32(&off32))),
                &SCALE_SHAPE,
            )
        })
        .unwrap(),
    });

    // int4 without offset (GGUF Q4_0 as signed nibbles)
    let q = ints(n, 4, -8, 7);
    let s = scales(COUT * NB, 5);
    let qf: Vec<f64> = q.iter().map(|&v| v as f64).collect();
    out.push(Form {
        name: "int4_block32",
        dense: blockwise_dense(&qf, &s, None),
        program: conv_program(o18, width, |f| {
            let d = wd(DType::Int4, &as_i8(&q));
            let s = Arc::new(WeightData::f16_from_f32(&s));
            f.blockwise_weight("w", weight_ty(), d, s, None, &SCALE_SHAPE)
        })
        .unwrap(),
    });

    // uint4 data with a uint4 offset per block
    let q = ints(n, 6, 0, 15);
    let s = scales(COUT * NB, 7);
    let off = ints(COUT * NB, 8, 0, 15);
    let qf: Vec<f64> = q.iter().map(|&v| v as f64).collect();
    let of: Vec<f64> = off.iter().map(|&v| v as f64).collect();
    out.push(Form {
        name: "uint4_uint4_offset",
        dense: blockwise_dense(&qf, &s, Some(&of)),
        program: conv_program(o18, width, |f| {
            f.blockwise_weight(
                "w",
                weight_ty(),
                wd(DType::Uint4, &as_u8(&q)),
                Arc::new(WeightData::f16_from_f32(&s)),
                Some(wd(DType::Uint4, &as_u8(&off))),
                &SCALE_SHAPE,
            )
        })
        .unwrap(),
    });

    // uint4 indices into one fp16 palette per group of 16 output rows
    let idx = ints(n, 9, 0, 15);
    let lut: Vec<f64> = ints(GROUPS * 16, 10, -512, 512)
        .iter()
        .map(|&v| v as f64 / 1024.0)
        .collect();
    let lut32: Vec<f32> = lut.iter().map(|&v| v as f32).collect();
    out.push(Form {
        name: "lut_uint4_row_groups",
        dense: lut_dense(&idx, &lut).into_iter().map(fp16_round).collect(),
        program: conv_program(o18, width, |f| {
            f.lut_weight(
                "w",
                weight_ty(),
                wd(DType::Uint4, &as_u8(&idx)),
                Arc::new(WeightData::f16_from_f32(&lut32)),
                &LUT_SHAPE,
            )
        })
        .unwrap(),
    });

    // quantise then palettise: int8 palettes expanded, then dequantised blockwise
    let idx = ints(n, 11, 0, 15);
    let lut8 = ints(GROUPS * 16, 12, -127, 127);
    let s = scales(COUT * NB, 13);
    let lf: Vec<f64> = lut8.iter().map(|&v| v as f64).collect();
    out.push(Form {
        name: "lut_int8_then_blockwise",
        dense: blockwise_dense(&lut_dense(&idx, &lf), &s, None),
        program: conv_program(o18, width, |f| {
            let i = f.weight(
                "w_indices",
                TensorType::new(DType::Uint4, [COUT, CIN, 1, 1]),
                wd(DType::Uint4, &as_u8(&idx)),
            )?;
            let l = f.weight(
                "w_lut",
                TensorType::new(DType::Int8, LUT_SHAPE),
                wd(DType::Int8, &as_i8(&lut8)),
            )?;
            let q = f.name_next("w_q").lut_to_dense(i, l, None)?;
            let sc = f.weight(
                "w_scale",
                TensorType::fp16(SCALE_SHAPE),
                WeightData::f16_from_f32(&s),
            )?;
            f.name_next("w").blockwise_shift_scale(q, sc, None)
        })
        .unwrap(),
    });

    // palettise then quantise: the int8 palettes dequantised (per tensor), then expanded
    let idx = ints(n, 14, 0, 15);
    let lut8 = ints(GROUPS * 16, 15, -127, 127);
    let ls = 1.0 / 256.0;
    let lf: Vec<f64> = lut8
        .iter()
        .map(|&v| fp16_round(v as f64 * ls) as f64)
        .collect();
    out.push(Form {
        name: "blockwise_lut_then_lut",
        dense: lut_dense(&idx, &lf).into_iter().map(|v| v as f32).collect(),
        program: conv_program(o18, width, |f| {
            let l = f.blockwise_weight(
                "w_lut",
                TensorType::fp16(LUT_SHAPE),
                wd(DType::Int8, &as_i8(&lut8)),
                Arc::new(WeightData::f16_from_f32(&[ls as f32])),
                None,
                &[1; 6],
            )?;
            let i = f.weight(
                "w_indices",
                TensorType::new(DType::Uint4, [COUT, CIN, 1, 1]),
                wd(DType::Uint4, &as_u8(&idx)),
            )?;
            f.name_next("w").lut_to_dense(i, l, None)
        })
        .unwrap(),
    });
    out.push(affine_form(o18, width));
    out
}

/// iOS16 `constexpr_affine_dequantize` with a per-output-channel scale and zero point.
pub fn affine_form(opset: Opset, width: usize) -> Form {
    let q = ints(COUT * CIN, 16, -128, 127);
    let s = scales(COUT, 17);
    let zp = ints(COUT, 18, -4, 4);
    Form {
        name: "affine_int8_per_channel",
        dense: (0..COUT * CIN)
            .map(|i| fp16_round(s[i / CIN] as f64 * (q[i] - zp[i / CIN]) as f64))
            .collect(),
        program: conv_program(opset, width, |f| {
            f.affine_weight(
                "w",
                weight_ty(),
                wd(DType::Int8, &as_i8(&q)),
                Literal::weight_vector(wd(DType::Int8, &as_i8(&zp))),
                Literal::weight_vector(Arc::new(WeightData::f16_from_f32(&s))),
                0,
            )
        })
        .unwrap(),
    }
}
