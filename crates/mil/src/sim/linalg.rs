//! `conv` (1×1 kernels) and `matmul`, both on the multiply-accumulate core ([`super::mac`]).

use half::f16;

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::literal::Literal;

use super::mac::gemm;
use super::tensor::Tensor;

/// Constant weights of a 1×1 convolution, `[cout, cin]` row-major in fp16.
#[derive(Debug, Clone)]
pub struct ConvWeights {
    pub cout: usize,
    pub cin: usize,
    pub values: Vec<f16>,
}

impl ConvWeights {
    /// From a `[cout, cin, 1, 1]` fp16 tensor.
    pub fn from_tensor(w: &Tensor) -> Result<ConvWeights> {
        let (cout, cin) = Self::dims(w.dtype, &w.shape)?;
        Ok(ConvWeights {
            cout,
            cin,
            values: w.floats()?.iter().map(|&v| f16::from_f32(v)).collect(),
        })
    }

    /// From a constant: fp16 blob data is taken as is (no round trip through f32).
    pub fn from_literal(lit: &Literal) -> Result<ConvWeights> {
        match lit.weight_data() {
            Some(d) if d.dtype() == DType::Fp16 => {
                let (cout, cin) = Self::dims(d.dtype(), &lit.ty().shape)?;
                let values = d
                    .as_bytes()
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect();
                Ok(ConvWeights { cout, cin, values })
            }
            _ => Self::from_tensor(&Tensor::from_literal(lit)?),
        }
    }

    pub(super) fn dims(dtype: DType, shape: &[usize]) -> Result<(usize, usize)> {
        match (dtype, shape) {
            (DType::Fp16, &[cout, cin, 1, 1]) => Ok((cout, cin)),
            (DType::Fp16, s) => Err(MilError::invalid(format!(
                "conv weight {s:?}: the simulator runs 1x1 kernels only"
            ))),
            (d, _) => Err(MilError::invalid(format!(
                "conv weight is {d}; the simulator models fp16 convolutions"
            ))),
        }
    }
}

/// `y[n, o, h, w] = Σ_c W[o, c] · x[n, c, h, w]` (1×1 kernel, stride 1, no padding, one group).
pub fn conv1x1(x: &Tensor, w: &ConvWeights) -> Result<Tensor> {
    if x.dtype != DType::Fp16 {
        return Err(MilError::invalid(format!(
            "conv input is {}; the simulator models fp16 convolutions",
            x.dtype
        )));
    }
    let &[batch, cin, h, wd] = x.shape.as_slice() else {
        return Err(MilError::invalid(format!(
            "conv input {:?} is not [N, C, H, W]",
            x.shape
        )));
    };
    if cin != w.cin {
        return Err(MilError::invalid(format!(
            "conv input has {cin} channels, the weight {}",
            w.cin
        )));
    }
    let cols = h * wd;
    let xv = x.floats()?;
    let mut y = vec![0f32; batch * w.cout * cols];
    for b in 0..batch {
        let xs = &xv[b * cin * cols..(b + 1) * cin * cols];
        let ys = &mut y[b * w.cout * cols..(b + 1) * w.cout * cols];
        gemm(&w.values, w.cout, cin, xs, cols, cols, ys, cols);
    }
    Tensor::float(DType::Fp16, vec![batch, w.cout, h, wd], y)
}

