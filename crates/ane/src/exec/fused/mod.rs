//! The executor of the fused strategy: per token batch one evaluation per chunk — the prefill
//! function for several tokens, the decode function for one — with the KV cache resident in
//! the chunks' bound input buffers. The CPU embeds the tokens, fills the RoPE tables and the
//! attention masks, copies the new keys and values into the cache buffers, chains the hidden
//! state chunk to chunk and settles near-ties of the logits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anelm_cpu::ops::softcap;
use anelm_model::plan::{Ffn, Mixer};
use anelm_model::{checked_state, ExecError, Executor, KvState, Logits, Model, RouteChoice};
use half::f16;

use super::settle_near_ties;
use crate::cache::CacheReport;
use crate::device::{Device, IoLayout, KernelIo};
use crate::error::{AneError, Result};
use crate::lower::fused::{
    build_chunk, fused_plan, ChunkSpec, FusedPlan, KvForm, BATCH, DECODE, PREFILL,
};
use crate::lower::LoweringOptions;
use crate::planar::{gather, scatter};
use columns::{layer_input, Col, Columns};
pub use state::FusedKv;

mod columns;
mod state;

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
    /// The batch function ([`LoweringOptions::decode_batch`] > 1).
    batch: Option<Bound<D>>,
}

impl<D: Device> Chunk<D> {
    fn bound_mut(&mut self) -> impl Iterator<Item = &mut Bound<D>> {
        [&mut self.prefill, &mut self.decode]
            .into_iter()
            .chain(self.batch.as_mut())
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
    /// The sequence whose cache the bound buffers of the prefill and decode functions hold.
    resident: Option<usize>,
    /// The sequence whose cache each slot of the batch functions holds.
    slots: Vec<Option<usize>>,
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
            let batch = (plan.decode_batch > 1)
                .then(|| bind(BATCH, plan.decode_batch))
                .transpose()?;
            chunks.push(Chunk {
                spec: spec.clone(),
                kernel,
                prefill,
                decode,
                batch,
            });
        }
        let slots = vec![None; plan.decode_batch.max(1)];
        Ok(FusedExecutor {
            model,
            device,
            plan,
            chunks,
            kv_dims,
            id: NEXT_EXECUTOR.fetch_add(1, Ordering::Relaxed),
            resident: None,
            slots,
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
            for b in c.bound_mut() {
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

    /// Makes `kv` the sequence the prefill and decode functions' cache buffers hold.
    fn make_resident(&mut self, kv: &FusedKv) {
        if self.resident != Some(kv.uid) {
            self.upload(kv, "");
            self.resident = Some(kv.uid);
        }
    }

    /// Writes `kv`'s whole cache into the inputs `k{l}{suffix}`, `v{l}{suffix}`.
    fn upload(&mut self, kv: &FusedKv, suffix: &str) {
        let s = kv.context;
        for (l, caches) in kv.cache.iter().enumerate() {
            for (kind, cache) in ["k", "v"].iter().zip(caches) {
                self.write_cache(&format!("{kind}{l}{suffix}"), 0..s, |c, t| cache[c * s + t]);
            }
        }
    }

    /// The slot of the batch functions each of `kvs` steps in: the one holding its cache
    /// already, else one that no other of them holds, its cache uploaded there.
    fn place(&mut self, kvs: &[&mut FusedKv]) -> Vec<usize> {
        let mut at: Vec<Option<usize>> = (kvs.iter())
            .map(|kv| self.slots.iter().position(|s| *s == Some(kv.uid)))
            .collect();
        for i in 0..kvs.len() {
            if at[i].is_some() {
                continue;
            }
            let free = (0..self.slots.len())
                .find(|j| !at.contains(&Some(*j)))
                .expect("a group is no wider than the slots");
            self.upload(kvs[i], &format!("_s{free}"));
            self.slots[free] = Some(kvs[i].uid);
            at[i] = Some(free);
        }
        at.into_iter().flatten().collect()
    }

    /// The suffixes of the cache inputs that hold sequence `uid`: "" if it is the resident
    /// one, `_s{j}` for the slot it holds.
    fn holders(&self, uid: usize) -> Vec<String> {
        let resident = (self.resident == Some(uid)).then(String::new);
        let slots = (self.slots.iter().enumerate())
            .filter(|(_, s)| **s == Some(uid))
            .map(|(j, _)| format!("_s{j}"));
        resident.into_iter().chain(slots).collect()
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

    /// Runs one evaluation of every chunk over `cols` (one sequence's tokens, at most the
    /// prefill width, or the batch function's slots) and advances each of `kvs` by its
    /// columns. `want` are the columns whose logits go to `out`, in order; `on_chunk(c,
    /// hidden)` sees the hidden state (token-major, unscaled) each chunk but the last hands on
    /// at a layer boundary (not the partial sum of a mixture split across chunks).
    fn step(
        &mut self,
        kvs: &mut [&mut FusedKv],
        cols: &Columns,
        want: &[usize],
        out: &mut [f32],
        on_chunk: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let m = Arc::clone(&self.model);
        let h = m.config.hidden_size;
        let shift = 2f32.powi(-self.plan.residual_shift);
        let mut x = cols.embeddings(&m, shift)?;
        let n = cols.cols.len();
        let live_n = cols.live().count();
        let w = match (cols.batch, n) {
            (true, _) => self.plan.decode_batch,
            (false, 1) => 1,
            (false, _) => self.plan.width,
        };
        let ropes = cols.ropes(&self.plan);
        let masks = cols.masks(&self.plan, w);
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
        // Choices forced: given ([`Executor::force_routes`], one sequence's), and those the
        // host settles in a chunk, for the later parts of a split mixture.
        let mut settled = match cols.live().next() {
            Some((_, c)) if !cols.batch => self.forced_tables(c.pos, n),
            _ => Vec::new(),
        };
        // A split mixture's pre-FFN residual, from the chunk that began it to the next.
        let mut hm = vec![0f32; n * h];
        // Which columns hold tokens (a DeltaNet's padding columns leave its state alone).
        let live: Vec<f32> = (0..w).map(|t| if t < live_n { 1.0 } else { 0.0 }).collect();
        // Which of the `n` columns hold a token (a batch function's idle slots do not).
        let held: Vec<bool> = cols.cols.iter().map(Option::is_some).collect();
        // The sequence behind an input of a layer's state: one's own, or a slot's.
        let seq_of = |slot: Option<usize>| match slot {
            None => Some(0),
            Some(j) => cols.cols.get(j).copied().flatten().map(|c| c.seq),
        };
        for ci in 0..self.chunks.len() {
            let chunk = &mut self.chunks[ci];
            let b = match (cols.batch, n) {
                (true, _) => chunk
                    .batch
                    .as_mut()
                    .ok_or_else(|| io_error(&chunk.spec.name, "batch function"))?,
                (false, 1) => &mut chunk.decode,
                (false, _) => &mut chunk.prefill,
            };
            let width = b.width;
            for (i, l) in b.io.inputs.clone().iter().enumerate() {
                let name = l.name.as_str();
                let zeros;
                let table: Option<(&[f32], usize)> = if name == "x" {
                    Some((&x, n))
                } else if name == "live" {
                    Some((&live, width))
                } else if name == "hm" {
                    Some((&hm, n))
                } else if let Some((li, _)) = layer_input(name, "route") {
                    let forced = settled.iter().find(|(l, _)| *l == li);
                    Some((forced.map_or(&unforced[..], |(_, t)| &t[..]), n))
                } else if let Some((r, _)) = layer_input(name, "cos") {
                    Some((&ropes[r].0, n))
                } else if let Some((r, _)) = layer_input(name, "sin") {
                    Some((&ropes[r].1, n))
                } else if let Some((mi, _)) = layer_input(name, "mask") {
                    Some((
                        &masks[mi],
                        self.plan.context + if cols.batch { 1 } else { width },
                    ))
                } else if let Some((li, slot)) = layer_input(name, "conv") {
                    match seq_of(slot) {
                        Some(q) => Some((&kvs[q].conv[li][..], l.width)),
                        None => {
                            zeros = vec![0f32; l.channels * l.width];
                            Some((&zeros[..], l.width))
                        }
                    }
                } else if let Some((li, slot)) = layer_input(name, "s") {
                    match seq_of(slot) {
                        Some(q) => Some((&kvs[q].s[li][..], 1)),
                        None => {
                            zeros = vec![0f32; l.channels];
                            Some((&zeros[..], 1))
                        }
                    }
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
                    &held,
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
                        range: std::ops::Range<usize>,
                        out: &mut [f32],
                        ld: usize,
                        first: usize|
             -> Result<()> {
                let i = io
                    .output(name)
                    .ok_or_else(|| io_error(&chunk.spec.name, name))?;
                let l: &IoLayout = &io.outputs[i];
                device.read_output(binding, i, |bytes| gather(l, bytes, range, out, ld, first));
                Ok(())
            };
            let mut new_kv = Vec::new();
            for li in chunk.spec.layers.clone() {
                let kvd = self.kv_dims[li];
                if kvd == 0 {
                    // A short conv or DeltaNet: its conv history moves on by the new tokens'
                    // pre-conv values, and a DeltaNet's state is the chunk's new one.
                    let (ch, state) = match &m.layers[li].mixer {
                        Mixer::DeltaNet(d) => (d.conv_channels(), true),
                        _ => (h, false),
                    };
                    if state {
                        for (q, kv) in kvs.iter_mut().enumerate() {
                            let name = match cols.batch {
                                false => format!("s{li}_new"),
                                true => match cols.of(q).next() {
                                    Some((j, _)) => format!("s{li}_s{j}_new"),
                                    None => continue,
                                },
                            };
                            let s = &mut kv.s[li];
                            let len = s.len();
                            read(&self.device, &b.binding, &name, 0..1, s, len, 0)?;
                        }
                    }
                    let mut bx = vec![0f32; n * ch];
                    let name = format!("conv{li}_new");
                    read(&self.device, &b.binding, &name, 0..n, &mut bx, ch, 0)?;
                    for (q, kv) in kvs.iter_mut().enumerate() {
                        let rows: Vec<f32> = (cols.of(q))
                            .flat_map(|(c, _)| bx[c * ch..(c + 1) * ch].iter().copied())
                            .collect();
                        kv.push_history(li, &rows);
                    }
                    continue;
                }
                for kind in ["k", "v"] {
                    let mut vals = vec![0f32; n * kvd];
                    let name = format!("{kind}{li}_new");
                    read(&self.device, &b.binding, &name, 0..n, &mut vals, kvd, 0)?;
                    new_kv.push((li, kind, vals));
                }
            }
            if chunk.spec.head {
                if !want.is_empty() {
                    let vocab = m.config.vocab_size;
                    let mut xf = vec![0f32; want.len() * h];
                    for (r, &c) in want.iter().enumerate() {
                        read(
                            &self.device,
                            &b.binding,
                            "xf",
                            c..c + 1,
                            &mut xf[r * h..],
                            h,
                            0,
                        )?;
                    }
                    if xf.iter().any(|v| !v.is_finite()) {
                        return Err(AneError::Unsupported(format!("{}: the final hidden state left the fp16 range; lower with a larger residual_shift", chunk.spec.name)));
                    }
                    for (r, &c) in want.iter().enumerate() {
                        for (t, &(first, _)) in self.plan.head_tiles.iter().enumerate() {
                            read(
                                &self.device,
                                &b.binding,
                                &format!("logits{t}"),
                                c..c + 1,
                                &mut out[r * vocab..(r + 1) * vocab],
                                vocab,
                                first,
                            )?;
                        }
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
            let mut live_x = cols.live().flat_map(|(c, _)| &x[c * h..(c + 1) * h]);
            if live_x.any(|v| !v.is_finite()) {
                return Err(AneError::Unsupported(format!("{}: the residual stream left the fp16 range; lower with a larger residual_shift", chunk.spec.name)));
            }
            // The new keys and values: into each sequence's cache and the buffers holding it.
            let s = self.plan.context;
            for (li, kind, vals) in new_kv {
                let kvd = vals.len() / n;
                let which = if kind == "k" { 0 } else { 1 };
                for (q, kv) in kvs.iter_mut().enumerate() {
                    let mine: Vec<(usize, Col)> = cols.of(q).collect();
                    let Some(&(_, first)) = mine.first() else {
                        continue;
                    };
                    let cache = &mut kv.cache[li][which];
                    for &(c, col) in &mine {
                        for ch in 0..kvd {
                            cache[ch * s + col.pos] = f16::from_f32(vals[c * kvd + ch]);
                        }
                    }
                    // Positions ascend with the columns, one per column.
                    let positions = first.pos..first.pos + mine.len();
                    let cache = &kv.cache[li][which];
                    for suffix in self.holders(kv.uid) {
                        self.write_cache(
                            &format!("{kind}{li}{suffix}"),
                            positions.clone(),
                            |ch, t| cache[ch * s + t],
                        );
                    }
                }
            }
        }
        for (q, kv) in kvs.iter_mut().enumerate() {
            kv.len += cols.of(q).count();
        }
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
        let kv = FusedKv::new(&self.model, self.id, capacity, self.plan.context);
        Ok(Box::new(kv))
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

    /// With batch functions ([`LoweringOptions::decode_batch`]): one evaluation of each chunk
    /// per group of as many sequences, each in the slot that holds its cache (uploaded when it
    /// takes one). Without: one sequence after the other.
    fn forward_batch(
        &mut self,
        states: &mut [&mut dyn KvState],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> std::result::Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        anelm_model::check_batch(states, tokens, vocab)?;
        let slots = self.plan.decode_batch;
        if slots <= 1 || tokens.len() <= 1 {
            return anelm_model::forward_each(self, states, tokens, out);
        }
        let (model, id) = (Arc::clone(&self.model), self.id);
        let group = |mut kvs: Vec<&mut FusedKv>, tokens: &[u32], out: &mut [f32]| {
            let at = self.place(&kvs);
            let mut cols = vec![None; slots];
            for (q, (&j, &token)) in at.iter().zip(tokens).enumerate() {
                let pos = kvs[q].len;
                cols[j] = Some(Col { seq: q, pos, token });
            }
            let cols = Columns { cols, batch: true };
            self.step(&mut kvs, &cols, &at, out, &mut |_, _| {})
        };
        super::batch_in_groups(&model, id, (states, tokens), slots, out, group)
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
            let cols = Columns::run(&tokens[done..done + len], kv.len);
            let want: Vec<usize> = rows.collect();
            self.step(&mut [&mut *kv], &cols, &want, dst, on_chunk)?;
            done += len;
        }
        if let Some(cap) = self.model.final_softcap {
            softcap(out, cap);
        }
        Ok(())
    }
}
