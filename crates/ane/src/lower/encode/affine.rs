//! Weights in dialect B (iOS16), whose opset has no blockwise or grouped-palette op: fp16 (the
//! file's values exactly), or per-channel uint8 through `constexpr_affine_dequantize`.
//!
//! A GGUF block scale cannot be expressed per channel, so the file's integers do not survive
//! into dialect B: `auto` keeps the file's values exactly as fp16 and says why for every
//! tensor; `int8` re-quantises each row to 256 levels (asymmetric, the row's range including
//! zero) and reports the error against the file; `int4` has no iOS16 form worth its error (one
//! palette per tensor) and is refused.

use std::sync::Arc;

use anelm_formats::quant::blockwise::int_form;
use anelm_mil::{DType, WeightData};
use half::f16;
use rayon::prelude::*;

use super::{fp16_stack, Encoded, Encoding, Forms, Part, Plan, TensorReport, WeightPolicy};
use crate::error::{AneError, Result};

/// `parts` stacked in the form `policy` gives them in dialect B.
pub(super) fn encode_ios16(parts: &[Part], policy: WeightPolicy, forms: &Forms) -> Result<Encoded> {
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    let cols = parts[0].weight.cols;
    if let Some(p) = parts.iter().find(|p| p.weight.cols != cols) {
        return Err(AneError::Unsupported(format!(
            "{} has {} columns, {} has {cols}",
            p.weight.name, p.weight.cols, parts[0].weight.name
        )));
    }
    match policy {
        WeightPolicy::Fp16 => super::encode_parts(parts, WeightPolicy::Fp16, forms),
        WeightPolicy::Auto => {
            let plans: Vec<Plan> = parts
                .iter()
                .map(|p| {
                    Plan::Fp16(if int_form(p.weight.dtype).is_some() {
                        format!(
                            "dialect B (ios16) has no blockwise weights: the file's {} values \
                             are kept exactly as fp16 (--weights int8 holds them per-channel, \
                             re-quantised; dialect A holds the file's integers)",
                            p.weight.dtype
                        )
                    } else {
                        format!(
                            "{} is not integers times a block scale: the file's precision is \
                             kept as fp16",
                            p.weight.dtype
                        )
                    })
                })
                .collect();
            fp16_stack(parts, &plans, 0, rows, cols)
        }
        WeightPolicy::Int8 => match forms.affine {
            Some(why) => Err(super::cannot(parts, policy, why)),
            None => affine_stack(parts, rows, cols),
        },
        WeightPolicy::Int4 => Err(AneError::Unsupported(format!(
            "{}: --weights int4 needs dialect A (ios18: 4-bit blocks and a palette per 16 rows); \
             dialect B (ios16) holds weights as fp16 or per-channel int8 (--weights int8)",
            parts[0].name()
        ))),
    }
}

/// One row as `scale * (q - zero_point)`, q in 0..=255: the range spans the row's values and
/// zero, the scale is fp16 (the op's output type) and the integers are rounded with it.
fn quantize_row(row: &[f32], q: &mut [u8]) -> (f16, u8) {
    let (lo, hi) = row
        .iter()
        .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let s = f16::from_f32((hi - lo) / 255.0);
    let sf = s.to_f32();
    if sf == 0.0 || !sf.is_finite() {
        q.fill(0);
        return (f16::ZERO, 0);
    }
    let zp = (-lo / sf).round().clamp(0.0, 255.0);
    for (qi, &v) in q.iter_mut().zip(row) {
        *qi = (v / sf + zp).round().clamp(0.0, 255.0) as u8;
    }
    (s, zp as u8)
}

fn affine_stack(parts: &[Part], rows: usize, cols: usize) -> Result<Encoded> {
    let mut data = vec![0u8; rows * cols];
    let mut scales = Vec::with_capacity(rows);
    let mut zps = Vec::with_capacity(rows);
    let mut reports = Vec::new();
    let mut max_l1 = 0f32;
    let mut at = 0;
    for p in parts {
        let v = p.values()?;
        let dst = &mut data[at * cols..(at + p.rows) * cols];
        // Per row: scale, zero point, largest error, largest |value|, L1 of the held weights.
        let per_row: Vec<(f16, u8, f32, f32, f32)> = dst
            .par_chunks_mut(cols)
            .zip(v.par_chunks(cols))
            .map(|(q, x)| {
                let (s, zp) = quantize_row(x, q);
                let (sf, zf) = (s.to_f32(), f32::from(zp));
                let (mut err, mut amax, mut l1) = (0f32, 0f32, 0f32);
                for (&qi, &xi) in q.iter().zip(x) {
                    let w = sf * (f32::from(qi) - zf);
                    err = err.max((w - xi).abs());
                    amax = amax.max(xi.abs());
                    l1 += w.abs();
                }
                (s, zp, err, amax, l1)
            })
            .collect();
        let (mut max_err, mut max_abs) = (0f32, 0f32);
        for &(s, zp, err, amax, l1) in &per_row {
            scales.push(s);
            zps.push(zp);
            max_err = max_err.max(err);
            max_abs = max_abs.max(amax);
            max_l1 = max_l1.max(l1);
        }
        reports.push(TensorReport {
            name: p.name(),
            source: p.weight.dtype.to_string(),
            encoding: "uint8/row+zero_point".into(),
            weights: (p.rows * cols) as u64,
            bytes: (p.rows * (cols + 3)) as u64,
            exact: max_err == 0.0,
            max_abs_err: max_err,
            max_abs,
            kept_fp16: None,
        });
        at += p.rows;
    }
    Ok(Encoded {
        encoding: Encoding::Affine {
            data: Arc::new(WeightData::from_bytes(DType::Uint8, rows * cols, data)?),
            scale: Arc::new(WeightData::f16(&scales)),
            zero_point: Arc::new(WeightData::u8(&zps)),
        },
        rows,
        cols,
        reports,
        max_row_l1: max_l1,
    })
}

