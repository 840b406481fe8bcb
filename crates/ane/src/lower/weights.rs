//! Model weights as fp16 blob data: ggml rows dequantised to f32, then rounded to fp16.

use std::sync::Arc;

use anelm_mil::{DType, WeightData};
use anelm_model::plan::Linear;
use anelm_model::Weight;
use half::f16;
use rayon::prelude::*;

use crate::error::{AneError, Result};

const FP16_MAX: f32 = 65504.0;

/// Rows `first..` of `w` as fp16 values filling `out` (whole rows).
fn rows_f16(w: &Weight, first: usize, out: &mut [u8]) -> Result<()> {
    let cols = w.cols;
    out.par_chunks_mut(cols * 2).enumerate().try_for_each_init(
        || vec![0f32; cols],
        |row, (r, dst)| {
            w.dequantize_row(first + r, row)?;
            for (d, &v) in dst.chunks_exact_mut(2).zip(row.iter()) {
                if v.abs() > FP16_MAX || v.is_nan() {
                    return Err(AneError::Unsupported(format!(
                        "{}: row {} holds {v}, outside the fp16 range",
                        w.name,
                        first + r
                    )));
                }
                d.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
            Ok(())
        },
    )
}

/// The matrices of `ws` (all with the same number of columns) stacked row-wise, as fp16
/// `[Σ rows, cols]`.
pub fn stacked(ws: &[&Weight]) -> Result<Arc<WeightData>> {
    let cols = ws[0].cols;
    if let Some(w) = ws.iter().find(|w| w.cols != cols) {
        return Err(AneError::Unsupported(format!(
            "{} has {} columns, {} has {cols}",
            w.name, w.cols, ws[0].name
        )));
    }
    let rows: usize = ws.iter().map(|w| w.rows).sum();
    let mut bytes = vec![0u8; rows * cols * 2];
    let mut at = 0;
    for w in ws {
        rows_f16(w, 0, &mut bytes[at..at + w.rows * cols * 2])?;
        at += w.rows * cols * 2;
    }
    Ok(Arc::new(WeightData::from_bytes(
        DType::Fp16,
        rows * cols,
        bytes,
    )?))
}

/// Rows `first..first + rows` of one matrix as fp16 `[rows, cols]`.
pub fn row_range(w: &Weight, first: usize, rows: usize) -> Result<Arc<WeightData>> {
    let mut bytes = vec![0u8; rows * w.cols * 2];
    rows_f16(w, first, &mut bytes)?;
    Ok(Arc::new(WeightData::from_bytes(
        DType::Fp16,
        rows * w.cols,
        bytes,
    )?))
}

/// Biases stacked like their weights, each given with its row count (zeros where a part has
/// none); None when no part has a bias.
pub fn stacked_bias(parts: &[(Option<&[f32]>, usize)]) -> Option<Vec<f32>> {
    if parts.iter().all(|(b, _)| b.is_none()) {
        return None;
    }
    Some(
        parts
            .iter()
            .flat_map(|&(b, n)| b.map_or_else(|| vec![0.0; n], <[f32]>::to_vec))
            .collect(),
    )
}

/// The biases of linears stacked like their weights.
pub fn linear_biases(ls: &[&Linear]) -> Option<Vec<f32>> {
    stacked_bias(
        &ls.iter()
            .map(|l| (l.bias.as_deref(), l.out_features()))
            .collect::<Vec<_>>(),
    )
}

/// Bias values as fp16 blob data.
pub fn bias_data(b: Option<Vec<f32>>) -> Option<Arc<WeightData>> {
    b.map(|b| Arc::new(WeightData::f16_from_f32(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_rows_and_biases() {
        let a = Weight::from_f32("a", 1, 2, &[1.0, 2.0]);
        let b = Weight::from_f32("b", 2, 2, &[3.0, 4.0, 5.0, 1e-3]);
        let w = stacked(&[&a, &b]).unwrap();
        assert_eq!(
            w.to_f32(),
            [1.0, 2.0, 3.0, 4.0, 5.0, f16::from_f32(1e-3).to_f32()]
        );
        assert_eq!(
            row_range(&b, 1, 1).unwrap().to_f32(),
            [5.0, f16::from_f32(1e-3).to_f32()]
        );
        let huge = Weight::from_f32("huge", 1, 1, &[1e6]);
        let e = stacked(&[&huge]).unwrap_err().to_string();
        assert!(e.contains("huge") && e.contains("fp16"), "{e}");
        let la = Linear {
            weight: a,
            bias: None,
        };
        let lb = Linear {
            weight: b,
            bias: Some(vec![1.0, 2.0]),
        };
        assert_eq!(linear_biases(&[&la, &lb]).unwrap(), [0.0, 1.0, 2.0]);
        assert!(linear_biases(&[&la]).is_none());
    }
}
