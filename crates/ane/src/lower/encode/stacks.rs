//! Building a stack of weight parts in one encoding: fp16, integer blocks with their fp16
//! scales and offsets, or a palette (lookup table) per group of rows.

use super::*;

/// The stack as fp16; `first_fp16` names the part that forced it (all parts are listed).
pub(super) fn fp16_stack(
    parts: &[Part],
    plans: &[Plan],
    first_fp16: usize,
    rows: usize,
    cols: usize,
) -> Result<Encoded> {
    let mut bytes = Vec::with_capacity(rows * cols * 2);
    let mut reports = Vec::new();
    let mut max_l1 = 0f64;
    for (p, plan) in parts.iter().zip(plans) {
        let v = p.values()?;
        let mut max_abs = 0f32;
        for (r, row) in v.chunks(cols).enumerate() {
            let mut l1 = 0f64;
            for &x in row {
                l1 += f64::from(f16::from_f32(x).to_f32().abs());
                if x.abs() > 65504.0 || x.is_nan() {
                    return Err(AneError::Unsupported(format!(
                        "{}: row {} holds {x}, outside the fp16 range",
                        p.weight.name,
                        p.first + r
                    )));
                }
                max_abs = max_abs.max(x.abs());
                bytes.extend_from_slice(&f16::from_f32(x).to_le_bytes());
            }
            max_l1 = max_l1.max(l1);
        }
        let kept_fp16 = match plan {
            Plan::Fp16(why) => Some(why.clone()),
            Plan::Ints(_) => Some(format!(
                "stacked with {}, which is held as fp16",
                parts[first_fp16].weight.name
            )),
        };
        reports.push(TensorReport {
            name: p.name(),
            source: p.weight.dtype.to_string(),
            encoding: "fp16".into(),
            weights: (p.rows * cols) as u64,
            bytes: (p.rows * cols * 2) as u64,
            exact: true,
            max_abs_err: 0.0,
            max_abs,
            kept_fp16: kept_fp16.filter(|w| w != "--weights fp16"),
        });
    }
    Ok(Encoded {
        encoding: Encoding::Fp16(Arc::new(WeightData::from_bytes(
            DType::Fp16,
            rows * cols,
            bytes,
        )?)),
        rows,
        cols,
        reports,
        max_row_l1: max_l1 as f32,
    })
}

/// The parts' integers as one blockwise weight; `sub_byte`: 4-bit data where the integers fit.
pub(super) fn blockwise_stack(
    parts: &[Part],
    mats: Vec<IntMatrix>,
    rows: usize,
    cols: usize,
    sub_byte: bool,
) -> Result<Encoded> {
    let block = mats.iter().fold(0, |g, m| gcd(g, m.block));
    let biased = mats.iter().any(|m| m.biases.is_some());
    let mats: Vec<IntMatrix> = mats
        .into_iter()
        .map(|m| {
            let m = m.reblock(block);
            if biased {
                m.with_biases()
            } else {
                m
            }
        })
        .collect();
    let (lo, hi) = mats.iter().fold((i8::MAX, i8::MIN), |(lo, hi), m| {
        let (a, b) = m.int_range();
        (lo.min(a), hi.max(b))
    });
    // A block whose scale is 0 but bias is not stores q = 1: keep 1 representable.
    let (lo, hi) = (lo.min(0), hi.max(1));
    let data_type = if !sub_byte {
        DType::Int8
    } else if lo >= -8 && hi <= 7 {
        DType::Int4
    } else if lo >= 0 && hi <= 15 {
        DType::Uint4
    } else {
        DType::Int8
    };
    let n_blocks = rows * cols / block;
    let mut ints: Vec<i8> = Vec::new();
    let mut scales: Vec<f16> = Vec::with_capacity(n_blocks);
    let mut offsets: Vec<f16> = Vec::with_capacity(if biased { n_blocks } else { 0 });
    let mut reports = Vec::new();
    let per_weight_bytes = |n: usize| {
        let data = n as f64 * f64::from(data_type.bits()) / 8.0;
        let meta = (n / block) as f64 * if biased { 4.0 } else { 2.0 };
        (data + meta).round() as u64
    };
    let mut file = vec![0f32; cols];
    let mut max_l1 = 0f64;
    for (p, mut m) in parts.iter().zip(mats) {
        let (mut max_err, mut max_abs, mut exact) = (0f32, 0f32, true);
        let per_row = cols / block;
        for (r, row) in m.ints.chunks_mut(cols).enumerate() {
            // The reference is the file's value (re-quantised parts differ from their integers).
            p.weight.dequantize_row(p.first + r, &mut file)?;
            let mut l1 = 0f64;
            for (j, q) in row.chunks_mut(block).enumerate() {
                let b = r * per_row + j;
                let bias = m.biases.as_ref().map_or(0.0, |v| v[b]);
                let (s, o, constant) = fp16_block(m.scales[b], bias);
                if !s.is_finite() {
                    return Err(AneError::Unsupported(format!(
                        "{}: row {} has a block scale of {}, outside the fp16 range",
                        p.weight.name,
                        p.first + r,
                        m.scales[b]
                    )));
                }
                scales.push(s);
                if biased {
                    offsets.push(o);
                }
                let (sf, of) = (s.to_f32(), o.to_f32());
                for (k, qi) in q.iter_mut().enumerate() {
                    if constant {
                        *qi = 1;
                    }
                    let qi = *qi;
                    let want = file[j * block + k];
                    let ours = sf * (f32::from(qi) - of);
                    l1 += f64::from(ours.abs());
                    if ours.to_bits() != want.to_bits() && !(ours == 0.0 && want == 0.0) {
                        exact = false;
                    }
                    max_err = max_err.max((ours - want).abs());
                    max_abs = max_abs.max(want.abs());
                }
            }
            max_l1 = max_l1.max(l1);
        }
        // The first part's integers become the data in place (a head tile is one part).
        if ints.is_empty() {
            ints = std::mem::take(&mut m.ints);
        } else {
            ints.extend_from_slice(&m.ints);
        }
        reports.push(TensorReport {
            name: p.name(),
            source: p.weight.dtype.to_string(),
            encoding: format!(
                "{}/{block}{}",
                data_type.name(),
                if biased { "+offset" } else { "" }
            ),
            weights: (p.rows * cols) as u64,
            bytes: per_weight_bytes(p.rows * cols),
            exact,
            max_abs_err: max_err,
            max_abs,
            kept_fp16: None,
        });
    }
    let data = match data_type {
        DType::Int4 => WeightData::int4(&ints)?,
        DType::Uint4 => {
            // The same allocation, reinterpreted (in-place collect): values are 0..=15.
            let u: Vec<u8> = ints.into_iter().map(|q| q as u8).collect();
            WeightData::uint4(&u)?
        }
        _ => {
            let n = ints.len();
            WeightData::from_bytes(DType::Int8, n, ints.into_iter().map(|q| q as u8).collect())?
        }
    };
    Ok(Encoded {
        encoding: Encoding::Blockwise {
            data: Arc::new(data),
            scale: Arc::new(WeightData::f16(&scales)),
            offset: biased.then(|| Arc::new(WeightData::f16(&offsets))),
            block,
        },
        rows,
        cols,
        reports,
        max_row_l1: max_l1 as f32,
    })
}