/// The weights `scale[row] * (data - zero_point[row])` define, in f32.
pub(super) fn to_f32(
    data: &WeightData,
    scale: &WeightData,
    zero_point: &WeightData,
    cols: usize,
) -> Vec<f32> {
    let (d, s, z) = (data.to_f32(), scale.to_f32(), zero_point.to_f32());
    d.iter()
        .enumerate()
        .map(|(i, &q)| s[i / cols] * (q - z[i / cols]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::MilDialect;
    use crate::lower::encode::{encode, WeightTarget};
    use anelm_formats::GgmlType;
    use anelm_model::Weight;

    fn target(policy: WeightPolicy) -> WeightTarget {
        WeightTarget {
            policy,
            dialect: MilDialect::B,
            forms: Forms::all(),
        }
    }

    fn float_weight(rows: usize, cols: usize) -> Weight {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 40.0) / 97.0)
            .collect();
        Weight::from_f32("w", rows, cols, &v)
    }

    #[test]
    fn int8_rows_hold_within_half_a_step_and_emit_the_ios16_op() {
        let w = float_weight(6, 64);
        let e = encode(&[Part::whole(&w)], target(WeightPolicy::Int8)).unwrap();
        assert!(matches!(e.encoding, Encoding::Affine { .. }));
        let want = w.to_f32().unwrap();
        let got = e.to_f32();
        for (r, (g, x)) in got.chunks(64).zip(want.chunks(64)).enumerate() {
            let (lo, hi) = x
                .iter()
                .fold((0f32, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
            let step = (hi - lo) / 255.0;
            for (a, b) in g.iter().zip(x) {
                assert!((a - b).abs() <= step * 0.51 + 1e-6, "row {r}: {a} vs {b}");
            }
        }
        assert_eq!(e.bytes(), (6 * 64 + 6 * 3) as u64);
        assert_eq!(e.reports[0].encoding, "uint8/row+zero_point");
        assert!(!e.reports[0].exact && e.reports[0].max_abs_err > 0.0);
        // It is the one weight op of ios16, and its type checks there.
        let mut f = anelm_mil::FunctionBuilder::new("main", anelm_mil::Opset::Ios16);
        let v = e.emit(&mut f, "w").unwrap();
        assert_eq!(
            f.type_of(v).unwrap(),
            &anelm_mil::TensorType::fp16([6, 64, 1, 1])
        );
    }

    #[test]
    fn auto_keeps_integer_blocks_exactly_as_fp16_and_says_why() {
        let bytes = anelm_formats::quant::blockwise::sample_blocks(GgmlType::Q4_0, 4 * 2, 7);
        let w = Weight::from_bytes("q", GgmlType::Q4_0, 4, 64, bytes);
        let e = encode(&[Part::whole(&w)], target(WeightPolicy::Auto)).unwrap();
        assert!(matches!(e.encoding, Encoding::Fp16(_)));
        let r = &e.reports[0];
        assert!(r.exact);
        assert!(
            r.kept_fp16.as_deref().unwrap().contains("dialect B"),
            "{r:?}"
        );
        // The same part in dialect A keeps the file's integers.
        let a = encode(&[Part::whole(&w)], WeightPolicy::Auto).unwrap();
        assert!(matches!(a.encoding, Encoding::Blockwise { .. }));
        assert_eq!(a.to_f32(), w.to_f32().unwrap());
    }

    #[test]
    fn int4_is_refused_naming_the_tensor() {
        let w = float_weight(2, 32);
        let e = encode(&[Part::whole(&w)], target(WeightPolicy::Int4)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("w:") && msg.contains("dialect A"), "{msg}");
    }

    #[test]
    fn a_zero_row_stays_zero_and_a_constant_row_is_within_a_step() {
        let mut v = vec![0f32; 2 * 32];
        v[32..].fill(0.5);
        let w = Weight::from_f32("c", 2, 32, &v);
        let e = encode(&[Part::whole(&w)], target(WeightPolicy::Int8)).unwrap();
        let got = e.to_f32();
        assert!(got[..32].iter().all(|&x| x == 0.0));
        assert!(
            got[32..].iter().all(|&x| (x - 0.5).abs() <= 0.5 / 255.0),
            "{got:?}"
        );
    }
}
