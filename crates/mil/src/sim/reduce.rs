//! Reductions, softmax and layer_norm: accumulated in f32 over the fp16 inputs, results rounded
//! to the output dtype. (The ANE's internal precision for these is not documented; f32 is our
//! assumption. Softmax subtracts the maximum first, as an fp16-safe program would.)

use crate::dtype::DType;
use crate::error::{MilError, Result};

use super::numerics;
use super::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

impl Reduce {
    pub fn from_name(op: &str) -> Option<Reduce> {
        Some(match op {
            "reduce_sum" => Reduce::Sum,
            "reduce_mean" => Reduce::Mean,
            "reduce_max" => Reduce::Max,
            "reduce_min" => Reduce::Min,
            "reduce_prod" => Reduce::Prod,
            _ => return None,
        })
    }
}

/// `[outer, len, inner]` view of a shape around the contiguous axes `first..=last`.
fn fibers(shape: &[usize], first: usize, last: usize) -> (usize, usize, usize) {
    let p = |s: &[usize]| s.iter().product::<usize>();
    (
        p(&shape[..first]),
        p(&shape[first..=last]),
        p(&shape[last + 1..]),
    )
}

fn output(dtype: DType, shape: Vec<usize>, mut v: Vec<f32>) -> Result<Tensor> {
    if dtype == DType::Fp16 {
        numerics::round_in_place(&mut v);
    }
    Tensor::float(dtype, shape, v)
}

/// One axis, kept as length 1; f32 accumulation in index order.
fn reduce_axis(op: Reduce, v: &[f32], shape: &[usize], axis: usize) -> (Vec<f32>, Vec<usize>) {
    let (outer, len, inner) = fibers(shape, axis, axis);
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| v[(o * len + k) * inner + i];
            let r = match op {
                Reduce::Sum | Reduce::Mean => (0..len).map(at).sum::<f32>(),
                Reduce::Max => (0..len).map(at).fold(f32::NEG_INFINITY, f32::max),
                Reduce::Min => (0..len).map(at).fold(f32::INFINITY, f32::min),
                Reduce::Prod => (0..len).map(at).product(),
            };
            out.push(if op == Reduce::Mean {
                r / len as f32
            } else {
                r
            });
        }
    }
    let mut s = shape.to_vec();
    s[axis] = 1;
    (out, s)
}

pub fn reduce(op: Reduce, x: &Tensor, axes: &[usize], keep_dims: bool) -> Result<Tensor> {
    let mut v = x.floats()?.to_vec();
    let mut shape = x.shape.clone();
    for &a in axes {
        if a >= shape.len() {
            return Err(MilError::invalid(format!(
                "axis {a} out of range for {:?}",
                x.shape
            )));
        }
        (v, shape) = reduce_axis(op, &v, &shape, a);
    }
    if !keep_dims {
        shape = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
    }
    output(x.dtype, shape, v)
}

/// Index of the largest element along `axis` (first on ties), as int32.
pub fn argmax(x: &Tensor, axis: usize, keep_dims: bool) -> Result<Tensor> {
    let v = x.floats()?;
    if axis >= x.rank() {
        return Err(MilError::invalid(format!(
            "axis {axis} out of range for {:?}",
            x.shape
        )));
    }
    let (outer, len, inner) = fibers(&x.shape, axis, axis);
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0;
            for k in 1..len {
                if v[(o * len + k) * inner + i] > v[(o * len + best) * inner + i] {
                    best = k;
                }
            }
            out.push(best as i32);
        }
    }
    let mut shape = x.shape.clone();
    if keep_dims {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Tensor::int32(shape, out)
}

