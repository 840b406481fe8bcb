//! Elementwise ops with numpy broadcasting. Floats are computed in f32 from the fp16 operands
//! and rounded to the result's dtype; transcendental functions use the f32 library functions
//! (the ANE's own approximations are not modelled).

use crate::dtype::DType;
use crate::error::{MilError, Result};
use crate::ops::broadcast;

use super::numerics;
use super::tensor::{strides, Data, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    Identity,
    Relu,
    Sigmoid,
    Silu,
    Tanh,
    Exp,
    Exp2,
    Sqrt,
    Rsqrt,
    Inverse,
    Abs,
    Square,
    Sin,
    Cos,
    Log,
    Floor,
    Ceil,
    Round,
    Sign,
    Softplus,
}

impl Unary {
    pub fn from_name(op: &str) -> Option<Unary> {
        Some(match op {
            "identity" => Unary::Identity,
            "relu" => Unary::Relu,
            "sigmoid" => Unary::Sigmoid,
            "silu" => Unary::Silu,
            "tanh" => Unary::Tanh,
            "exp" => Unary::Exp,
            "exp2" => Unary::Exp2,
            "sqrt" => Unary::Sqrt,
            "rsqrt" => Unary::Rsqrt,
            "inverse" => Unary::Inverse,
            "abs" => Unary::Abs,
            "square" => Unary::Square,
            "sin" => Unary::Sin,
            "cos" => Unary::Cos,
            "log" => Unary::Log,
            "floor" => Unary::Floor,
            "ceil" => Unary::Ceil,
            "round" => Unary::Round,
            "sign" => Unary::Sign,
            "softplus" => Unary::Softplus,
            _ => return None,
        })
    }

