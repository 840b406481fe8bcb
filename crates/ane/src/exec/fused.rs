//! The executor of the fused strategy: per token batch one evaluation per chunk — the prefill
//! function for several tokens, the decode function for one — with the KV cache resident in
//! the chunks' bound input buffers. The CPU embeds the tokens, fills the RoPE tables and the
//! attention masks, copies the new keys and values into the cache buffers, chains the hidden
//! state chunk to chunk and settles near-ties of the logits.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anelm_cpu::ops::softcap;
use anelm_model::plan::{Ffn, Mixer};
use anelm_model::{
    checked_state, ExecError, Executor, KvState, Logits, Model, OwnedState, RouteChoice,
};
use half::f16;

use super::{embed, settle_near_ties};
use crate::cache::CacheReport;
use crate::device::{Device, IoLayout, KernelIo};
use crate::error::{AneError, Result};
use crate::lower::fused::{
    build_chunk, fused_plan, ChunkSpec, FusedPlan, KvForm, DECODE, MASKED, PREFILL,
};
use crate::lower::LoweringOptions;
use crate::planar::{gather, scatter};

static NEXT_STATE: AtomicUsize = AtomicUsize::new(1);
static NEXT_EXECUTOR: AtomicUsize = AtomicUsize::new(1);

/// One function of a chunk, bound.
struct Bound<D: Device> {
    binding: D::Binding,
    io: KernelIo,
    width: usize,
}

struct Chunk<D: Device> {
    spec: ChunkSpec,
    kernel: D::Kernel,
    prefill: Bound<D>,
    decode: Bound<D>,
}

/// A sequence's KV cache, kept on the CPU (fp16, `[kv_dim][context]` per layer) and uploaded
/// into the chunks' buffers when the sequence becomes the resident one.
pub struct FusedKv {
    owner: usize,
    uid: usize,
    len: usize,
    capacity: usize,
    context: usize,
    /// Per layer: keys and values.
    cache: Vec<[Vec<f16>; 2]>,
    /// Per layer: a short conv's history, `[kernel - 1][hidden]` oldest first (f32, as the
    /// CPU engine keeps it; empty for attention layers).
    conv: Vec<Vec<f32>>,
    /// Per layer: a DeltaNet's state `[n_v][dk][dv]` (f32 between steps, fp16 in the program).
    s: Vec<Vec<f32>>,
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

pub struct FusedExecutor<D: Device> {
    model: Arc<Model>,
    device: D,
    plan: FusedPlan,
    chunks: Vec<Chunk<D>>,
    /// Channels of each layer's K (and V) cache.
    kv_dims: Vec<usize>,
    id: usize,
    /// The sequence whose cache the bound buffers hold.
    resident: Option<usize>,
    dispatches: u64,
    /// What the lowering made of each weight tensor.
    weight_reports: Vec<crate::lower::TensorReport>,
    cache: CacheReport,
    /// Whether near-tied top logits (and router choices) are recomputed in f32
    /// ([`settle_near_ties`], [`super::routes`]).
    settle_ties: bool,
    /// Evaluations repeated to force a router choice settled in f32.
    route_redos: u64,
    /// Expert choices to follow ([`Executor::force_routes`]).
    forced: Vec<RouteChoice>,
}

fn io_error(chunk: &str, what: &str) -> AneError {
    AneError::Unsupported(format!("{chunk}: the device reports no {what}"))
}

impl<D: Device> FusedExecutor<D> {
    /// Segments, lowers and compiles `model` for `device`; `on_chunk` sees each chunk before it
    /// is compiled.
    pub fn new(
        model: Arc<Model>,
        mut device: D,
        opts: &LoweringOptions,
        mut on_chunk: impl FnMut(&ChunkSpec),
    ) -> Result<Self> {
        let plan = fused_plan(&model, opts)?;
        let kv_dims = (model.layers.iter())
            .map(|l| l.attention().map_or(0, |a| a.n_kv_heads * a.head_dim))
            .collect();
        let mut chunks = Vec::new();
        let mut weight_reports = Vec::new();
        let mut cache = CacheReport::default();
        for (i, spec) in plan.chunks.iter().enumerate() {
            on_chunk(spec);
            let unit = build_chunk(&model, &plan, i, KvForm::Inputs)?;
            let (kernel, outcome) =
                crate::cache::compile(&mut device, &unit, opts.cache_dir.as_deref())?;
            cache.push(&spec.name, outcome);
            weight_reports.extend(unit.weight_reports.iter().cloned());
            drop(unit);
            let mut bind = |name: &str, width: usize| -> Result<Bound<D>> {
                let io = device
                    .io(&kernel, name)
                    .ok_or_else(|| io_error(&spec.name, name))?
                    .clone();
                Ok(Bound {
                    binding: device.bind(&kernel, name)?,
                    io,
                    width,
                })
            };
            let (prefill, decode) = (bind(PREFILL, plan.width)?, bind(DECODE, 1)?);
            chunks.push(Chunk {
                spec: spec.clone(),
                kernel,
                prefill,
                decode,
            });
        }
        Ok(FusedExecutor {
            model,
            device,
            plan,
            chunks,
            kv_dims,
            id: NEXT_EXECUTOR.fetch_add(1, Ordering::Relaxed),
            resident: None,
            dispatches: 0,
            weight_reports,
            cache,
            settle_ties: true,
            route_redos: 0,
            forced: Vec::new(),
        })
    }

