use super::*;
use anelm_formats::quant::blockwise::sample_blocks;
use anelm_formats::GgmlType;

/// A `[rows, cols]` weight of `dtype` from random blocks.
fn weight(name: &str, dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> Weight {
    let blocks = rows * cols / dtype.block_elems();
    Weight::from_bytes(name, dtype, rows, cols, sample_blocks(dtype, blocks, seed))
}

fn file_values(w: &Weight) -> Vec<f32> {
    w.to_f32().unwrap()
}

#[test]
fn exact_types_hold_the_files_numbers_and_bytes() {
    for (dtype, data) in [
        (GgmlType::Q8_0, "int8/32"),
        (GgmlType::Q4_0, "int4/32"),
        (GgmlType::Q5_0, "int8/32"),
    ] {
        let w = weight("w", dtype, 8, 64, 1);
        let e = encode(&[Part::whole(&w)], WeightPolicy::Auto).unwrap();
        let r = &e.reports[0];
        assert_eq!(r.encoding, data, "{dtype}");
        assert!(r.exact && r.max_abs_err == 0.0, "{dtype}: {r:?}");
        let got = e.to_f32();
        for (g, f) in got.iter().zip(file_values(&w)) {
            assert_eq!(g.to_bits(), f.to_bits(), "{dtype}");
        }
        if dtype != GgmlType::Q5_0 {
            // 8 and 4-bit integers with one fp16 scale per 32: the file's own size.
            assert_eq!(e.bytes(), w.n_bytes() as u64, "{dtype}");
        }
        assert_eq!(r.bytes, e.bytes());
    }
}

#[test]
fn biased_types_are_near_with_the_error_measured() {
    for (dtype, data) in [
        (GgmlType::Q4_1, "uint4/32+offset"),
        (GgmlType::Q5_1, "int8/32+offset"),
        (GgmlType::Q4K, "uint4/32+offset"),
        (GgmlType::Q5K, "int8/32+offset"),
        (GgmlType::Q2K, "int4/16+offset"),
        (GgmlType::Q3K, "int4/16"),
        (GgmlType::Q6K, "int8/16"),
    ] {
        let w = weight("w", dtype, 4, 256, 7);
        let e = encode(&[Part::whole(&w)], WeightPolicy::Auto).unwrap();
        let r = &e.reports[0];
        assert_eq!(r.encoding, data, "{dtype}");
        let file = file_values(&w);
        let got = e.to_f32();
        let err = got
            .iter()
            .zip(&file)
            .map(|(g, f)| (g - f).abs())
            .fold(0f32, f32::max);
        assert_eq!(err, r.max_abs_err, "{dtype}");
        let amax = file.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(amax, r.max_abs);
        // fp16 scales and offsets: a few fp16 ulps of the largest weight at most.
        assert!(err <= amax * 4e-3, "{dtype}: {err} of {amax}");
        assert!(e.bytes() < (w.rows * w.cols * 2) as u64 * 6 / 10, "{dtype}");
    }
}

#[test]
fn stacks_promote_to_a_common_form() {
    // Gemma 3's QKV: Q5_0, Q5_0, Q8_0 → int8/32, exact.
    let q = weight("q", GgmlType::Q5_0, 4, 64, 1);
    let k = weight("k", GgmlType::Q5_0, 2, 64, 2);
    let v = weight("v", GgmlType::Q8_0, 2, 64, 3);
    let e = encode(
        &[Part::whole(&q), Part::whole(&k), Part::whole(&v)],
        WeightPolicy::Auto,
    )
    .unwrap();
    assert_eq!(e.rows, 8);
    assert!(e.reports.iter().all(|r| r.exact && r.encoding == "int8/32"));
    let want: Vec<f32> = [&q, &k, &v].iter().flat_map(|w| file_values(w)).collect();
    assert_eq!(e.to_f32(), want);
    // Q4_K beside Q6_K: blocks of 16, offsets (zero for Q6_K's rows).
    let a = weight("a", GgmlType::Q4K, 2, 256, 4);
    let b = weight("b", GgmlType::Q6K, 2, 256, 5);
    let e = encode(&[Part::whole(&a), Part::whole(&b)], WeightPolicy::Auto).unwrap();
    assert!(e.reports.iter().all(|r| r.encoding == "int8/16+offset"));
    let got = e.to_f32();
    let fb = file_values(&b);
    let amax = fb.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (g, f) in got[512..].iter().zip(&fb) {
        assert!((g - f).abs() <= amax * 2e-3);
    }
    let Encoding::Blockwise { block, .. } = e.encoding else {
        panic!("blockwise expected")
    };
    assert_eq!(block, 16);
}

/// The row L1 bound measured while encoding equals the one computed from the weights.
fn check_l1(e: &Encoded) {
    let want = e
        .to_f32()
        .chunks(e.cols)
        .map(|r| r.iter().map(|v| v.abs() as f64).sum::<f64>())
        .fold(0.0, f64::max) as f32;
    assert!(
        (e.max_row_l1() - want).abs() <= want * 1e-6,
        "{} vs {want}",
        e.max_row_l1()
    );
}

#[test]
fn row_l1_bounds() {
    let w = weight("w", GgmlType::Q4_1, 8, 64, 3);
    for p in [WeightPolicy::Auto, WeightPolicy::Fp16, WeightPolicy::Int4] {
        check_l1(&encode(&[Part::whole(&w)], p).unwrap());
    }
    let vals: Vec<f32> = (0..1024)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 8.0)
        .collect();
    let f = Weight::from_f32("f", 16, 64, &vals);
    check_l1(&encode(&[Part::whole(&f)], WeightPolicy::Int4).unwrap());
}

