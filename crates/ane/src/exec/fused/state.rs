//! A sequence's state in the fused strategy: its KV cache, conv histories and DeltaNet states
//! on the CPU. The cache is uploaded into the chunks' bound buffers when the sequence becomes
//! the resident one (or takes a slot of the batch functions); the histories and states go in
//! as inputs every step.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

use anelm_model::plan::Mixer;
use anelm_model::{KvState, Model, OwnedState};
use half::f16;

static NEXT_STATE: AtomicUsize = AtomicUsize::new(1);

/// A sequence's KV cache (fp16, `[kv_dim][context]` per layer) and recurrent state.
pub struct FusedKv {
    pub(super) owner: usize,
    pub(super) uid: usize,
    pub(super) len: usize,
    pub(super) capacity: usize,
    pub(super) context: usize,
    /// Per layer: keys and values.
    pub(super) cache: Vec<[Vec<f16>; 2]>,
    /// Per layer: a short conv's history, `[kernel - 1][channels]` oldest first (f32, as the
    /// CPU engine keeps it; empty for attention layers).
    pub(super) conv: Vec<Vec<f32>>,
    /// Per layer: a DeltaNet's state `[n_v][dk][dv]` (f32 between steps, fp16 in the program).
    pub(super) s: Vec<Vec<f32>>,
}

impl FusedKv {
    /// An empty state of `model` for `capacity` positions in caches of `context`.
    pub(super) fn new(model: &Model, owner: usize, capacity: usize, context: usize) -> FusedKv {
        let h = model.config.hidden_size;
        let cache = (model.layers.iter())
            .map(|l| {
                let d = l.attention().map_or(0, |a| a.n_kv_heads * a.head_dim);
                [vec![f16::ZERO; d * context], vec![f16::ZERO; d * context]]
            })
            .collect();
        let conv = (model.layers.iter())
            .map(|l| match &l.mixer {
                Mixer::ShortConv(c) => vec![0f32; (c.kernel - 1) * h],
                Mixer::DeltaNet(d) => vec![0f32; (d.conv_kernel - 1) * d.conv_channels()],
                Mixer::Attention(_) => Vec::new(),
            })
            .collect();
        let s = (model.layers.iter())
            .map(|l| match &l.mixer {
                Mixer::DeltaNet(d) => vec![0f32; d.n_v_heads * d.k_dim * d.v_dim],
                _ => Vec::new(),
            })
            .collect();
        FusedKv {
            owner,
            uid: NEXT_STATE.fetch_add(1, Ordering::Relaxed),
            len: 0,
            capacity,
            context,
            cache,
            conv,
            s,
        }
    }

    /// Moves layer `li`'s conv history on by `rows` (`channels` floats each, oldest first).
    pub(super) fn push_history(&mut self, li: usize, rows: &[f32]) {
        let hist = &mut self.conv[li];
        let keep = hist.len();
        let mut all = std::mem::take(hist);
        all.extend_from_slice(rows);
        *hist = all.split_off(all.len() - keep);
    }
}

impl OwnedState for FusedKv {
    fn owner(&self) -> usize {
        self.owner
    }
}

impl KvState for FusedKv {
    fn len(&self) -> usize {
        self.len
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    /// Positions from `len` on are masked out; their stale values need no clearing. A conv
    /// history cannot go back: a model with one starts over (len 0), as the CPU engine's does.
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if self.conv.iter().any(|c| !c.is_empty()) {
            self.conv
                .iter_mut()
                .chain(&mut self.s)
                .for_each(|c| c.fill(0.0));
            self.len = 0;
        } else {
            self.len = len;
        }
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
