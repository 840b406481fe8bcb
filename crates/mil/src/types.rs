//! Value types: `tensor<dtype, [dims]>` (a scalar is a rank-0 tensor) and `state<tensor<...>>`.

use crate::dtype::DType;
use std::fmt;

/// A statically shaped tensor type. Rank 0 is a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Vec::new(),
        }
    }

    pub fn fp16(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::Fp16, shape)
    }

    pub fn fp32(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::Fp32, shape)
    }

    pub fn int32(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::Int32, shape)
    }

    pub fn int8(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::Int8, shape)
    }

    pub fn uint8(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::Uint8, shape)
    }

    pub fn bool(shape: impl Into<Vec<usize>>) -> Self {
        Self::new(DType::Bool, shape)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Number of elements (1 for a scalar); saturates instead of overflowing on absurd shapes,
    /// which [`TensorType::check_size`] rejects.
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Rejects shapes whose byte size does not fit in memory arithmetic (hostile input).
    pub fn check_size(&self) -> crate::Result<()> {
        const MAX_ELEMENTS: usize = 1 << 48;
        if self.numel() > MAX_ELEMENTS {
            return Err(crate::MilError::invalid(format!(
                "{self} has more than 2^48 elements"
            )));
        }
        Ok(())
    }

    /// Bytes of the packed data (sub-byte types packed).
    pub fn packed_bytes(&self) -> usize {
        self.dtype.packed_bytes(self.numel())
    }

    pub fn with_shape(&self, shape: Vec<usize>) -> Self {
        TensorType {
            dtype: self.dtype,
            shape,
        }
    }

    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }
}

/// Canonical `tensor<fp16, [1, 64, 1, 64]>` form (for messages; the printer spells scalars
/// per dialect itself).
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor<{}, [", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]>")
    }
}

/// The type of an SSA value: a tensor, or a state wrapping one (function inputs only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValueType {
    Tensor(TensorType),
    State(TensorType),
}

impl ValueType {
    /// The tensor type, or the wrapped tensor type of a state.
    pub fn tensor(&self) -> &TensorType {
        match self {
            ValueType::Tensor(t) | ValueType::State(t) => t,
        }
    }

    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            ValueType::Tensor(t) => Some(t),
            ValueType::State(_) => None,
        }
    }

    pub fn is_state(&self) -> bool {
        matches!(self, ValueType::State(_))
    }
}

impl From<TensorType> for ValueType {
    fn from(t: TensorType) -> Self {
        ValueType::Tensor(t)
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Tensor(t) => write!(f, "{t}"),
            ValueType::State(t) => write!(f, "state<{t}>"),
        }
    }
}
