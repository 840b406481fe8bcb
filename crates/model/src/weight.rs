//! Weights as the executors see them: a matrix of any ggml type, either still in the memory-mapped
//! file or owned (when loading had to transform it: a transpose, a row permutation, a `+1`).

use std::sync::Arc;

use anelm_formats::{GgmlType, Tensor, TensorStore};

use crate::error::{ModelError, Result};

enum Bytes {
    /// A byte range of one tensor in a mapped store.
    Mapped {
        store: Arc<TensorStore>,
        index: usize,
        start: usize,
        len: usize,
    },
    Owned(Vec<u8>),
}

/// A `[rows, cols]` matrix: row `r` holds output feature `r`, `cols` is the input length.
/// Rows are stored one after the other, each a whole number of `dtype` blocks.
pub struct Weight {
    pub name: String,
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    bytes: Bytes,
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Weight({} {} [{}, {}])",
            self.name, self.dtype, self.rows, self.cols
        )
    }
}

impl Weight {
    /// A mapped matrix from a 2-D tensor (or a 1-D one as a single row).
    pub fn mapped(store: &Arc<TensorStore>, t: &Tensor<'_>) -> Result<Weight> {
        if t.shape.len() > 2 {
            return Err(ModelError::shape(
                t.file,
                t.name,
                format!("{:?} is not a matrix", t.shape),
            ));
        }
        Self::mapped_flat(store, t)
    }

    /// A mapped matrix over a tensor of any rank: the last dimension is the row, every other
    /// dimension counts rows (llama.cpp's merged experts `[n_expert, rows, cols]` are
    /// `n_expert · rows` rows, sliced per expert with [`Self::slice_rows`]).
    pub fn mapped_flat(store: &Arc<TensorStore>, t: &Tensor<'_>) -> Result<Weight> {
        let index = store
            .index_of(t.name)
            .ok_or_else(|| ModelError::shape(t.file, t.name, "tensor is not in the given store"))?;
        let (rows, cols) = t.rows_cols();
        if cols % t.dtype.block_elems() != 0 {
            return Err(ModelError::shape(
                t.file,
                t.name,
                format!("{:?} is not a matrix of whole {} blocks", t.shape, t.dtype),
            ));
        }
        Ok(Weight {
            name: t.name.to_string(),
            dtype: t.dtype,
            rows,
            cols,
            bytes: Bytes::Mapped {
                store: store.clone(),
                index,
                start: 0,
                len: t.data.len(),
            },
        })
    }

    /// An owned matrix of f32 values.
    pub fn from_f32(name: &str, rows: usize, cols: usize, values: &[f32]) -> Weight {
        assert_eq!(values.len(), rows * cols, "Weight::from_f32 size");
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Weight {
            name: name.to_string(),
            dtype: GgmlType::F32,
            rows,
            cols,
            bytes: Bytes::Owned(bytes),
        }
    }

    /// An owned matrix from raw bytes of `dtype`.
    pub fn from_bytes(
        name: &str,
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Weight {
        debug_assert_eq!(dtype.bytes_for(rows * cols), Some(bytes.len()));
        Weight {
            name: name.to_string(),
            dtype,
            rows,
            cols,
            bytes: Bytes::Owned(bytes),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped {
                store,
                index,
                start,
                len,
            } => &store.at(*index).data[*start..*start + *len],
            Bytes::Owned(v) => v,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.bytes().len() / self.rows.max(1)
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }

    /// Rows `start..start + n` as a new weight sharing the same bytes (splits a fused QKV).
    pub fn slice_rows(&self, name: &str, start: usize, n: usize) -> Weight {
        assert!(start + n <= self.rows, "slice_rows out of range");
        let rb = self.row_bytes();
        let bytes = match &self.bytes {
            Bytes::Mapped {
                store,
                index,
                start: s,
                ..
            } => Bytes::Mapped {
                store: store.clone(),
                index: *index,
                start: s + start * rb,
                len: n * rb,
            },
            Bytes::Owned(v) => Bytes::Owned(v[start * rb..(start + n) * rb].to_vec()),
        };
        Weight {
            name: name.to_string(),
            dtype: self.dtype,
            rows: n,
            cols: self.cols,
            bytes,
        }
    }

    /// A copy with rows reordered: row `i` of the result is row `order[i]` of `self`.
    pub fn permute_rows(&self, order: &[usize]) -> Weight {
        assert_eq!(order.len(), self.rows);
        let mut out = Vec::with_capacity(self.bytes().len());
        for &r in order {
            out.extend_from_slice(self.row(r));
        }
        Weight::from_bytes(&self.name, self.dtype, self.rows, self.cols, out)
    }

    /// Dequantises row `r` into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        anelm_formats::quant::dequantize(self.dtype, self.row(r), out).map_err(ModelError::from)
    }

    /// The whole matrix as f32, row-major.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.rows * self.cols];
        anelm_formats::quant::dequantize(self.dtype, self.bytes(), &mut out)?;
        Ok(out)
    }

    /// Bytes read when every row is used once (a matrix-vector product).
    pub fn n_bytes(&self) -> usize {
        self.bytes().len()
    }
}
