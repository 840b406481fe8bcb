//! The activation quantisers: round trips through our dequantisers, and the bytes against gguf-py's
//! Q8_0 quantiser and the numpy transcriptions of ggml's `quantize_row_q8_1_ref` and
//! `quantize_row_q8_K_ref` in tests/gguf_py_quant.py.

mod quant_support;

use std::path::Path;

use anelm_formats::quant::activation::{
    quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use anelm_formats::quant::dequantize;
use anelm_formats::GgmlType;
use half::f16;
use quant_support::{rng, spread_values, GgufPy};

/// 32 blocks of 256 values: random magnitudes and signs, one all-zero block, and one with max 127
/// and halves in between (ties: Q8_0 rounds them away from zero, Q8_K to even).
fn input() -> Vec<f32> {
    let mut x = spread_values(&mut rng(), 256 * 32);
    x[256..512].fill(0.0);
    for (j, v) in x[512..768].iter_mut().enumerate() {
        *v = if j == 0 {
            127.0
        } else {
            (j as f32 - 128.0) / 2.0
        };
    }
    x
}

fn quantized(x: &[f32]) -> (Vec<BlockQ8_0>, Vec<BlockQ8_1>, Vec<BlockQ8K>) {
    let mut q0 = vec![BlockQ8_0::quantize(&[0.0; 32]); x.len() / 32];
    let mut q1 = vec![BlockQ8_1::quantize(&[0.0; 32]); x.len() / 32];
    let mut qk = vec![BlockQ8K::quantize(&[0.0; 256]); x.len() / 256];
    quantize_row_q8_0(x, &mut q0).expect("whole blocks");
    quantize_row_q8_1(x, &mut q1).expect("whole blocks");
    quantize_row_q8_k(x, &mut qk).expect("whole blocks");
    (q0, q1, qk)
}

fn dequant(dtype: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / dtype.block_bytes() * dtype.block_elems()];
    dequantize(dtype, bytes, &mut out).expect("whole blocks");
    out
}

#[test]
fn q8_0_and_q8_1_round_trip_within_half_a_step() {
    let x = input();
    let (q0, q1, _) = quantized(&x);
    for (i, (b0, b1)) in q0.iter().zip(&q1).enumerate() {
        assert_eq!(
            (b0.d, b0.qs),
            (b1.d, b1.qs),
            "block {i}: Q8_0 and Q8_1 quants agree"
        );
        let xs = &x[32 * i..32 * i + 32];
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        // s uses the f32 scale, before its rounding to f16.
        let sum: i32 = b1.qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(
            b1.s,
            f16::from_f32(sum as f32 * (amax / 127.0)),
            "block {i}"
        );
        let back = dequant(GgmlType::Q8_0, &b0.to_bytes());
        assert_eq!(back, dequant(GgmlType::Q8_1, &b1.to_bytes()), "block {i}");
        if amax == 0.0 {
            assert!(back.iter().all(|&v| v == 0.0), "block {i}");
            continue;
        }
        assert!(
            b0.qs.iter().any(|q| q.unsigned_abs() == 127),
            "block {i}: amax maps to ±127"
        );
        // Half a step, plus the f16 rounding of d (relative 2^-11) on up to 127 steps.
        let step = b0.d.to_f32();
        for (v, w) in xs.iter().zip(&back) {
            assert!(
                (v - w).abs() <= 0.5 * step + amax * 2f32.powi(-10),
                "block {i}: {v} -> {w}"
            );
        }
    }
}

#[test]
fn q8_k_round_trips_and_sums_groups() {
    let x = input();
    let (_, _, qk) = quantized(&x);
    assert_eq!(
        qk[1],
        BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16]
        },
        "the all-zero block"
    );
    for (i, b) in qk.iter().enumerate() {
        for g in 0..16 {
            let sum: i32 = b.qs[16 * g..16 * g + 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            assert_eq!(i32::from(b.bsums[g]), sum, "block {i} group {g}");
        }
        let back = dequant(GgmlType::Q8K, &b.to_bytes());
        for (v, w) in x[256 * i..256 * (i + 1)].iter().zip(&back) {
            // Half a step, plus the f32 roundings of iscale * x and d * q.
            assert!(
                (v - w).abs() <= 0.5 * b.d.abs() + v.abs() * 1e-6,
                "block {i}: {v} -> {w}"
            );
        }
    }
}

fn python_quantize(name: &str, input: &Path) -> Vec<u8> {
    GgufPy::spawn(&["quantize", name, &input.display().to_string()]).read_all()
}

fn assert_same_blocks(name: &str, block_bytes: usize, ours: &[u8], theirs: &[u8]) {
    assert_eq!(ours.len(), theirs.len(), "{name}: byte counts");
    let differing: Vec<usize> = ours
        .chunks(block_bytes)
        .zip(theirs.chunks(block_bytes))
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i)
        .collect();
    if let Some(&i) = differing.first() {
        panic!(
            "{name}: {} blocks differ; block {i}:\n ours   {:02x?}\n theirs {:02x?}",
            differing.len(),
            &ours[i * block_bytes..][..block_bytes],
            &theirs[i * block_bytes..][..block_bytes]
        );
    }
}

#[test]
fn quantisers_match_gguf_py_and_the_ggml_reference() {
    let x = input();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("x.f32");
    std::fs::write(
        &path,
        x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .expect("write input");
    let (q0, q1, qk) = quantized(&x);
    let q0: Vec<u8> = q0.iter().flat_map(|b| b.to_bytes()).collect();
    let q1: Vec<u8> = q1.iter().flat_map(|b| b.to_bytes()).collect();
    let qk: Vec<u8> = qk.iter().flat_map(|b| b.to_bytes()).collect();
    assert_same_blocks(
        "q8_0",
        GgmlType::Q8_0.block_bytes(),
        &q0,
        &python_quantize("q8_0", &path),
    );
    assert_same_blocks(
        "q8_1",
        GgmlType::Q8_1.block_bytes(),
        &q1,
        &python_quantize("q8_1", &path),
    );
    assert_same_blocks(
        "q8_K",
        GgmlType::Q8K.block_bytes(),
        &qk,
        &python_quantize("q8_K", &path),
    );
}
