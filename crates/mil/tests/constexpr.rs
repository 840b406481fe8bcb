//! Compressed weights: every constexpr form run by the simulator equals the conv with the dense
//! fp16 weights; the ops' definitions on coremltools' own examples; bad input is one error.

mod common;

use anelm_mil::sim::{Simulator, Tensor};
use anelm_mil::{
    constexpr, DType, FunctionBuilder, Literal, MilError, Opset, Program, TensorType, ValueId,
    WeightData,
};
use common::quant::{self, Form, CIN, COUT};
use std::sync::Arc;

const W: usize = 16;

fn input() -> Tensor {
    let v = quant::ints(CIN * W, 99, -64, 64)
        .into_iter()
        .map(|v| v as f32 / 32.0)
        .collect();
    Tensor::fp16([1, CIN, 1, W], v).unwrap()
}

fn run(p: &Program) -> Vec<f32> {
    let sim = Simulator::new(&p.functions[0]).unwrap();
    sim.run(vec![input()]).unwrap()[0]
        .floats()
        .unwrap()
        .to_vec()
}

fn the_weight(p: &Program) -> ValueId {
    p.functions[0].find("w").unwrap()
}

fn check_form(form: &Form) {
    let f = &form.program.functions[0];
    // The evaluation by definition, rounded to fp16, is the independently computed dense weight.
    let mut dense = constexpr::dense_f32(f, the_weight(&form.program)).unwrap();
    anelm_mil::sim::numerics::round_in_place(&mut dense);
    let bad = dense.iter().zip(&form.dense).position(|(a, b)| a != b);
    assert_eq!(bad, None, "{}: first differing weight", form.name);
    // The compressed program runs and equals the conv with dense fp16 weights, bit for bit.
    let y = run(&form.program);
    assert_eq!(y.len(), COUT * W);
    assert!(y.iter().any(|&v| v != 0.0), "{}: all zero", form.name);
    assert_eq!(
        y,
        run(&quant::dense_program(&form.dense, W)),
        "{}",
        form.name
    );
}

#[test]
fn every_ios18_form_equals_the_dense_conv() {
    let forms = quant::ios18_forms(W);
    assert_eq!(forms.len(), 7);
    for form in &forms {
        check_form(form);
    }
}

#[test]
fn affine_per_channel_equals_the_dense_conv_in_ios16() {
    check_form(&quant::affine_form(Opset::Ios16, W));
}

#[test]
fn stored_bytes_are_the_compressed_ones() {
    let forms = quant::ios18_forms(W);
    let bytes = |name: &str| {
        let p = &forms.iter().find(|f| f.name == name).unwrap().program;
        (p.weight_bytes(), p.stored_weights())
    };
    let n = (COUT * CIN) as u64;
    let (b, list) = bytes("uint4_uint4_offset");
    // uint4 data, fp16 scale [64, 4], uint4 offset [64, 4]
    assert_eq!(b, n / 2 + 64 * 4 * 2 + 64 * 4 / 2);
    let names: Vec<_> = list.iter().map(|w| (w.name.as_str(), w.ty.dtype)).collect();
    assert_eq!(
        names,
        [
            ("main/w_data", DType::Uint4),
            ("main/w_scale", DType::Fp16),
            ("main/w_offset", DType::Uint4)
        ]
    );
    assert!(list.iter().all(|w| w.loaded));
    let (b, _) = bytes("lut_uint4_row_groups");
    assert_eq!(b, n / 2 + 4 * 16 * 2);
    let (b, list) = bytes("affine_int8_per_channel");
    assert_eq!(b, n + 64 + 64 * 2);
    assert_eq!(list[0].name, "main/w.quantized_data");
}

/// A function holding only the op under test, its operands as blob consts.
fn lone(build: impl FnOnce(&mut FunctionBuilder) -> anelm_mil::Result<ValueId>) -> Vec<f32> {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let v = build(&mut f).unwrap();
    constexpr::dense_f32(f.function(), v).unwrap()
}