#[test]
fn head_tiles_take_row_ranges() {
    let w = weight("head", GgmlType::Q8_0, 10, 64, 9);
    let part = Part {
        weight: &w,
        first: 3,
        rows: 4,
    };
    let e = encode(&[part], WeightPolicy::Auto).unwrap();
    assert_eq!(e.reports[0].name, "head[3..7]");
    assert_eq!(e.to_f32(), file_values(&w)[3 * 64..7 * 64].to_vec());
}

#[test]
fn policies() {
    let w = weight("w", GgmlType::Q8_0, 4, 64, 11);
    // fp16: today's form, nothing reported as a fallback.
    let e = encode(&[Part::whole(&w)], WeightPolicy::Fp16).unwrap();
    assert!(matches!(e.encoding, Encoding::Fp16(_)));
    assert_eq!(e.reports[0].kept_fp16, None);
    let want: Vec<f32> = file_values(&w)
        .iter()
        .map(|&v| f16::from_f32(v).to_f32())
        .collect();
    assert_eq!(e.to_f32(), want);
    // int4 re-quantises 8-bit blocks: symmetric, error at most half a step.
    let e = encode(&[Part::whole(&w)], WeightPolicy::Int4).unwrap();
    assert_eq!(e.reports[0].encoding, "int4/32");
    assert!(!e.reports[0].exact);
    let file = file_values(&w);
    let got = e.to_f32();
    for (bg, bf) in got.chunks(32).zip(file.chunks(32)) {
        let step = bf.iter().fold(0f32, |m, v| m.max(v.abs())) / 7.0;
        for (g, f) in bg.iter().zip(bf) {
            assert!((g - f).abs() <= step * 0.5 + 1e-6, "{g} vs {f}");
        }
    }
    // Float weights: kept at fp16 by auto (with the reason), quantised by int8.
    let vals: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let f = Weight::from_f32("f", 4, 64, &vals);
    let e = encode(&[Part::whole(&f)], WeightPolicy::Auto).unwrap();
    assert!(matches!(e.encoding, Encoding::Fp16(_)));
    assert!(e.reports[0]
        .kept_fp16
        .as_deref()
        .unwrap()
        .contains("f32 is not"));
    let e = encode(&[Part::whole(&f)], WeightPolicy::Int8).unwrap();
    assert_eq!(e.reports[0].encoding, "int8/32");
    let got = e.to_f32();
    for (bg, bf) in got.chunks(32).zip(vals.chunks(32)) {
        let step = bf.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (g, f) in bg.iter().zip(bf) {
            assert!((g - f).abs() <= step * 0.5001, "{g} vs {f}");
        }
    }
    // int4 palettises float weights: 16 fp16 entries per group of rows, each weight its
    // nearest entry.
    let e = encode(&[Part::whole(&f)], WeightPolicy::Int4).unwrap();
    assert_eq!(e.reports[0].encoding, "lut4/4rows");
    let Encoding::Lut { lut, group, .. } = &e.encoding else {
        panic!("lut expected")
    };
    assert_eq!(*group, 4);
    let palette = lut.to_f32();
    let got = e.to_f32();
    for (g, x) in got.iter().zip(&vals) {
        let best = palette.iter().fold(f32::MAX, |m, p| m.min((p - x).abs()));
        assert!((g - x).abs() <= best + 1e-6, "{g} for {x}");
        assert!(palette.contains(g));
    }
    assert_eq!(e.bytes(), 256 / 2 + 32);
    // A float part stacked with an integer one: all fp16, the reason names the float part.
    let e = encode(&[Part::whole(&w), Part::whole(&f)], WeightPolicy::Auto).unwrap();
    assert!(matches!(e.encoding, Encoding::Fp16(_)));
    assert!(e.reports[0]
        .kept_fp16
        .as_deref()
        .unwrap()
        .contains("stacked with f"));
}