    /// On (the default): near-tied top logits are recomputed in f32 on the CPU. Off: the
    /// logits are the device's alone.
    pub fn set_settle_ties(&mut self, on: bool) {
        self.settle_ties = on;
    }

    /// Which chunks were compiled and which loaded from the program cache.
    pub fn cache_report(&self) -> &CacheReport {
        &self.cache
    }

    pub fn plan(&self) -> &FusedPlan {
        &self.plan
    }

    /// Device evaluations so far.
    pub fn dispatches(&self) -> u64 {
        self.dispatches
    }

    /// Of [`Self::dispatches`], the evaluations repeated to force a router choice that the
    /// host settled in f32 (a near-tie where fp16 picked otherwise).
    pub fn route_redos(&self) -> u64 {
        self.route_redos
    }

    /// What the lowering made of each weight tensor.
    pub fn weight_reports(&self) -> &[crate::lower::TensorReport] {
        &self.weight_reports
    }

    /// Writes columns `cols` of the cache input `name` of every bound function that has it:
    /// channel `c`, column `t` gets `value(c, t)`.
    fn write_cache(
        &mut self,
        name: &str,
        cols: std::ops::Range<usize>,
        value: impl Fn(usize, usize) -> f16,
    ) {
        for c in &mut self.chunks {
            for b in [&mut c.prefill, &mut c.decode] {
                if let Some(i) = b.io.input(name) {
                    let l = &b.io.inputs[i];
                    self.device.write_input(&mut b.binding, i, |bytes| {
                        for ch in 0..l.channels {
                            for t in cols.clone() {
                                let at = l.offset(ch, t);
                                bytes[at..at + 2].copy_from_slice(&value(ch, t).to_le_bytes());
                            }
                        }
                    });
                }
            }
        }
    }

    /// Makes `kv` the sequence the bound cache buffers hold.
    fn make_resident(&mut self, kv: &FusedKv) {
        if self.resident == Some(kv.uid) {
            return;
        }
        let s = kv.context;
        for (l, caches) in kv.cache.iter().enumerate() {
            for (kind, cache) in ["k", "v"].iter().zip(caches) {
                self.write_cache(&format!("{kind}{l}"), 0..s, |c, t| cache[c * s + t]);
            }
        }
        self.resident = Some(kv.uid);
    }

    /// The attention mask of `window` for `n` tokens at `p0` (function width `w`): column-major
    /// rows of `w` values over the `context` cached positions then the `w` new ones; rows past
    /// `n` repeat row `n - 1`.
    fn mask(&self, window: Option<usize>, p0: usize, n: usize, w: usize) -> Vec<f32> {
        let s = self.plan.context;
        let mut m = vec![MASKED; (s + w) * w];
        for t in 0..w {
            let q = p0 + t.min(n - 1);
            let sees = |pos: usize| pos <= q && window.is_none_or(|win| q - pos < win);
            for j in 0..p0.min(s) {
                if sees(j) {
                    m[j * w + t] = 0.0;
                }
            }
            for u in 0..n.min(w) {
                if sees(p0 + u) {
                    m[(s + u) * w + t] = 0.0;
                }
            }
        }
        m
    }

