//! The CPU KV cache: per layer, the keys and values of every position (`[pos][kv_dim]`), each
//! in its own format (f32, f16, q8_0 or q4_0): the smaller ones shrink the cache and the
//! bandwidth attention reads; f32 keeps the exact path exact.
//!
//! A sliding-window layer holds only the positions its window can still reach, [`BACK`] more,
//! and room for one pass: `window - 1 + BACK + MAX_BATCH` of them, from its `base` on. Before a
//! pass that would run past them, the positions the pass's first token needs (and `BACK` before
//! them) move to the front (once per `MAX_BATCH` tokens or so: a window's worth of keys and
//! values). Such a state goes back to any position from `BACK` before its last pass on (a
//! speculative rollback, a chat template that renders the last tokens of a reply its own way);
//! further back, it starts over (as a recurrent state does) when a windowed layer has forgotten
//! positions the next token needs.

use std::any::Any;

use anelm_model::{KvState, OwnedState};
use half::f16;

use crate::kvblock::{each_format, BlockQ4_0, BlockQ8_0, KvBlock};
use crate::shared::SharedSlice;
use crate::MAX_BATCH;

/// Positions before its last pass that a state with sliding windows can always go back to.
pub(crate) const BACK: usize = 128;

/// The element format of the keys or the values of the cache (llama.cpp's `--cache-type-k/-v`
/// names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0];

    pub fn parse(name: &str) -> Option<KvDtype> {
        KvDtype::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// Values per block: a head's dimension must be a multiple of it.
    pub fn block(self) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 => 1,
            KvDtype::Q8_0 | KvDtype::Q4_0 => 32,
        }
    }

    /// Bytes of `values` values (a multiple of [`KvDtype::block`]).
    pub fn bytes(self, values: usize) -> usize {
        let block = match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
            KvDtype::Q8_0 => size_of::<BlockQ8_0>(),
            KvDtype::Q4_0 => size_of::<BlockQ4_0>(),
        };
        values / self.block() * block
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        KvDtype::parse(s).ok_or_else(|| {
            let names: Vec<&str> = KvDtype::ALL.iter().map(|d| d.name()).collect();
            format!("unknown cache type '{s}' (one of {})", names.join(", "))
        })
    }
}

/// A vector of blocks that starts zeroed without touching its pages (the kernel maps zero
/// pages on first use), so that a cache's resident size is the positions it holds.
fn zeroed<B: KvBlock>(n: usize) -> Vec<B> {
    if n == 0 || size_of::<B>() == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<B>(n).expect("cache size overflows");
    // SAFETY: the layout is non-zero; every format is plain data for which all-zero bytes are
    // the zero value, and the Vec takes the allocation with the same layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut B;
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, n, n)
    }
}

/// The keys or the values of every layer, in one format.
pub(crate) enum KvVec {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8_0>),
    Q4_0(Vec<BlockQ4_0>),
}

/// A [`KvVec`] as attention reads it.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
}

impl Rows<'_> {
    /// The bytes of the values `at` (whole blocks).
    pub(crate) fn bytes(&self, at: std::ops::Range<usize>) -> &[u8] {
        fn go<B: KvBlock>(r: &[B], at: std::ops::Range<usize>) -> &[u8] {
            let b = &r[blocks::<B>(at)];
            // SAFETY: every format is plain data, its bytes all initialised.
            unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, size_of_val(b)) }
        }
        each_format!(self, Rows, r => go(r, at))
    }
}

