//! The CPU executor: runs the LayerPlan over new tokens appended to a KV cache — a prompt's
//! tokens, one decode token, or one token each of several sequences (a batched decode step).
//!
//! A pass's rows are tokens; each row knows its sequence ([`Seq`]: cache, recurrent state,
//! position). Products take all rows at once and compute each row as it would be alone, so a
//! batched step gives each sequence the bits of its solo step.
//!
//! One forward pass is one job of the thread pool: every thread walks the layers. Products and
//! attention hand out tiles dynamically and write shared buffers, followed by a barrier; the
//! cheap per-token steps in between (residuals, norms, the gate activation, quantising the next
//! input) every thread does for itself on its own copy of the residual stream, which saves the
//! barriers they would need — five per layer remain (after q/k/v, attention, o, gate/up, down).
//! RoPE, the q/k norms and the cache writes run as the q/k/v products finish each block of heads.
//! All buffers live in [`Buffers`], sized for the largest batch seen (at most [`MAX_BATCH`]
//! tokens; longer batches run in chunks), so a token allocates nothing.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anelm_model::plan::{Ffn, GatedMlp, Layer, Linear, Mixer};
use anelm_model::{
    check_batch, check_runs, checked_state, ExecError, Executor, KvState, Logits, Model,
    RouteChoice, Run, Weight,
};

use crate::adaptive::Adaptive;
use crate::attention::{window_len, Cache, TILE};
use crate::deltanet;
use crate::kv::{CpuKv, KvDtype, KvLayer, Layers, Recurrent, SharedRows};
use crate::ops::softcap;
use crate::pool::{physical_cores, Ctx, Pool};
use crate::resident::Resident;
use crate::shared::SharedSlice;
use crate::simd::Isa;

use buffers::{Buffers, Dims, Views};
use layer::Forward;

mod attention_pass;
mod buffers;
mod deltanet_pass;
mod ffn_pass;
mod layer;
mod shortconv_pass;

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// Tokens one pass of the layers processes; longer batches are split.
pub const MAX_BATCH: usize = 512;
/// Passes of one sequence up to this many tokens choose their thread count as decode steps do.
const ADAPTIVE_ROWS: usize = 16;
/// Query tokens per attention work item in prefill (16 measured 3–8 % faster than 8 at pp4096
/// on SmolLM2, f16 and q8_0 caches, on AMD Zen 4 and Intel Xeon).
const ATTN_BLOCK: usize = 16;
/// Passes of up to this many tokens (a verifying pass, a batched step with short runs) take
/// decode attention, each row reading its cache in its own format, rather than prefill's,
/// which converts a window of the cache to f32 for a block of queries: for a few rows the
/// conversion costs more than it saves (SmolLM2 at depth 2000: pp3 +25 %, pp9 +20 %, pp16
/// +13 %, pp32 −10 %; Gemma 3 pp9 +25 %; on Zen 4). Both give the same bits.
pub(super) const SHORT_PASS: usize = 16;

/// How a [`CpuExecutor`] runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOptions {
    /// Threads (0: one per physical core).
    pub threads: usize,
    /// The format of the cached keys (None: f16 when every layer matrix is quantised and
    /// `exact` is off, else f32, so that unquantised models and exact runs keep f32 attention).
    pub cache_k: Option<KvDtype>,
    /// The format of the cached values (None: as for the keys).
    pub cache_v: Option<KvDtype>,
    /// Instruction set (None: the best the CPU has).
    pub isa: Option<Isa>,
    /// Exact f32 products for quantised weights too (rows dequantised, activations kept f32)
    /// instead of 8-bit activations; several times slower, for checking results.
    pub exact: bool,
    /// Sliding-window layers keep every position, as full-attention ones do (llama.cpp's
    /// `--swa-full`), instead of their window and one pass: more memory, but a state can then go
    /// back to any position (a prefix reused from far back) without starting over.
    pub swa_full: bool,
}

impl CpuOptions {
    /// The formats of the cached keys and values these options give `model`.
    pub fn cache_types(&self, model: &Model) -> (KvDtype, KvDtype) {
        let default = if all_quantized(model) && !self.exact {
            KvDtype::F16
        } else {
            KvDtype::F32
        };
        (
            self.cache_k.unwrap_or(default),
            self.cache_v.unwrap_or(default),
        )
    }
}

