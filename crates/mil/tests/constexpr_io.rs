//! Compressed weights through every file form: MIL text (print → parse → print fixed point,
//! blobs read back), `.mlpackage` accepted by coremltools' validator, and our evaluation
//! against coremltools' own `decompress` of each op.

mod common;

use anelm_mil::blob::BlobPolicy;
use anelm_mil::package::{write_package, PackageOptions};
use anelm_mil::sim::{Simulator, Tensor};
use anelm_mil::text::{parse_program, print_program, read_model_dir, write_model_dir};
use anelm_mil::{
    blob::BlobLayout, constexpr, DType, Dialect, FunctionBuilder, Opset, Program, TensorType,
    WeightData,
};
use common::quant::{self, Form, CIN};
use common::{assert_round_trip, assert_valid};
use std::sync::Arc;

const W: usize = 8;

fn run(p: &Program) -> Vec<f32> {
    let x = Tensor::fp16(
        [1, CIN, 1, W],
        (0..CIN * W).map(|i| (i % 9) as f32 / 8.0).collect(),
    );
    let sim = Simulator::new(&p.functions[0]).unwrap();
    sim.run(vec![x.unwrap()]).unwrap()[0]
        .floats()
        .unwrap()
        .to_vec()
}

fn text_round_trip(form: &Form, dialect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let art = write_model_dir(&form.program, dir.path(), &BlobPolicy::default()).unwrap();
    assert!(
        art.text.starts_with(dialect),
        "{}: {}",
        form.name,
        &art.text[..14]
    );
    // Parsed with its BLOBFILE references kept: prints the same text.
    let parsed = parse_program(&art.text).unwrap();
    let again = print_program(&parsed, &BlobLayout::default()).unwrap();
    assert_eq!(again, art.text, "{}: print → parse → print", form.name);
    // Read back with its blobs (sub-byte records included): same text, same results.
    let back = read_model_dir(dir.path()).unwrap();
    let policy = BlobPolicy::default();
    assert_eq!(
        anelm_mil::text::to_artifacts(&back, &policy).unwrap().text,
        art.text
    );
    assert_eq!(back.weight_bytes(), form.program.weight_bytes());
    assert_eq!(run(&back), run(&form.program), "{}", form.name);
}

#[test]
fn every_form_round_trips_through_text() {
    for form in quant::ios18_forms(W) {
        text_round_trip(&form, "program(1.3)");
    }
    let b = quant::affine_form(Opset::Ios16, W);
    text_round_trip(&b, "program(1.0)");
    let text = anelm_mil::text::to_artifacts(&b.program, &BlobPolicy::default())
        .unwrap()
        .text;
    assert!(
        text.contains("= constexpr_affine_dequantize()[axis = tensor<int32, []>(0)"),
        "attribute form in dialect B: {text}"
    );
}

