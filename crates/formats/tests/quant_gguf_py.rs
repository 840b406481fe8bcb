//! Our dequantisers against gguf-py's (PyPI `gguf`, gguf/quants.py) on random blocks, bit for bit,
//! and the generated IQ grid tables against gguf-py's.

mod quant_support;

use std::path::Path;

use anelm_formats::quant;
use anelm_formats::GgmlType::{self, *};
use proptest::prelude::Rng;
use proptest::test_runner::TestRng;
use quant_support::{python, rng, GgufPy};

/// The types gguf-py dequantises with ggml's layout. Not here: Q8_1 (gguf-py lists an outdated
/// 40-byte block and has no dequantiser), Q8_K, F64 and the integer types; the unit tests check
/// those against their definitions.
const COVERED: [GgmlType; 25] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS, MXFP4,
    IQ2XXS, IQ2XS, IQ2S, IQ3XXS, IQ3S, IQ1S, IQ1M, TQ1_0, TQ2_0,
];

/// A floating-point field of a block (a scale, or the value itself for the float types): its
/// format and byte offset. IQ1_M's f16 scale is split over the top nibbles of its four u16 scale
/// words at 48..56.
#[derive(Clone, Copy)]
enum Field {
    F16At(usize),
    Bf16At(usize),
    F32At(usize),
    Iq1mScale,
}

/// The floating-point fields of one block of `t` (an independent statement of ggml's layouts).
fn fields(t: GgmlType) -> Vec<Field> {
    use Field::{Bf16At, F16At, F32At, Iq1mScale};
    match t {
        F32 => vec![F32At(0)],
        BF16 => vec![Bf16At(0)],
        F16 | Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS => vec![F16At(0)],
        IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S => vec![F16At(0)],
        Q4_1 | Q5_1 | Q4K | Q5K => vec![F16At(0), F16At(2)],
        Q2K => vec![F16At(80), F16At(82)],
        Q3K => vec![F16At(108)],
        Q6K => vec![F16At(208)],
        TQ1_0 => vec![F16At(52)],
        TQ2_0 => vec![F16At(64)],
        IQ1M => vec![Iq1mScale],
        MXFP4 => vec![], // an E8M0 byte: every value is finite
        other => panic!("{other} is not compared with gguf-py"),
    }
}

/// Edge values used for the first blocks: ±0, ±largest finite, ±smallest subnormal, smallest
/// normal, 1.
const SPECIAL_F16: [u16; 8] = [
    0x0000, 0x8000, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x0400, 0x3c00,
];
const SPECIAL_BF16: [u16; 8] = [
    0x0000, 0x8000, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x0080, 0x3f80,
];
const SPECIAL_F32: [u32; 8] = [
    0x0000_0000,
    0x8000_0000,
    0x7f7f_ffff,
    0xff7f_ffff,
    0x0000_0001,
    0x8000_0001,
    0x0080_0000,
    0x3f80_0000,
];

/// Random bits with the exponent (bits `mask`) not all ones: finite values of every magnitude
/// and sign, subnormals included.
fn finite_bits(rng: &mut TestRng, mask: u64) -> u64 {
    loop {
        let b = rng.next_u64();
        if b & mask != mask {
            return b;
        }
    }
}