    /// `eps` is the `epsilon` operand of log / rsqrt / inverse (0 for the others).
    fn apply(self, x: f32, eps: f32) -> f32 {
        match self {
            Unary::Identity => x,
            Unary::Relu => x.max(0.0),
            Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Unary::Silu => x / (1.0 + (-x).exp()),
            Unary::Tanh => x.tanh(),
            Unary::Exp => x.exp(),
            Unary::Exp2 => x.exp2(),
            Unary::Sqrt => x.sqrt(),
            Unary::Rsqrt => 1.0 / (x + eps).sqrt(),
            Unary::Inverse => 1.0 / (x + eps),
            Unary::Abs => x.abs(),
            Unary::Square => x * x,
            Unary::Sin => x.sin(),
            Unary::Cos => x.cos(),
            Unary::Log => (x + eps).ln(),
            Unary::Floor => x.floor(),
            Unary::Ceil => x.ceil(),
            Unary::Round => x.round_ties_even(),
            Unary::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            Unary::Softplus => x.exp().ln_1p(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    RealDiv,
    Pow,
    Maximum,
    Minimum,
    FloorDiv,
    Mod,
}

impl Binary {
    pub fn from_name(op: &str) -> Option<Binary> {
        Some(match op {
            "add" => Binary::Add,
            "sub" => Binary::Sub,
            "mul" => Binary::Mul,
            "real_div" => Binary::RealDiv,
            "pow" => Binary::Pow,
            "maximum" => Binary::Maximum,
            "minimum" => Binary::Minimum,
            "floor_div" => Binary::FloorDiv,
            "mod" => Binary::Mod,
            _ => return None,
        })
    }

    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::RealDiv => a / b,
            Binary::Pow => a.powf(b),
            Binary::Maximum => a.max(b),
            Binary::Minimum => a.min(b),
            Binary::FloorDiv => (a / b).floor(),
            Binary::Mod => a - (a / b).floor() * b,
        }
    }

    fn apply_int(self, a: i32, b: i32) -> Result<i32> {
        let checked = match self {
            Binary::Add => a.checked_add(b),
            Binary::Sub => a.checked_sub(b),
            Binary::Mul => a.checked_mul(b),
            Binary::Maximum => Some(a.max(b)),
            Binary::Minimum => Some(a.min(b)),
            Binary::FloorDiv => (b != 0).then(|| a.div_euclid(b)),
            Binary::Mod => (b != 0).then(|| a.rem_euclid(b)),
            Binary::RealDiv | Binary::Pow => {
                return Err(MilError::invalid(format!(
                    "{self:?} on int32 is not supported by the simulator"
                )))
            }
        };
        checked.ok_or_else(|| {
            MilError::invalid(format!(
                "int32 {self:?} of {a} and {b} overflows or divides by zero"
            ))
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Equal,
    NotEqual,
    Greater,
    GreaterEqual,
    Less,
    LessEqual,
}

impl Compare {
    pub fn from_name(op: &str) -> Option<Compare> {
        Some(match op {
            "equal" => Compare::Equal,
            "not_equal" => Compare::NotEqual,
            "greater" => Compare::Greater,
            "greater_equal" => Compare::GreaterEqual,
            "less" => Compare::Less,
            "less_equal" => Compare::LessEqual,
            _ => return None,
        })
    }

    fn apply(self, a: f32, b: f32) -> bool {
        match self {
            Compare::Equal => a == b,
            Compare::NotEqual => a != b,
            Compare::Greater => a > b,
            Compare::GreaterEqual => a >= b,
            Compare::Less => a < b,
            Compare::LessEqual => a <= b,
        }
    }
}

/// Rounds float results to the tensor's dtype.
fn finish_float(dtype: DType, shape: Vec<usize>, mut v: Vec<f32>) -> Result<Tensor> {
    if dtype == DType::Fp16 {
        numerics::round_in_place(&mut v);
    }
    Tensor::float(dtype, shape, v)
}

pub fn unary(op: Unary, x: &Tensor, eps: f32) -> Result<Tensor> {
    let v: Vec<f32> = x.floats()?.iter().map(|&a| op.apply(a, eps)).collect();
    finish_float(x.dtype, x.shape.clone(), v)
}

/// Calls `f(out_index, a_index, b_index)` for every element of the broadcast of two shapes.
fn for_each_broadcast(
    a: &[usize],
    b: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) -> Result<Vec<usize>> {
    let out = broadcast(a, b)?;
    let r = out.len();
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut p = vec![1; r - s.len()];
        p.extend_from_slice(s);
        p
    };
    let (pa, pb) = (pad(a), pad(b));
    let (sa, sb) = (strides(&pa), strides(&pb));
    // Broadcast dims step by 0.
    let step = |p: &[usize], s: &[usize]| -> Vec<usize> {
        (0..r).map(|i| if p[i] == 1 { 0 } else { s[i] }).collect()
    };
    let (ea, eb) = (step(&pa, &sa), step(&pb, &sb));
    let n: usize = out.iter().product();
    if n == 0 {
        return Ok(out);
    }
    let inner = if r == 0 { 1 } else { out[r - 1] };
    let (ia, ib) = if r == 0 {
        (0, 0)
    } else {
        (ea[r - 1], eb[r - 1])
    };
    let mut idx = vec![0usize; r.saturating_sub(1)];
    let mut o = 0;
    loop {
        let base_a: usize = idx.iter().zip(&ea).map(|(i, s)| i * s).sum();
        let base_b: usize = idx.iter().zip(&eb).map(|(i, s)| i * s).sum();
        for j in 0..inner {
            f(o, base_a + j * ia, base_b + j * ib);
            o += 1;
        }
        // Advance the outer index (all dims but the last).
        let mut d = idx.len();
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

pub fn binary(op: Binary, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    if x.dtype != y.dtype {
        return Err(MilError::invalid(format!(
            "operand dtypes differ: {} vs {}",
            x.dtype, y.dtype
        )));
    }
    match (&x.data, &y.data) {
        (Data::Float(a), Data::Float(b)) => {
            let mut v = Vec::new();
            let shape =
                for_each_broadcast(&x.shape, &y.shape, |_, i, j| v.push(op.apply(a[i], b[j])))?;
            finish_float(x.dtype, shape, v)
        }
        (Data::Int(a), Data::Int(b)) => {
            let mut v = Vec::new();
            let mut err = None;
            let shape = for_each_broadcast(&x.shape, &y.shape, |_, i, j| {
                match op.apply_int(a[i], b[j]) {
                    Ok(r) => v.push(r),
                    Err(e) => {
                        err.get_or_insert(e);
                        v.push(0);
                    }
                }
            })?;
            match err {
                Some(e) => Err(e),
                None => Tensor::int32(shape, v),
            }
        }
        _ => Err(MilError::invalid(format!(
            "{op:?} needs float or int32 operands, got {}",
            x.dtype
        ))),
    }
}

pub fn compare(op: Compare, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let as_f32 = |t: &Tensor| -> Result<Vec<f32>> {
        Ok(match &t.data {
            Data::Float(v) => v.clone(),
            Data::Int(v) => v.iter().map(|&i| i as f32).collect(),
            Data::Bool(v) => v.iter().map(|&b| b as u8 as f32).collect(),
        })
    };
    let (a, b) = (as_f32(x)?, as_f32(y)?);
    let mut v = Vec::new();
    let shape = for_each_broadcast(&x.shape, &y.shape, |_, i, j| v.push(op.apply(a[i], b[j])))?;
    Tensor::bool(shape, v)
}

pub fn logical(op: &str, x: &Tensor, y: Option<&Tensor>) -> Result<Tensor> {
    let a = x.bools()?;
    match (op, y) {
        ("logical_not", None) => Tensor::bool(x.shape.clone(), a.iter().map(|v| !v).collect()),
        (_, Some(y)) => {
            let b = y.bools()?;
            let f = match op {
                "logical_and" => |p: bool, q: bool| p && q,
                "logical_or" => |p: bool, q: bool| p || q,
                "logical_xor" => |p: bool, q: bool| p != q,
                other => return Err(MilError::invalid(format!("unknown logical op {other}"))),
            };
            let mut v = Vec::new();
            let shape = for_each_broadcast(&x.shape, &y.shape, |_, i, j| v.push(f(a[i], b[j])))?;
            Tensor::bool(shape, v)
        }
        (other, None) => Err(MilError::invalid(format!("{other} needs two operands"))),
    }
}

/// `cond ? a : b`, broadcasting all three.
pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let c = cond.bools()?;
    let (av, bv) = (a.floats()?, b.floats()?);
    // Broadcast a against b first, then cond against the result.
    let mut ab = Vec::new();
    let ab_shape = for_each_broadcast(&a.shape, &b.shape, |_, i, j| ab.push((av[i], bv[j])))?;
    let mut v = Vec::new();
    let shape = for_each_broadcast(&cond.shape, &ab_shape, |_, i, j| {
        v.push(if c[i] { ab[j].0 } else { ab[j].1 })
    })?;
    Tensor::float(a.dtype, shape, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp16(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::fp16(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn broadcasting_follows_numpy() {
        let x = fp16(&[1, 2, 1, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = fp16(&[1, 2, 1, 1], &[10.0, 20.0]);
        let y = binary(Binary::Add, &x, &b).unwrap();
        assert_eq!(y.shape, vec![1, 2, 1, 3]);
        assert_eq!(y.floats().unwrap(), &[11.0, 12.0, 13.0, 24.0, 25.0, 26.0]);
        let s = fp16(&[], &[2.0]);
        assert_eq!(
            binary(Binary::Mul, &s, &x).unwrap().floats().unwrap()[5],
            12.0
        );
        let row = fp16(&[3], &[1.0, 0.0, -1.0]);
        let c = compare(Compare::Greater, &x, &row).unwrap();
        assert_eq!(c.bools().unwrap(), &[false, true, true, true, true, true]);
        assert!(binary(Binary::Add, &x, &fp16(&[2], &[1.0, 2.0])).is_err());
    }

    #[test]
    fn fp16_results_are_rounded_and_overflow_to_inf() {
        let x = fp16(&[2], &[60000.0, 1.0]);
        let y = binary(Binary::Add, &x, &x).unwrap();
        assert_eq!(y.floats().unwrap(), &[f32::INFINITY, 2.0]);
        let t = unary(Unary::Sigmoid, &fp16(&[1], &[0.3]), 0.0).unwrap();
        assert_eq!(
            t.floats().unwrap()[0],
            numerics::round(1.0 / (1.0 + (-numerics::round(0.3)).exp()))
        );
    }

    #[test]
    fn select_and_logical() {
        let c = Tensor::bool([2], vec![true, false]).unwrap();
        let a = fp16(&[2], &[1.0, 2.0]);
        let b = fp16(&[], &[-1.0]);
        assert_eq!(select(&c, &a, &b).unwrap().floats().unwrap(), &[1.0, -1.0]);
        assert_eq!(
            logical("logical_not", &c, None).unwrap().bools().unwrap(),
            &[false, true]
        );
        let i = Tensor::int32([2], vec![3, i32::MAX]).unwrap();
        assert!(
            binary(Binary::Add, &i, &i).is_err(),
            "int overflow is an error"
        );
    }
}