pub struct CpuExecutor {
    model: Arc<Model>,
    pool: Pool,
    isa: Isa,
    /// The formats of the cached keys and values.
    kv: (KvDtype, KvDtype),
    id: usize,
    bufs: Buffers,
    exact: bool,
    swa_full: bool,
    /// The copies of the weights the products read.
    resident: Resident,
    /// Whether decode steps run on all threads or one, for each number of sequences decoded
    /// at once (`adaptive[n - 1]`: their steps take different times), and for short passes of
    /// one sequence (`adaptive[MAX_BATCH + n - 1]`, n ≤ [`ADAPTIVE_ROWS`]).
    adaptive: Vec<Adaptive>,
    /// Per row of the last call, the narrowest router boundary it met
    /// ([`Executor::route_gaps`]).
    route_gaps: Vec<f32>,
    /// The choices at router near-ties of the last call ([`Executor::tied_routes`]).
    route_ties: Vec<RouteChoice>,
}

impl CpuExecutor {
    /// An executor running on `threads` threads (0: one per physical core).
    pub fn new(model: Arc<Model>, threads: usize) -> Self {
        Self::with_options(
            model,
            CpuOptions {
                threads,
                ..CpuOptions::default()
            },
        )
    }

    pub fn with_options(model: Arc<Model>, opts: CpuOptions) -> Self {
        let threads = if opts.threads == 0 {
            physical_cores()
        } else {
            opts.threads
        };
        let isa = opts
            .isa
            .filter(|i| Isa::available().contains(i))
            .unwrap_or_else(Isa::detect);
        let kv = opts.cache_types(&model);
        let bufs = Buffers::new(&Dims::of(&model), 0, threads);
        let resident = Resident::new(matrices(&model), isa, !opts.exact);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        CpuExecutor {
            model,
            pool: Pool::new(threads),
            isa,
            kv,
            id,
            bufs,
            exact: opts.exact,
            swa_full: opts.swa_full,
            resident,
            adaptive: Vec::new(),
            route_gaps: Vec::new(),
            route_ties: Vec::new(),
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The formats of the cached keys and values.
    pub fn kv_dtypes(&self) -> (KvDtype, KvDtype) {
        self.kv
    }
}

/// Whether `model`'s cache can hold keys as `k` and values as `v`: every attention head's
/// dimension a whole number of the formats' blocks (the one-line reason if not).
pub fn check_cache_types(model: &Model, k: KvDtype, v: KvDtype) -> Result<(), String> {
    for (which, d) in [("--cache-type-k", k), ("--cache-type-v", v)] {
        let bad = model
            .layers
            .iter()
            .filter_map(|l| l.attention())
            .find(|a| !a.head_dim.is_multiple_of(d.block()));
        if let Some(a) = bad {
            return Err(format!(
                "{which} {d}: the model's attention heads have {} dimensions, not a multiple of \
                 the {}-value blocks of {d}",
                a.head_dim,
                d.block()
            ));
        }
    }
    Ok(())
}

fn mlp_linears(m: &GatedMlp) -> [&Linear; 3] {
    [&m.gate, &m.up, &m.down]
}

fn linears(l: &Layer) -> Vec<&Linear> {
    let mut v = l.mixer.linears();
    let mlp = mlp_linears;
    match &l.ffn {
        Ffn::Gated { gate, up, down, .. } => v.extend([gate, up, down]),
        Ffn::Plain { up, down, .. } => v.extend([up, down]),
        Ffn::Moe(m) => {
            v.extend(m.experts.iter().flat_map(mlp));
            v.extend(m.shared.iter().flat_map(|s| mlp(&s.mlp)));
        }
    }
    v
}

/// The matrices of the products: every layer's and the output head (a token embedding of its own
/// stays mapped: lookups read a row at a time; one tied to the head reads the head's copy).
fn matrices(m: &Model) -> impl Iterator<Item = &Weight> {
    m.layers
        .iter()
        .flat_map(linears)
        .map(|l| &l.weight)
        .chain(std::iter::once(&m.lm_head))
}

fn all_quantized(m: &Model) -> bool {
    m.layers
        .iter()
        .flat_map(linears)
        .all(|l| l.weight.dtype.is_quantized())
}

impl Executor for CpuExecutor {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        let max = self.model.max_positions();
        if capacity > max {
            return Err(ExecError::ContextFull {
                needed: capacity,
                capacity: max,
            });
        }
        check_cache_types(&self.model, self.kv.0, self.kv.1).map_err(ExecError::Device)?;
        let layers = &self.model.layers;
        let kv_layers: Vec<KvLayer> = layers
            .iter()
            .map(|l| {
                l.attention().map_or(KvLayer::default(), |a| KvLayer {
                    dim: a.n_kv_heads * a.head_dim,
                    head: a.head_dim,
                    window: a.window.filter(|_| !self.swa_full),
                })
            })
            .collect();
        let recurrent: Vec<(usize, usize)> = layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::DeltaNet(d) => (
                    d.conv_channels() * (d.conv_kernel - 1),
                    d.n_v_heads * d.k_dim * d.v_dim,
                ),
                Mixer::ShortConv(c) => ((c.kernel - 1) * self.model.config.hidden_size, 0),
                Mixer::Attention(_) => (0, 0),
            })
            .collect();
        Ok(Box::new(CpuKv::new(
            &kv_layers, &recurrent, capacity, self.kv, self.id,
        )))
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        let kv: &mut CpuKv = checked_state(state, self.id, tokens, vocab)?;
        self.route_gaps.clear();
        self.route_ties.clear();
        if tokens.is_empty() {
            out.clear();
            return Ok(());
        }
        let n = tokens.len();
        let want = n - logits.rows(n)..n;
        overwritten(out, want.len() * vocab);
        self.reserve(n.min(MAX_BATCH));

