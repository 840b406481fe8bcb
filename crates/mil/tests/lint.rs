//! Lint rules: each one fires on a program that breaks it, and the canonical programs are clean.

mod common;

use anelm_mil::lint::{lint, lint_with, Chip, LintConfig, Severity};
use anelm_mil::{Dialect, FunctionBuilder, Opset, Program, TensorType, WeightData};

/// A dialect-A program around `body` with inputs `inputs` and outputs `outs`.
fn prog(inputs: &str, body: &str, outs: &str) -> String {
    format!(
        "program(1.3)\n{{\n    func main<ios18>({inputs}) {{\n{body}\n    }} -> ({outs});\n}}\n"
    )
}

fn rules(src: &str) -> Vec<(&'static str, Severity, Option<String>)> {
    rules_for(src, Chip::Unknown)
}

/// The findings for `chip`; every one cites its evidence.
fn rules_for(src: &str, chip: Chip) -> Vec<(&'static str, Severity, Option<String>)> {
    let p = anelm_mil::text::parse_program(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    lint_with(&p, &LintConfig::for_chip(chip))
        .into_iter()
        .inspect(|f| assert!(f.evidence().contains('§') || f.rule == "unknown-op", "{f}"))
        .map(|f| (f.rule, f.severity, f.value))
        .collect()
}

fn severity_of(src: &str, chip: Chip, rule: &str) -> Option<Severity> {
    rules_for(src, chip)
        .into_iter()
        .find(|r| r.0 == rule)
        .map(|r| r.1)
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
    // ORI runs reduce_mean in GPT-2 on M4 Max (C4).
    assert_eq!(severity_of(&src, Chip::M4, "reduce_mean"), None);
    assert_eq!(
        severity_of(&src, Chip::M3, "reduce_mean"),
        Some(Severity::Warning)
    );
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
    // Silently ignored on M3 Max (FG); an ANE run elsewhere: a warning unless the chip is M3.
    fires(&runtime, "conv-runtime-weight", Severity::Warning, "y");
    assert_eq!(
        severity_of(&runtime, Chip::M3, "conv-runtime-weight"),
        Some(Severity::Error)
    );
    let wide = prog(
        "tensor<fp16, [1, 32000, 1, 32]> x",
        "        tensor<fp16, [64, 32000, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, [64, 32000, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n        tensor<fp16, [1, 64, 1, 32]> y = conv(weight = w, x = x);",
        "y",
    );
    fires(&wide, "conv-input-channels", Severity::Error, "y");
    fires(&wide, "max-dim", Severity::Warning, "x");
    // MAD's classifier ran [1, 32000, 1, S] on M4: the limit is per chip.
    assert_eq!(severity_of(&wide, Chip::M4, "max-dim"), None);
    assert_eq!(
        severity_of(&wide, Chip::M3, "max-dim"),
        Some(Severity::Warning)
    );
    let tall = prog(
        X,
        "        tensor<fp16, [20000, 64, 1, 1]> w = const()[name = string(\"w\"), val = tensor<fp16, [20000, 64, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n        tensor<fp16, [1, 20000, 1, 32]> y = conv(weight = w, x = x);",
        "y",
    );
    fires(&tall, "max-dim", Severity::Warning, "y");
    assert_eq!(severity_of(&tall, Chip::M4, "max-dim"), None);
    let cfg = LintConfig {
        max_dim: 30000,
        ..LintConfig::default()
    };
    let p = anelm_mil::text::parse_program(&tall).unwrap();
    assert!(!lint_with(&p, &cfg).iter().any(|f| f.rule == "max-dim"));
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
    // Rejected on M3 Max (ESP), 32000 ran on M4 (MAD): warning on M3, info when unknown.
    fires(&soft(48), "softmax-length", Severity::Info, "p");
    assert_eq!(
        severity_of(&soft(48), Chip::M3, "softmax-length"),
        Some(Severity::Warning)
    );
    assert_eq!(severity_of(&soft(48), Chip::M4, "softmax-length"), None);
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
    // Narrowed: hardware-run programs slice inputs; ESP's failure was in a complex graph.
    fires(&slice, "slice-input", Severity::Info, "y");
    let dup = prog(X, "        tensor<fp16, [1, 64, 1, 32]> a = relu(x = x)[name = string(\"r\")];\n        tensor<fp16, [1, 64, 1, 32]> y = relu(x = a)[name = string(\"r\")];", "y");
    fires(&dup, "duplicate-op-name", Severity::Warning, "r");
    // A reused const name ran on M3 Max: info only.
    let dup_const = prog(X, "        fp16 c = const()[name = string(\"c\"), val = fp16(2.0)];\n        fp16 d = const()[name = string(\"c\"), val = fp16(3.0)];\n        tensor<fp16, [1, 64, 1, 32]> a = mul(x = x, y = c)[name = string(\"a\")];\n        tensor<fp16, [1, 64, 1, 32]> y = mul(x = a, y = d)[name = string(\"y\")];", "y");
    fires(&dup_const, "duplicate-op-name", Severity::Info, "c");
    assert!(
        !rules(&dup_const).iter().any(|r| r.1 > Severity::Info),
        "{:?}",
        rules(&dup_const)
    );
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
    // Sub-byte data: used by no hardware-proven program (FACTS §5) — info, for the probe.
    assert!(has("unproven", Severity::Info, "w4"), "{found:?}");
    assert!(!found.iter().any(|f| f.rule == "sub-byte-weights"));
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
    // Casts fail on M1/M2 (C1) and run on M3 and later.
    let on = |chip| {
        lint_with(
            &common::add_fp32_io(Dialect::a()).unwrap(),
            &LintConfig::for_chip(chip),
        )
    };
    let m1 = on(Chip::M1);
    assert_eq!(
        m1.iter()
            .filter(|f| f.rule == "cast" && f.severity == Severity::Warning)
            .count(),
        3
    );
    assert_eq!(
        m1.iter()
            .filter(|f| f.rule == "fp32-io" && f.severity == Severity::Warning)
            .count(),
        2
    );
    assert!(on(Chip::M4).is_empty(), "{:?}", on(Chip::M4));
    let line = add[0].to_string();
    assert!(
        line.starts_with("info[") && line.contains("main/"),
        "{line}"
    );
}

#[test]
fn ops_and_forms_no_proven_program_uses_are_info() {
    let unproven = |src: &str| -> Vec<String> {
        rules(src)
            .into_iter()
            .filter(|r| r.0 == "unproven")
            .inspect(|r| assert_eq!(r.1, Severity::Info))
            .map(|r| r.2.unwrap_or_default())
            .collect()
    };
    let abs = prog(
        X,
        "        tensor<fp16, [1, 64, 1, 32]> y = abs(x = x);",
        "y",
    );
    assert_eq!(unproven(&abs), ["y"]);
    let concat = |axis: i32, shape: &str| {
        prog(
            X,
            &format!("        int32 ax = const()[name = string(\"ax\"), val = int32({axis})];\n        bool il = const()[name = string(\"il\"), val = bool(false)];\n        tensor<fp16, {shape}> y = concat(axis = ax, interleave = il, values = (x, x));"),
            "y",
        )
    };
    assert!(unproven(&concat(1, "[1, 128, 1, 32]")).is_empty());
    assert_eq!(unproven(&concat(3, "[1, 64, 1, 64]")), ["y"]);
    assert_eq!(unproven(&concat(-1, "[1, 64, 1, 64]")), ["y"]);
    let matmul = |tx: bool| {
        prog(
            "tensor<fp16, [1, 4, 32, 16]> a, tensor<fp16, [1, 4, 32, 16]> b",
            &format!("        bool tx = const()[name = string(\"tx\"), val = bool({tx})];\n        bool ty = const()[name = string(\"ty\"), val = bool({ty})];\n        tensor<fp16, [1, 4, {n}, {n}]> y = matmul(transpose_x = tx, transpose_y = ty, x = a, y = b);", ty = !tx, n = if tx { 16 } else { 32 }),
            "y",
        )
    };
    assert!(unproven(&matmul(false)).is_empty());
    assert_eq!(unproven(&matmul(true)), ["y"]);
    let conv3 = prog(
        X,
        "        tensor<fp16, [64, 64, 3, 3]> w = const()[name = string(\"w\"), val = tensor<fp16, [64, 64, 3, 3]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64)))];\n        string pt = const()[name = string(\"pt\"), val = string(\"same\")];\n        tensor<fp16, [1, 64, 1, 32]> y = conv(pad_type = pt, weight = w, x = x);",
        "y",
    );
    assert_eq!(unproven(&conv3), ["y"]);
    // Ops other rules report failing are not repeated here.
    let gelu = prog(
        X,
        "        tensor<fp16, [1, 64, 1, 32]> y = gelu(x = x);",
        "y",
    );
    assert!(unproven(&gelu).is_empty());
}

#[test]
fn several_functions_are_proven_only_in_ios18() {
    let two = |d: Dialect| {
        let mut p = Program::new(d.clone());
        for name in ["prefill", "decode"] {
            let mut f = FunctionBuilder::new(name, d.proven_opset());
            let x = f.input("x", TensorType::fp16([1, 64, 1, 32])).unwrap();
            let y = f.name_next("y").sigmoid(x).unwrap();
            f.output(y).unwrap();
            p.add_function(f.finish().unwrap()).unwrap();
        }
        lint(&p)
    };
    assert!(two(Dialect::a()).is_empty(), "{:?}", two(Dialect::a()));
    let b = two(Dialect::b());
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!((b[0].rule, b[0].severity), ("unproven", Severity::Info));
    assert!(b[0].message.contains("ios16"), "{}", b[0]);
}

#[test]
fn affine_dequantize_warns_except_on_m4() {
    let src = prog(
        X,
        "        tensor<fp16, [64, 64, 1, 1]> w = constexpr_affine_dequantize()[axis = int32(0), name = string(\"w\"), quantized_data = tensor<int8, [64, 64, 1, 1]>(BLOBFILE(path = string(\"@model_path/weights/w.bin\"), offset = uint64(64))), scale = fp16(0.125), zero_point = int8(0)];\n        tensor<fp16, [1, 64, 1, 32]> y = conv(weight = w, x = x);",
        "y",
    );
    fires(&src, "affine-dequantize", Severity::Warning, "w");
    assert_eq!(
        severity_of(&src, Chip::M3, "affine-dequantize"),
        Some(Severity::Warning)
    );
    assert_eq!(severity_of(&src, Chip::M4, "affine-dequantize"), None);
    assert!(
        !rules(&src).iter().any(|r| r.0 == "unproven"),
        "int8 data is proven"
    );
}
