//! Core ML packages: written, validated by coremltools (../shared/tools/validate_mlpackage.py),
//! and read back.

mod common;

use anelm_mil::blob::{BlobFile, BlobPolicy};
use anelm_mil::package::{read_package, write_package, PackageOptions};
use anelm_mil::text::{print_program, to_artifacts};
use anelm_mil::{DType, Dialect, FunctionBuilder, Literal, Opset, Program, TensorType, WeightData};
use common::*;
use std::path::Path;
use std::sync::Arc;

fn write(p: &Program, dir: &Path, name: &str) -> std::path::PathBuf {
    let pkg = dir.join(format!("{name}.mlpackage"));
    write_package(p, &pkg, &PackageOptions::default(), &BlobPolicy::default()).unwrap();
    pkg
}

#[test]
fn conv_packages_for_spec_7_8_9_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    for (opset, spec) in [(Opset::Ios16, 7), (Opset::Ios17, 8), (Opset::Ios18, 9)] {
        let mut d = Dialect::a();
        d.version = if opset == Opset::Ios16 {
            "1.0".into()
        } else {
            "1.3".into()
        };
        let mut f = FunctionBuilder::new("main", opset);
        let x = f.input("x", TensorType::fp16([1, 64, 1, 64])).unwrap();
        let w = f
            .weight("w", TensorType::fp16([128, 64, 1, 1]), weights(128 * 64, 1))
            .unwrap();
        let y = f.name_next("y").conv1x1(x, w).unwrap();
        f.output(y).unwrap();
        let p = Program::single(f.finish().unwrap());
        let pkg = write(&p, dir.path(), &format!("conv_spec{spec}"));
        let report = assert_valid(&pkg, spec);
        assert_eq!(
            report["summary"]["functions"]["main"]["op_types"]["conv"],
            1
        );
        assert_eq!(report["summary"]["weights"]["distinct_blobs"], 1);
        assert_round_trip(&p, &pkg);
    }
}

#[test]
fn fused_ffn_and_fp32_io_packages_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    let ffn = swiglu_ffn(Dialect::a(), 64, 256, 64).unwrap();
    let pkg = write(&ffn, dir.path(), "ffn");
    let report = assert_valid(&pkg, 9);
    let ops = &report["summary"]["functions"]["main"]["op_types"];
    assert_eq!(
        (
            ops["conv"].as_i64(),
            ops["mul"].as_i64(),
            ops["sigmoid"].as_i64()
        ),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(report["summary"]["weights"]["bytes"], 3 * 64 * 256 * 2);
    assert_round_trip(&ffn, &pkg);

    let add = add_fp32_io(Dialect::b()).unwrap();
    let pkg = write(&add, dir.path(), "add");
    assert_valid(&pkg, 7);
    assert!(
        !pkg.join("Data/com.apple.CoreML/weights").exists(),
        "no weights dir without weights"
    );
    assert_round_trip(&add, &pkg);
}

#[test]
fn multifunction_package_shares_weight_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let shared = [
        weights(128 * 64, 2),
        weights(128 * 64, 3),
        weights(64 * 128, 4),
    ];
    let mut p = Program::new(Dialect::a());
    for (name, width) in [("prefill", 64), ("decode", 32)] {
        let mut f = FunctionBuilder::new(name, Opset::Ios18);
        swiglu_body(&mut f, 64, 128, width, Some(shared.clone())).unwrap();
        p.add_function(f.finish().unwrap()).unwrap();
    }
    let text = to_artifacts(&p, &BlobPolicy::default()).unwrap().text;
    for off in [64, 16512, 32960] {
        assert_eq!(
            text.matches(&format!("offset = uint64({off}))")).count(),
            2,
            "both functions reference blob {off}"
        );
    }
    let pkg = dir.path().join("multi.mlpackage");
    let opts = PackageOptions {
        default_function: Some("decode".into()),
        ..Default::default()
    };
    write_package(&p, &pkg, &opts, &BlobPolicy::default()).unwrap();
    let report = assert_valid(&pkg, 9);
    assert_eq!(report["summary"]["default_function"], "decode");
    assert_eq!(
        report["summary"]["functions"]["decode"]["inputs"]["x"],
        "FLOAT16[1,64,1,32]"
    );
    let w = &report["summary"]["weights"];
    assert_eq!(
        (w["blob_references"].as_i64(), w["distinct_blobs"].as_i64()),
        (Some(6), Some(3))
    );
    let blob = BlobFile::open(&pkg.join("Data/com.apple.CoreML/weights/weight.bin")).unwrap();
    assert_eq!(blob.records().len(), 3, "each shared weight stored once");
    assert_round_trip(&p, &pkg);
    let back = read_package(&pkg).unwrap();
    let names: Vec<_> = back.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["prefill", "decode"]);
    assert_eq!(
        back.weights().len(),
        3,
        "shared blobs read back as shared data"
    );
}

/// A decode step over a KV cache held as a state: read, write the new column at a runtime
/// position, use the updated cache.
fn stateful_program() -> Program {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let cache = f
        .state_input("k_cache", TensorType::fp16([1, 64, 1, 32]))
        .unwrap();
    let x = f.input("x", TensorType::fp16([1, 64, 1, 1])).unwrap();
    let begin = f.input("begin", TensorType::int32([4])).unwrap();
    let end = f.input("end", TensorType::int32([4])).unwrap();
    let c = f.name_next("cache_in").read_state(cache).unwrap();
    let c2 = f
        .name_next("cache_new")
        .slice_update_at(c, x, begin, end)
        .unwrap();
    let c3 = f.name_next("cache_out").update_state(cache, c2).unwrap();
    let w = f
        .weight("wq", TensorType::fp16([64, 64, 1, 1]), weights(64 * 64, 5))
        .unwrap();
    let q = f.name_next("q").conv1x1(x, w).unwrap();
    let y = f.name_next("scores").matmul(q, c3, true, false).unwrap();
    f.output(y).unwrap();
    Program::single(f.finish().unwrap())
}

