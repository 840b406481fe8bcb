//! I/O binding from `modelAttributes` dumps written as fixture files in the shapes public dumps
//! show (see `src/layout/parse.rs` for the sources): several procedures with global symbol
//! indices, `PlaneDescriptor` entries, parameter and state inputs, silent strides, extra keys,
//! and malformed dictionaries (each one clear error, never a panic).

use anelm_macos::layout::{resolve, ModelAttributes, ProcedureIo, ALIGN_16K};
use anelm_macos::{DeclaredFunction, DeclaredTensor, ElemType};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/attributes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn t(name: &str, dtype: ElemType, channels: usize, width: usize) -> DeclaredTensor {
    DeclaredTensor {
        name: name.into(),
        dtype,
        channels,
        width,
    }
}

fn f16(name: &str, channels: usize, width: usize) -> DeclaredTensor {
    t(name, ElemType::Fp16, channels, width)
}

fn function(
    name: &str,
    inputs: Vec<DeclaredTensor>,
    outputs: Vec<DeclaredTensor>,
) -> DeclaredFunction {
    DeclaredFunction {
        name: name.into(),
        inputs,
        outputs,
    }
}

fn resolve_fixture(name: &str, f: &DeclaredFunction, n: usize) -> anelm_macos::Result<ProcedureIo> {
    resolve(&ModelAttributes::from_json(&fixture(name))?, f, n)
}

/// (name, symbol, channel stride, bytes) of every bound slot, inputs then outputs.
fn summary(io: &ProcedureIo) -> Vec<(String, u32, usize, usize)> {
    io.inputs
        .iter()
        .chain(&io.outputs)
        .map(|s| (s.name.clone(), s.symbol, s.channel_stride, s.bytes))
        .collect()
}

fn row(name: &str, symbol: u32, stride: usize, bytes: usize) -> (String, u32, usize, usize) {
    (name.to_string(), symbol, stride, bytes)
}

#[test]
fn a_projection_kernel_binds_its_parameter_input() {
    // descale [1, 1, 1, W] is listed in LiveInputParamList with a RowStride only.
    let f = function(
        "main",
        vec![f16("x", 64, 64), f16("descale", 1, 64)],
        vec![f16("q", 64, 64), f16("k", 32, 64)],
    );
    let io = resolve_fixture("projection_param_input.json", &f, 1).unwrap();
    assert_eq!(io.procedure, 0);
    assert_eq!(
        summary(&io),
        [
            row("x", 1, 128, 8192),
            row("descale", 0, 128, 128),
            row("q", 1, 128, 8192),
            row("k", 0, 128, 4096),
        ]
    );
    assert!(
        io.unbound.is_empty() && io.notes.is_empty(),
        "{:?}",
        io.notes
    );
}

#[test]
fn two_procedures_share_one_symbol_table() {
    let attrs = ModelAttributes::from_json(&fixture("fused_prefill_decode.json")).unwrap();
    let prefill = function(
        "prefill",
        vec![
            f16("x", 8, 64),
            f16("cos0", 4, 64),
            f16("sin0", 4, 64),
            f16("mask", 1, 64),
        ],
        vec![f16("y", 8, 64)],
    );
    let io = resolve(&attrs, &prefill, 2).unwrap();
    assert_eq!(io.procedure, 0);
    assert_eq!(
        summary(&io),
        [
            row("x", 3, 128, 1024),
            row("cos0", 0, 128, 512),
            row("sin0", 2, 128, 512),
            row("mask", 1, 128, 128),
            row("y", 0, 128, 1024),
        ]
    );
    // decode: the same names at symbols 4..7, a state input, PlaneDescriptor strides, a
    // 16 KiB-aligned parameter, and a mask the compiler dropped.
    let decode = function(
        "decode",
        vec![
            f16("x", 8, 1),
            f16("cos0", 4, 1),
            f16("sin0", 4, 1),
            f16("mask", 1, 1),
            f16("kv0", 8, 16),
        ],
        vec![f16("y", 8, 1)],
    );
    let io = resolve(&attrs, &decode, 2).unwrap();
    assert_eq!(io.procedure, 1);
    assert_eq!(
        summary(&io),
        [
            row("x", 7, 64, 512),
            row("cos0", 4, 64, 256),
            row("sin0", 6, 64, ALIGN_16K),
            row("kv0", 5, 64, 512),
            row("y", 1, 64, 512),
        ]
    );
    assert_eq!(io.unbound, [f16("mask", 1, 1)]);
    assert_eq!(io.notes.len(), 1, "{:?}", io.notes);
    assert!(io.notes[0].contains("input mask is not among the procedure's symbols"));
}

