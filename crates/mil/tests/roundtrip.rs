//! Property: random well-typed programs survive print → parse → print unchanged, and the
//! parsed program (with its blobs read back from the written files) equals the original.

use anelm_mil::blob::{BlobFile, BlobPolicy};
use anelm_mil::text::{parse_program, print_program, to_artifacts};
use anelm_mil::{
    DType, Dialect, Elements, FunctionBuilder, Literal, Program, TensorType, ValueId, WeightData,
};
use half::f16;
use proptest::prelude::*;
use std::sync::Arc;

#[derive(Debug, Clone)]
struct Step {
    kind: u8,
    a: usize,
    b: usize,
    c: u16,
}

#[derive(Debug, Clone)]
struct Case {
    dialect_b: bool,
    per_tensor: bool,
    inputs: Vec<(bool, Vec<usize>)>,
    steps: Vec<Step>,
    names: Vec<String>,
    text: String,
}

fn case() -> impl Strategy<Value = Case> {
    let input = (any::<bool>(), prop::collection::vec(1usize..6, 1..=4));
    let step = (any::<u8>(), any::<usize>(), any::<usize>(), any::<u16>())
        .prop_map(|(kind, a, b, c)| Step { kind, a, b, c });
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(input, 1..4),
        prop::collection::vec(step, 1..40),
        prop::collection::vec("[a-z_][a-z0-9_@]{0,6}", 0..6),
        "[ -~\t\n]{0,12}",
    )
        .prop_map(|(dialect_b, per_tensor, inputs, steps, names, text)| Case {
            dialect_b,
            per_tensor,
            inputs,
            steps,
            names,
            text,
        })
}

/// A finite fp16 from random bits.
fn finite_f16(bits: u16) -> f32 {
    let v = f16::from_bits(bits);
    if v.is_nan() {
        0.5
    } else {
        v.to_f32()
    }
}

