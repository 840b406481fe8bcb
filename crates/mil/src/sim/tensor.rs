//! The simulator's values: a dtype, a shape and row-major elements. Floats are held as f32 —
//! an fp16 tensor holds only values exactly representable in fp16.

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::literal::{Elements, Literal};

use super::numerics;

#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// fp16 or fp32 elements.
    Float(Vec<f32>),
    Int(Vec<i32>),
    Bool(Vec<bool>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    /// An fp16 tensor from f32 values, each rounded to fp16.
    pub fn fp16(shape: impl Into<Vec<usize>>, mut values: Vec<f32>) -> Result<Tensor> {
        numerics::round_in_place(&mut values);
        Tensor::float(DType::Fp16, shape, values)
    }

    /// A float tensor whose values already have `dtype`'s precision.
    pub fn float(dtype: DType, shape: impl Into<Vec<usize>>, values: Vec<f32>) -> Result<Tensor> {
        let shape = shape.into();
        check_len(&shape, values.len())?;
        if !matches!(dtype, DType::Fp16 | DType::Fp32) {
            return Err(MilError::invalid(format!(
                "{dtype} is not a float type the simulator holds"
            )));
        }
        Ok(Tensor {
            dtype,
            shape,
            data: Data::Float(values),
        })
    }

    pub fn int32(shape: impl Into<Vec<usize>>, values: Vec<i32>) -> Result<Tensor> {
        let shape = shape.into();
        check_len(&shape, values.len())?;
        Ok(Tensor {
            dtype: DType::Int32,
            shape,
            data: Data::Int(values),
        })
    }

    pub fn bool(shape: impl Into<Vec<usize>>, values: Vec<bool>) -> Result<Tensor> {
        let shape = shape.into();
        check_len(&shape, values.len())?;
        Ok(Tensor {
            dtype: DType::Bool,
            shape,
            data: Data::Bool(values),
        })
    }

    /// The value of a constant (inline, or a loaded blob). Floats keep their precision
    /// (fp64 constants become fp32); every integer type becomes int32.
    pub fn from_literal(lit: &Literal) -> Result<Tensor> {
        let ty = lit.ty();
        let shape = ty.shape.clone();
        match (ty.dtype, lit.elements()) {
            (DType::Bool, Some(Elements::Bool(v))) => Tensor::bool(shape, v.clone()),
            (DType::String, _) => Err(MilError::invalid("a string constant is not a tensor value")),
            (d, _) if d.is_float() => {
                let v = lit.values_f32().ok_or_else(|| {
                    MilError::invalid(format!("constant {ty} has no loaded data"))
                })?;
                // fp16 constants hold fp16 values already; wider floats are held as fp32.
                Tensor::float(
                    if d == DType::Fp16 {
                        DType::Fp16
                    } else {
                        DType::Fp32
                    },
                    shape,
                    v,
                )
            }
            (d, _) if d.is_int() => {
                let v = match lit.elements() {
                    Some(e) => e.to_i64s(),
                    None => lit
                        .values_f32()
                        .map(|v| v.into_iter().map(|x| x as i64).collect()),
                };
                let v = v.ok_or_else(|| {
                    MilError::invalid(format!("constant {ty} has no loaded data"))
                })?;
                let v = v
                    .into_iter()
                    .map(|x| {
                        i32::try_from(x)
                            .map_err(|_| MilError::invalid(format!("{x} does not fit int32")))
                    })
                    .collect::<Result<_>>()?;
                Tensor::int32(shape, v)
            }
            (d, _) => Err(MilError::invalid(format!(
                "{d} constants are not supported by the simulator"
            ))),
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The float elements, or an error naming what was expected.
    pub fn floats(&self) -> Result<&[f32]> {
        match &self.data {
            Data::Float(v) => Ok(v),
            _ => Err(MilError::invalid(format!(
                "expected a float tensor, got {}",
                self.dtype
            ))),
        }
    }

    pub fn ints(&self) -> Result<&[i32]> {
        match &self.data {
            Data::Int(v) => Ok(v),
            _ => Err(MilError::invalid(format!(
                "expected an int32 tensor, got {}",
                self.dtype
            ))),
        }
    }

    pub fn bools(&self) -> Result<&[bool]> {
        match &self.data {
            Data::Bool(v) => Ok(v),
            _ => Err(MilError::invalid(format!(
                "expected a bool tensor, got {}",
                self.dtype
            ))),
        }
    }

    /// Converts to `dtype` (fp16 rounds; float to int truncates toward zero, as MIL's cast).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        let shape = self.shape.clone();
        let as_f32: Vec<f32> = match &self.data {
            Data::Float(v) => v.clone(),
            Data::Int(v) => v.iter().map(|&x| x as f32).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8 as f32).collect(),
        };
        match dtype {
            DType::Fp16 => Tensor::fp16(shape, as_f32),
            DType::Fp32 => Tensor::float(DType::Fp32, shape, as_f32),
            DType::Int32 => Tensor::int32(shape, as_f32.iter().map(|&x| x as i32).collect()),
            DType::Bool => Tensor::bool(shape, as_f32.iter().map(|&x| x != 0.0).collect()),
            d => Err(MilError::invalid(format!(
                "cast to {d} is not supported by the simulator"
            ))),
        }
    }

    /// Same elements under another shape (the element count must agree).
    pub fn reshaped(mut self, shape: Vec<usize>) -> Result<Tensor> {
        check_len(&shape, self.numel())?;
        self.shape = shape;
        Ok(self)
    }
}

fn check_len(shape: &[usize], len: usize) -> Result<()> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(MilError::invalid(format!(
            "shape {shape:?} needs {n} elements, got {len}"
        )));
    }
    Ok(())
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TensorType;

    #[test]
    fn literals_become_tensors() {
        let t = Tensor::from_literal(&Literal::i32s(vec![1, 2, 3])).unwrap();
        assert_eq!(
            (t.shape.clone(), t.ints().unwrap().to_vec()),
            (vec![3], vec![1, 2, 3])
        );
        let t = Tensor::from_literal(&Literal::f16(0.1)).unwrap();
        assert_eq!(t.floats().unwrap(), &[half::f16::from_f32(0.1).to_f32()]);
        assert!(Tensor::from_literal(&Literal::string("valid")).is_err());
        let blob = Literal::Blob {
            ty: TensorType::fp16([2]),
            source: crate::BlobSource::File {
                path: "@model_path/w.bin".into(),
                offset: 64,
            },
        };
        let e = Tensor::from_literal(&blob).unwrap_err().to_string();
        assert!(e.contains("no loaded data"), "{e}");
    }

    #[test]
    fn casts_and_strides() {
        let t = Tensor::float(DType::Fp32, [2], vec![1.0001, -2.7]).unwrap();
        assert_eq!(t.cast(DType::Int32).unwrap().ints().unwrap(), &[1, -2]);
        assert_eq!(
            t.cast(DType::Fp16).unwrap().floats().unwrap(),
            &[1.0, half::f16::from_f32(-2.7).to_f32()]
        );
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert!(Tensor::int32([2, 2], vec![1]).is_err());
    }
}
