//! Data movement: transpose, concat, split, slices and slice updates. Values are copied
//! unchanged (no rounding).

use crate::error::{MilError, Result};

use super::tensor::{strides, Data, Tensor};

/// The elements of `t` at the source indices `idx`, as a tensor of `shape` (same dtype).
fn gather(t: &Tensor, shape: Vec<usize>, idx: &[usize]) -> Tensor {
    let data = match &t.data {
        Data::Float(v) => Data::Float(idx.iter().map(|&i| v[i]).collect()),
        Data::Int(v) => Data::Int(idx.iter().map(|&i| v[i]).collect()),
        Data::Bool(v) => Data::Bool(idx.iter().map(|&i| v[i]).collect()),
    };
    Tensor {
        dtype: t.dtype,
        shape,
        data,
    }
}

/// Walks a box of extents `len` in row-major order: element `i` is at `base + Σ i[a]·steps[a]`.
fn walk(len: &[usize], steps: &[i64], base: i64) -> Vec<usize> {
    let n: usize = len.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut idx = vec![0usize; len.len()];
    loop {
        let at = base
            + idx
                .iter()
                .zip(steps)
                .map(|(&i, &s)| i as i64 * s)
                .sum::<i64>();
        out.push(at as usize);
        let mut d = len.len();
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < len[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

pub fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let mut seen = perm.to_vec();
    seen.sort_unstable();
    if seen != (0..x.rank()).collect::<Vec<_>>() {
        return Err(MilError::invalid(format!(
            "perm {perm:?} is not a permutation of rank {}",
            x.rank()
        )));
    }
    let st = strides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let steps: Vec<i64> = perm.iter().map(|&p| st[p] as i64).collect();
    Ok(gather(x, shape.clone(), &walk(&shape, &steps, 0)))
}

/// A slice as per-axis start, step and length.
pub struct Slice {
    pub start: Vec<i64>,
    pub step: Vec<i64>,
    pub len: Vec<usize>,
}

impl Slice {
    /// `slice_by_size`: `size[i] == -1` means to the end.
    pub fn by_size(shape: &[usize], begin: &[i64], size: &[i64]) -> Result<Slice> {
        if begin.len() != shape.len() || size.len() != shape.len() {
            return Err(MilError::invalid(format!(
                "begin {begin:?} / size {size:?} do not match rank {}",
                shape.len()
            )));
        }
        let mut s = Slice {
            start: Vec::new(),
            step: vec![1; shape.len()],
            len: Vec::new(),
        };
        for (a, &d) in shape.iter().enumerate() {
            let d = d as i64;
            let b = if begin[a] < 0 { begin[a] + d } else { begin[a] };
            let n = if size[a] == -1 { d - b } else { size[a] };
            if b < 0 || n < 0 || b + n > d {
                return Err(MilError::invalid(format!(
                    "slice begin {begin:?} size {size:?} is out of bounds of {shape:?}"
                )));
            }
            s.start.push(b);
            s.len.push(n as usize);
        }
        Ok(s)
    }

    /// `slice_by_index` with MIL's masks (numpy semantics, end exclusive).
    pub fn by_index(
        shape: &[usize],
        begin: &[i64],
        end: &[i64],
        stride: &[i64],
        begin_mask: &[bool],
        end_mask: &[bool],
    ) -> Result<Slice> {
        let r = shape.len();
        if [
            begin.len(),
            end.len(),
            stride.len(),
            begin_mask.len(),
            end_mask.len(),
        ]
        .iter()
        .any(|&n| n != r)
        {
            return Err(MilError::invalid(format!(
                "slice operands need {r} entries each"
            )));
        }
        let mut s = Slice {
            start: Vec::new(),
            step: stride.to_vec(),
            len: Vec::new(),
        };
        for a in 0..r {
            let d = shape[a] as i64;
            let st = stride[a];
            if st == 0 {
                return Err(MilError::invalid("slice stride 0"));
            }
            let norm = |v: i64| if v < 0 { v + d } else { v };
            let (b, n) = if st > 0 {
                let b = if begin_mask[a] {
                    0
                } else {
                    norm(begin[a]).clamp(0, d)
                };
                let e = if end_mask[a] {
                    d
                } else {
                    norm(end[a]).clamp(0, d)
                };
                (b, if e > b { (e - b + st - 1) / st } else { 0 })
            } else {
                let b = if begin_mask[a] {
                    d - 1
                } else {
                    norm(begin[a]).clamp(-1, d - 1)
                };
                let e = if end_mask[a] {
                    -1
                } else {
                    norm(end[a]).clamp(-1, d - 1)
                };
                (b, if b > e { (b - e - st - 1) / -st } else { 0 })
            };
            s.start.push(b);
            s.len.push(n as usize);
        }
        Ok(s)
    }

    /// Flat indices, in `shape`, of the sliced elements in order.
    fn indices(&self, shape: &[usize]) -> Vec<usize> {
        let st = strides(shape);
        let steps: Vec<i64> = self
            .step
            .iter()
            .zip(&st)
            .map(|(&s, &t)| s * t as i64)
            .collect();
        let base = self
            .start
            .iter()
            .zip(&st)
            .map(|(&b, &t)| b * t as i64)
            .sum();
        walk(&self.len, &steps, base)
    }
}

pub fn slice(x: &Tensor, s: &Slice) -> Result<Tensor> {
    Ok(gather(x, s.len.clone(), &s.indices(&x.shape)))
}

/// `x` with the slice `s` replaced by `update` (whose shape must be the slice's).
pub fn slice_update(x: &Tensor, update: &Tensor, s: &Slice) -> Result<Tensor> {
    if update.shape != s.len {
        return Err(MilError::invalid(format!(
            "update of shape {:?} does not fill the slice {:?}",
            update.shape, s.len
        )));
    }
    if update.dtype != x.dtype {
        return Err(MilError::invalid(format!(
            "update is {}, x is {}",
            update.dtype, x.dtype
        )));
    }
    let idx = s.indices(&x.shape);
    let mut out = x.clone();
    match (&mut out.data, &update.data) {
        (Data::Float(d), Data::Float(u)) => idx.iter().zip(u).for_each(|(&i, &v)| d[i] = v),
        (Data::Int(d), Data::Int(u)) => idx.iter().zip(u).for_each(|(&i, &v)| d[i] = v),
        (Data::Bool(d), Data::Bool(u)) => idx.iter().zip(u).for_each(|(&i, &v)| d[i] = v),
        _ => {
            return Err(MilError::invalid(
                "update and x hold different element types",
            ))
        }
    }
    Ok(out)
}

pub fn concat(values: &[&Tensor], axis: usize) -> Result<Tensor> {
    let first = values
        .first()
        .ok_or_else(|| MilError::invalid("concat of no values"))?;
    let r = first.rank();
    if axis >= r {
        return Err(MilError::invalid(format!(
            "concat axis {axis} out of range for rank {r}"
        )));
    }
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for v in values {
        if v.rank() != r
            || v.dtype != first.dtype
            || (0..r).any(|a| a != axis && v.shape[a] != first.shape[a])
        {
            return Err(MilError::invalid(format!(
                "cannot concat {:?} and {:?} on axis {axis}",
                first.shape, v.shape
            )));
        }
        shape[axis] += v.shape[axis];
    }
    // Each value contributes contiguous runs of `shape[axis..]` elements per outer index.
    let outer: usize = shape[..axis].iter().product();
    let mut data = match &first.data {
        Data::Float(_) => Data::Float(Vec::new()),
        Data::Int(_) => Data::Int(Vec::new()),
        Data::Bool(_) => Data::Bool(Vec::new()),
    };
    for o in 0..outer {
        for v in values {
            let run: usize = v.shape[axis..].iter().product();
            match (&mut data, &v.data) {
                (Data::Float(d), Data::Float(s)) => d.extend_from_slice(&s[o * run..(o + 1) * run]),
                (Data::Int(d), Data::Int(s)) => d.extend_from_slice(&s[o * run..(o + 1) * run]),
                (Data::Bool(d), Data::Bool(s)) => d.extend_from_slice(&s[o * run..(o + 1) * run]),
                _ => return Err(MilError::invalid("concat of different element types")),
            }
        }
    }
    Ok(Tensor {
        dtype: first.dtype,
        shape,
        data,
    })
}

pub fn split(x: &Tensor, axis: usize, sizes: &[usize]) -> Result<Vec<Tensor>> {
    if axis >= x.rank() || sizes.iter().sum::<usize>() != x.shape[axis] {
        return Err(MilError::invalid(format!(
            "cannot split {:?} into {sizes:?} on axis {axis}",
            x.shape
        )));
    }
    let mut begin = 0i64;
    let mut out = Vec::with_capacity(sizes.len());
    for &s in sizes {
        let mut b = vec![0i64; x.rank()];
        let mut size: Vec<i64> = x.shape.iter().map(|&d| d as i64).collect();
        b[axis] = begin;
        size[axis] = s as i64;
        out.push(slice(x, &Slice::by_size(&x.shape, &b, &size)?)?);
        begin += s as i64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize]) -> Tensor {
        let n = shape.iter().product::<usize>();
        Tensor::int32(shape.to_vec(), (0..n as i32).collect()).unwrap()
    }

    #[test]
    fn transpose_permutes_axes() {
        let x = t(&[2, 3]);
        let y = transpose(&x, &[1, 0]).unwrap();
        assert_eq!(
            (y.shape.clone(), y.ints().unwrap().to_vec()),
            (vec![3, 2], vec![0, 3, 1, 4, 2, 5])
        );
    }

    #[test]
    fn slices_concat_split_update() {
        let x = t(&[1, 4, 1, 3]);
        let s = slice(
            &x,
            &Slice::by_size(&x.shape, &[0, 1, 0, 0], &[1, 2, 1, -1]).unwrap(),
        )
        .unwrap();
        assert_eq!(s.ints().unwrap(), &[3, 4, 5, 6, 7, 8]);
        let r = slice(
            &x,
            &Slice::by_index(
                &x.shape,
                &[0, 3, 0, 2],
                &[1, 0, 1, 0],
                &[1, -2, 1, -1],
                &[false; 4],
                &[false; 4],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            (r.shape.clone(), r.ints().unwrap().to_vec()),
            (vec![1, 2, 1, 2], vec![11, 10, 5, 4])
        );
        let parts = split(&x, 1, &[1, 3]).unwrap();
        assert_eq!(parts[1].shape, vec![1, 3, 1, 3]);
        let back = concat(&[&parts[0], &parts[1]], 1).unwrap();
        assert_eq!(back, x);
        let w = concat(&[&x, &x], 3).unwrap();
        assert_eq!(&w.ints().unwrap()[..6], &[0, 1, 2, 0, 1, 2]);
        let u = Tensor::int32([1, 1, 1, 3], vec![-1, -2, -3]).unwrap();
        let y = slice_update(
            &x,
            &u,
            &Slice::by_size(&x.shape, &[0, 2, 0, 0], &[1, 1, 1, 3]).unwrap(),
        )
        .unwrap();
        assert_eq!(&y.ints().unwrap()[6..9], &[-1, -2, -3]);
        assert!(Slice::by_size(&x.shape, &[0, 3, 0, 0], &[1, 2, 1, 1]).is_err());
    }
}