/// Builds whatever the steps describe. Steps pair values at random, so the builder's type
/// checking refuses some (and the generated names, some of them not identifiers or taken): every
/// refusal must be an `Invalid` error saying why, and the ops that take any float tensor (unary,
/// reshape to one dimension, cast) are never refused unless given a name.
fn build(case: &Case) -> Program {
    let dialect = if case.dialect_b {
        Dialect::b()
    } else {
        Dialect::a()
    };
    let mut f = FunctionBuilder::new("main", dialect.proven_opset());
    let mut vals: Vec<ValueId> = Vec::new();
    for (i, (fp32, shape)) in case.inputs.iter().enumerate() {
        let t = if *fp32 {
            TensorType::fp32(shape.clone())
        } else {
            TensorType::fp16(shape.clone())
        };
        vals.push(f.input(&format!("in{i}"), t).unwrap());
    }
    let mut names = case.names.iter();
    f.constant("note", Literal::string(case.text.clone()))
        .expect("a string constant");
    for s in &case.steps {
        let x = vals[s.a % vals.len()];
        let y = vals[s.b % vals.len()];
        let tx = f.type_of(x).unwrap().clone();
        let mut named = false;
        if s.kind % 7 == 0 {
            if let Some(n) = names.next() {
                f.name_next(n);
                named = true;
            }
        }
        let r: anelm_mil::Result<Vec<ValueId>> = match s.kind % 17 {
            0 => f
                .unary(
                    [
                        "relu", "sigmoid", "tanh", "exp", "sqrt", "silu", "identity", "abs",
                    ][s.c as usize % 8],
                    x,
                )
                .map(|v| vec![v]),
            1 => f
                .binary(
                    ["add", "mul", "sub", "maximum", "minimum", "real_div"][s.c as usize % 6],
                    x,
                    y,
                )
                .map(|v| vec![v]),
            2 => f
                .binary_scalar(["add", "mul", "pow"][s.b % 3], x, finite_f16(s.c))
                .map(|v| vec![v]),
            3 => f.softmax(x, -((s.c % 4) as i32) - 1).map(|v| vec![v]),
            4 => {
                let axes: Vec<i32> = (0..tx.rank() as i32)
                    .filter(|i| s.c & (1 << i) != 0)
                    .collect();
                f.reduce(
                    ["reduce_sum", "reduce_max"][s.b % 2],
                    x,
                    &axes,
                    s.c & 0x100 != 0,
                )
                .map(|v| vec![v])
            }
            5 => {
                let mut perm: Vec<i32> = (0..tx.rank() as i32).collect();
                perm.rotate_left(s.c as usize % tx.rank().max(1));
                f.transpose(x, &perm).map(|v| vec![v])
            }
            6 => f.reshape(x, &[-1]).map(|v| vec![v]),
            7 => f.concat(&[x, y], (s.c % 4) as i32).map(|v| vec![v]),
            8 => {
                let size: Vec<i32> = tx
                    .shape
                    .iter()
                    .map(|&d| ((s.c as usize % d) + 1) as i32)
                    .collect();
                f.slice_by_size(x, &vec![0; tx.rank()], &size)
                    .map(|v| vec![v])
            }
            9 => f
                .cast(
                    x,
                    if tx.dtype == DType::Fp16 {
                        DType::Fp32
                    } else {
                        DType::Fp16
                    },
                )
                .map(|v| vec![v]),
            10 => f.matmul(x, y, s.c & 1 != 0, s.c & 2 != 0).map(|v| vec![v]),
            11 if tx.rank() == 4 && tx.dtype == DType::Fp16 => {
                let cout = 1 + s.c as usize % 5;
                let w: Vec<f32> = (0..cout * tx.shape[1])
                    .map(|i| finite_f16(s.c.wrapping_add(i as u16)))
                    .collect();
                let data = Arc::new(WeightData::f16_from_f32(&w));
                let name = format!("w{}", vals.len());
                f.weight(&name, TensorType::fp16([cout, tx.shape[1], 1, 1]), data)
                    .and_then(|w| f.conv1x1(x, w))
                    .map(|v| vec![v])
            }
            12 => f.expand_dims(x, &[(s.c % 3) as i32]).map(|v| vec![v]),
            13 => f.split(x, (s.c % 4) as i32, 1 + (s.b % 3) as i32),
            14 => {
                let cond = f.greater(x, y);
                cond.and_then(|c| f.select(c, x, y)).map(|v| vec![v])
            }
            15 => {
                // A small inline matrix const (printed nested), broadcast against x.
                let (r, c) = (1 + s.c as usize % 3, 1 + s.b % 4);
                let v = (0..r * c)
                    .map(|i| f16::from_f32(finite_f16(s.c.wrapping_mul(31).wrapping_add(i as u16))))
                    .collect();
                let t = TensorType::new(tx.dtype, [r, c]);
                let data = if tx.dtype == DType::Fp16 {
                    Elements::F16(v)
                } else {
                    Elements::F32(v.iter().map(|h| h.to_f32()).collect())
                };
                let name = format!("m{}", vals.len());
                Literal::immediate(t, data)
                    .and_then(|l| f.constant(&name, l))
                    .and_then(|m| f.add(x, m))
                    .map(|v| vec![v])
            }
            _ => f
                .slice_by_index(
                    x,
                    &vec![0; tx.rank()],
                    &tx.shape.iter().map(|&d| d as i32).collect::<Vec<_>>(),
                )
                .map(|v| vec![v]),
        };
        match r {
            Ok(new) => vals.extend(new),
            Err(e) => {
                assert!(
                    matches!(&e, anelm_mil::MilError::Invalid(m) if !m.is_empty()),
                    "{s:?}: refused with {e:?}"
                );
                assert!(
                    named || ![0, 6, 9].contains(&(s.kind % 17)),
                    "{s:?}: an op valid for any float tensor was refused: {e}"
                );
            }
        }
    }
    let last = *vals.last().unwrap();
    f.output(last).unwrap();
    let mut p = Program::new(dialect);
    p.add_function(f.finish().unwrap()).unwrap();
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_programs_round_trip_through_text(case in case()) {
        let p = build(&case);
        let policy = if case.per_tensor { BlobPolicy::PerTensor } else { BlobPolicy::default() };
        let art = to_artifacts(&p, &policy).unwrap();
        let mut parsed = parse_program(&art.text).map_err(|e| TestCaseError::fail(format!("{e}\n{}", art.text)))?;
        prop_assert_eq!(&print_program(&parsed, &Default::default()).unwrap(), &art.text);
        // Read the weights back from the blob files as written.
        let files: Vec<(String, BlobFile)> = art.layout.files().iter()
            .map(|f| (f.mil_path(), BlobFile::parse(f.relative_path.clone(), f.to_bytes()).unwrap()))
            .collect();
        parsed.resolve_blobs(|path, offset, ty| {
            let (_, file) = files.iter().find(|(p, _)| p == path).expect("planned file");
            file.read(offset, ty)
        }).unwrap();
        prop_assert_eq!(parsed, p);
    }
}