        let mut done = 0;
        while done < n {
            let len = (n - done).min(self.bufs.cap);
            // Rows of logits inside this chunk, relative to the chunk and to `out`.
            let lo = want.start.max(done);
            let hi = done + len;
            let (rows, out_rows) = if lo < hi {
                (lo - done..hi - done, lo - want.start..hi - want.start)
            } else {
                (0..0, 0..0)
            };
            let out_chunk = &mut out[out_rows.start * vocab..out_rows.end * vocab];
            let tokens = &tokens[done..done + len];
            let rows: Vec<usize> = rows.collect();
            self.run(&mut [&mut *kv], &[len], tokens, &rows, out_chunk, false);
            done += len;
        }
        if let Some(cap) = self.model.final_softcap {
            softcap(out, cap);
        }
        Ok(())
    }

    fn route_gaps(&self) -> &[f32] {
        &self.route_gaps
    }

    fn tied_routes(&self) -> &[RouteChoice] {
        &self.route_ties
    }

    /// The sequences' tokens go through the layers as the rows of one chunk: each product
    /// reads its weight once for all of them, with each row's arithmetic what it is alone (its
    /// own activation quantisation, the kernels' per-row accumulation), and attention and the
    /// recurrent layers run per sequence on its own state. A single sequence is the same pass.
    fn forward_batch(
        &mut self,
        states: &mut [&mut dyn KvState],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        check_batch(states, tokens, vocab)?;
        let mut kvs = Vec::with_capacity(states.len());
        for s in states.iter_mut() {
            kvs.push(checked_state::<CpuKv>(&mut **s, self.id, &[], vocab)?);
        }
        self.route_gaps.clear();
        self.route_ties.clear();
        overwritten(out, tokens.len() * vocab);
        self.reserve(tokens.len().min(MAX_BATCH));
        let per = self.bufs.cap;
        self.bufs.reserve_decode(per.min(tokens.len()));
        for ((kvs, tokens), out) in kvs
            .chunks_mut(per)
            .zip(tokens.chunks(per))
            .zip(out.chunks_mut(per * vocab))
        {
            let rows: Vec<usize> = (0..tokens.len()).collect();
            self.run(kvs, &vec![1; tokens.len()], tokens, &rows, out, false);
        }
        if let Some(cap) = self.model.final_softcap {
            softcap(out, cap);
        }
        Ok(())
    }

    /// The runs go through the layers as the rows of one chunk (several chunks when they
    /// exceed the buffers' rows): each product reads its weight once for all of them, each
    /// row's arithmetic what it is alone, and attention and the recurrent layers run per
    /// sequence on its own state over its own run — so a prompt chunk or a verifying pass
    /// joins the decode tokens of the other sequences in one pass, and each row is what its
    /// run alone gives. Only the wanted rows go through the head.
    fn forward_runs(
        &mut self,
        states: &mut [&mut dyn KvState],
        runs: &[Run],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        check_runs(states, runs, tokens, vocab)?;
        if runs.iter().all(|&r| r == Run::last(1)) {
            return self.forward_batch(states, tokens, out);
        }
        let mut kvs = Vec::with_capacity(states.len());
        let mut at = 0;
        for (s, run) in states.iter_mut().zip(runs) {
            kvs.push(checked_state::<CpuKv>(
                &mut **s,
                self.id,
                &tokens[at..at + run.len],
                vocab,
            )?);
            at += run.len;
        }
        self.route_gaps.clear();
        self.route_ties.clear();
        overwritten(out, runs.iter().map(|r| r.logits).sum::<usize>() * vocab);
        // Passes of whole runs, in order, each at most MAX_BATCH tokens; a longer run goes
        // alone, in chunks, as `forward` takes it.
        let (mut first, mut at, mut row_at) = (0, 0, 0);
        while first < runs.len() {
            let mut end = first + 1;
            let mut n = runs[first].len;
            while end < runs.len() && n + runs[end].len <= MAX_BATCH && runs[first].len <= MAX_BATCH
            {
                n += runs[end].len;
                end += 1;
            }
            let wanted: usize = runs[first..end].iter().map(|r| r.logits).sum();
            let row_out = &mut out[row_at * vocab..(row_at + wanted) * vocab];
            let toks = &tokens[at..at + n];
            if runs[first].len > MAX_BATCH {
                let mut rows = Vec::new();
                let state: &mut dyn KvState = &mut *kvs[first];
                self.forward(state, toks, runs[first].selection(), &mut rows)?;
                row_out.copy_from_slice(&rows);
            } else {
                self.reserve(n);
                if n == end - first {
                    self.bufs.reserve_decode(n);
                }
                let mut rows = Vec::with_capacity(wanted);
                let mut last = 0;
                for run in &runs[first..end] {
                    last += run.len;
                    rows.extend(last - run.logits..last);
                }
                let lens: Vec<usize> = runs[first..end].iter().map(|r| r.len).collect();
                self.run(&mut kvs[first..end], &lens, toks, &rows, row_out, false);
                if let Some(cap) = self.model.final_softcap {
                    softcap(row_out, cap);
                }
            }
            first = end;
            at += n;
            row_at += wanted;
        }
        Ok(())
    }

    /// [`Executor::forward`]'s pass with the head left out: every token's final-normed hidden
    /// state, in chunks of at most the buffers' rows.
    fn hidden_states(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        let h = self.model.config.hidden_size;
        let kv: &mut CpuKv = checked_state(state, self.id, tokens, vocab)?;
        out.clear();
        self.route_gaps.clear();
        self.route_ties.clear();
        out.resize(tokens.len() * h, 0.0);
        self.reserve(tokens.len().clamp(1, MAX_BATCH));
        let mut done = 0;
        while done < tokens.len() {
            let len = (tokens.len() - done).min(self.bufs.cap);
            let chunk = &tokens[done..done + len];
            let dst = &mut out[done * h..(done + len) * h];
            let rows: Vec<usize> = (0..len).collect();
            self.run(&mut [&mut *kv], &[len], chunk, &rows, dst, true);
            done += len;
        }
        Ok(())
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
}