/// A [`KvVec`] as the threads of a pass share it (each writes the rows of its tokens).
pub(crate) enum SharedRows<'a> {
    F32(SharedSlice<'a, f32>),
    F16(SharedSlice<'a, f16>),
    Q8_0(SharedSlice<'a, BlockQ8_0>),
    Q4_0(SharedSlice<'a, BlockQ4_0>),
}

impl KvVec {
    fn new(dtype: KvDtype, values: usize) -> KvVec {
        let n = values / dtype.block();
        match dtype {
            KvDtype::F32 => KvVec::F32(zeroed(n)),
            KvDtype::F16 => KvVec::F16(zeroed(n)),
            KvDtype::Q8_0 => KvVec::Q8_0(zeroed(n)),
            KvDtype::Q4_0 => KvVec::Q4_0(zeroed(n)),
        }
    }

    fn dtype(&self) -> KvDtype {
        match self {
            KvVec::F32(_) => KvDtype::F32,
            KvVec::F16(_) => KvDtype::F16,
            KvVec::Q8_0(_) => KvDtype::Q8_0,
            KvVec::Q4_0(_) => KvDtype::Q4_0,
        }
    }

    /// Moves the values `src` (whole blocks) to `dst` on.
    fn move_values(&mut self, src: std::ops::Range<usize>, dst: usize) {
        fn go<B: KvBlock>(v: &mut [B], src: std::ops::Range<usize>, dst: usize) {
            v.copy_within(blocks::<B>(src), dst / B::N);
        }
        each_format!(self, KvVec, v => go(v, src, dst))
    }

    /// Copies the values `src` (whole blocks) of `from`, of the same format, to `dst` on.
    /// False for another format.
    fn copy_values(&mut self, from: &KvVec, src: std::ops::Range<usize>, dst: usize) -> bool {
        fn go<B: KvBlock>(to: &mut [B], from: &[B], src: std::ops::Range<usize>, dst: usize) {
            let src = blocks::<B>(src);
            let at = dst / B::N;
            to[at..at + src.len()].copy_from_slice(&from[src]);
        }
        match (self, from) {
            (KvVec::F32(t), KvVec::F32(f)) => go(t, f, src, dst),
            (KvVec::F16(t), KvVec::F16(f)) => go(t, f, src, dst),
            (KvVec::Q8_0(t), KvVec::Q8_0(f)) => go(t, f, src, dst),
            (KvVec::Q4_0(t), KvVec::Q4_0(f)) => go(t, f, src, dst),
            _ => return false,
        }
        true
    }

    pub(crate) fn shared(&mut self) -> SharedRows<'_> {
        match self {
            KvVec::F32(v) => SharedRows::F32(SharedSlice::new(v)),
            KvVec::F16(v) => SharedRows::F16(SharedSlice::new(v)),
            KvVec::Q8_0(v) => SharedRows::Q8_0(SharedSlice::new(v)),
            KvVec::Q4_0(v) => SharedRows::Q4_0(SharedSlice::new(v)),
        }
    }
}

/// `values` (a range of values, whole blocks) as a range of blocks of `B`.
fn blocks<B: KvBlock>(values: std::ops::Range<usize>) -> std::ops::Range<usize> {
    debug_assert!(values.start.is_multiple_of(B::N) && values.end.is_multiple_of(B::N));
    values.start / B::N..values.end / B::N
}

impl SharedRows<'_> {
    /// Whether values are held in quantised blocks.
    pub(crate) fn quantized(&self) -> bool {
        matches!(self, SharedRows::Q8_0(_) | SharedRows::Q4_0(_))
    }

    /// The values `at` (whole blocks).
    ///
    /// # Safety
    /// No thread writes them until the next barrier.
    pub(crate) unsafe fn range(&self, at: std::ops::Range<usize>) -> Rows<'_> {
        match self {
            SharedRows::F32(s) => Rows::F32(s.range(blocks::<f32>(at))),
            SharedRows::F16(s) => Rows::F16(s.range(blocks::<f16>(at))),
            SharedRows::Q8_0(s) => Rows::Q8_0(s.range(blocks::<BlockQ8_0>(at))),
            SharedRows::Q4_0(s) => Rows::Q4_0(s.range(blocks::<BlockQ4_0>(at))),
        }
    }

    /// Stores `src` as the values from `at` (a block boundary) on.
    ///
    /// # Safety
    /// No other thread touches them until the next barrier.
    pub(crate) unsafe fn store(&self, at: usize, src: &[f32]) {
        let r = at..at + src.len();
        each_format!(self, SharedRows, s => quantize_into(s, r, src))
    }
}

