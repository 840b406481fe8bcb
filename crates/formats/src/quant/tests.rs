//! Unit tests: layout constants, definitions that gguf-py cannot check (Q8_K, Q8_1, the integer
//! and f64 casts), hand-worked blocks, and the rounding rules of the activation quantisers. The
//! bitwise comparisons with gguf-py are in tests/quant_gguf_py.rs and tests/quant_models.rs, the
//! quantiser round trips in tests/quant_activation.rs.

use half::f16;
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::activation::{
    quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use super::*;
use crate::GgmlType::{self, *};

fn dequant(dtype: GgmlType, src: &[u8]) -> Vec<f32> {
    let n = src.len() / dtype.block_bytes() * dtype.block_elems();
    let mut out = vec![f32::NAN; n];
    dequantize(dtype, src, &mut out).expect("whole blocks");
    out
}

#[test]
fn module_constants_match_ggml_type_geometry() {
    let table = [
        (Q4_0, legacy::Q4_0_BYTES, legacy::QK),
        (Q4_1, legacy::Q4_1_BYTES, legacy::QK),
        (Q5_0, legacy::Q5_0_BYTES, legacy::QK),
        (Q5_1, legacy::Q5_1_BYTES, legacy::QK),
        (Q8_0, legacy::Q8_0_BYTES, legacy::QK),
        (Q8_1, legacy::Q8_1_BYTES, legacy::QK),
        (Q2K, k_quants::Q2_K_BYTES, k_quants::QK_K),
        (Q3K, k_quants::Q3_K_BYTES, k_quants::QK_K),
        (Q4K, k_quants::Q4_K_BYTES, k_quants::QK_K),
        (Q5K, k_quants::Q5_K_BYTES, k_quants::QK_K),
        (Q6K, k_quants::Q6_K_BYTES, k_quants::QK_K),
        (Q8K, k_quants::Q8_K_BYTES, k_quants::QK_K),
        (IQ4NL, codebook::IQ4_NL_BYTES, codebook::QK),
        (IQ4XS, codebook::IQ4_XS_BYTES, k_quants::QK_K),
        (MXFP4, codebook::MXFP4_BYTES, codebook::QK),
        (IQ2XXS, iq::IQ2_XXS_BYTES, k_quants::QK_K),
        (IQ2XS, iq::IQ2_XS_BYTES, k_quants::QK_K),
        (IQ2S, iq::IQ2_S_BYTES, k_quants::QK_K),
        (IQ3XXS, iq::IQ3_XXS_BYTES, k_quants::QK_K),
        (IQ3S, iq::IQ3_S_BYTES, k_quants::QK_K),
        (IQ1S, iq::IQ1_S_BYTES, k_quants::QK_K),
        (IQ1M, iq::IQ1_M_BYTES, k_quants::QK_K),
        (TQ1_0, ternary::TQ1_0_BYTES, k_quants::QK_K),
        (TQ2_0, ternary::TQ2_0_BYTES, k_quants::QK_K),
    ];
    for (t, bytes, elems) in table {
        assert_eq!((t.block_bytes(), t.block_elems()), (bytes, elems), "{t}");
    }
    // The typed activation blocks have ggml's layout.
    assert_eq!(std::mem::size_of::<BlockQ8_0>(), Q8_0.block_bytes());
    assert_eq!(std::mem::size_of::<BlockQ8_1>(), Q8_1.block_bytes());
    assert_eq!(std::mem::size_of::<BlockQ8K>(), Q8K.block_bytes());
}

#[test]
fn every_type_dequantizes_and_checks_lengths() {
    for t in GgmlType::ALL {
        let src = vec![0u8; 2 * t.block_bytes()];
        let mut out = vec![f32::NAN; 2 * t.block_elems()];
        dequantize(t, &src, &mut out).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(
            out.iter().all(|v| v.is_finite()),
            "{t}: zero bytes must give finite values"
        );
        assert!(
            dequantize(t, &src[1..], &mut out).is_err(),
            "{t}: short source accepted"
        );
        assert!(
            dequantize(t, &src, &mut out[1..]).is_err(),
            "{t}: short destination accepted"
        );
    }
}

#[test]
fn plain_types_are_numeric_casts() {
    assert_eq!(dequant(I8, &[0x80, 0x7f, 0xff]), [-128.0, 127.0, -1.0]);
    assert_eq!(dequant(I16, &[0x00, 0x80, 0xff, 0x7f]), [-32768.0, 32767.0]);
    let i32s = [i32::MIN, 16_777_217, -3];
    let bytes: Vec<u8> = i32s.iter().flat_map(|v| v.to_le_bytes()).collect();
    // 2^24 + 1 is not an f32: rounds to even, 2^24.
    assert_eq!(dequant(I32, &bytes), [-2147483648.0, 16_777_216.0, -3.0]);
    let i64s = [i64::MAX, -(1i64 << 40) - 1];
    let bytes: Vec<u8> = i64s.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(dequant(I64, &bytes), [9.223372e18, -1_099_511_627_776.0]);
    let f64s = [0.1f64, 1e300, -1e-300, f64::NEG_INFINITY];
    let bytes: Vec<u8> = f64s.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out = dequant(F64, &bytes);
    assert_eq!(out[0].to_bits(), 0.1f32.to_bits());
    assert_eq!(out[1], f32::INFINITY);
    assert_eq!(out[2].to_bits(), (-0.0f32).to_bits());
    assert_eq!(out[3], f32::NEG_INFINITY);
}

#[test]
fn bf16_and_f16_widen_exactly() {
    // bf16 0x3f80 = 1.0, 0xc049 = -3.140625; a NaN keeps its payload bits.
    let out = dequant(BF16, &[0x80, 0x3f, 0x49, 0xc0, 0x81, 0x7f]);
    assert_eq!(out[..2], [1.0, -3.140625]);
    assert_eq!(out[2].to_bits(), 0x7f81_0000);
    // f16 0x0001 is the smallest subnormal, 2^-24; 0x7bff is the largest finite, 65504.
    assert_eq!(
        dequant(F16, &[0x01, 0x00, 0xff, 0x7b]),
        [2f32.powi(-24), 65504.0]
    );
}

#[test]
fn q4_0_and_q5_0_by_hand() {
    // d = 0.5; byte j = (j << 4) | (15 - j):
    // weight j = (15 - j - 8) / 2, weight j + 16 = (j - 8) / 2.
    let mut b = vec![0x00, 0x38];
    b.extend((0..16u8).map(|j| (j << 4) | (15 - j)));
    let out = dequant(Q4_0, &b);
    for j in 0..16 {
        assert_eq!(out[j], (7 - j as i32) as f32 * 0.5);
        assert_eq!(out[j + 16], (j as i32 - 8) as f32 * 0.5);
    }
    // Q5_0 with the same nibbles and qh = 0x8000_0001: the fifth bit of weights 0 and 31 only.
    let mut b5 = vec![0x00, 0x38, 0x01, 0x00, 0x00, 0x80];
    b5.extend(&b[2..]);
    let out = dequant(Q5_0, &b5);
    assert_eq!(out[0], (15 + 16 - 16) as f32 * 0.5);
    assert_eq!(out[1], (14 - 16) as f32 * 0.5);
    assert_eq!(out[31], (15 + 16 - 16) as f32 * 0.5);
    assert_eq!(out[30], (14 - 16) as f32 * 0.5);
}

#[test]
fn q4_k_scales_and_mins_by_hand() {
    // Sub-block 0: scale 3, min 2; sub-block 5: scale 0x25 (low 4 bits 5 from byte 9, high bits
    // 0b10 from byte 1's top), min 0x31 (low 1 from byte 9's high nibble, high 0b11 from byte 5).
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
    let sc = &mut b[4..16];
    sc[0] = 3;
    sc[4] = 2;
    sc[1] = 0b1000_0000;
    sc[5] = 0b1100_0000;
    sc[9] = 0x15;
    assert_eq!(k_quants::k4_scale_min(sc, 5), (0x25, 0x31));
    // Weight 7 (sub-block 0, low nibble of qs[7]) is 9;
    // weight 32 * 5 + 7 (high nibble of qs[64 + 7]) is 4.
    b[16 + 7] = 9;
    b[16 + 64 + 7] = 4 << 4;
    let out = dequant(Q4K, &b);
    assert_eq!(out[7], 2.0 * 3.0 * 9.0 - 0.25 * 2.0);
    assert_eq!(out[6], -0.25 * 2.0);
    assert_eq!(out[5 * 32 + 7], (2.0 * 37.0) * 4.0 - 0.25 * 49.0);
}

#[test]
fn q8_k_is_d_times_q() {
    let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    for d in [1.0f32, -0.0, 3.4e38, -1e-45, -7.25, 0.1] {
        let mut b = vec![0u8; Q8K.block_bytes()];
        rng.fill_bytes(&mut b);
        b[..4].copy_from_slice(&d.to_le_bytes());
        let out = dequant(Q8K, &b);
        for (j, v) in out.iter().enumerate() {
            assert_eq!(
                v.to_bits(),
                (d * f32::from(b[4 + j] as i8)).to_bits(),
                "d {d}, weight {j}"
            );
        }
    }
}

#[test]
fn q8_1_is_d_times_q_and_ignores_s() {
    let mut b = vec![0u8; Q8_1.block_bytes()];
    TestRng::deterministic_rng(RngAlgorithm::ChaCha).fill_bytes(&mut b);
    b[..2].copy_from_slice(&f16::from_f32(-0.375).to_le_bytes());
    let out = dequant(Q8_1, &b);
    b[2] ^= 0xff;
    assert_eq!(dequant(Q8_1, &b), out);
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, f32::from(b[4 + j] as i8) * -0.375);
    }
}