#[test]
fn silent_strides_fall_back_and_extra_fields_never_refuse() {
    let f = function(
        "main",
        vec![t("x", ElemType::Fp32, 3, 17)],
        vec![t("y", ElemType::Fp32, 3, 17)],
    );
    let io = resolve_fixture("silent_strides_extra_fields.json", &f, 1).unwrap();
    // fp32 W=17: 68 bytes, padded to 128 (FACTS §4).
    assert_eq!(summary(&io), [row("x", 0, 128, 384), row("y", 0, 128, 384)]);
    assert_eq!(io.notes.len(), 1, "{:?}", io.notes);
    let note = &io.notes[0];
    assert!(
        note.contains(
            "input x (symbol 0, LiveInputList): no PlaneStride, RowStride or PlaneDescriptor"
        ) && note.contains("\"CompressionMode\":\"none\"")
            && note.contains("\"Tiling\":{\"TileW\":8}"),
        "the warning carries the raw entry: {note}"
    );
}

#[test]
fn a_real_m1_dump_binds_by_global_index_or_says_why_not() {
    // freedomtan/coreml_to_ane_hwx ane/README.md: an image model (Height 320, two YUV planes).
    let attrs = ModelAttributes::from_json(&fixture("m1_hwx_two_procedures.json")).unwrap();
    let desc = attrs.description.as_ref().unwrap();
    assert_eq!(desc.procedure_ids["0@default"], 1);
    assert_eq!(
        attrs.network_status[1].inputs[0].plane_row_strides(),
        Ok(Some(vec![512, 512]))
    );
    // Not a [1, C, 1, W] tensor: one clear line naming the function, tensor and field.
    let f = function(
        "res_320x320",
        vec![f16("input_tensor", 2, 320)],
        vec![f16("output_tensor", 2, 640)],
    );
    let e = resolve(&attrs, &f, 2).unwrap_err().to_string();
    assert_eq!(
        e,
        "modelAttributes: function res_320x320: input input_tensor: Height 320, but the MIL declares 1"
    );
    // "default" is procedure 1 through the name map, whose status entry is the 480-row one.
    let f = function(
        "default",
        vec![f16("input_tensor", 2, 480)],
        vec![f16("output_tensor", 2, 960)],
    );
    let e = resolve(&attrs, &f, 2).unwrap_err().to_string();
    assert!(
        e.contains("function default: input input_tensor: Height 480"),
        "{e}"
    );
}

#[test]
fn malformed_dictionaries_give_one_clear_error_each() {
    let f = function("main", vec![f16("x", 2, 16)], vec![f16("y", 2, 16)]);
    let cases = fixture("malformed.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let (case, want) = (c["case"].as_str().unwrap(), c["error"].as_str().unwrap());
        let got = ModelAttributes::from_json(&c["attributes"])
            .and_then(|a| resolve(&a, &f, 1))
            .map(|io| format!("resolved: {io:?}"))
            .unwrap_or_else(|e| e.to_string());
        assert!(
            got.starts_with("modelAttributes: ") && got.contains(want) && !got.contains('\n'),
            "{case}: got {got:?}, want {want:?}"
        );
    }
}
