//! MIL text: golden files, print → parse → print fixed points, and parsing public forms.

mod common;

use anelm_mil::blob::BlobPolicy;
use anelm_mil::text::{parse_program, print_program, to_artifacts, HEADER_A, HEADER_B};
use anelm_mil::{Dialect, MilError, Program};
use common::*;

/// Compares with a golden file; `ANELM_BLESS=1` rewrites it (review the diff before committing).
fn check_golden(name: &str, text: &str) {
    let path = golden_path(name);
    if std::env::var_os("ANELM_BLESS").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with ANELM_BLESS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(text, want, "{name} differs from its golden file");
}

fn fixed_point(text: &str) {
    let parsed = parse_program(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let again = print_program(&parsed, &Default::default()).unwrap();
    assert_eq!(again, text, "print -> parse -> print is not a fixed point");
}

fn goldens(name: &str, build: fn(Dialect) -> anelm_mil::Result<Program>) {
    for (tag, d, header) in [("a", Dialect::a(), HEADER_A), ("b", Dialect::b(), HEADER_B)] {
        let p = build(d).unwrap();
        let art = to_artifacts(&p, &BlobPolicy::default()).unwrap();
        assert!(art.text.starts_with(header), "dialect {tag} header");
        check_golden(&format!("{name}.{tag}.mil"), &art.text);
        fixed_point(&art.text);
    }
}

#[test]
fn conv1x1_golden() {
    goldens("conv1x1", common::conv1x1);
}

#[test]
fn swiglu_ffn_golden() {
    goldens("swiglu_ffn", |d| common::swiglu_ffn(d, 64, 128, 64));
}

#[test]
fn add_fp32_io_golden() {
    goldens("add_fp32_io", common::add_fp32_io);
}

#[test]
fn set_dialect_retargets_a_built_program() {
    let mut p = common::swiglu_ffn(Dialect::a(), 64, 128, 64).unwrap();
    p.set_dialect(Dialect::b()).unwrap();
    let want = common::swiglu_ffn(Dialect::b(), 64, 128, 64).unwrap();
    let policy = BlobPolicy::default();
    assert_eq!(
        to_artifacts(&p, &policy).unwrap().text,
        to_artifacts(&want, &policy).unwrap().text
    );

    let mut f = anelm_mil::FunctionBuilder::new("main", anelm_mil::Opset::Ios18);
    let s = f
        .state_input("s", anelm_mil::TensorType::fp16([1, 4]))
        .unwrap();
    let r = f.read_state(s).unwrap();
    f.output(r).unwrap();
    let mut stateful = Program::single(f.finish().unwrap());
    let before = stateful.clone();
    let e = stateful.set_dialect(Dialect::b()).unwrap_err().to_string();
    assert!(e.contains("read_state needs ios18"), "{e}");
    assert_eq!(stateful, before, "unchanged on error");
}

#[test]
fn per_tensor_policy_references_offset_64_in_separate_files() {
    let p = common::swiglu_ffn(Dialect::a(), 64, 128, 64).unwrap();
    let art = to_artifacts(&p, &BlobPolicy::PerTensor).unwrap();
    let files: Vec<&str> = art
        .layout
        .files()
        .iter()
        .map(|f| f.relative_path.as_str())
        .collect();
    assert_eq!(
        files,
        [
            "weights/w_gate.bin",
            "weights/w_up.bin",
            "weights/w_down.bin"
        ]
    );
    for f in ["w_gate", "w_up", "w_down"] {
        let r = format!(
            "BLOBFILE(path = string(\"@model_path/weights/{f}.bin\"), offset = uint64(64))"
        );
        assert!(art.text.contains(&r), "{r}");
    }
    fixed_point(&art.text);
    let single = to_artifacts(&p, &BlobPolicy::default()).unwrap();
    // w_gate, w_up: 128*64*2 = 16384 bytes each -> metadata at 64, 16512, 32960.
    for off in [64, 16512, 32960] {
        assert!(
            single.text.contains(&format!("offset = uint64({off})")),
            "offset {off}"
        );
    }
}

#[test]
fn directory_round_trip_loads_weights_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::swiglu_ffn(Dialect::b(), 64, 128, 64).unwrap();
    let art = anelm_mil::text::write_model_dir(&p, dir.path(), &BlobPolicy::default()).unwrap();
    let back = anelm_mil::text::read_model_dir(dir.path()).unwrap();
    let orig: Vec<_> = p
        .weights()
        .into_iter()
        .map(|w| w.as_ref().clone())
        .collect();
    let read: Vec<_> = back
        .weights()
        .into_iter()
        .map(|w| w.as_ref().clone())
        .collect();
    assert_eq!(orig, read);
    // Re-planning the loaded program reproduces the same text.
    assert_eq!(
        to_artifacts(&back, &BlobPolicy::default()).unwrap().text,
        art.text
    );
}

