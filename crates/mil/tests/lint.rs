//! Lint rules: each one fires on a program that breaks it, and the canonical programs are clean.

mod common;

use anelm_mil::lint::{lint, lint_with, LintConfig, Severity};
use anelm_mil::{check_text, Dialect, FunctionBuilder, Opset, Program, TensorType, WeightData};

/// A dialect-A program around `body` with inputs `inputs` and outputs `outs`.
fn prog(inputs: &str, body: &str, outs: &str) -> String {
    format!(
        "program(1.3)\n{{\n    func main<ios18>({inputs}) {{\n{body}\n    }} -> ({outs});\n}}\n"
    )
}

fn rules(src: &str) -> Vec<(&'static str, Severity, Option<String>)> {
    check_text(src)
        .unwrap_or_else(|e| panic!("{e}\n{src}"))
        .into_iter()
        .map(|f| (f.rule, f.severity, f.value))
        .collect()
}

fn fires(src: &str, rule: &str, severity: Severity, at: &str) {
    let r = rules(src);
    assert!(
        r.iter()
            .any(|(n, s, v)| *n == rule && *s == severity && v.as_deref() == Some(at)),
        "{rule} ({severity}) at {at} not in {r:?}"
    );
}

const X: &str = "tensor<fp16, [1, 64, 1, 32]> x";

#[test]
fn unsupported_ops() {
    for (op, sev) in [
        ("gelu", Severity::Error),
        ("rsqrt", Severity::Error),
        ("inverse", Severity::Error),
    ] {
        let src = prog(
            X,
            &format!("        tensor<fp16, [1, 64, 1, 32]> y = {op}(x = x);"),
            "y",
        );
        fires(&src, op, sev, "y");
    }
    let src = prog(
        X,
        "        tensor<int32, [1]> ax = const()[name = string(\"ax\"), val = tensor<int32, [1]>([1])];\n        bool kd = const()[name = string(\"kd\"), val = bool(true)];\n        tensor<fp16, [1, 1, 1, 32]> y = reduce_mean(x = x, axes = ax, keep_dims = kd);",
        "y",
    );
    fires(&src, "reduce_mean", Severity::Warning, "y");
    let src = prog(
        X,
        "        tensor<int32, [4]> r = const()[name = string(\"r\"), val = tensor<int32, [4]>([1, 2, 1, 1])];\n        tensor<fp16, [1, 128, 1, 32]> y = tile(x = x, reps = r);",
        "y",
    );
    fires(&src, "tile", Severity::Error, "y");
}

fn conv_src(weight_decl: &str, out: &str, extra_args: &str) -> String {
    prog(
        &format!("{X}, tensor<fp16, [64]> b"),
        &format!(
            "        {weight_decl}\n        tensor<fp16, [1, {out}, 1, 32]> y = conv(weight = w, x = x{extra_args});"
        ),
        "y",
    )
}

#[test]
fn conv_rules() {
    let w = "tensor<fp16, [64, 64, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, [64, 64, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];";
    fires(
        &conv_src(w, "64", ", bias = b"),
        "conv-bias",
        Severity::Error,
        "y",
    );
    let runtime = prog(
        &format!("{X}, tensor<fp16, [64, 64, 1, 1]> w"),
        "        tensor<fp16, [1, 64, 1, 32]> y = conv(weight = w, x = x);",
        "y",
    );
    fires(&runtime, "conv-runtime-weight", Severity::Error, "y");
    let wide = prog(
        "tensor<fp16, [1, 32000, 1, 32]> x",
        "        tensor<fp16, [64, 32000, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, [64, 32000, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n        tensor<fp16, [1, 64, 1, 32]> y = conv(weight = w, x = x);",
        "y",
    );
    fires(&wide, "conv-input-channels", Severity::Error, "y");
    fires(&wide, "dim-over-16384", Severity::Warning, "x");
    let tall = prog(
        X,
        "        tensor<fp16, [20000, 64, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, [20000, 64, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n        tensor<fp16, [1, 20000, 1, 32]> y = conv(weight = w, x = x);",
        "y",
    );
    fires(&tall, "dim-over-16384", Severity::Warning, "y");
    assert!(!rules(&tall).iter().any(|r| r.0 == "conv-input-channels"));
}

#[test]
fn attention_rules() {
    let q = "tensor<fp16, [1, 4, 32, 16]> q, tensor<fp16, [1, 4, 32, 16]> k, tensor<fp16, [1, 4, 32, 16]> v, tensor<fp16, [1, 1, 32, 32]> m";
    let src = prog(q, "        tensor<fp16, [1, 4, 32, 16]> a = scaled_dot_product_attention(attn_mask = m, key = k, query = q, value = v);", "a");
    fires(&src, "sdpa-mask", Severity::Error, "a");
    let nomask = prog(q, "        tensor<fp16, [1, 4, 32, 16]> a = scaled_dot_product_attention(key = k, query = q, value = v);", "a");
    assert!(!rules(&nomask).iter().any(|r| r.0 == "sdpa-mask"));
    let soft = |n: usize| {
        prog(
            &format!("tensor<fp16, [1, 4, 32, {n}]> s"),
            &format!("        int32 ax = const()[name = string(\"ax\"), val = int32(-1)];\n        tensor<fp16, [1, 4, 32, {n}]> p = softmax(axis = ax, x = s);"),
            "p",
        )
    };
    fires(&soft(48), "softmax-length", Severity::Warning, "p");
    assert!(!rules(&soft(64)).iter().any(|r| r.0 == "softmax-length"));
}