#[test]
fn lut_to_dense_matches_the_coremltools_examples() {
    // compression.py, constexpr_lut_to_dense, Case 1: two 2-bit palettes over the rows.
    let case1 = lone(|f| {
        let i = f.weight(
            "i",
            TensorType::new(DType::Uint2, [6, 2]),
            WeightData::pack(DType::Uint2, &[2u8, 3, 3, 0, 1, 0, 3, 0, 2, 1, 0, 3]).unwrap(),
        )?;
        let l = f.weight(
            "l",
            TensorType::fp16([2, 1, 4, 1]),
            WeightData::f16_from_f32(&[1.0, 5.0, 9.0, 13.0, 2.0, 10.0, 18.0, 26.0]),
        )?;
        f.lut_to_dense(i, l, None)
    });
    assert_eq!(
        case1,
        [9.0, 13.0, 13.0, 1.0, 5.0, 1.0, 26.0, 2.0, 18.0, 10.0, 2.0, 26.0]
    );
    // Case 2: 1-bit vector palettes a = (1, 2, 3), b = (4, 5, 6) along axis 1, then axis 2.
    let case2 = |axis: i32| {
        lone(|f| {
            let i = f.weight(
                "i",
                TensorType::new(DType::Uint1, [2, 2, 2]),
                WeightData::pack(DType::Uint1, &[0u8, 0, 1, 0, 1, 1, 0, 0]).unwrap(),
            )?;
            let l = f.weight(
                "l",
                TensorType::new(DType::Int8, [1, 1, 1, 2, 3]),
                WeightData::i8(&[1, 2, 3, 4, 5, 6]),
            )?;
            let d = f.lut_to_dense(i, l, Some(axis))?;
            let want = if axis == 1 { [2, 6, 2] } else { [2, 2, 6] };
            assert_eq!(f.type_of(d)?, &TensorType::new(DType::Int8, want));
            Ok(d)
        })
    };
    let a1: Vec<f32> = [
        1, 1, 2, 2, 3, 3, 4, 1, 5, 2, 6, 3, 4, 4, 5, 5, 6, 6, 1, 1, 2, 2, 3, 3,
    ]
    .map(|v| v as f32)
    .to_vec();
    assert_eq!(case2(1), a1);
    let a2: Vec<f32> = [
        1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 4, 5, 6, 1, 2, 3, 1, 2, 3,
    ]
    .map(|v| v as f32)
    .to_vec();
    assert_eq!(case2(-1), a2);
}

#[test]
fn blockwise_and_affine_follow_their_definitions() {
    // compression.py constexpr_sparse_blockwise_shift_scale example, dense: per-column scale
    // and offset over a [4, 4] tensor (block [4, 1]).
    let y = lone(|f| {
        let d = f.weight(
            "d",
            TensorType::int8([4, 4]),
            WeightData::i8(&[10, 11, 0, 0, 3, 4, 5, 0, 0, 0, 6, 7, 8, 9, 0, 0]),
        )?;
        let s = f.weight(
            "s",
            TensorType::fp32([1, 4]),
            WeightData::f32(&[0.1, 0.2, 0.3, 0.4]),
        )?;
        let o = f.weight("o", TensorType::int8([1, 4]), WeightData::i8(&[1, 2, 3, 4]))?;
        f.blockwise_shift_scale(d, s, Some(o))
    });
    // (data - offset) * scale, column by column, as f32 (the example's fp32 scale).
    let want: Vec<f32> = [
        (9.0, 0.1),
        (9.0, 0.2),
        (-3.0, 0.3),
        (-4.0, 0.4),
        (2.0, 0.1),
        (2.0, 0.2),
        (2.0, 0.3),
        (-4.0, 0.4),
    ]
    .iter()
    .map(|&(d, s): &(f32, f32)| s * d)
    .collect();
    assert_eq!(&y[..8], &want[..]);
    assert_eq!(y[9..12], [0.2f32 * -2.0, 0.3 * 3.0, 0.4 * 3.0]);
    // Affine with a scalar fp32 zero point and a vector scale along axis 1.
    let y = lone(|f| {
        let q = Literal::weight(
            TensorType::uint8([2, 3]),
            Arc::new(WeightData::u8(&[0, 10, 20, 30, 40, 50])),
        )?;
        let s = Literal::weight_vector(Arc::new(WeightData::f16_from_f32(&[1.0, 0.5, 0.25])));
        f.affine_dequantize("w", q, Literal::f32(10.0), s, 1)
    });
    assert_eq!(y, [-10.0, 0.0, 2.5, 20.0, 15.0, 10.0]);
}