pub fn softmax(x: &Tensor, axis: usize) -> Result<Tensor> {
    let v = x.floats()?;
    if axis >= x.rank() {
        return Err(MilError::invalid(format!(
            "axis {axis} out of range for {:?}",
            x.shape
        )));
    }
    let (outer, len, inner) = fibers(&x.shape, axis, axis);
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * len + k) * inner + i;
            let max = (0..len).map(|k| v[at(k)]).fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for k in 0..len {
                let e = (v[at(k)] - max).exp();
                out[at(k)] = e;
                sum += e;
            }
            for k in 0..len {
                out[at(k)] /= sum;
            }
        }
    }
    output(x.dtype, x.shape.clone(), out)
}

/// `(x - mean) / sqrt(var + eps) * gamma + beta` over the contiguous `axes`.
pub fn layer_norm(
    x: &Tensor,
    axes: &[usize],
    gamma: Option<&Tensor>,
    beta: Option<&Tensor>,
    eps: f32,
) -> Result<Tensor> {
    let v = x.floats()?;
    let (first, last) = match (axes.iter().min(), axes.iter().max()) {
        (Some(&a), Some(&b)) if b - a + 1 == axes.len() && b < x.rank() => (a, b),
        _ => {
            return Err(MilError::invalid(format!(
                "layer_norm over axes {axes:?} of {:?}: the simulator needs contiguous axes",
                x.shape
            )))
        }
    };
    let (outer, len, inner) = fibers(&x.shape, first, last);
    let param = |t: Option<&Tensor>, default: f32| -> Result<Vec<f32>> {
        match t {
            None => Ok(vec![default; len]),
            Some(t) if t.numel() == len => Ok(t.floats()?.to_vec()),
            Some(t) => Err(MilError::invalid(format!(
                "gamma/beta of shape {:?} do not match {len} normalised elements",
                t.shape
            ))),
        }
    };
    let (g, b) = (param(gamma, 1.0)?, param(beta, 0.0)?);
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * len + k) * inner + i;
            let mean = (0..len).map(|k| v[at(k)]).sum::<f32>() / len as f32;
            let var = (0..len).map(|k| (v[at(k)] - mean).powi(2)).sum::<f32>() / len as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for k in 0..len {
                out[at(k)] = (v[at(k)] - mean) * inv * g[k] + b[k];
            }
        }
    }
    output(x.dtype, x.shape.clone(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::fp16(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn reductions_over_any_axes() {
        let x = t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            reduce(Reduce::Sum, &x, &[1], false)
                .unwrap()
                .floats()
                .unwrap(),
            &[6.0, 15.0]
        );
        let m = reduce(Reduce::Max, &x, &[0], true).unwrap();
        assert_eq!(
            (m.shape.clone(), m.floats().unwrap().to_vec()),
            (vec![1, 3], vec![4.0, 5.0, 6.0])
        );
        assert_eq!(
            reduce(Reduce::Mean, &x, &[0, 1], false)
                .unwrap()
                .floats()
                .unwrap(),
            &[3.5]
        );
        assert_eq!(argmax(&x, 1, false).unwrap().ints().unwrap(), &[2, 2]);
    }

    #[test]
    fn softmax_and_layer_norm() {
        let x = t(&[1, 3], &[0.0, 1.0, 2.0]);
        let s = softmax(&x, 1).unwrap();
        let e: Vec<f32> = [0.0f32, 1.0, 2.0].iter().map(|v| (v - 2.0).exp()).collect();
        let sum: f32 = e.iter().sum();
        let want: Vec<f32> = e.iter().map(|v| numerics::round(v / sum)).collect();
        assert_eq!(s.floats().unwrap(), &want[..]);
        // Normalising over the channel axis of a [1, C, 1, W] activation.
        let x = t(&[1, 2, 1, 2], &[1.0, 10.0, 3.0, 30.0]);
        let y = layer_norm(&x, &[1], None, None, 0.0).unwrap();
        assert_eq!(y.floats().unwrap(), &[-1.0, -1.0, 1.0, 1.0]);
        assert!(layer_norm(&x, &[1, 3], None, None, 0.0).is_err());
    }
}