#[test]
fn stateful_package_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let p = stateful_program();
    assert_eq!(
        p.functions[0]
            .type_of(p.functions[0].outputs()[0])
            .tensor()
            .shape,
        vec![1, 64, 1, 32]
    );
    let pkg = write(&p, dir.path(), "stateful");
    let report = assert_valid(&pkg, 9);
    assert_eq!(report["summary"]["states"], serde_json::json!(["k_cache"]));
    let ops = &report["summary"]["functions"]["main"]["op_types"];
    assert_eq!(ops["coreml_update_state"], 1);
    assert_eq!(ops["read_state"], 1);
    assert_round_trip(&p, &pkg);
}

#[test]
fn quantized_weight_packages_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    let q: Vec<i8> = (0..96 * 64).map(|i| ((i * 5) % 255) as i8).collect();
    // iOS16 attribute-form constexpr_affine_dequantize (MAD) and iOS18 blockwise shift-scale (OMX).
    for opset in [Opset::Ios16, Opset::Ios18] {
        let mut f = FunctionBuilder::new("main", opset);
        let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
        let data = Literal::weight(
            TensorType::int8([96, 64, 1, 1]),
            Arc::new(WeightData::i8(&q)),
        )
        .unwrap();
        let w = if opset == Opset::Ios16 {
            f.affine_dequantize("w", data, Literal::i8(0), Literal::f16(0.125), 0)
                .unwrap()
        } else {
            let d = f.constant("w_data", data).unwrap();
            let s = f
                .weight(
                    "w_scale",
                    TensorType::fp16([96, 1, 1, 1]),
                    WeightData::f16_from_f32(&[0.5; 96]),
                )
                .unwrap();
            f.name_next("w").blockwise_shift_scale(d, s, None).unwrap()
        };
        let y = f.name_next("y").conv1x1(x, w).unwrap();
        f.output(y).unwrap();
        let p = Program::single(f.finish().unwrap());
        let pkg = write(&p, dir.path(), &format!("int8_{}", opset.ios_name()));
        let report = assert_valid(&pkg, if opset == Opset::Ios16 { 7 } else { 9 });
        assert!(report["summary"]["weights"]["bytes_by_dtype"]["int8"].as_i64() == Some(96 * 64));
        assert_round_trip(&p, &pkg);
    }
}

#[test]
fn broken_packages_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let p = conv1x1(Dialect::a()).unwrap();
    // A corrupt blob sentinel.
    let pkg = write(&p, dir.path(), "bad_sentinel");
    let bin = pkg.join("Data/com.apple.CoreML/weights/weight.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[64] = 0;
    std::fs::write(&bin, bytes).unwrap();
    let (code, report) = validate(&pkg);
    assert_eq!(code, 1, "{report:#}");
    assert!(
        report["errors"].to_string().contains("sentinel"),
        "{report:#}"
    );
    assert!(read_package(&pkg).is_err());

    // A declared output type that type inference contradicts.
    let pkg = write(&p, dir.path(), "bad_type");
    let model = pkg.join("Data/com.apple.CoreML/model.mlmodel");
    let mut m = anelm_mil::package::model_proto(
        &p,
        &to_artifacts(&p, &BlobPolicy::default()).unwrap().layout,
        &PackageOptions::default(),
    )
    .unwrap();
    let main = m
        .ml_program
        .as_mut()
        .unwrap()
        .functions
        .get_mut("main")
        .unwrap();
    let block = main.block_specializations.get_mut("CoreML8").unwrap();
    let conv = block
        .operations
        .iter_mut()
        .find(|o| o.r#type == "conv")
        .unwrap();
    if let Some(anelm_mil::package::proto::value_type::Type::TensorType(t)) = conv.outputs[0]
        .r#type
        .as_mut()
        .and_then(|t| t.r#type.as_mut())
    {
        t.data_type = DType::Fp32.proto_code();
    }
    std::fs::write(&model, prost::Message::encode_to_vec(&m)).unwrap();
    let (code, report) = validate(&pkg);
    assert_eq!(code, 1, "{report:#}");
    assert!(read_package(&pkg).is_err(), "our reader type-checks too");
}

#[test]
fn writer_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let p = conv1x1(Dialect::a()).unwrap();
    let pkg = write(&p, dir.path(), "once");
    let again = write_package(&p, &pkg, &PackageOptions::default(), &BlobPolicy::default());
    assert!(again.unwrap_err().to_string().contains("already exists"));
    let old = PackageOptions {
        spec_version: Some(7),
        ..Default::default()
    };
    assert!(write_package(
        &p,
        &dir.path().join("old.mlpackage"),
        &old,
        &BlobPolicy::default()
    )
    .is_err());
    let unresolved = anelm_mil::text::parse_program(
        &print_program(
            &p,
            &to_artifacts(&p, &BlobPolicy::default()).unwrap().layout,
        )
        .unwrap(),
    )
    .unwrap();
    let e = write_package(
        &unresolved,
        &dir.path().join("u.mlpackage"),
        &PackageOptions::default(),
        &BlobPolicy::default(),
    );
    let e = e.unwrap_err().to_string();
    assert!(
        e.contains("load the blobs"),
        "a parsed program must load its weights first: {e}"
    );
}