/// Builds in a fresh iOS18 function and returns the error message.
fn error(build: impl FnOnce(&mut FunctionBuilder) -> anelm_mil::Result<ValueId>) -> String {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let e = build(&mut f).expect_err("must be rejected");
    assert!(matches!(e, MilError::Invalid(_)), "{e:?}");
    let m = e.to_string();
    assert!(!m.contains('\n'), "one line: {m}");
    m
}

fn arc<T: Copy + Into<i64>>(d: DType, v: &[T]) -> Arc<WeightData> {
    Arc::new(WeightData::pack(d, v).unwrap())
}

fn f16s(n: usize) -> Arc<WeightData> {
    Arc::new(WeightData::f16_from_f32(&vec![0.5; n]))
}

#[test]
fn bad_compressed_weights_are_one_clear_error() {
    let ty = TensorType::fp16([4, 8]);
    let i8s = |n: usize| arc(DType::Int8, &vec![1i8; n]);
    let u4s = |n: usize| arc(DType::Uint4, &vec![1u8; n]);
    let cases: Vec<(String, &str)> = vec![
        (
            error(|f| f.blockwise_weight("w", ty.clone(), i8s(32), f16s(12), None, &[4, 3])),
            "does not divide",
        ),
        (
            error(|f| f.blockwise_weight("w", ty.clone(), i8s(32), f16s(4), None, &[4])),
            "rank",
        ),
        (
            error(|f| {
                let off = Some(arc(DType::Int8, &[0i8; 8]));
                f.blockwise_weight("w", ty.clone(), u4s(32), f16s(8), off, &[4, 2])
            }),
            "data's dtype uint4",
        ),
        (
            error(|f| {
                let off = Some(u4s(4));
                f.blockwise_weight("w", ty.clone(), u4s(32), f16s(8), off, &[4, 2])
            }),
            "weight data",
        ),
        (
            error(|f| {
                let d = arc(DType::Int32, &[1i32; 32]);
                f.blockwise_weight("w", ty.clone(), d, f16s(8), None, &[4, 2])
            }),
            "int4, uint4, int8, uint8, fp16, fp32",
        ),
        (
            error(|f| {
                let s = Arc::new(WeightData::f32(&[0.5; 8]));
                f.blockwise_weight("w", ty.clone(), i8s(32), s, None, &[4, 2])
            }),
            "declared tensor<fp16, [4, 8]>",
        ),
        (
            error(|f| f.blockwise_weight("w", ty.clone(), i8s(31), f16s(8), None, &[4, 2])),
            "does not fit",
        ),
        (
            error(|f| f.lut_weight("w", ty.clone(), u4s(32), f16s(8), &[1, 1, 8, 1])),
            "16",
        ),
        (
            error(|f| f.lut_weight("w", ty.clone(), u4s(32), f16s(16), &[1, 16, 1])),
            "rank 4",
        ),
        (
            error(|f| f.lut_weight("w", ty.clone(), u4s(32), f16s(48), &[3, 1, 16, 1])),
            "does not divide",
        ),
        (
            error(|f| f.lut_weight("w", ty.clone(), u4s(32), f16s(32), &[1, 1, 16, 2])),
            "scalar palettes",
        ),
        (
            error(|f| {
                let i = f.weight("i", TensorType::new(DType::Uint4, [4, 8]), u4s(32))?;
                let l = f.weight("l", TensorType::fp16([1, 1, 16, 2]), f16s(32))?;
                f.lut_to_dense(i, l, None)
            }),
            "vector_axis must be given",
        ),
        (
            error(|f| {
                let i = f.weight("i", TensorType::new(DType::Uint4, [4, 8]), u4s(32))?;
                let l = f.weight("l", TensorType::fp16([1, 1, 16, 2]), f16s(32))?;
                f.lut_to_dense(i, l, Some(2))
            }),
            "out of range",
        ),
        (
            error(|f| {
                let i = f.weight("i", TensorType::int8([4, 8]), i8s(32))?;
                let l = f.weight("l", TensorType::fp16([1, 1, 16, 1]), f16s(16))?;
                f.lut_to_dense(i, l, None)
            }),
            "uint1, uint2, uint3, uint4, uint6, uint8",
        ),
        (
            error(|f| {
                let x = f.input("x", TensorType::int8([4, 8]))?;
                let s = f.weight("s", TensorType::fp16([4, 1]), f16s(4))?;
                f.blockwise_shift_scale(x, s, None)
            }),
            "must be a constant",
        ),
        (
            error(|f| {
                let s = Literal::weight_vector(f16s(8));
                f.affine_weight("w", ty.clone(), i8s(32), Literal::i8(0), s, 0)
            }),
            "vector of 4",
        ),
        (
            error(|f| {
                let s = Literal::weight(TensorType::fp16([4, 1]), f16s(4))?;
                f.affine_weight("w", ty.clone(), i8s(32), Literal::i8(0), s, 0)
            }),
            "scalar or a vector",
        ),
        (
            error(|f| {
                let d = u4s(32);
                f.affine_weight("w", ty.clone(), d, Literal::i8(0), Literal::f16(1.0), 0)
            }),
            "uint8, int8",
        ),
        (
            error(|f| {
                f.affine_weight(
                    "w",
                    ty.clone(),
                    i8s(32),
                    Literal::i8(0),
                    Literal::f16(1.0),
                    2,
                )
            }),
            "axis 2 out of range",
        ),
    ];
    for (msg, want) in &cases {
        assert!(msg.contains(want), "{msg:?} should mention {want:?}");
    }
    assert!(WeightData::pack(DType::Uint3, &[8u8]).is_err());
    assert!(WeightData::pack(DType::Int4, &[-9i8]).is_err());
    assert!(WeightData::pack(DType::Fp16, &[1u8]).is_err());
}