impl CpuExecutor {
    /// Buffers for chunks of `rows` tokens, and scratch for attention and the recurrent
    /// layers (the same whatever the context).
    fn reserve(&mut self, rows: usize) {
        if self.bufs.cap < rows {
            self.bufs = Buffers::new(&Dims::of(&self.model), rows, self.pool.threads());
        }
        // Attention scores span a tile of the cache, for a group of heads.
        let layers = &self.model.layers;
        let group = layers
            .iter()
            .filter_map(|l| l.attention())
            .map(|a| a.n_heads / a.n_kv_heads)
            .max()
            .unwrap_or(1);
        let dn_scratch = layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::DeltaNet(d) => deltanet::scratch_len(d),
                Mixer::Attention(_) | Mixer::ShortConv(_) => 0,
            })
            .max()
            .unwrap_or(0);
        let window = layers
            .iter()
            .filter_map(|l| l.attention())
            .map(|a| window_len(a.head_dim))
            .max()
            .unwrap_or(0);
        for p in &self.bufs.own {
            let p = &mut *p.lock().unwrap_or_else(|e| e.into_inner());
            let need = (TILE * group).max(dn_scratch);
            if p.scratch.len() < need {
                p.scratch.resize(need, 0.0);
            }
            if p.window.len() < window {
                p.window.resize(window, 0.0);
            }
        }
        self.bufs.reserve_decode(rows.min(SHORT_PASS));
    }

    /// One pass over `tokens`, the next `lens[i]` of them (in order) the next tokens of
    /// `kvs[i]`: writes the logits of the chunk rows `rows` (or, `hidden`, their final-normed
    /// hidden states) into `out` and advances the states.
    fn run(
        &mut self,
        kvs: &mut [&mut CpuKv],
        lens: &[usize],
        tokens: &[u32],
        rows: &[usize],
        out: &mut [f32],
        hidden: bool,
    ) {
        debug_assert!(kvs.len() == lens.len() && lens.iter().sum::<usize>() == tokens.len());
        // A decode step, or a short pass of one sequence (a speculative verification), may go
        // on one thread while the machine is contended (see `adaptive`).
        let decode = if kvs.len() == tokens.len() {
            Some(tokens.len() - 1)
        } else if kvs.len() == 1 && tokens.len() <= ADAPTIVE_ROWS {
            Some(MAX_BATCH + tokens.len() - 1)
        } else {
            None
        };
        if let Some(i) = decode {
            if self.adaptive.len() <= i {
                self.adaptive.resize_with(i + 1, Adaptive::default);
            }
        }
        kvs.iter_mut()
            .zip(lens)
            .for_each(|(kv, &len)| kv.make_room(len));
        let solo = decode.is_some_and(|i| self.adaptive[i].solo_next());
        let started = Instant::now();
        let env = Env {
            m: &self.model,
            pool: &self.pool,
            isa: self.isa,
            exact: self.exact,
            resident: &self.resident,
            solo,
        };
        let runs = Runs {
            lens,
            tokens,
            rows,
            hidden,
        };
        run_chunk(&env, &mut self.bufs, kvs, runs, out);
        if self
            .model
            .layers
            .iter()
            .any(|l| matches!(l.ffn, Ffn::Moe(_)))
        {
            let p = self.bufs.own[0].lock().unwrap_or_else(|e| e.into_inner());
            self.route_gaps.extend_from_slice(&p.route_gap);
            // Positions in the sequence: a single sequence's pass only.
            if let [kv] = &kvs[..] {
                let ties = p.route_ties.iter().map(|(t, layer, experts)| RouteChoice {
                    position: kv.len + t,
                    layer: *layer,
                    experts: experts.clone(),
                });
                let from = self.route_ties.len();
                self.route_ties.extend(ties);
                self.route_ties[from..].sort_by_key(|c| (c.position, c.layer));
            }
        }
        kvs.iter_mut()
            .zip(lens)
            .for_each(|(kv, &len)| kv.len += len);
        if let Some(i) = decode {
            let contended = !solo && self.pool.contended();
            self.adaptive[i].record(started.elapsed(), contended);
        }
    }
}