    /// The forced choices ([`Executor::force_routes`]) of the `n` tokens at `p0..` as the
    /// `route{l}` inputs take them: `-E` for an expert forced in, `+E` for one forced out.
    fn forced_tables(&self, p0: usize, n: usize) -> super::routes::Settled {
        let mut tables: super::routes::Settled = Vec::new();
        for c in &self.forced {
            let Ffn::Moe(moe) = &self.model.layers[c.layer].ffn else {
                continue;
            };
            if !(p0..p0 + n).contains(&c.position) {
                continue;
            }
            let ne = moe.experts.len();
            let at = match tables.iter().position(|(l, _)| *l == c.layer) {
                Some(i) => i,
                None => {
                    tables.push((c.layer, vec![0.0; n * ne]));
                    tables.len() - 1
                }
            };
            let t = c.position - p0;
            for (e, v) in tables[at].1[t * ne..(t + 1) * ne].iter_mut().enumerate() {
                *v = if c.experts.contains(&e) {
                    -(ne as f32)
                } else {
                    ne as f32
                };
            }
        }
        tables
    }

    /// Runs `tokens` (at most the prefill width) through every chunk; `on_chunk(c, hidden)`
    /// sees the hidden state (token-major, unscaled) each chunk but the last hands on at a
    /// layer boundary (not the partial sum of a mixture split across chunks).
    fn step(
        &mut self,
        kv: &mut FusedKv,
        tokens: &[u32],
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        on_chunk: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let m = Arc::clone(&self.model);
        let (n, h, p0) = (tokens.len(), m.config.hidden_size, kv.len);
        let mut x = vec![0f32; n * h];
        embed(&m, tokens, p0, &mut x)?;
        let shift = 2f32.powi(-self.plan.residual_shift);
        x.iter_mut().for_each(|v| *v *= shift);
        let decode = n == 1;
        let w = if decode { 1 } else { self.plan.width };
        // Tables this batch needs: RoPE cos/sin per distinct rope (token-major), masks.
        let ropes: Vec<(Vec<f32>, Vec<f32>)> = self
            .plan
            .ropes
            .iter()
            .map(|r| {
                let d2 = r.dims / 2;
                let (mut cos, mut sin) = (vec![0f32; n * d2], vec![0f32; n * d2]);
                for t in 0..n {
                    r.angles(
                        p0 + t,
                        &mut cos[t * d2..(t + 1) * d2],
                        &mut sin[t * d2..(t + 1) * d2],
                    );
                }
                (cos, sin)
            })
            .collect();
        let masks: Vec<Vec<f32>> = self
            .plan
            .windows
            .iter()
            .map(|&win| self.mask(win, p0, n, w))
            .collect();
        let ones = vec![1f32; (self.plan.context + w).max(n)];
        // A mixture's forced router choices: none until the host settles a near-tie.
        let most_experts = (m.layers.iter())
            .map(|l| match &l.ffn {
                Ffn::Moe(moe) => moe.experts.len(),
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        let unforced = vec![0f32; n * most_experts];
        // Choices forced: given ([`Executor::force_routes`]), and those the host settles in a
        // chunk, for the later parts of a split mixture.
        let mut settled = self.forced_tables(p0, n);
        // A split mixture's pre-FFN residual, from the chunk that began it to the next.
        let mut hm = vec![0f32; n * h];
        // Which columns hold tokens (a DeltaNet's padding columns leave its state alone).
        let live: Vec<f32> = (0..w).map(|t| if t < n { 1.0 } else { 0.0 }).collect();
        for ci in 0..self.chunks.len() {
            let chunk = &mut self.chunks[ci];
            let b = if decode {
                &mut chunk.decode
            } else {
                &mut chunk.prefill
            };
            let width = b.width;
            for (i, l) in b.io.inputs.clone().iter().enumerate() {
                let name = l.name.as_str();
                let table: Option<(&[f32], usize)> = if name == "x" {
                    Some((&x, n))
                } else if name == "live" {
                    Some((&live, width))
                } else if name == "hm" {
                    Some((&hm, n))
                } else if let Some(li) = name
                    .strip_prefix("route")
                    .and_then(|r| r.parse::<usize>().ok())
                {
                    let forced = settled.iter().find(|(l, _)| *l == li);
                    Some((forced.map_or(&unforced[..], |(_, t)| &t[..]), n))
                } else if let Some(r) = name
                    .strip_prefix("cos")
                    .and_then(|r| r.parse::<usize>().ok())
                {
                    Some((&ropes[r].0, n))
                } else if let Some(r) = name
                    .strip_prefix("sin")
                    .and_then(|r| r.parse::<usize>().ok())
                {
                    Some((&ropes[r].1, n))
                } else if let Some(mi) = name
                    .strip_prefix("mask")
                    .and_then(|r| r.parse::<usize>().ok())
                {
                    Some((&masks[mi], self.plan.context + width))
                } else if let Some(li) = name
                    .strip_prefix("conv")
                    .and_then(|r| r.parse::<usize>().ok())
                {
                    Some((&kv.conv[li], l.width))
                } else if let Some(li) =
                    name.strip_prefix('s').and_then(|r| r.parse::<usize>().ok())
                {
                    Some((&kv.s[li], 1))
                } else {
                    None
                };
                if let Some((values, cols)) = table {
                    self.device.write_input(&mut b.binding, i, |bytes| {
                        scatter(l, values, cols, &ones, bytes)
                    });
                }
            }
            self.device.evaluate(&chunk.kernel, &mut b.binding, n)?;
            self.dispatches += 1;
            if self.settle_ties {
                let evaluated = super::routes::Evaluated {
                    device: &mut self.device,
                    kernel: &chunk.kernel,
                    binding: &mut b.binding,
                    io: &b.io,
                };
                let (again, forced) = super::routes::settle_routes(
                    evaluated,
                    &m,
                    chunk.spec.layers.clone(),
                    n,
                    &settled,
                )?;
                for (layer, table) in forced {
                    settled.retain(|(l, _)| *l != layer);
                    settled.push((layer, table));
                }
                self.dispatches += again as u64;
                self.route_redos += again as u64;
            }
            let io = b.io.clone();
            let read = |device: &D,
                        binding: &D::Binding,
                        name: &str,
                        cols: std::ops::Range<usize>,
                        out: &mut [f32],
                        ld: usize,
                        first: usize|
             -> Result<()> {
                let i = io
                    .output(name)
                    .ok_or_else(|| io_error(&chunk.spec.name, name))?;
                let l: &IoLayout = &io.outputs[i];
                device.read_output(binding, i, |bytes| gather(l, bytes, cols, out, ld, first));
                Ok(())
            };
            let mut new_kv = Vec::new();
            for li in chunk.spec.layers.clone() {
                let kvd = self.kv_dims[li];
                if kvd == 0 {
                    // A short conv or DeltaNet: its conv history moves on by the new tokens'
                    // pre-conv values, and a DeltaNet's state is the chunk's new one.
                    let (width, state) = match &m.layers[li].mixer {
                        Mixer::DeltaNet(d) => (d.conv_channels(), true),
                        _ => (h, false),
                    };
                    if state {
                        let s = &mut kv.s[li];
                        let len = s.len();
                        read(
                            &self.device,
                            &b.binding,
                            &format!("s{li}_new"),
                            0..1,
                            s,
                            len,
                            0,
                        )?;
                    }
                    let hist = &mut kv.conv[li];
                    let mut bx = vec![0f32; n * width];
                    read(
                        &self.device,
                        &b.binding,
                        &format!("conv{li}_new"),
                        0..n,
                        &mut bx,
                        width,
                        0,
                    )?;
                    let mut all = std::mem::take(hist);
                    let keep = all.len();
                    all.extend_from_slice(&bx);
                    *hist = all.split_off(all.len() - keep);
                    continue;
                }
                for kind in ["k", "v"] {
                    let mut vals = vec![0f32; n * kvd];
                    read(
                        &self.device,
                        &b.binding,
                        &format!("{kind}{li}_new"),
                        0..n,
                        &mut vals,
                        kvd,
                        0,
                    )?;
                    new_kv.push((li, kind, vals));
                }
            }
            if chunk.spec.head {
                if !rows.is_empty() {
                    let vocab = m.config.vocab_size;
                    let mut xf = vec![0f32; rows.len() * h];
                    read(&self.device, &b.binding, "xf", rows.clone(), &mut xf, h, 0)?;
                    if xf.iter().any(|v| !v.is_finite()) {
                        return Err(AneError::Unsupported(format!("{}: the final hidden state left the fp16 range; lower with a larger residual_shift", chunk.spec.name)));
                    }
                    for (t, &(first, _)) in self.plan.head_tiles.iter().enumerate() {
                        read(
                            &self.device,
                            &b.binding,
                            &format!("logits{t}"),
                            rows.clone(),
                            out,
                            vocab,
                            first,
                        )?;
                    }
                    if self.settle_ties {
                        for (logits, x) in out.chunks_exact_mut(vocab).zip(xf.chunks_exact(h)) {
                            settle_near_ties(&m.lm_head, x, logits)?;
                        }
                    }
                }
            } else {
                read(&self.device, &b.binding, "y", 0..n, &mut x, h, 0)?;
                if chunk.spec.open_layer().is_some() {
                    read(&self.device, &b.binding, "hm", 0..n, &mut hm, h, 0)?;
                } else {
                    on_chunk(ci, &x.iter().map(|v| v / shift).collect::<Vec<f32>>());
                }
            }
            if x.iter().any(|v| !v.is_finite()) {
                return Err(AneError::Unsupported(format!("{}: the residual stream left the fp16 range; lower with a larger residual_shift", chunk.spec.name)));
            }
            // The new keys and values: into the sequence's cache and the bound buffers.
            let s = self.plan.context;
            for (li, kind, vals) in new_kv {
                let kvd = vals.len() / n;
                let cache = &mut kv.cache[li][if kind == "k" { 0 } else { 1 }];
                for t in 0..n {
                    for c in 0..kvd {
                        cache[c * s + p0 + t] = f16::from_f32(vals[t * kvd + c]);
                    }
                }
                self.write_cache(&format!("{kind}{li}"), p0..p0 + n, |c, t| {
                    f16::from_f32(vals[(t - p0) * kvd + c])
                });
            }
        }
        kv.len += n;
        Ok(())
    }
}

impl<D: Device> Executor for FusedExecutor<D> {
    fn new_state(&self, capacity: usize) -> std::result::Result<Box<dyn KvState>, ExecError> {
        let max = self.plan.context.min(self.model.max_positions());
        if capacity > max {
            return Err(ExecError::ContextFull {
                needed: capacity,
                capacity: max,
            });
        }
        let context = self.plan.context;
        let cache = (self.kv_dims.iter())
            .map(|d| [vec![f16::ZERO; d * context], vec![f16::ZERO; d * context]])
            .collect();
        let h = self.model.config.hidden_size;
        let conv = (self.model.layers.iter())
            .map(|l| match &l.mixer {
                Mixer::ShortConv(c) => vec![0f32; (c.kernel - 1) * h],
                Mixer::DeltaNet(d) => vec![0f32; (d.conv_kernel - 1) * d.conv_channels()],
                Mixer::Attention(_) => Vec::new(),
            })
            .collect();
        let s = (self.model.layers.iter())
            .map(|l| match &l.mixer {
                Mixer::DeltaNet(d) => vec![0f32; d.n_v_heads * d.k_dim * d.v_dim],
                _ => Vec::new(),
            })
            .collect();
        Ok(Box::new(FusedKv {
            owner: self.id,
            uid: NEXT_STATE.fetch_add(1, Ordering::Relaxed),
            len: 0,
            capacity,
            context,
            cache,
            conv,
            s,
        }))
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), ExecError> {
        self.forward_traced(state, tokens, logits, out, &mut |_, _| {})
    }

    fn force_routes(&mut self, routes: &[RouteChoice]) -> bool {
        self.forced = routes.to_vec();
        true
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
}

impl<D: Device> FusedExecutor<D> {
    /// [`Executor::forward`], calling `on_chunk(chunk, hidden)` with the hidden state each chunk
    /// but the last hands to the next (token-major, unscaled).
    pub fn forward_traced(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        on_chunk: &mut dyn FnMut(usize, &[f32]),
    ) -> std::result::Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        let kv: &mut FusedKv = checked_state(state, self.id, tokens, vocab)?;
        out.clear();
        self.make_resident(kv);
        let n = tokens.len();
        let want = n - logits.rows(n)..n;
        out.resize(want.len() * vocab, 0.0);
        let mut done = 0;
        while done < n {
            let len = self.plan.width.min(n - done);
            let (lo, hi) = (want.start.max(done), done + len);
            let rows = if lo < hi { lo - done..hi - done } else { 0..0 };
            let dst = if lo < hi {
                &mut out[(lo - want.start) * vocab..(hi - want.start) * vocab]
            } else {
                &mut [][..]
            };
            self.step(kv, &tokens[done..done + len], rows, dst, on_chunk)?;
            done += len;
        }
        if let Some(cap) = self.model.final_softcap {
            softcap(out, cap);
        }
        Ok(())
    }
}