/// MIL `matmul` of two fp16 tensors of rank ≥ 2 with broadcast batch dimensions.
pub fn matmul(x: &Tensor, y: &Tensor, transpose_x: bool, transpose_y: bool) -> Result<Tensor> {
    if x.dtype != DType::Fp16 || y.dtype != DType::Fp16 {
        return Err(MilError::invalid(format!(
            "matmul of {} and {}: the simulator models fp16 matmul",
            x.dtype, y.dtype
        )));
    }
    if x.rank() < 2 || y.rank() < 2 {
        return Err(MilError::invalid(format!(
            "matmul of {:?} and {:?}: the simulator needs rank >= 2",
            x.shape, y.shape
        )));
    }
    let (rx, ry) = (x.rank(), y.rank());
    let (xr, xc) = (x.shape[rx - 2], x.shape[rx - 1]);
    let (yr, yc) = (y.shape[ry - 2], y.shape[ry - 1]);
    let (m, k) = if transpose_x { (xc, xr) } else { (xr, xc) };
    let (k2, n) = if transpose_y { (yc, yr) } else { (yr, yc) };
    if k != k2 {
        return Err(MilError::invalid(format!(
            "matmul inner dimensions differ: {:?} x {:?}",
            x.shape, y.shape
        )));
    }
    let batch = crate::ops::broadcast(&x.shape[..rx - 2], &y.shape[..ry - 2])?;
    let nb: usize = batch.iter().product();
    let (xv, yv) = (x.floats()?, y.floats()?);
    // Flat index of batch `b` in an operand whose batch dims broadcast to `batch`.
    let batch_index = |dims: &[usize], b: usize| -> usize {
        let pad = batch.len() - dims.len();
        let (mut rem, mut idx, mut stride) = (b, 0, 1);
        for a in (0..batch.len()).rev() {
            let i = rem % batch[a];
            rem /= batch[a];
            if a >= pad {
                let d = dims[a - pad];
                if d != 1 {
                    idx += i * stride;
                }
                stride *= d;
            }
        }
        idx
    };
    let mut out = vec![0f32; nb * m * n];
    let mut a = vec![f16::ZERO; m * k];
    let mut bm = vec![0f32; k * n];
    for b in 0..nb {
        let xs = &xv[batch_index(&x.shape[..rx - 2], b) * xr * xc..][..xr * xc];
        let ys = &yv[batch_index(&y.shape[..ry - 2], b) * yr * yc..][..yr * yc];
        for i in 0..m {
            for c in 0..k {
                a[i * k + c] = f16::from_f32(if transpose_x {
                    xs[c * xc + i]
                } else {
                    xs[i * xc + c]
                });
            }
        }
        for c in 0..k {
            for j in 0..n {
                bm[c * n + j] = if transpose_y {
                    ys[j * yc + c]
                } else {
                    ys[c * yc + j]
                };
            }
        }
        gemm(&a, m, k, &bm, n, n, &mut out[b * m * n..(b + 1) * m * n], n);
    }
    let mut shape = batch;
    shape.extend([m, n]);
    Tensor::float(DType::Fp16, shape, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_and_matmul_agree_with_plain_products() {
        let x = Tensor::fp16([1, 2, 1, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let w = Tensor::fp16([2, 2, 1, 1], vec![1.0, 1.0, 0.5, -1.0]).unwrap();
        let y = conv1x1(&x, &ConvWeights::from_tensor(&w).unwrap()).unwrap();
        assert_eq!(y.floats().unwrap(), &[5.0, 7.0, 9.0, -3.5, -4.0, -4.5]);
        let a = Tensor::fp16([2, 1, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::fp16([2, 2], vec![1.0, 0.0, 0.0, 2.0]).unwrap();
        let p = matmul(&a, &b, false, true).unwrap();
        assert_eq!(
            (p.shape.clone(), p.floats().unwrap().to_vec()),
            (vec![2, 1, 2], vec![1.0, 4.0, 3.0, 8.0])
        );
        let q = matmul(&a, &a, true, false).unwrap();
        assert_eq!(
            q.floats().unwrap(),
            &[1.0, 2.0, 2.0, 4.0, 9.0, 12.0, 12.0, 16.0]
        );
        let bad = Tensor::fp16([3, 3, 1, 1], vec![0.0; 9]).unwrap();
        assert!(conv1x1(&x, &ConvWeights::from_tensor(&bad).unwrap()).is_err());
    }
}
