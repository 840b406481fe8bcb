//! The CPU KV cache: per layer, the keys and values of every position (`[pos][kv_dim]`), in f32
//! or f16. f16 halves the cache and the bandwidth attention reads; f32 keeps the exact path exact.

use std::any::Any;

use anelm_model::{KvState, OwnedState};
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
        let offset: Vec<usize> = kv_dims
            .iter()
            .scan(0, |at, d| Some(std::mem::replace(at, *at + d * capacity)))
            .collect();
        let total = kv_dims.iter().sum::<usize>() * capacity;
        Layers {
            k: vec![zero; total],
            v: vec![zero; total],
            offset,
        }
    }
}

pub(crate) enum KvData {
    F32(Layers<f32>),
    F16(Layers<f16>),
}

/// A cache element type, and its cache inside a [`KvData`].
pub(crate) trait KvType: KvElem {
    fn layers(data: &mut KvData) -> Option<&mut Layers<Self>>;
}

impl KvType for f32 {
    fn layers(data: &mut KvData) -> Option<&mut Layers<f32>> {
        match data {
            KvData::F32(l) => Some(l),
            KvData::F16(_) => None,
        }
    }
}

impl KvType for f16 {
    fn layers(data: &mut KvData) -> Option<&mut Layers<f16>> {
        match data {
            KvData::F16(l) => Some(l),
            KvData::F32(_) => None,
        }
    }
}

/// The recurrent state of the DeltaNet and short-conv layers: per layer its conv history and
/// (DeltaNet) its per-head matrices, f32, each layer at its offset (zero-sized for other layers).
pub(crate) struct Recurrent {
    pub conv: Vec<f32>,
    pub s: Vec<f32>,
    pub conv_offset: Vec<usize>,
    pub s_offset: Vec<usize>,
}

impl Recurrent {
    /// `sizes[l]` = (conv history floats, state floats) of layer `l`.
    pub(crate) fn new(sizes: &[(usize, usize)]) -> Self {
        let offsets = |f: fn(&(usize, usize)) -> usize| -> (Vec<usize>, usize) {
            let mut at = 0;
            let v = sizes
                .iter()
                .map(|s| {
                    let start = at;
                    at += f(s);
                    start
                })
                .collect();
            (v, at)
        };
        let (conv_offset, conv_len) = offsets(|s| s.0);
        let (s_offset, s_len) = offsets(|s| s.1);
        Recurrent {
            conv: vec![0.0; conv_len],
            s: vec![0.0; s_len],
            conv_offset,
            s_offset,
        }
    }
}

pub struct CpuKv {
    pub(crate) data: KvData,
    pub(crate) recurrent: Recurrent,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
    /// Identifies the executor (model) the state belongs to.
    pub(crate) owner: usize,
}

impl CpuKv {
    pub(crate) fn new(
        kv_dims: &[usize],
        recurrent: &[(usize, usize)],
        capacity: usize,
        dtype: KvDtype,
        owner: usize,
    ) -> Self {
        let data = match dtype {
            KvDtype::F32 => KvData::F32(Layers::new(kv_dims, capacity)),
            KvDtype::F16 => KvData::F16(Layers::new(kv_dims, capacity)),
        };
        CpuKv {
            data,
            recurrent: Recurrent::new(recurrent),
            len: 0,
            capacity,
            owner,
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self.data {
            KvData::F32(_) => KvDtype::F32,
            KvData::F16(_) => KvDtype::F16,
        }
    }
}

impl OwnedState for CpuKv {
    fn owner(&self) -> usize {
        self.owner
    }
}

impl KvState for CpuKv {
    fn len(&self) -> usize {
        self.len
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    /// Keys and values can be forgotten from any position; a recurrent state cannot go back,
    /// so a model with one starts over (len 0) when asked to keep fewer positions than it has.
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if self.recurrent.s.is_empty() && self.recurrent.conv.is_empty() {
            self.len = len;
        } else {
            self.recurrent.conv.fill(0.0);
            self.recurrent.s.fill(0.0);
            self.len = 0;
        }
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recurrent_state_restarts_instead_of_going_back() {
        let mut kv = CpuKv::new(&[4, 0], &[(0, 0), (6, 8)], 10, KvDtype::F32, 1);
        kv.len = 5;
        kv.recurrent.s[3] = 1.0;
        kv.truncate(7);
        assert_eq!(kv.len(), 5, "keeping more than held changes nothing");
        kv.truncate(3);
        assert_eq!(kv.len(), 0);
        assert!(kv.recurrent.s.iter().all(|&x| x == 0.0));

        let mut plain = CpuKv::new(&[4], &[(0, 0)], 10, KvDtype::F16, 1);
        plain.len = 5;
        plain.truncate(3);
        assert_eq!(plain.len(), 3);
    }
}
