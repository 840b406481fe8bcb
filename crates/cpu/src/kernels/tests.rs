//! Property tests: every kernel of every available instruction set against the scalar
//! reference, and the scalar reference against an f64 dot product of the weights as the formats
//! crate dequantises them (an independent reading of the block layouts).
//!
//! Tolerance: the integer block sums are exact in every version, so they differ only in the
//! order of the f32 additions that combine blocks: 2e-6 of `Σ|w·x|` covers that order for the
//! row lengths tested (≤ 2048).

use anelm_formats::GgmlType;
use half::f16;
use proptest::prelude::*;

use super::*;
use crate::q8::{ActKind, Q8Buf};

const QUANT: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];
const FLOAT: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// xorshift64*: deterministic test data from a proptest seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Offsets of the f16 scale fields in a block of each type.
fn scale_fields(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    }
}

/// A row of `n` values of type `t`: random quant bytes with finite scales.
fn weight_row(t: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = t.bytes_for(n).expect("whole blocks");
    match t {
        GgmlType::F32 => (0..n).flat_map(|_| rng.unit().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.unit()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(rng.unit()).to_le_bytes())
            .collect(),
        _ => {
            let mut row: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
            for block in row.chunks_exact_mut(t.block_bytes()) {
                for &at in scale_fields(t) {
                    block[at..at + 2]
                        .copy_from_slice(&f16::from_f32(rng.unit() * 0.1).to_le_bytes());
                }
            }
            row
        }
    }
}

/// Activations with a few outliers, as real hidden states have.
fn activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| rng.unit() * if i % 97 == 5 { 40.0 } else { 2.0 })
        .collect()
}

fn run_q8(k: Kernel, row: &[u8], q: &Q8Buf, t: usize) -> Vec<f32> {
    let Kernel::Q8 { f, .. } = k else {
        panic!("not an 8-bit kernel")
    };
    let xs: Vec<_> = (0..t).map(|i| q.row(i)).collect();
    let mut out = vec![0f32; t];
    for (xs, out) in xs.chunks(MAX_ROWS).zip(out.chunks_mut(MAX_ROWS)) {
        // SAFETY: the kernels come from `select` with an available instruction set.
        unsafe { f(row, xs, out) };
    }
    out
}

fn run_f32(k: Kernel, row: &[u8], x: &[Vec<f32>]) -> Vec<f32> {
    let Kernel::F32(f) = k else {
        panic!("not an f32 kernel")
    };
    let xs: Vec<&[f32]> = x.iter().map(|v| &v[..]).collect();
    let mut out = vec![0f32; x.len()];
    // SAFETY: as above.
    unsafe { f(row, &xs, &mut out) };
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn quantised_kernels_agree_with_the_reference(seed in any::<u64>(), ti in 0usize..8, superblocks in 1usize..5, t in 1usize..=MAX_ROWS) {
        let ty = QUANT[ti];
        let n = 256 * superblocks;
        let mut rng = Rng(seed | 1);
        let row = weight_row(ty, n, &mut rng);
        let kind = select(ty, Isa::Scalar).act();
        let mut q = Q8Buf::new(kind, t, n);
        let x: Vec<Vec<f32>> = (0..t).map(|_| activations(n, &mut rng)).collect();
        for (i, xi) in x.iter().enumerate() {
            q.quantize_row(i, xi);
        }
        // The reference against f64 over the dequantised weights and activations.
        let mut w = vec![0f32; n];
        anelm_formats::quant::dequantize(ty, &row, &mut w).unwrap();
        let want = run_q8(select(ty, Isa::Scalar), &row, &q, t);
        for (i, want_i) in want.iter().enumerate() {
            let r = q.row(i);
            let block = if kind == ActKind::Q8K { 256 } else { 32 };
            let xd: Vec<f64> = r.qs.iter().enumerate().map(|(j, &v)| f64::from(v) * f64::from(r.d[j / block])).collect();
            let exact: f64 = w.iter().zip(&xd).map(|(a, b)| f64::from(*a) * b).sum();
            let mag: f64 = w.iter().zip(&xd).map(|(a, b)| (f64::from(*a) * b).abs()).sum();
            prop_assert!((f64::from(*want_i) - exact).abs() <= 2e-6 * mag + 1e-9, "{ty} scalar {want_i} vs f64 {exact}");
            // Every other instruction set against the reference.
            for isa in Isa::available() {
                let got = run_q8(select(ty, isa), &row, &q, t);
                prop_assert!((f64::from(got[i]) - f64::from(*want_i)).abs() <= 2e-6 * mag + 1e-9, "{ty} {isa:?} row {i}: {} vs {want_i}", got[i]);
            }
        }
    }

    #[test]
    fn float_kernels_agree_with_the_reference(seed in any::<u64>(), ti in 0usize..3, n in 1usize..300, t in 1usize..=MAX_ROWS) {
        let ty = FLOAT[ti];
        let mut rng = Rng(seed | 1);
        let row = weight_row(ty, n, &mut rng);
        let x: Vec<Vec<f32>> = (0..t).map(|_| activations(n, &mut rng)).collect();
        let mut w = vec![0f32; n];
        anelm_formats::quant::dequantize(ty, &row, &mut w).unwrap();
        let want = run_f32(select(ty, Isa::Scalar), &row, &x);
        for isa in Isa::available() {
            let got = run_f32(select(ty, isa), &row, &x);
            for i in 0..t {
                let mag: f32 = w.iter().zip(&x[i]).map(|(a, b)| (a * b).abs()).sum();
                let exact: f64 = w.iter().zip(&x[i]).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                prop_assert!((f64::from(want[i]) - exact).abs() <= 1e-6 * f64::from(mag) + 1e-9);
                prop_assert!((got[i] - want[i]).abs() <= 1e-6 * mag + 1e-9, "{ty} {isa:?}: {} vs {}", got[i], want[i]);
            }
        }
    }
}

