//! The file's own numbers on the ANE: every integer-block matrix of both real models encoded as
//! `--weights auto` holds it. Where the type maps exactly (Q8_0, Q4_0, Q5_0: an fp16 scale, no
//! bias) the encoding's weights by the op's definition, `scale * (data - offset)` in f32, are
//! gguf-py's dequantised values bit for bit; for the others the error is what the report says
//! and stays within fp16 rounding of the scales and offsets.

#[path = "../../formats/tests/quant_support/mod.rs"]
mod quant_support;

use std::sync::Arc;

use anelm_ane::lower::encode::{encode, Part, WeightPolicy};
use anelm_formats::quant::blockwise::int_form;
use anelm_formats::{GgmlType, Gguf};
use anelm_model::Weight;
use quant_support::{model, GgufPy};

fn maps_exactly(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0)
}

fn check_model(file: &str) {
    let path = model(file);
    let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let store = Arc::new(gguf.tensors);
    let matrices: Vec<String> = (store.infos().iter())
        .filter(|t| t.shape.len() == 2 && int_form(t.dtype).is_some())
        .map(|t| t.name.clone())
        .collect();
    let exact: Vec<String> = (matrices.iter())
        .filter(|n| maps_exactly(store.require(n).unwrap().dtype))
        .cloned()
        .collect();
    assert!(!exact.is_empty(), "{file}: no exactly-mapping tensor");
    let mut args = vec!["tensors".to_string(), path.display().to_string()];
    args.extend(exact.iter().cloned());
    let mut py = GgufPy::spawn(&args);
    let mut failures = Vec::new();
    for name in &matrices {
        let t = store.require(name).unwrap();
        let w = Weight::mapped(&store, &t).unwrap_or_else(|e| panic!("{e}"));
        let e = encode(&[Part::whole(&w)], WeightPolicy::Auto).unwrap_or_else(|e| panic!("{e}"));
        let r = &e.reports[0];
        let ours = e.to_f32();
        if maps_exactly(t.dtype) {
            assert!(r.exact, "{name} ({}) reported inexact: {r:?}", t.dtype);
            if let Some(m) =
                py.compare_next(&format!("{name} ({})", t.dtype), t.dtype as u32, &ours)
            {
                failures.push(m.message);
            }
        } else {
            let file = w.to_f32().unwrap();
            let err = (ours.iter().zip(&file)).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert_eq!(err, r.max_abs_err, "{name}: reported error");
            assert!(
                err <= r.max_abs * 1e-3,
                "{name} ({}): error {err} of {}",
                t.dtype,
                r.max_abs
            );
        }
        // Nothing silently wider than the file: 4-bit types stay 4-bit, 8-bit stay 8-bit.
        let f = int_form(t.dtype).unwrap();
        let bits = if f.lo >= -8 && f.hi <= 15 {
            "int4"
        } else {
            "int8"
        };
        assert!(
            r.encoding.contains(bits),
            "{name} ({}): {}",
            t.dtype,
            r.encoding
        );
    }
    py.finish();
    assert!(failures.is_empty(), "{file}:\n{}", failures.join("\n"));
}

#[test]
fn smollm2_blocks_are_the_files_numbers() {
    check_model("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_blocks_are_the_files_numbers() {
    check_model("gemma-3-270m-q4_k_m.gguf");
}