unsafe fn quantize_into<B: KvBlock>(
    s: &SharedSlice<'_, B>,
    at: std::ops::Range<usize>,
    src: &[f32],
) {
    B::quantize(s.range_mut(blocks::<B>(at)), src);
}

/// One layer's part of the cache: the values of a position (`dim`, heads of `head` values),
/// and its sliding window if any.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KvLayer {
    pub dim: usize,
    pub head: usize,
    pub window: Option<usize>,
}

impl KvLayer {
    fn heads(&self) -> usize {
        self.dim.checked_div(self.head).unwrap_or(0)
    }
}

/// Keys and values of all layers, each in one allocation: layer `l` holds the positions
/// `base[l] .. base[l] + slots[l]` in the values `offset[l] .. offset[l] + slots[l] * dim`,
/// head by head — head `h`'s position `p` from `offset[l] + (h · slots[l] + p - base[l]) ·
/// head` on — so that attention reads a head's positions as one stream (position by position,
/// the heads interleaved, made decode attention three times slower where the cache is not
/// in the caches: a head's rows were 128 of every 384 bytes).
pub(crate) struct Layers {
    pub k: KvVec,
    pub v: KvVec,
    pub offset: Vec<usize>,
    /// Positions each layer holds at once: the state's capacity, or a window and a pass.
    pub slots: Vec<usize>,
    /// The first position each layer holds (above 0 once a windowed layer has moved on).
    pub base: Vec<usize>,
    layers: Vec<KvLayer>,
}

impl Layers {
    fn new(layers: &[KvLayer], capacity: usize, k: KvDtype, v: KvDtype) -> Self {
        let slots: Vec<usize> = layers
            .iter()
            .map(|l| l.window.map_or(capacity, |w| window_slots(w).min(capacity)))
            .collect();
        let offset: Vec<usize> = layers
            .iter()
            .zip(&slots)
            .scan(0, |at, (l, n)| Some(std::mem::replace(at, *at + l.dim * n)))
            .collect();
        let total = layers.iter().zip(&slots).map(|(l, n)| l.dim * n).sum();
        Layers {
            k: KvVec::new(k, total),
            v: KvVec::new(v, total),
            offset,
            base: vec![0; layers.len()],
            slots,
            layers: layers.to_vec(),
        }
    }

    /// Whether every windowed layer still holds what a token at position `len` attends to.
    fn reaches(&self, len: usize) -> bool {
        self.layers
            .iter()
            .zip(&self.base)
            .all(|(l, &b)| l.window.is_none_or(|w| b <= (len + 1).saturating_sub(w)))
    }

    /// Makes room in every windowed layer for `n` (at most [`MAX_BATCH`]) positions from `len`
    /// on, keeping the ones the first of them attends to.
    fn make_room(&mut self, len: usize, n: usize) {
        for l in 0..self.layers.len() {
            let (Some(w), layer) = (self.layers[l].window, self.layers[l]) else {
                continue;
            };
            let (base, slots) = (self.base[l], self.slots[l]);
            if len + n <= base + slots {
                continue;
            }
            let keep = (len + 1).saturating_sub(w + BACK);
            debug_assert!(
                base <= keep && len + n - keep <= slots,
                "a pass beyond the window"
            );
            for h in 0..layer.heads() {
                let at = self.offset[l] + h * slots * layer.head;
                let src = at + (keep - base) * layer.head..at + (len - base) * layer.head;
                self.k.move_values(src.clone(), at);
                self.v.move_values(src, at);
            }
            self.base[l] = keep;
        }
    }
}

/// Positions a layer with a sliding window of `w` holds: the `w - 1` before a pass, [`BACK`]
/// more, and the pass.
fn window_slots(w: usize) -> usize {
    w.saturating_sub(1) + BACK + MAX_BATCH
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
    pub(crate) data: Layers,
    pub(crate) recurrent: Recurrent,
    pub(crate) len: usize,
    pub(crate) capacity: usize,
    /// Identifies the executor (model) the state belongs to.
    pub(crate) owner: usize,
}