#[test]
fn ksigns_and_e8m0_match_ggml() {
    // The first 16 entries of ggml's ksigns_iq2xs.
    assert_eq!(
        iq::KSIGNS[..16],
        [0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15]
    );
    assert_eq!(iq::KSIGNS[127], 255);
    assert_eq!(codebook::e8m0_to_f32_half(127), 0.5);
    assert_eq!(codebook::e8m0_to_f32_half(0), 2f32.powi(-128));
    assert_eq!(codebook::e8m0_to_f32_half(1), 2f32.powi(-127));
    assert_eq!(codebook::e8m0_to_f32_half(255), 2f32.powi(127));
}

#[test]
fn tq1_0_trits_by_hand() {
    // 0xff * 3^n mod 256 gives trits 2, 2, 2, 2, 2 (minus 1: all +1); 0 gives all -1. A byte
    // encoding trits (1, 0, 2, 1, 1) is ceil((1*81 + 0*27 + 2*9 + 1*3 + 1) * 256 / 243) = 109.
    let mut b = vec![0u8; 54];
    b[0] = 109;
    b[32] = 0xff;
    b[52..].copy_from_slice(&f16::from_f32(3.0).to_le_bytes());
    let out = dequant(TQ1_0, &b);
    let first: Vec<f32> = (0..5).map(|n| out[32 * n]).collect();
    assert_eq!(first, [0.0, -3.0, 3.0, 0.0, 0.0]);
    assert!((0..5).all(|n| out[160 + 16 * n] == 3.0));
    assert_eq!(out[161], -3.0);
    assert_eq!(out[255], -3.0);
}