/// One sequence of a chunk: its cache and recurrent state, the position of its first token,
/// and the rows of the chunk that are its tokens.
struct Seq<'a> {
    kc: SharedRows<'a>,
    vc: SharedRows<'a>,
    conv: SharedSlice<'a, f32>,
    s: SharedSlice<'a, f32>,
    /// Where each layer's keys and values, conv history and states begin.
    kv_at: &'a [usize],
    conv_at: &'a [usize],
    s_at: &'a [usize],
    /// Each layer's first position held, and how many it holds.
    base: &'a [usize],
    slots: &'a [usize],
    p0: usize,
    rows: Range<usize>,
}

impl Seq<'_> {
    /// Layer `li`'s keys and values (`kvd` of each a position).
    ///
    /// # Safety
    /// No thread writes them until the next barrier.
    unsafe fn cache(&self, li: usize, kvd: usize) -> Cache<'_> {
        let at = self.kv_at[li]..self.kv_at[li] + self.slots[li] * kvd;
        Cache {
            k: self.kc.range(at.clone()),
            v: self.vc.range(at),
            slots: self.slots[li],
            base: self.base[li],
        }
    }

    /// Where layer `li` keeps KV head `h`'s `hd` values of position `pos` (see [`Layers`]).
    fn kv_value(&self, li: usize, h: usize, hd: usize, pos: usize) -> usize {
        debug_assert!((self.base[li]..self.base[li] + self.slots[li]).contains(&pos));
        self.kv_at[li] + (h * self.slots[li] + pos - self.base[li]) * hd
    }
}

/// The tokens of one pass, each sequence's rows in a run, and the rows whose logits are
/// wanted.
struct Chunk<'a> {
    tokens: &'a [u32],
    seqs: Vec<Seq<'a>>,
    rows: &'a [usize],
    /// The rows' final-normed hidden states go to `out`, not their logits.
    hidden: bool,
}