#[test]
fn ios18_forms_are_refused_by_dialect_b() {
    for form in quant::ios18_forms(W) {
        if form.name == "affine_int8_per_channel" {
            continue;
        }
        let mut p = form.program.clone();
        let e = p.set_dialect(Dialect::b()).unwrap_err().to_string();
        assert!(e.contains("needs ios18") && e.contains("ios16"), "{e}");
        // Forcing the opset does not get it printed or packaged either.
        p.functions[0].opset = Opset::Ios16;
        let e = print_program(&p, &BlobLayout::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("constexpr_") && e.contains("needs ios18"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("x.mlpackage");
        let opts = PackageOptions::default();
        assert!(write_package(&p, &pkg, &opts, &BlobPolicy::default()).is_err());
        // Nor parsed: the same text tagged ios16 is an error at the op's line.
        let text = anelm_mil::text::to_artifacts(&form.program, &BlobPolicy::default())
            .unwrap()
            .text
            .replace("<ios18>", "<ios16>");
        let e = parse_program(&text).unwrap_err();
        assert!(matches!(e, anelm_mil::MilError::Parse { .. }), "{e:?}");
        assert!(e.to_string().contains("needs opset ios18"), "{e}");
    }
}

#[test]
fn every_form_is_a_valid_package() {
    let dir = tempfile::tempdir().unwrap();
    let mut forms = quant::ios18_forms(W);
    forms.push(quant::affine_form(Opset::Ios16, W));
    for (i, form) in forms.iter().enumerate() {
        let ios16 = form.program.functions[0].opset == Opset::Ios16;
        let pkg = dir.path().join(format!("{}_{i}.mlpackage", form.name));
        let opts = PackageOptions::default();
        write_package(&form.program, &pkg, &opts, &BlobPolicy::default()).unwrap();
        let report = assert_valid(&pkg, if ios16 { 7 } else { 9 });
        let ops = &report["summary"]["functions"]["main"]["op_types"];
        let used: Vec<&str> = form.program.functions[0]
            .ops()
            .iter()
            .map(|o| o.op_type.as_str())
            .filter(|t| t.starts_with("constexpr_"))
            .collect();
        assert!(!used.is_empty());
        for t in used {
            assert!(ops[t].as_i64() >= Some(1), "{}: {t} in {ops}", form.name);
        }
        assert_eq!(
            report["summary"]["weights"]["bytes"].as_u64(),
            Some(form.program.weight_bytes()),
            "{}: the stored bytes are the compressed ones",
            form.name
        );
        // Read back it computes the same; iOS18 packages hold constexpr operands as inputs, so
        // the attribute-form affine op reads back in input form (same op, other spelling).
        let back = anelm_mil::package::read_package(&pkg).unwrap();
        assert_eq!(run(&back), run(&form.program), "{}", form.name);
        if ios16 || form.name != "affine_int8_per_channel" {
            assert_round_trip(&form.program, &pkg);
        }
    }
}

/// coremltools' `decompress` of each op on the operands in argv[1] (JSON), printed as JSON.
const DECOMPRESS: &str = r#"
import json, sys, numpy as np
from coremltools.converters.mil.mil.ops.defs.iOS18.compression import (
    constexpr_blockwise_shift_scale as bss, constexpr_lut_to_dense as ltd)
from coremltools.converters.mil.mil.ops.defs.iOS16.constexpr_ops import (
    constexpr_affine_dequantize as aff)
out = []
for c in json.loads(sys.argv[1]):
    a = lambda k, t: np.array(c[k][0], dtype=t).reshape(c[k][1])
    if c["op"] == "lut":
        v = ltd.decompress(a("indices", np.uint8), a("lut", np.float32), c.get("axis"))
    elif c["op"] == "blockwise":
        off = a("offset", np.int8) if "offset" in c else None
        v = bss.decompress(a("data", np.int8), a("scale", np.float32), off)
    else:
        v = aff.decompress(a("data", np.int8), a("zp", np.int8), a("scale", np.float32), c["axis"])
    out.append([float(x) for x in np.asarray(v).flatten()])
print(json.dumps(out))
"#;

#[test]
fn evaluation_equals_coremltools_decompress() {
    use serde_json::json;
    let ints = |n: usize, seed: u64, lo: i64, hi: i64| quant::ints(n, seed, lo, hi);
    let floats = |n: usize, seed: u64| -> Vec<f32> {
        ints(n, seed, -99, 99)
            .iter()
            .map(|&v| v as f32 / 37.0)
            .collect()
    };
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    // Scalar palettes grouped along both dims of [4, 6] (uint3), vector palettes on axis 0.
    for (shape, lshape, axis) in [
        (vec![4usize, 6], vec![2usize, 3, 8, 1], None),
        (vec![2, 3], vec![1, 3, 8, 2], Some(0)),
        (vec![3, 2, 4], vec![1, 2, 2, 8, 3], Some(-1)),
    ] {
        let n: usize = shape.iter().product();
        let ln: usize = lshape.iter().product();
        let idx = ints(n, n as u64, 0, 7);
        let lut = floats(ln, ln as u64);
        let i = f
            .weight(
                &format!("i{}", ours.len()),
                TensorType::new(DType::Uint3, shape.clone()),
                WeightData::pack(DType::Uint3, &idx).unwrap(),
            )
            .unwrap();
        let l = f
            .weight(
                &format!("l{}", ours.len()),
                TensorType::fp32(lshape.clone()),
                WeightData::f32(&lut),
            )
            .unwrap();
        ours.push(f.lut_to_dense(i, l, axis).unwrap());
        let mut c = json!({"op": "lut", "indices": [idx, shape], "lut": [lut, lshape]});
        if let Some(a) = axis {
            c["axis"] = json!(a);
        }
        cases.push(c);
    }
    // Blockwise over three dims with an int8 offset, and without one.
    for (with_offset, sshape) in [(true, vec![2usize, 3, 2]), (false, vec![4, 1, 8])] {
        let shape = vec![4usize, 6, 8];
        let (n, sn) = (4 * 6 * 8, sshape.iter().product::<usize>());
        let data = ints(n, 7, -128, 127);
        let scale = floats(sn, 8);
        let off = ints(sn, 9, -5, 5);
        let k = ours.len();
        let d = f
            .weight(
                &format!("d{k}"),
                TensorType::int8(shape.clone()),
                WeightData::pack(DType::Int8, &data).unwrap(),
            )
            .unwrap();
        let s = f
            .weight(
                &format!("s{k}"),
                TensorType::fp32(sshape.clone()),
                WeightData::f32(&scale),
            )
            .unwrap();
        let o = with_offset.then(|| {
            f.weight(
                &format!("o{k}"),
                TensorType::int8(sshape.clone()),
                WeightData::pack(DType::Int8, &off).unwrap(),
            )
            .unwrap()
        });
        ours.push(f.blockwise_shift_scale(d, s, o).unwrap());
        let mut c = json!({"op": "blockwise", "data": [data, shape], "scale": [scale, sshape]});
        if with_offset {
            c["offset"] = json!([off, sshape]);
        }
        cases.push(c);
    }
    // Affine: vector scale, scalar zero point, along axis 1 of [3, 5].
    let data = ints(15, 10, -128, 127);
    let scale = floats(5, 11);
    let q = anelm_mil::Literal::weight(
        TensorType::int8([3, 5]),
        Arc::new(WeightData::pack(DType::Int8, &data).unwrap()),
    )
    .unwrap();
    let sl = anelm_mil::Literal::weight_vector(Arc::new(WeightData::f32(&scale)));
    ours.push(
        f.affine_dequantize("a", q, anelm_mil::Literal::i8(3), sl, 1)
            .unwrap(),
    );
    cases.push(
        json!({"op": "affine", "data": [data, [3, 5]], "zp": [[3], []],
                      "scale": [scale, [5]], "axis": 1}),
    );

    let out = std::process::Command::new(common::python())
        .arg("-c")
        .arg(DECOMPRESS)
        .arg(serde_json::Value::Array(cases).to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<Vec<f32>> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), ours.len());
    for (k, (&id, want)) in ours.iter().zip(&theirs).enumerate() {
        let got = constexpr::dense_f32(f.function(), id).unwrap();
        assert_eq!(&got, want, "case {k}");
    }
}