#[test]
fn io_and_text_rules() {
    let odd = prog(
        "tensor<fp16, [1, 64, 1, 17]> x",
        "        tensor<fp16, [1, 64, 1, 17]> y = relu(x = x);",
        "y",
    );
    fires(&odd, "io-row-padding", Severity::Warning, "x");
    fires(&odd, "io-row-padding", Severity::Warning, "y");
    let window = prog(
        "tensor<fp16, [1, 8, 1, 14600]> x",
        "        tensor<fp16, [1, 8, 1, 14600]> y = relu(x = x);",
        "y",
    );
    fires(&window, "input-spatial-window", Severity::Warning, "x");
    let slice = prog(
        X,
        "        tensor<int32, [4]> b = const()[name = string(\"b\"), val = tensor<int32, [4]>([0, 0, 0, 0])];\n        tensor<int32, [4]> e = const()[name = string(\"e\"), val = tensor<int32, [4]>([1, 32, 1, 32])];\n        tensor<fp16, [1, 32, 1, 32]> y = slice_by_index(begin = b, end = e, x = x);",
        "y",
    );
    fires(&slice, "slice-input", Severity::Warning, "y");
    let dup = prog(X, "        tensor<fp16, [1, 64, 1, 32]> a = relu(x = x)[name = string(\"r\")];\n        tensor<fp16, [1, 64, 1, 32]> y = relu(x = a)[name = string(\"r\")];", "y");
    fires(&dup, "duplicate-op-name", Severity::Warning, "r");
    let inline = prog(
        X,
        "        tensor<fp16, [1, 64, 1, 32]> y = mul(x = x, y = fp16(2.0));",
        "y",
    );
    fires(&inline, "inline-literal", Severity::Warning, "y");
    let unknown = prog(
        X,
        "        tensor<fp16, [1, 64, 1, 32]> y = fancy_op(x = x);",
        "y",
    );
    fires(&unknown, "unknown-op", Severity::Info, "y");
}

#[test]
fn program_size_rules() {
    // 2.0e9 bytes of declared fp16 weights (never loaded: the lint reads the declared types).
    let big = |rows: usize| {
        prog(
            X,
            &format!("        tensor<fp16, [{rows}, 25000, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, [{rows}, 25000, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n        tensor<fp16, [1, 64, 1, 32]> y = relu(x = x);"),
            "y, w",
        )
    };
    assert!(rules(&big(34000)).contains(&("weights-size", Severity::Warning, None)));
    assert!(rules(&big(44000)).contains(&("weights-size", Severity::Error, None)));
    assert!(!rules(&big(1000)).iter().any(|r| r.0 == "weights-size"));

    let p = common::conv1x1(Dialect::a()).unwrap();
    let cfg = LintConfig {
        layers: Some(25),
        ..Default::default()
    };
    assert!(lint_with(&p, &cfg)
        .iter()
        .any(|f| f.rule == "too-many-layers"));
    assert!(!lint(&p).iter().any(|f| f.rule == "too-many-layers"));
}

#[test]
fn state_and_weight_rules() {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let s = f
        .state_input("cache", TensorType::fp16([1, 64, 1, 32]))
        .unwrap();
    let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
    let w = f
        .weight(
            "w4",
            TensorType::new(anelm_mil::DType::Int4, [64]),
            WeightData::int4(&[1; 64]).unwrap(),
        )
        .unwrap();
    let y = f.name_next("y").add(x, x).unwrap();
    f.name_next("u").update_state(s, y).unwrap();
    f.output(y).unwrap();
    f.output(w).unwrap();
    let found = lint(&Program::single(f.finish().unwrap()));
    let has = |rule: &str, sev: Severity, v: &str| {
        found
            .iter()
            .any(|f| f.rule == rule && f.severity == sev && f.value.as_deref() == Some(v))
    };
    assert!(
        has("output-written-to-state", Severity::Error, "y"),
        "{found:?}"
    );
    assert!(
        has("sub-byte-weights", Severity::Warning, "w4"),
        "{found:?}"
    );
}

#[test]
fn canonical_programs_have_no_errors_or_warnings() {
    for p in [
        common::conv1x1(Dialect::a()).unwrap(),
        common::swiglu_ffn(Dialect::b(), 64, 128, 64).unwrap(),
    ] {
        let found = lint(&p);
        assert!(found.is_empty(), "{found:?}");
    }
    let add = lint(&common::add_fp32_io(Dialect::a()).unwrap());
    assert!(add.iter().all(|f| f.severity == Severity::Info), "{add:?}");
    assert_eq!(add.iter().filter(|f| f.rule == "cast").count(), 3);
    assert_eq!(add.iter().filter(|f| f.rule == "fp32-io").count(), 2);
    let line = add[0].to_string();
    assert!(
        line.starts_with("info[") && line.contains("main/"),
        "{line}"
    );
}
