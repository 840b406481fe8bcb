//! Model weights as program data: matrices stacked in the policy's encoding ([`super::encode`]),
//! biases as fp16.

use std::sync::Arc;

use anelm_mil::WeightData;
use anelm_model::plan::Linear;
use anelm_model::Weight;

use super::encode::{encode, Encoded, Part, WeightTarget};
use crate::error::Result;

/// The matrices of `ws` (all with the same number of columns) stacked row-wise, in the form
/// `target` gives them.
pub fn stacked(ws: &[&Weight], target: WeightTarget) -> Result<Encoded> {
    encode(
        &ws.iter().map(|w| Part::whole(w)).collect::<Vec<_>>(),
        target,
    )
}

/// Rows `first..first + rows` of one matrix.
pub fn row_range(w: &Weight, first: usize, rows: usize, target: WeightTarget) -> Result<Encoded> {
    encode(
        &[Part {
            weight: w,
            first,
            rows,
        }],
        target,
    )
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
    use crate::lower::WeightPolicy;

    #[test]
    fn stacks_rows_and_biases() {
        let a = Weight::from_f32("a", 1, 2, &[1.0, 2.0]);
        let b = Weight::from_f32("b", 2, 2, &[3.0, 4.0, 5.0, 1e-3]);
        let w = stacked(&[&a, &b], WeightPolicy::Auto.into()).unwrap();
        assert_eq!(
            w.to_f32(),
            [1.0, 2.0, 3.0, 4.0, 5.0, half::f16::from_f32(1e-3).to_f32()]
        );
        assert_eq!(
            row_range(&b, 1, 1, WeightPolicy::Fp16.into())
                .unwrap()
                .to_f32(),
            [5.0, half::f16::from_f32(1e-3).to_f32()]
        );
        let huge = Weight::from_f32("huge", 1, 1, &[1e6]);
        let e = stacked(&[&huge], WeightPolicy::Auto.into())
            .unwrap_err()
            .to_string();
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
