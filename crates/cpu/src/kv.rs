//! The CPU KV cache: per layer, the keys and values of every position (`[pos][kv_dim]`), in f32
//! or f16. f16 halves the cache and the bandwidth attention reads; f32 keeps the exact path exact.

use std::any::Any;

use anelm_model::KvState;
use half::f16;

use crate::vecmath::KvElem;

/// The element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    pub fn parse(name: &str) -> Option<KvDtype> {
        match name {
            "f32" => Some(KvDtype::F32),
            "f16" => Some(KvDtype::F16),
            _ => None,
        }
    }
}

/// Keys and values of all layers, each in one allocation: layer `l` holds
/// `offset[l] .. offset[l] + capacity * dims[l]`.
pub(crate) struct Layers<E> {
    pub k: Vec<E>,
    pub v: Vec<E>,
    pub offset: Vec<usize>,
}

impl<E: KvElem> Layers<E> {
    fn new(kv_dims: &[usize], capacity: usize) -> Self {
        let zero = E::from_f32(0.0);
        let offset: Vec<usize> = kv_dims.iter().scan(0, |at, d| Some(std::mem::replace(at, *at + d * capacity))).collect();
        let total = kv_dims.iter().sum::<usize>() * capacity;
        Layers { k: vec![zero; total], v: vec![zero; total], offset }
    }
}

pub(crate) enum KvData {
    F32(Layers<f32>),
    F16(Layers<f16>),
}

pub struct CpuKv {
    pub(crate) data: KvData,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
    /// Identifies the executor (model) the state belongs to.
    pub(crate) owner: usize,
}

impl CpuKv {
    pub(crate) fn new(kv_dims: &[usize], capacity: usize, dtype: KvDtype, owner: usize) -> Self {
        let data = match dtype {
            KvDtype::F32 => KvData::F32(Layers::new(kv_dims, capacity)),
            KvDtype::F16 => KvData::F16(Layers::new(kv_dims, capacity)),
        };
        CpuKv { data, len: 0, capacity, owner }
    }

    pub fn dtype(&self) -> KvDtype {
        match self.data {
            KvData::F32(_) => KvDtype::F32,
            KvData::F16(_) => KvDtype::F16,
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