#[test]
fn q8_k_rounds_ties_to_even() {
    // max = 127 gives iscale = -1 exactly, so q = nearest_int(-x): ties go to even.
    let mut x = [0.0f32; 256];
    x[0] = 127.0;
    x[1..5].copy_from_slice(&[0.5, 1.5, 2.5, -2.5]);
    let b = BlockQ8K::quantize(&x);
    assert_eq!(b.qs[..5], [-127, 0, -2, -2, 2]);
    assert_eq!(b.d, -1.0);
    // Q8_0 rounds half away from zero instead: 127 / 127 = 1, so q = round(x).
    let mut x0 = [0.0f32; 32];
    x0[0] = 127.0;
    x0[1..4].copy_from_slice(&[0.5, 2.5, -2.5]);
    assert_eq!(BlockQ8_0::quantize(&x0).qs[..4], [127, 1, 3, -3]);
}

#[test]
fn quantize_rows_check_lengths() {
    let x = vec![1.0f32; 65];
    assert!(quantize_row_q8_0(&x, &mut [BlockQ8_0::quantize(&[0.0; 32]); 2]).is_err());
    assert!(quantize_row_q8_1(&x[..64], &mut [BlockQ8_1::quantize(&[0.0; 32]); 1]).is_err());
    assert!(quantize_row_q8_k(&x, &mut []).is_err());
    assert!(quantize_row_q8_k(&[], &mut []).is_ok());
}