/// Float parts palettised with 4-bit indices: one k-means palette per group of rows.
pub(super) fn lut_stack(parts: &[Part], rows: usize, cols: usize) -> Result<Encoded> {
    let group = parts.iter().fold(LUT_GROUP, |g, p| gcd(g, p.rows));
    let mut indices = Vec::with_capacity(rows * cols);
    let mut lut: Vec<f16> = Vec::with_capacity(rows / group * 16);
    let mut reports = Vec::new();
    let mut max_l1 = 0f64;
    for p in parts {
        // Each part's palettes are its own (per gcd(16, its rows) rows, as it would be alone),
        // repeated for the stack's smaller groups: the weights do not depend on the stacking.
        let own = gcd(LUT_GROUP, p.rows);
        let v = p.values()?;
        let groups: Vec<(Vec<f32>, Vec<u8>)> = v
            .par_chunks(own * cols)
            .map(|g| palette::kmeans(g, 16, LUT_SEED, 30))
            .collect();
        let (mut max_err, mut max_abs) = (0f32, 0f32);
        for ((c, idx), g) in groups.iter().zip(v.chunks(own * cols)) {
            for _ in 0..own / group {
                lut.extend(c.iter().map(|&x| f16::from_f32(x)));
            }
            for (ir, xr) in idx.chunks(cols).zip(g.chunks(cols)) {
                let mut l1 = 0f64;
                for (&i, &x) in ir.iter().zip(xr) {
                    max_err = max_err.max((c[i as usize] - x).abs());
                    max_abs = max_abs.max(x.abs());
                    l1 += f64::from(c[i as usize].abs());
                }
                max_l1 = max_l1.max(l1);
            }
            indices.extend_from_slice(idx);
        }
        let n = p.rows * cols;
        reports.push(TensorReport {
            name: p.name(),
            source: p.weight.dtype.to_string(),
            encoding: format!("lut4/{group}rows"),
            weights: n as u64,
            bytes: (n / 2 + p.rows / group * 32) as u64,
            exact: max_err == 0.0,
            max_abs_err: max_err,
            max_abs,
            kept_fp16: None,
        });
    }
    Ok(Encoded {
        encoding: Encoding::Lut {
            indices: Arc::new(WeightData::uint4(&indices)?),
            lut: Arc::new(WeightData::f16(&lut)),
            group,
        },
        rows,
        cols,
        reports,
        max_row_l1: max_l1 as f32,
    })
}