#[test]
fn constant_blocks_and_bad_input() {
    // A Q4_1 block with d = 0 and m = 0.5: every weight is 0.5.
    let mut b = vec![0u8; 20];
    b[2..4].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
    b[4..].fill(0x5a);
    let w = Weight::from_bytes("c", GgmlType::Q4_1, 1, 32, b);
    let e = encode(&[Part::whole(&w)], WeightPolicy::Auto).unwrap();
    assert!(e.to_f32().iter().all(|&v| v == 0.5));
    assert!(e.reports[0].exact);
    let a = weight("a", GgmlType::Q8_0, 1, 32, 1);
    let c = weight("wide", GgmlType::Q8_0, 1, 64, 1);
    let err = encode(&[Part::whole(&a), Part::whole(&c)], WeightPolicy::Auto)
        .unwrap_err()
        .to_string();
    assert!(err.contains("wide") && err.contains("columns"), "{err}");
    assert!("int5".parse::<WeightPolicy>().unwrap_err().contains("auto"));
}

fn on(forms: Forms, policy: WeightPolicy) -> WeightTarget {
    WeightTarget {
        policy,
        dialect: MilDialect::A,
        forms,
    }
}

#[test]
fn a_machine_without_4_bit_forms_holds_the_files_integers_as_int8() {
    let no4 = Forms {
        int4: Some("no 4-bit here"),
        lut: Some("no palettes here"),
        ..Forms::all()
    };
    for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4K] {
        let w = weight("w", dtype, 4, 256, 3);
        let narrow = encode(&[Part::whole(&w)], WeightPolicy::Auto).unwrap();
        let wide = encode(&[Part::whole(&w)], on(no4, WeightPolicy::Auto)).unwrap();
        assert!(
            wide.reports[0].encoding.starts_with("int8/"),
            "{dtype}: {:?}",
            wide.reports[0]
        );
        // The same weights, in wider containers.
        assert_eq!(wide.to_f32(), narrow.to_f32(), "{dtype}");
        assert!(wide.bytes() > narrow.bytes());
    }
    let w = weight("w", GgmlType::Q8_0, 4, 64, 3);
    let e = encode(&[Part::whole(&w)], on(no4, WeightPolicy::Int4)).unwrap_err();
    assert!(
        e.to_string()
            .contains("w: --weights int4 cannot apply: no 4-bit here"),
        "{e}"
    );
    let f = Weight::from_f32("f", 2, 32, &[0.5; 64]);
    let e = encode(
        &[Part::whole(&f)],
        on(Forms { int4: None, ..no4 }, WeightPolicy::Int4),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no palettes here"), "{e}");
}

#[test]
fn a_machine_without_blockwise_weights_keeps_fp16_and_says_why() {
    let none = Forms {
        int8: Some("probe saw it fail"),
        ..Forms::all()
    };
    let w = weight("w", GgmlType::Q4_0, 4, 64, 5);
    let e = encode(&[Part::whole(&w)], on(none, WeightPolicy::Auto)).unwrap();
    assert!(matches!(e.encoding, Encoding::Fp16(_)));
    let why = e.reports[0].kept_fp16.as_deref().unwrap();
    assert!(why.contains("probe saw it fail"), "{why}");
    let fp16: Vec<f32> = (file_values(&w).iter())
        .map(|&v| half::f16::from_f32(v).to_f32())
        .collect();
    assert_eq!(e.to_f32(), fp16);
    let err = encode(&[Part::whole(&w)], on(none, WeightPolicy::Int8)).unwrap_err();
    assert!(
        err.to_string().contains("--weights int8 cannot apply"),
        "{err}"
    );
    // fp16 asks nothing of the machine.
    assert!(encode(&[Part::whole(&w)], on(none, WeightPolicy::Fp16)).is_ok());
}