#[test]
fn every_other_type_falls_back_to_dequantising() {
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::IQ4NL,
        GgmlType::IQ2XXS,
    ] {
        assert!(
            matches!(select(ty, Isa::detect()), Kernel::Dequant(_)),
            "{ty}"
        );
    }
    for ty in QUANT {
        assert!(
            matches!(select(ty, Isa::detect()), Kernel::Q8 { .. }),
            "{ty}"
        );
    }
}

#[cfg(target_arch = "x86_64")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn packed_rows_agree_with_the_reference(seed in any::<u64>(), ti in 0usize..5, blocks in 1usize..12, rows in 1usize..40, t in 1usize..=packed::MAX_TOKENS) {
        // Each packed kernel the CPU has (AVX2 on every x86-64 machine we test on, AVX-512 on
        // most).
        let isas: Vec<Isa> = Isa::available().into_iter().filter(|i| i.has_avx2()).collect();
        prop_assert!(!isas.is_empty());
        let ty = QUANT[ti];
        let n = 32 * blocks;
        let mut rng = Rng(seed | 1);
        let w: Vec<Vec<u8>> = (0..rows).map(|_| weight_row(ty, n, &mut rng)).collect();
        let mut q = Q8Buf::new(ActKind::Q8B32, t, n);
        for i in 0..t {
            q.quantize_row(i, &activations(n, &mut rng));
        }
        let mut released = 0;
        let p = packed::pack(ty, rows, blocks, |r| &w[r][..], |r| released = r).unwrap();
        prop_assert_eq!(released, rows);
        let lay = packed::Layout::of(ty).unwrap();
        let xs: Vec<_> = (0..t).map(|i| q.row(i)).collect();
        // All the groups in one call, as the forward pass makes it.
        let groups = rows.div_ceil(packed::ROWS);
        for isa in isas {
        let mut out = vec![0f32; t * groups * packed::ROWS];
        // SAFETY: the CPU has `isa`.
        unsafe { x86_packed::packed_dot(isa, &p, blocks, lay, &xs, &mut out) };
        for (r, wr) in w.iter().enumerate() {
            let want = run_q8(select(ty, Isa::Scalar), wr, &q, t);
            let mut deq = vec![0f32; n];
            anelm_formats::quant::dequantize(ty, wr, &mut deq).unwrap();
            for i in 0..t {
                let row = q.row(i);
                let mag: f32 = deq.iter().zip(row.qs).enumerate().map(|(j, (a, &b))| (a * f32::from(b) * row.d[j / 32]).abs()).sum();
                // Q8_0's bias of 128 adds a cancellation of at most 255/127 to the bound.
                let got = out[i * groups * packed::ROWS + r];
                prop_assert!((got - want[i]).abs() <= 6e-6 * mag + 1e-9, "{isa:?} {ty} row {r} token {i}: {} vs {}", got, want[i]);
            }
        }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn unpacking_a_row_gives_back_the_files_bytes(seed in any::<u64>(), ti in 0usize..5, blocks in 1usize..12, rows in 1usize..10) {
        let ty = QUANT[ti];
        let mut rng = Rng(seed | 1);
        let w: Vec<Vec<u8>> = (0..rows).map(|_| weight_row(ty, 32 * blocks, &mut rng)).collect();
        let data = packed::pack(ty, rows, blocks, |r| &w[r][..], |_| {}).unwrap();
        let p = packed::Packed { isa: Isa::Scalar, dtype: ty, blocks, data: &data };
        for (r, want) in w.iter().enumerate() {
            let mut got = vec![0u8; want.len()];
            packed::unpack_row(&p, r, &mut got);
            prop_assert_eq!(&got, want, "{} row {}", ty, r);
        }
    }
}