impl Chunk<'_> {
    /// The sequence of row `t`, and the position of its token.
    fn at(&self, t: usize) -> (&Seq<'_>, usize) {
        let i = self.seqs.partition_point(|s| s.rows.end <= t);
        let s = &self.seqs[i];
        (s, s.p0 + t - s.rows.start)
    }

    /// Every sequence has one token: a decode step.
    fn decode(&self) -> bool {
        self.seqs.len() == self.tokens.len()
    }
}

/// What a forward pass reads and never changes.
struct Env<'a> {
    m: &'a Model,
    pool: &'a Pool,
    isa: Isa,
    exact: bool,
    resident: &'a Resident,
    /// Run on the caller's thread alone.
    solo: bool,
}

/// The tokens of a pass: `lens[i]` of them (in order) for the i-th sequence, and the rows
/// whose logits (or, `hidden`, final-normed hidden states) are wanted.
struct Runs<'a> {
    lens: &'a [usize],
    tokens: &'a [u32],
    rows: &'a [usize],
    hidden: bool,
}

fn run_chunk(env: &Env<'_>, b: &mut Buffers, kvs: &mut [&mut CpuKv], r: Runs<'_>, out: &mut [f32]) {
    let Runs {
        lens,
        tokens,
        rows,
        hidden,
    } = r;
    let (m, isa) = (env.m, env.isa);
    let mut start = 0;
    let seqs = kvs
        .iter_mut()
        .zip(lens)
        .map(|(kv, &len)| {
            let p0 = kv.len;
            let Layers {
                k,
                v,
                offset,
                base,
                slots,
                ..
            } = &mut kv.data;
            let Recurrent {
                conv,
                s,
                conv_offset,
                s_offset,
            } = &mut kv.recurrent;
            let seq = Seq {
                kc: k.shared(),
                vc: v.shared(),
                conv: SharedSlice::new(conv),
                s: SharedSlice::new(s),
                kv_at: offset,
                conv_at: conv_offset,
                s_at: s_offset,
                base,
                slots,
                p0,
                rows: start..start + len,
            };
            start += len;
            seq
        })
        .collect();
    let c = &Chunk {
        tokens,
        seqs,
        rows,
        hidden,
    };
    let views = Views {
        q: SharedSlice::new(&mut b.q),
        k: SharedSlice::new(&mut b.k),
        v: SharedSlice::new(&mut b.v),
        att: SharedSlice::new(&mut b.att),
        o: SharedSlice::new(&mut b.o),
        g: SharedSlice::new(&mut b.g),
        u: SharedSlice::new(&mut b.u),
        z: SharedSlice::new(&mut b.z),
        b: SharedSlice::new(&mut b.b),
        a: SharedSlice::new(&mut b.a),
        r: SharedSlice::new(&mut b.r),
        part: SharedSlice::new(&mut b.part),
        part_stats: SharedSlice::new(&mut b.part_stats),
        out: SharedSlice::new(out),
    };
    let own = &b.own;
    let job = |ctx: &Ctx| {
        let mut p = own[ctx.ith].lock().unwrap_or_else(|e| e.into_inner());
        p.route_gap.clear();
        p.route_gap.resize(c.tokens.len(), f32::INFINITY);
        p.route_ties.clear();
        let mut f = Forward {
            m,
            isa,
            exact: env.exact,
            resident: env.resident,
            ctx,
            v: &views,
            c,
            n: c.tokens.len(),
            p: &mut p,
        };
        // SAFETY (for every step): each step writes only the shared rows or elements its thread
        // claimed, and a barrier separates it from the steps that read them.
        unsafe {
            f.embed();
            for (li, layer) in m.layers.iter().enumerate() {
                match &layer.mixer {
                    Mixer::Attention(a) => f.attention(layer, a, li),
                    Mixer::DeltaNet(d) => f.deltanet(layer, d, li),
                    Mixer::ShortConv(s) => f.short_conv(layer, s, li),
                }
                f.ffn(layer, li);
            }
            f.head();
        }
    };
    if env.solo {
        env.pool.run_solo(job);
    } else {
        env.pool.run(job);
    }
}

/// Makes `out` `len` long for a pass that writes every element of it: only what it grows by is
/// zeroed, so a decode step's rows of logits (a fifth of a megabyte each for a 49k vocabulary)
/// are rewritten in place rather than cleared first.
fn overwritten(out: &mut Vec<f32>, len: usize) {
    out.truncate(len);
    out.resize(len, 0.0);
}