/// `n` random blocks of `t` whose floating-point fields are finite: edge values in the first 8
/// blocks, random finite values after.
fn random_blocks(t: GgmlType, n: usize, rng: &mut TestRng) -> Vec<u8> {
    let mut bytes = vec![0u8; n * t.block_bytes()];
    rng.fill_bytes(&mut bytes);
    for (i, block) in bytes.chunks_exact_mut(t.block_bytes()).enumerate() {
        for (k, field) in fields(t).into_iter().enumerate() {
            let special = (i < SPECIAL_F16.len()).then_some((i + 3 * k) % SPECIAL_F16.len());
            let f16_bits = |rng: &mut TestRng| {
                special.map_or_else(|| finite_bits(rng, 0x7c00) as u16, |s| SPECIAL_F16[s])
            };
            match field {
                Field::F16At(at) => block[at..at + 2].copy_from_slice(&f16_bits(rng).to_le_bytes()),
                Field::Bf16At(at) => {
                    let bits = special
                        .map_or_else(|| finite_bits(rng, 0x7f80) as u16, |s| SPECIAL_BF16[s]);
                    block[at..at + 2].copy_from_slice(&bits.to_le_bytes());
                }
                Field::F32At(at) => {
                    let bits = special
                        .map_or_else(|| finite_bits(rng, 0x7f80_0000) as u32, |s| SPECIAL_F32[s]);
                    block[at..at + 4].copy_from_slice(&bits.to_le_bytes());
                }
                Field::Iq1mScale => {
                    let d = f16_bits(rng);
                    for word in 0..4 {
                        let at = 48 + 2 * word;
                        let w = u16::from_le_bytes([block[at], block[at + 1]]);
                        let nibble = (d >> (4 * word)) & 0xf;
                        block[at..at + 2]
                            .copy_from_slice(&((w & 0x0fff) | (nibble << 12)).to_le_bytes());
                    }
                }
            }
        }
    }
    bytes
}

#[test]
fn random_blocks_match_gguf_py_bitwise() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rng = rng();
    let mut cases = Vec::new();
    let mut args = vec!["blocks".to_string()];
    for t in COVERED {
        // 1024 blocks draw every grid row of the IQ types many times over.
        let n_blocks = if t.is_quantized() { 1024 } else { 8192 };
        let bytes = random_blocks(t, n_blocks, &mut rng);
        let mut ours = vec![0f32; n_blocks * t.block_elems()];
        quant::dequantize(t, &bytes, &mut ours).expect("whole blocks");
        // Finite scales never give NaN; a NaN would also make a bitwise comparison meaningless.
        if let Some(i) = ours.iter().position(|v| v.is_nan()) {
            panic!("{t}: value {i} is NaN although every scale is finite");
        }
        let path = dir.path().join(format!("{}.bin", t.name()));
        std::fs::write(&path, &bytes).expect("write blocks");
        args.push(t.name().to_string());
        args.push(path.display().to_string());
        cases.push((t, bytes, ours));
    }
    let mut py = GgufPy::spawn(&args);
    let mut failures = Vec::new();
    for (t, bytes, ours) in &cases {
        if let Some(m) = py.compare_next(t.name(), *t as u32, ours) {
            let block = m.index / t.block_elems();
            let raw = &bytes[block * t.block_bytes()..][..t.block_bytes()];
            failures.push(format!("{}\n  block {block}: {raw:02x?}", m.message));
        }
    }
    py.finish();
    assert!(
        failures.is_empty(),
        "{} of {} types differ from gguf-py:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn covered_types_are_exactly_those_gguf_py_dequantises() {
    // gguf.quants.dequantize handles F32 and F16 itself, every other type through _type_traits.
    let script = "import gguf.quants as q; print(' '.join(['F32', 'F16'] + [t.name for t in q._type_traits]))";
    let out = std::process::Command::new(python())
        .args(["-c", script])
        .output()
        .expect("run Python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = String::from_utf8_lossy(&out.stdout);
    let mut theirs: Vec<&str> = theirs.split_whitespace().collect();
    // NVFP4 (id 40) is newer than our GgmlType; it is not a type we read.
    theirs.retain(|n| *n != "NVFP4");
    let mut ours: Vec<String> = COVERED.iter().map(|t| t.name().to_uppercase()).collect();
    theirs.sort_unstable();
    ours.sort_unstable();
    assert_eq!(ours, theirs);
}

#[test]
fn iq_tables_are_generated_from_gguf_py() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/quant");
    let out = std::process::Command::new(python())
        .arg(src.join("gen_iq_tables.py"))
        .output()
        .expect("run Python");
    assert!(
        out.status.success(),
        "gen_iq_tables.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read(src.join("iq_tables.rs")).expect("read iq_tables.rs");
    assert!(
        out.stdout == committed,
        "src/quant/iq_tables.rs differs from gen_iq_tables.py's output: regenerate it with --write"
    );
}