/// Statements as public projects write them (FACTS §1): MAD-style dialect A without name
/// attributes and without spaces, hex floats, tuples, constexpr attribute form.
const MAD_STYLE: &str = r#"program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x, tensor<fp16, [1,64,1,1]> rw) {
        tensor<fp16, [1,64,1,32]> sq = mul(x=x,y=x);
        tensor<int32, [1]> rax = const()[name=string("rax"), val=tensor<int32, [1]>([1])];
        bool kd = const()[name=string("kd"), val=bool(true)];
        tensor<fp16, [1,1,1,32]> ss = reduce_sum(x=sq,axes=rax,keep_dims=kd);
        fp16 invd = const()[name=string("invd"), val=fp16(0.015625)];
        tensor<fp16, [1,1,1,32]> ss2 = mul(x=ss,y=invd);
        fp16 nhalf = const()[name=string("nhalf"), val=fp16(-0x1p-1)];
        tensor<fp16, [1,1,1,32]> rrms = pow(x=ss2,y=nhalf);
        tensor<fp16, [1,64,1,32]> xr = mul(x=x,y=rrms);
        tensor<fp16, [1,64,1,32]> xn = mul(x=xr,y=rw);
        string pt = const()[name=string("pt"), val=string("valid")];
        tensor<int32, [2]> st = const()[name=string("st"), val=tensor<int32, [2]>([1,1])];
        tensor<int32, [4]> pd = const()[name=string("pd"), val=tensor<int32, [4]>([0,0,0,0])];
        tensor<int32, [2]> dl = const()[name=string("dl"), val=tensor<int32, [2]>([1,1])];
        int32 gr = const()[name=string("gr"), val=int32(1)];
        tensor<fp16, [96, 64, 1, 1]> W0 = constexpr_affine_dequantize()[axis = int32(0), name = string("W0"), quantized_data = tensor<int8, [96, 64, 1, 1]>(BLOBFILE(path = string("@model_path/weights/weight.bin"), offset = uint64(64))), scale = fp16(0x1p-3), zero_point = int8(0)];
        tensor<fp16, [1,96,1,32]> h = conv(dilations=dl,groups=gr,pad=pd,pad_type=pt,strides=st,weight=W0,x=xn)[name=string("cv")];
        int32 cax = const()[name=string("cax"), val=int32(1)];
        bool cid = const()[name=string("cid"), val=bool(false)];
        tensor<fp16, [1,160,1,32]> out = concat(axis=cax,interleave=cid,values=(h,xn));
    } -> (out);
}
"#;

