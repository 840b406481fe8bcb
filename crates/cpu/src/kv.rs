//! The CPU KV cache: per layer, keys and values of every position, f32.

use std::any::Any;

use anelm_model::KvState;

pub struct CpuKv {
    /// Per layer: `[capacity][kv_dim]` keys and values.
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
    /// Identifies the executor (model) the state belongs to.
    pub(crate) owner: usize,
}

impl CpuKv {
    pub(crate) fn new(kv_dims: Vec<usize>, capacity: usize, owner: usize) -> Self {
        CpuKv {
            k: kv_dims.iter().map(|d| vec![0.0; d * capacity]).collect(),
            v: kv_dims.iter().map(|d| vec![0.0; d * capacity]).collect(),
            len: 0,
            capacity,
            owner,
        }
    }
}

impl KvState for CpuKv {
    fn len(&self) -> usize {
        self.len
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
