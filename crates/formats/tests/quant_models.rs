//! Every tensor of the two real models, dequantised by
//! `Gguf::open(..).tensors.require(..).to_f32()`, against gguf-py's reader and dequantisers, bit
//! for bit.

mod quant_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anelm_formats::{GgmlType, Gguf};
use quant_support::{model, GgufPy};

fn check_model(file: &str, expected_types: &[GgmlType]) {
    let path = model(file);
    let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = gguf
        .tensors
        .infos()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    let types: BTreeSet<&str> = gguf
        .tensors
        .infos()
        .iter()
        .map(|t| t.dtype.name())
        .collect();
    let expected: BTreeSet<&str> = expected_types.iter().map(|t| t.name()).collect();
    assert_eq!(types, expected, "{file}: tensor types");

    let mut args = vec!["tensors".to_string(), path.display().to_string()];
    args.extend(names.iter().cloned());
    let mut py = GgufPy::spawn(&args);
    let mut ours_time = Duration::ZERO;
    let mut n_values = 0;
    let mut failures = Vec::new();
    for name in &names {
        let tensor = gguf.tensors.require(name).unwrap_or_else(|e| panic!("{e}"));
        let start = Instant::now();
        let ours = tensor.to_f32().unwrap_or_else(|e| panic!("{e}"));
        ours_time += start.elapsed();
        n_values += ours.len();
        let what = format!("{name} ({}, {:?})", tensor.dtype, tensor.shape);
        if let Some(m) = py.compare_next(&what, tensor.dtype as u32, &ours) {
            failures.push(m.message);
        }
    }
    py.finish();
    eprintln!(
        "{file}: {} tensors, {n_values} values dequantised in {ours_time:?}",
        names.len()
    );
    assert!(
        failures.is_empty(),
        "{file}: {} tensors differ from gguf-py:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_every_tensor_matches_gguf_py() {
    check_model(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        &[GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0],
    );
}

#[test]
fn gemma3_every_tensor_matches_gguf_py() {
    use GgmlType::*;
    check_model("gemma-3-270m-q4_k_m.gguf", &[F32, Q5_0, Q8_0, Q4K, Q6K]);
}