#[test]
fn parses_mad_style_text_and_reaches_a_fixed_point() {
    let p = parse_program(MAD_STYLE).unwrap();
    let f = &p.functions[0];
    assert_eq!(p.dialect, Dialect::a());
    assert_eq!(f.ops().len(), 20);
    let sq = f.producer(f.find("sq").unwrap()).unwrap();
    assert_eq!(sq.name, None, "statement without a name attribute");
    let nhalf = f.const_value(f.find("nhalf").unwrap()).unwrap();
    assert_eq!(nhalf.to_f64(), Some(-0.5));
    let w0 = f.producer(f.find("W0").unwrap()).unwrap();
    assert_eq!(w0.attributes.len(), 4);
    // Operands read the same whether bound to a const, in place, or as attributes.
    assert_eq!(
        f.operand_literal(w0, "scale").unwrap().to_f64(),
        Some(0.125)
    );
    let conv = f.producer(f.find("h").unwrap()).unwrap();
    assert_eq!(f.operand_literal(conv, "groups").unwrap().to_i64(), Some(1));
    assert_eq!(conv.value_input("weight"), f.find("W0"));
    assert!(
        f.operand_literal(conv, "x").is_none(),
        "computed operands are not constants"
    );
    let printed = print_program(&p, &Default::default()).unwrap();
    assert!(printed.contains("        tensor<fp16, [1, 64, 1, 32]> sq = mul(x = x, y = x);\n"));
    assert!(
        printed.contains("fp16 nhalf = const()[name = string(\"nhalf\"), val = fp16(-0.500000)];")
    );
    fixed_point(&printed);
}