impl CpuKv {
    pub(crate) fn new(
        layers: &[KvLayer],
        recurrent: &[(usize, usize)],
        capacity: usize,
        (k, v): (KvDtype, KvDtype),
        owner: usize,
    ) -> Self {
        CpuKv {
            data: Layers::new(layers, capacity, k, v),
            recurrent: Recurrent::new(recurrent),
            len: 0,
            capacity,
            owner,
        }
    }

    /// The formats of the keys and of the values.
    pub fn dtypes(&self) -> (KvDtype, KvDtype) {
        (self.data.k.dtype(), self.data.v.dtype())
    }

    /// Room for a pass of `n` (at most [`MAX_BATCH`]) new positions.
    pub(crate) fn make_room(&mut self, n: usize) {
        self.data.make_room(self.len, n);
    }

    /// Positions of layer `l` held in memory (the slots it keeps; a window's are reused).
    pub fn layer_slots(&self, l: usize) -> usize {
        self.data.slots[l]
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
    /// Keys and values can be forgotten from any position that windowed layers still reach; a
    /// recurrent state cannot go back, so a model with one starts over (len 0) when asked to
    /// keep fewer positions than it has, and so does one whose windows have moved past `len`.
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if self.recurrent.s.is_empty() && self.recurrent.conv.is_empty() && self.data.reaches(len) {
            self.len = len;
        } else {
            self.recurrent.conv.fill(0.0);
            self.recurrent.s.fill(0.0);
            self.data.base.fill(0);
            self.len = 0;
        }
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    /// Copies the keys and values of `src`'s first `len` positions, layer by layer (the same
    /// bits as computing them here). Refused for a state of another model or other formats,
    /// where `src`'s windows have moved on from position 0, and for a recurrent state unless
    /// `len` is all of `src` (its recurrent state exists only at its own length).
    fn copy_prefix(&mut self, src: &mut dyn KvState, len: usize) -> bool {
        let Some(src) = src.as_any_mut().downcast_mut::<CpuKv>() else {
            return false;
        };
        let recurrent = !(src.recurrent.s.is_empty() && src.recurrent.conv.is_empty());
        let d = &self.data;
        if src.owner != self.owner
            || src.dtypes() != self.dtypes()
            || len > src.len
            || len > self.capacity
            || (recurrent && len != src.len)
            || src.data.base.iter().any(|&b| b != 0)
            || src.data.slots.len() != d.slots.len()
            || d.slots.iter().any(|&s| s < len)
        {
            return false;
        }
        self.data.base.fill(0);
        for l in 0..self.data.slots.len() {
            let layer = self.data.layers[l];
            for h in 0..layer.heads() {
                let from = src.data.offset[l] + h * src.data.slots[l] * layer.head;
                let to = self.data.offset[l] + h * self.data.slots[l] * layer.head;
                let values = from..from + len * layer.head;
                let copied = self.data.k.copy_values(&src.data.k, values.clone(), to)
                    && self.data.v.copy_values(&src.data.v, values, to);
                debug_assert!(copied, "the formats were checked");
            }
        }
        if recurrent {
            self.recurrent.conv.copy_from_slice(&src.recurrent.conv);
            self.recurrent.s.copy_from_slice(&src.recurrent.s);
        }
        self.len = len;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recurrent_state_restarts_instead_of_going_back() {
        let mut kv = CpuKv::new(
            &plain(&[4, 0]),
            &[(0, 0), (6, 8)],
            10,
            (KvDtype::F32, KvDtype::F32),
            1,
        );
        kv.len = 5;
        kv.recurrent.s[3] = 1.0;
        kv.truncate(7);
        assert_eq!(kv.len(), 5, "keeping more than held changes nothing");
        kv.truncate(3);
        assert_eq!(kv.len(), 0);
        assert!(kv.recurrent.s.iter().all(|&x| x == 0.0));

        let mut flat = CpuKv::new(
            &plain(&[32]),
            &[(0, 0)],
            10,
            (KvDtype::Q8_0, KvDtype::F16),
            1,
        );
        flat.len = 5;
        flat.truncate(3);
        assert_eq!(flat.len(), 3);
        assert_eq!(flat.dtypes(), (KvDtype::Q8_0, KvDtype::F16));
    }

    fn plain(dims: &[usize]) -> Vec<KvLayer> {
        dims.iter()
            .map(|&dim| KvLayer {
                dim,
                head: dim,
                window: None,
            })
            .collect()
    }

    /// The value a test stores for position `pos` of layer `l`, element `i`.
    fn mark(l: usize, pos: usize, i: usize) -> f32 {
        (l * 100_000 + pos * 10 + i) as f32
    }

    #[test]
    fn a_windowed_layer_keeps_its_window_in_fixed_memory_and_goes_back_near_its_last_pass() {
        let (w, dim, capacity) = (5, 2, 4 * MAX_BATCH);
        let layers = [
            KvLayer {
                dim,
                head: dim,
                window: None,
            },
            // Two heads: the window moves each head's positions within its own rows.
            KvLayer {
                dim,
                head: 1,
                window: Some(w),
            },
        ];
        // Where element `i` of position `pos` of layer `l` is held.
        let index = |kv: &CpuKv, l: usize, pos: usize, i: usize| {
            let (layer, d) = (layers[l], &kv.data);
            let (h, e) = (i / layer.head, i % layer.head);
            d.offset[l] + (h * d.slots[l] + pos - d.base[l]) * layer.head + e
        };
        let mut kv = CpuKv::new(
            &layers,
            &[(0, 0); 2],
            capacity,
            (KvDtype::F32, KvDtype::F32),
            1,
        );
        assert_eq!(kv.layer_slots(0), capacity);
        assert_eq!(kv.layer_slots(1), w - 1 + BACK + MAX_BATCH);
        let KvVec::F32(k) = &kv.data.k else {
            unreachable!()
        };
        assert_eq!(
            k.len(),
            dim * (capacity + w - 1 + BACK + MAX_BATCH),
            "memory: the slots only"
        );
        // Passes of varied lengths, as prefill chunks and decode steps append them.
        let mut passes = vec![MAX_BATCH, 7, MAX_BATCH, 1, 1, MAX_BATCH - 3, 300];
        passes.extend([1; 40]);
        for n in passes {
            let start = kv.len;
            kv.make_room(n);
            for pos in start..start + n {
                for l in 0..2 {
                    for i in 0..dim {
                        let at = index(&kv, l, pos, i);
                        let KvVec::F32(k) = &mut kv.data.k else {
                            unreachable!()
                        };
                        k[at] = mark(l, pos, i);
                    }
                }
            }
            kv.len += n;
            // Every position of the pass still sees its window, at the slot it says, and the
            // state can go back `BACK` before the pass.
            let base = kv.data.base[1];
            assert!(base <= (start + 1).saturating_sub(w));
            assert!(kv.data.reaches(start.saturating_sub(BACK)));
            let KvVec::F32(k) = &kv.data.k else {
                unreachable!()
            };
            for pos in (start + 1).saturating_sub(w)..kv.len {
                for i in 0..dim {
                    assert_eq!(
                        k[index(&kv, 1, pos, i)],
                        mark(1, pos, i),
                        "position {pos} after a pass from {start}"
                    );
                }
            }
        }
        // Back to `BACK` before the last pass: kept; far back: the state starts over.
        let len = kv.len;
        kv.truncate(len - 1 - BACK);
        assert_eq!(kv.len(), len - 1 - BACK);
        kv.truncate(len - 600);
        assert_eq!((kv.len(), kv.data.base[1]), (0, 0));
    }

    #[test]
    fn cache_types_have_llama_cpp_names_and_sizes() {
        for d in KvDtype::ALL {
            assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
        }
        assert!("q5_1".parse::<KvDtype>().unwrap_err().contains("q8_0"));
        // ggml's block sizes: 34 bytes per 32 values (q8_0), 18 (q4_0).
        assert_eq!(KvDtype::Q8_0.bytes(64), 68);
        assert_eq!(KvDtype::Q4_0.bytes(64), 36);
        assert_eq!(KvDtype::F16.bytes(64), 128);
    }
}
