//! TensorStore: every tensor of a model by name — dtype, row-major shape and bytes — over one or
//! more memory-mapped files (a GGUF file, or safetensors shards).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{FormatError, Result};
use crate::{quant, GgmlType};

/// Where one tensor lives: its file, byte range, type and shape.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: GgmlType,
    /// Row-major, outermost first: a linear weight is `[out_features, in_features]`.
    pub shape: Vec<usize>,
    source: usize,
    offset: usize,
    len: usize,
}

impl TensorInfo {
    pub(crate) fn new(
        name: String,
        dtype: GgmlType,
        shape: Vec<usize>,
        source: usize,
        offset: usize,
        len: usize,
    ) -> Self {
        TensorInfo {
            name,
            dtype,
            shape,
            source,
            offset,
            len,
        }
    }

    pub fn n_elems(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn n_bytes(&self) -> usize {
        self.len
    }

    /// The tensor's bytes within its file.
    pub(crate) fn byte_range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// A borrowed tensor: metadata plus its bytes in the map.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub dtype: GgmlType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
    /// The file the tensor came from (for error messages).
    pub file: &'a Path,
}

impl Tensor<'_> {
    pub fn n_elems(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows and columns of a matrix view: the last dimension is the row length, the rest are rows.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        (self.n_elems() / cols.max(1), cols)
    }

    /// Dequantises the whole tensor to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.n_elems()];
        quant::dequantize(self.dtype, self.data, &mut out)?;
        Ok(out)
    }

    /// Checks the shape, naming the file and tensor when it differs.
    pub fn expect_shape(&self, shape: &[usize]) -> Result<()> {
        if self.shape == shape {
            Ok(())
        } else {
            Err(FormatError::malformed(
                self.file,
                format!(
                    "tensor '{}' has shape {:?}, expected {:?}",
                    self.name, self.shape, shape
                ),
            ))
        }
    }
}

/// A read-only anonymous map holding a copy of `bytes` (for files parsed from memory).
pub(crate) fn anon_map(bytes: &[u8]) -> std::io::Result<Mmap> {
    let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1))?;
    map[..bytes.len()].copy_from_slice(bytes);
    map.make_read_only()
}

/// All tensors of a model, memory-mapped.
pub struct TensorStore {
    files: Vec<(PathBuf, Mmap)>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl TensorStore {
    pub(crate) fn from_parts(files: Vec<(PathBuf, Mmap)>, tensors: Vec<TensorInfo>) -> Self {
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        TensorStore {
            files,
            tensors,
            index,
        }
    }

    /// Tensor infos in file order.
    pub fn infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The first file of the store (the GGUF file or the first shard), for error messages.
    pub fn primary_path(&self) -> &Path {
        self.files
            .first()
            .map(|(p, _)| p.as_path())
            .unwrap_or(Path::new("<empty>"))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> Tensor<'a> {
        let (path, map) = &self.files[info.source];
        Tensor {
            name: &info.name,
            dtype: info.dtype,
            shape: &info.shape,
            data: &map[info.offset..info.offset + info.len],
            file: path,
        }
    }

    /// Position of tensor `name` in [`Self::infos`], for O(1) access through [`Self::at`].
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The tensor at position `i` of [`Self::infos`].
    pub fn at(&self, i: usize) -> Tensor<'_> {
        self.view(&self.tensors[i])
    }

    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.index.get(name).map(|&i| self.view(&self.tensors[i]))
    }

    /// The tensor `name`, or an error naming the file and the missing tensor.
    pub fn require(&self, name: &str) -> Result<Tensor<'_>> {
        self.get(name).ok_or_else(|| FormatError::MissingTensor {
            path: self.primary_path().to_path_buf(),
            name: name.to_string(),
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = Tensor<'_>> {
        self.tensors.iter().map(|t| self.view(t))
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.len).sum()
    }
}