#[test]
fn a_failed_weight_call_leaves_nothing_behind() {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let ty = TensorType::fp16([4, 8]);
    let d = Arc::new(WeightData::i8(&[3; 32]));
    let bad_offset = Some(arc(DType::Uint4, &[1u8; 4]));
    assert!(f
        .blockwise_weight("w", ty.clone(), d.clone(), f16s(4), bad_offset, &[4, 1])
        .is_err());
    assert_eq!(f.function().values().len(), 0);
    let w = f
        .blockwise_weight("w", ty, d, f16s(4), None, &[4, 1])
        .unwrap();
    let names: Vec<_> = f
        .function()
        .values()
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["w_data", "w_scale", "w"]);
    assert_eq!(
        constexpr::dense_f32(f.function(), w).unwrap(),
        vec![1.5; 32]
    );
}

#[test]
fn ios18_constexpr_ops_are_refused_by_ios16() {
    let mut f = FunctionBuilder::new("main", Opset::Ios16);
    let e = f
        .blockwise_weight(
            "w",
            TensorType::fp16([4, 8]),
            Arc::new(WeightData::i8(&[1; 32])),
            f16s(4),
            None,
            &[4, 1],
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs opset ios18"), "{e}");
    let e = f
        .lut_weight(
            "w",
            TensorType::fp16([4, 8]),
            arc(DType::Uint1, &[1u8; 32]),
            f16s(2),
            &[1, 1, 2, 1],
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("constexpr_lut_to_dense needs opset ios18"),
        "{e}"
    );
}