/// Dialect B as ALM/FG write it, with an OMX-style bank: two procedures, statements without
/// names, BLOBFILE literals passed inline to constexpr_blockwise_shift_scale.
const DIALECT_B_BANK: &str = r#"program(1.0)
[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{"coremlc-version", "3505.4.1"}})]
{
    func procedure000<ios16>(tensor<fp16, [1, 32, 1, 32]> x) {
        tensor<string, []> pt = const()[name = tensor<string, []>("pt"), val = tensor<string, []>("valid")];
        tensor<int32, [2]> st = const()[name = tensor<string, []>("st"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, [4]> pd = const()[name = tensor<string, []>("pd"), val = tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [2]> dl = const()[name = tensor<string, []>("dl"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, []> gr = const()[name = tensor<string, []>("gr"), val = tensor<int32, []>(1)];
        tensor<fp16, [16, 32, 1, 1]> W = const()[name = tensor<string, []>("W"), val = tensor<fp16, [16, 32, 1, 1]>(BLOBFILE(path = tensor<string, []>("@model_path/weights/w.bin"), offset = tensor<uint64, []>(64)))];
        tensor<fp16, [1, 16, 1, 32]> y = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = W, x = x)[name = tensor<string, []>("cv")];
    } -> (y);
    func procedure001<ios18>(tensor<fp16, [1, 32, 1, 32]> x) {
        tensor<fp16, [16, 32, 1, 1]> w = constexpr_blockwise_shift_scale(data = tensor<int8, [16, 32, 1, 1]>(BLOBFILE(path = tensor<string, []>("@model_path/weights/q.bin"), offset = tensor<uint64, []>(64))), scale = tensor<fp16, [16, 1, 1, 1]>(BLOBFILE(path = tensor<string, []>("@model_path/weights/q.bin"), offset = tensor<uint64, []>(640))))[name = tensor<string, []>("dequant")];
        tensor<fp16, []> two = const()[name = tensor<string, []>("two"), val = tensor<fp16, []>(2.0)];
        tensor<fp16, [1, 32, 1, 32]> up = mul(x = x, y = two);
        tensor<fp16, [16, 32, 1, 32]> t = matmul(transpose_x = tensor<bool, []>(false), transpose_y = tensor<bool, []>(false), x = w, y = up);
    } -> (t);
}
"#;

#[test]
fn parses_dialect_b_multi_function_bank() {
    let p = parse_program(DIALECT_B_BANK).unwrap();
    assert_eq!(p.dialect, Dialect::b());
    assert_eq!(p.functions.len(), 2);
    assert_eq!(p.functions[1].name, "procedure001");
    let f = &p.functions[1];
    let w = f.producer(f.find("w").unwrap()).unwrap();
    assert_eq!(
        w.inputs.len(),
        2,
        "BLOBFILE literals passed inline as arguments"
    );
    let printed = print_program(&p, &Default::default()).unwrap();
    assert!(printed.starts_with(HEADER_B));
    assert!(
        printed.contains("transpose_x = tensor<bool, []>(false)"),
        "inline literal kept inline"
    );
    fixed_point(&printed);
}

fn parse_err(src: &str) -> (usize, usize, String) {
    match parse_program(src).unwrap_err() {
        MilError::Parse { line, col, msg } => (line, col, msg),
        e => panic!("not a parse error: {e}"),
    }
}

#[test]
fn errors_name_line_and_column() {
    let body = |stmt: &str| {
        format!("program(1.3)\n{{\n    func main<ios18>(tensor<fp16, [1, 4]> x) {{\n{stmt}\n    }} -> (y);\n}}\n")
    };
    let (l, c, m) = parse_err(&body("        tensor<fp16, [1, 5]> y = relu(x = x);"));
    assert_eq!((l, c), (4, 9));
    assert!(m.contains("declared type") && m.contains("[1, 4]"), "{m}");
    let (l, _, m) = parse_err(&body("        tensor<fp16, [1, 4]> y = relu(x = z);"));
    assert_eq!(l, 4);
    assert!(m.contains("z is not defined"), "{m}");
    let (l, c, m) = parse_err(&body("        tensor<fp16, [1, 4]> y = relu(x = x)"));
    assert_eq!((l, c), (5, 5));
    assert!(m.contains("expected `;`"), "{m}");
    let (_, _, m) = parse_err(&body("        tensor<fp16, [1, 4]> x = relu(x = x);"));
    assert!(m.contains("already defined"), "{m}");
    let (l, c, m) = parse_err(&body(
        "        tensor<fp16, [4294967296, 4294967296, 65536]> y = relu(x = x);",
    ));
    assert_eq!((l, c), (4, 9));
    assert!(
        m.contains("2^48"),
        "absurd shapes are errors, not overflows: {m}"
    );
    let (_, _, m) = parse_err("program(1.3)\n{\n    func main<ios99>() {\n    } -> ();\n}\n");
    assert!(m.contains("ios99"), "{m}");
    let (_, _, m) = parse_err(&body("        tensor<fp16, [1, 4]> y = frobnicate(x = x);\n        tensor<fp16, [1, 4]> q = relu(x = y, alpha = x);"));
    assert!(
        m.contains("unknown parameter alpha"),
        "unknown ops pass, bad params on known ones fail: {m}"
    );
}

#[test]
fn unknown_ops_keep_their_declared_types() {
    let src = "program(1.3)\n{\n    func main<CoreML8>(tensor<fp16, [1, 4]> x) {\n        tensor<fp16, [1, 4]> y = frobnicate(x = x);\n    } -> (y);\n}\n";
    let p = parse_program(src).unwrap();
    assert_eq!(p.build_info, vec![]);
    let printed = print_program(&p, &Default::default()).unwrap();
    assert_eq!(
        printed, src,
        "no buildInfo, CoreML8 tag and unknown op all preserved"
    );
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    fn sources() -> Vec<String> {
        ["conv1x1.a.mil", "swiglu_ffn.b.mil", "add_fp32_io.a.mil"]
            .iter()
            .map(|n| std::fs::read_to_string(golden_path(n)).unwrap())
            .chain([MAD_STYLE.to_string(), DIALECT_B_BANK.to_string()])
            .collect()
    }

    proptest! {
        /// Truncated or corrupted MIL text is an error (or, by chance, still a program), never a panic.
        #[test]
        fn damaged_text_is_an_error_not_a_panic(which in 0usize..5, cut in any::<prop::sample::Index>(), pos in any::<prop::sample::Index>(), byte in 0u8..128) {
            let src = &sources()[which];
            let chars: Vec<char> = src.chars().collect();
            let truncated: String = chars[..cut.index(chars.len())].iter().collect();
            let _ = parse_program(&truncated);
            let mut mutated = chars.clone();
            mutated[pos.index(chars.len())] = byte as char;
            let mutated: String = mutated.into_iter().collect();
            if let Ok(p) = parse_program(&mutated) {
                // Whatever parses must print and re-parse.
                let printed = print_program(&p, &Default::default()).unwrap();
                prop_assert_eq!(print_program(&parse_program(&printed).unwrap(), &Default::default()).unwrap(), printed);
            }
        }
    }
}
