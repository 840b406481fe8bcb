//! The CPU executor: runs the LayerPlan over a batch of new tokens appended to a KV cache.
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
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anelm_model::plan::{
    Activation, Attention, DeltaNet, Ffn, GatedMlp, Layer, Linear, Mixer, Moe, Norm,
};
use anelm_model::{checked_state, ExecError, Executor, KvState, Logits, Model, Weight};

use crate::adaptive::Adaptive;
use crate::attention::{attend, attend_parts, combine, parts, positions, Cache, MAX_PARTS};
use crate::deltanet;
use crate::kernels::{select, select_exact, Kernel};
use crate::kv::{CpuKv, KvData, KvDtype, Layers, Recurrent};
use crate::matmul::{matmul, Input, Product};
use crate::moe::route;
use crate::ops::{norm_row, rope_head, softcap};
use crate::pool::{physical_cores, Ctx, Pool};
use crate::q8::{ActKind, Q8Buf};
use crate::resident::Resident;
use crate::shared::SharedSlice;
use crate::simd::Isa;
use crate::vecmath::{gate, Gate, KvElem};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// Tokens one pass of the layers processes; longer batches are split.
pub const MAX_BATCH: usize = 512;
/// Query tokens per attention work item in prefill.
const ATTN_BLOCK: usize = 8;

/// How a [`CpuExecutor`] runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOptions {
    /// Threads (0: one per physical core).
    pub threads: usize,
    /// KV cache element type (None: f16 when every layer matrix is quantised and `exact` is
    /// off, else f32, so that unquantised models and exact runs keep f32 attention).
    pub kv: Option<KvDtype>,
    /// Instruction set (None: the best the CPU has).
    pub isa: Option<Isa>,
    /// Exact f32 products for quantised weights too (rows dequantised, activations kept f32)
    /// instead of 8-bit activations; several times slower, for checking results.
    pub exact: bool,
}

pub struct CpuExecutor {
    model: Arc<Model>,
    pool: Pool,
    isa: Isa,
    kv: KvDtype,
    id: usize,
    bufs: Buffers,
    exact: bool,
    /// The copies of the weights the products read.
    resident: Resident,
    /// Whether decode steps run on all threads or one.
    adaptive: Adaptive,
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
        let kv = opts.kv.unwrap_or_else(|| {
            if all_quantized(&model) && !opts.exact {
                KvDtype::F16
            } else {
                KvDtype::F32
            }
        });
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
            resident,
            adaptive: Adaptive::default(),
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

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv
    }
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

/// The matrices of the products: every layer's and the output head (the token embedding stays
/// mapped: lookups read a row at a time).
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

/// Widths of the activation buffers (the largest over the layers).
struct Dims {
    hidden: usize,
    /// Queries, or a DeltaNet's `q | k | v` projection.
    q: usize,
    kv: usize,
    /// An attention output gate, or a DeltaNet's `z`.
    z: usize,
    /// A DeltaNet's value heads (`b`, `a`).
    heads: usize,
    /// Router logits of a mixture of experts.
    experts: usize,
    ffn: usize,
    /// The longest weight row in values (dequantisation scratch).
    cols: usize,
    /// The most rotated dimensions of a head.
    rope: usize,
}

impl Dims {
    fn of(m: &Model) -> Dims {
        let max = |f: &dyn Fn(&Layer) -> usize| m.layers.iter().map(f).max().unwrap_or(0);
        let attn = |f: &dyn Fn(&Attention) -> usize| max(&|l| l.attention().map_or(0, f));
        let dn = |f: &dyn Fn(&DeltaNet) -> usize| {
            max(&|l| match &l.mixer {
                Mixer::DeltaNet(d) => f(d),
                Mixer::Attention(_) => 0,
            })
        };
        Dims {
            hidden: m.config.hidden_size,
            q: attn(&|a| a.n_heads * a.head_dim).max(dn(&|d| d.conv_channels())),
            kv: attn(&|a| a.n_kv_heads * a.head_dim),
            z: attn(&|a| a.output_gate.as_ref().map_or(0, |g| g.out_features()))
                .max(dn(&|d| d.n_v_heads * d.v_dim)),
            heads: dn(&|d| d.n_v_heads),
            experts: max(&|l| match &l.ffn {
                Ffn::Moe(moe) => moe.router.rows,
                _ => 0,
            }),
            ffn: max(&|l| l.ffn.hidden_features()),
            cols: m
                .layers
                .iter()
                .flat_map(linears)
                .map(|l| l.in_features())
                .max()
                .unwrap_or(0)
                .max(m.config.hidden_size),
            rope: attn(&|a| a.rope.as_ref().map_or(0, |r| r.dims)),
        }
    }

    fn widest(&self) -> usize {
        self.hidden.max(self.q).max(self.z).max(self.ffn)
    }
}

/// The buffers of one chunk of tokens. Products write the shared ones (each thread its rows);
/// every thread keeps its own copy of the residual stream and of the inputs of the next product,
/// computing the cheap per-token steps redundantly instead of waiting at a barrier for them.
struct Buffers {
    /// Tokens the buffers hold.
    cap: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    /// Output of the attention projection and of the FFN.
    o: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    /// Attention output gate or DeltaNet `z`.
    z: Vec<f32>,
    /// DeltaNet `b` and `a`.
    b: Vec<f32>,
    a: Vec<f32>,
    /// Router logits.
    r: Vec<f32>,
    /// Decode attention's parts: outputs and softmax statistics of each query head and part.
    part: Vec<f32>,
    part_stats: Vec<(f32, f32)>,
    own: Vec<Mutex<Private>>,
}

/// One thread's buffers.
struct Private {
    /// The residual stream.
    x: Vec<f32>,
    /// The f32 input of the next product.
    xn: Vec<f32>,
    q8b: Q8Buf,
    q8k: Q8Buf,
    /// Dequantised weight rows, attention scores, position embeddings.
    scratch: Vec<f32>,
    /// RoPE's cos and sin per token of the current layer.
    angles: Vec<f32>,
    /// Prefill attention's parts of one query: outputs and softmax statistics.
    part: Vec<f32>,
    part_stats: Vec<(f32, f32)>,
    /// Mixture of experts: the normalised inputs, the weighted sum of the experts, the routes.
    moe_x: Vec<f32>,
    moe_acc: Vec<f32>,
    routes: Vec<Vec<(usize, f32)>>,
    probs: Vec<f32>,
    picked: Vec<(usize, f32)>,
}

impl Buffers {
    fn new(d: &Dims, cap: usize, threads: usize) -> Buffers {
        let z = |w: usize| vec![0f32; cap * w];
        let widest = d.widest();
        Buffers {
            cap,
            q: z(d.q),
            k: z(d.kv),
            v: z(d.kv),
            att: z(d.q),
            o: z(d.hidden),
            g: z(d.ffn),
            u: z(d.ffn),
            z: z(d.z),
            b: z(d.heads),
            a: z(d.heads),
            r: z(d.experts),
            // A head is at least one value wide, so `q` bounds the number of heads too.
            part: vec![0.0; MAX_PARTS * d.q],
            part_stats: vec![(0.0, 0.0); MAX_PARTS * d.q],
            own: (0..threads)
                .map(|_| {
                    Mutex::new(Private {
                        x: z(d.hidden),
                        xn: z(widest),
                        // Q8K needs whole 256-value blocks; only widths that are multiples of 256 use it.
                        q8b: Q8Buf::new(ActKind::Q8B32, cap, widest.next_multiple_of(32)),
                        q8k: Q8Buf::new(ActKind::Q8K, cap, widest.next_multiple_of(256)),
                        scratch: vec![0.0; d.cols],
                        angles: vec![0.0; cap * d.rope],
                        part: vec![0.0; MAX_PARTS * d.q],
                        part_stats: vec![(0.0, 0.0); MAX_PARTS * d.q],
                        moe_x: if d.experts > 0 {
                            z(d.hidden)
                        } else {
                            Vec::new()
                        },
                        moe_acc: if d.experts > 0 {
                            z(d.hidden)
                        } else {
                            Vec::new()
                        },
                        routes: vec![Vec::new(); d.experts],
                        probs: Vec::new(),
                        picked: Vec::new(),
                    })
                })
                .collect(),
        }
    }
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
        let layers = &self.model.layers;
        let dims: Vec<usize> = layers
            .iter()
            .map(|l| l.attention().map_or(0, |a| a.n_kv_heads * a.head_dim))
            .collect();
        let recurrent: Vec<(usize, usize)> = layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::DeltaNet(d) => (
                    d.conv_channels() * (d.conv_kernel - 1),
                    d.n_v_heads * d.k_dim * d.v_dim,
                ),
                Mixer::Attention(_) => (0, 0),
            })
            .collect();
        Ok(Box::new(CpuKv::new(
            &dims, &recurrent, capacity, self.kv, self.id,
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
        out.clear();
        if tokens.is_empty() {
            return Ok(());
        }
        let n = tokens.len();
        let want = n - logits.rows(n)..n;
        out.resize(want.len() * vocab, 0.0);

        let cap = n.min(MAX_BATCH);
        if self.bufs.cap < cap {
            self.bufs = Buffers::new(&Dims::of(&self.model), cap, self.pool.threads());
        }
        // Attention scores span the whole cache, for a group of heads.
        let group = self
            .model
            .layers
            .iter()
            .filter_map(|l| l.attention())
            .map(|a| a.n_heads / a.n_kv_heads)
            .max()
            .unwrap_or(1);
        let dn_scratch = self
            .model
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::DeltaNet(d) => deltanet::scratch_len(d),
                Mixer::Attention(_) => 0,
            })
            .max()
            .unwrap_or(0);
        for p in &self.bufs.own {
            let s = &mut p.lock().unwrap_or_else(|e| e.into_inner()).scratch;
            let need = (kv.capacity * group).max(dn_scratch);
            if s.len() < need {
                s.resize(need, 0.0);
            }
        }

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
            let chunk = Chunk {
                tokens: &tokens[done..done + len],
                p0: kv.len,
                rows,
            };
            let out_chunk = &mut out[out_rows.start * vocab..out_rows.end * vocab];
            // A decode step may go on one thread while the machine is contended (see
            // `adaptive`).
            let step = len == 1;
            let env = Env {
                m: &self.model,
                pool: &self.pool,
                isa: self.isa,
                exact: self.exact,
                resident: &self.resident,
                solo: step && self.adaptive.solo_next(),
            };
            let started = Instant::now();
            let rec = &mut kv.recurrent;
            match &mut kv.data {
                KvData::F32(l) => {
                    run_chunk(&env, &mut self.bufs, l, rec, kv.capacity, &chunk, out_chunk)
                }
                KvData::F16(l) => {
                    run_chunk(&env, &mut self.bufs, l, rec, kv.capacity, &chunk, out_chunk)
                }
            }
            if step {
                let contended = !env.solo && self.pool.contended();
                self.adaptive.record(started.elapsed(), contended);
            }
            kv.len += len;
            done += len;
        }
        if let Some(cap) = self.model.final_softcap {
            softcap(out, cap);
        }
        Ok(())
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
}

/// Tokens at positions `p0..`, and the rows whose logits are wanted.
struct Chunk<'a> {
    tokens: &'a [u32],
    p0: usize,
    rows: Range<usize>,
}

/// The shared buffers as the pool's threads see them.
struct Views<'a, E> {
    q: SharedSlice<'a, f32>,
    k: SharedSlice<'a, f32>,
    v: SharedSlice<'a, f32>,
    att: SharedSlice<'a, f32>,
    o: SharedSlice<'a, f32>,
    g: SharedSlice<'a, f32>,
    u: SharedSlice<'a, f32>,
    z: SharedSlice<'a, f32>,
    b: SharedSlice<'a, f32>,
    a: SharedSlice<'a, f32>,
    r: SharedSlice<'a, f32>,
    part: SharedSlice<'a, f32>,
    part_stats: SharedSlice<'a, (f32, f32)>,
    kc: SharedSlice<'a, E>,
    vc: SharedSlice<'a, E>,
    conv: SharedSlice<'a, f32>,
    s: SharedSlice<'a, f32>,
    out: SharedSlice<'a, f32>,
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

fn run_chunk<E: KvElem>(
    env: &Env<'_>,
    b: &mut Buffers,
    cache: &mut Layers<E>,
    rec: &mut Recurrent,
    capacity: usize,
    c: &Chunk<'_>,
    out: &mut [f32],
) {
    let (m, isa) = (env.m, env.isa);
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
        kc: SharedSlice::new(&mut cache.k),
        vc: SharedSlice::new(&mut cache.v),
        conv: SharedSlice::new(&mut rec.conv),
        s: SharedSlice::new(&mut rec.s),
        out: SharedSlice::new(out),
    };
    let own = &b.own;
    let offsets = &cache.offset;
    let (conv_at, s_at) = (&rec.conv_offset, &rec.s_offset);
    let job = |ctx: &Ctx| {
        let mut p = own[ctx.ith].lock().unwrap_or_else(|e| e.into_inner());
        let mut f = Forward {
            m,
            isa,
            exact: env.exact,
            resident: env.resident,
            ctx,
            v: &views,
            c,
            n: c.tokens.len(),
            capacity,
            p: &mut p,
        };
        // SAFETY (for every step): each step writes only the shared rows or elements its thread
        // claimed, and a barrier separates it from the steps that read them.
        unsafe {
            f.embed();
            for (li, layer) in m.layers.iter().enumerate() {
                match &layer.mixer {
                    Mixer::Attention(a) => f.attention(layer, a, offsets[li]),
                    Mixer::DeltaNet(d) => f.deltanet(layer, d, conv_at[li], s_at[li]),
                }
                f.ffn(layer);
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

/// One thread's view of a forward pass over a chunk.
struct Forward<'a, E> {
    m: &'a Model,
    isa: Isa,
    exact: bool,
    resident: &'a Resident,
    ctx: &'a Ctx<'a>,
    v: &'a Views<'a, E>,
    c: &'a Chunk<'a>,
    n: usize,
    capacity: usize,
    p: &'a mut Private,
}

impl<E: KvElem> Forward<'_, E> {
    fn kernel(&self, w: &Weight) -> Kernel {
        if self.exact {
            select_exact(w.dtype, self.isa)
        } else {
            select(w.dtype, self.isa)
        }
    }

    /// Puts rows `rows` of `src` (width `w`) into this thread's input buffers, for a product with
    /// each weight of `ws`: f32 into `xn` (unless `src` is `xn`), 8-bit into the Q8 buffers.
    fn prepare(&mut self, src: Src<'_>, w: usize, rows: Range<usize>, ws: &[&Weight]) {
        let mut kinds = [false; 3];
        for wt in ws {
            kinds[self.kernel(wt).act() as usize] = true;
        }
        let p = &mut *self.p;
        let row = |t: usize| t * w..(t + 1) * w;
        p.q8b.cols = w;
        p.q8k.cols = w;
        for t in rows {
            if let (Src::Shared(s), true) = (src, kinds[ActKind::F32 as usize]) {
                // SAFETY: the shared rows were written before the last barrier.
                p.xn[row(t)].copy_from_slice(unsafe { s.range(row(t)) });
            }
            let x: &[f32] = match src {
                Src::Xn => &p.xn[row(t)],
                // SAFETY: as above.
                Src::Shared(s) => unsafe { s.range(row(t)) },
            };
            if kinds[ActKind::Q8B32 as usize] {
                p.q8b.quantize_row(t, x);
            }
            if kinds[ActKind::Q8K as usize] {
                p.q8k.quantize_row(t, x);
            }
        }
    }

    /// `out = x Wᵀ + b` for this thread's prepared inputs; see [`matmul`] for `align`/`done`.
    fn product(
        &mut self,
        w: &Weight,
        bias: Option<&[f32]>,
        out: &SharedSlice<'_, f32>,
        align: usize,
        done: impl FnMut(Range<usize>, Range<usize>),
    ) {
        self.products([(w, bias, out)], align, done);
    }

    /// Products over the same output rows in one [`matmul`], each `(W, b, out)`.
    fn products<const N: usize>(
        &mut self,
        ws: [Target<'_>; N],
        align: usize,
        done: impl FnMut(Range<usize>, Range<usize>),
    ) {
        let kernels = ws.map(|(w, ..)| self.kernel(w));
        let (n, resident) = (self.n, self.resident);
        let p = &mut *self.p;
        let ps: [Product<'_>; N] = std::array::from_fn(|i| {
            let ((w, bias, out), kernel) = (ws[i], kernels[i]);
            let input = match kernel.act() {
                ActKind::F32 => Input::F32(&p.xn[..n * w.cols]),
                ActKind::Q8B32 => Input::Q8(&p.q8b),
                ActKind::Q8K => Input::Q8(&p.q8k),
            };
            let view = resident.view(w);
            Product {
                kernel,
                w,
                bias,
                input,
                out,
                bytes: view.bytes,
                packed: view.packed,
            }
        });
        matmul(self.ctx, &ps, n, &mut p.scratch, align, done);
    }

    fn linear(&mut self, lin: &Linear, out: &SharedSlice<'_, f32>) {
        self.product(&lin.weight, lin.bias.as_deref(), out, 1, |_, _| {});
    }

    /// `xn = norm(x)` for every token.
    fn norm_into_xn(&mut self, norm: &Norm) {
        let h = self.m.config.hidden_size;
        let p = &mut *self.p;
        for t in 0..self.n {
            let xn = &mut p.xn[t * h..(t + 1) * h];
            xn.copy_from_slice(&p.x[t * h..(t + 1) * h]);
            norm_row(norm, xn);
        }
    }

    /// `x += post_norm(o)` for every token.
    unsafe fn residual(&mut self, post: Option<&Norm>) {
        let o = self.v.o.range(0..self.n * self.m.config.hidden_size);
        add_residual(self.p, self.m.config.hidden_size, self.n, o, post);
    }

    /// `x += post_norm(moe_acc)` for every token.
    fn residual_moe(&mut self, post: Option<&Norm>) {
        let p = &mut *self.p;
        let acc = std::mem::take(&mut p.moe_acc);
        add_residual(p, self.m.config.hidden_size, self.n, &acc, post);
        p.moe_acc = acc;
    }

    fn embed(&mut self) {
        let (m, h) = (self.m, self.m.config.hidden_size);
        let p = &mut *self.p;
        for t in 0..self.n {
            let row = &mut p.x[t * h..(t + 1) * h];
            let id = self.c.tokens[t] as usize;
            m.embedding
                .dequantize_row(id, row)
                .expect("embedding rows are whole blocks (checked at load)");
            if let Some(sc) = m.embed_scale {
                row.iter_mut().for_each(|v| *v *= sc);
            }
            if let Some(pe) = &m.pos_embedding {
                let pos = &mut p.scratch[..h];
                pe.dequantize_row(self.c.p0 + t, pos)
                    .expect("position rows are whole blocks (checked at load)");
                row.iter_mut().zip(pos.iter()).for_each(|(v, p)| *v += p);
            }
        }
    }

    unsafe fn attention(&mut self, layer: &Layer, a: &Attention, cache_at: usize) {
        let (ctx, v, n, isa) = (self.ctx, self.v, self.n, self.isa);
        let h = self.m.config.hidden_size;
        let (hd, qd, kvd) = (
            a.head_dim,
            a.n_heads * a.head_dim,
            a.n_kv_heads * a.head_dim,
        );
        let p0 = self.c.p0;

        self.norm_into_xn(&layer.attn_norm);
        let gate_w = a.output_gate.as_ref().map(|g| &g.weight);
        let inputs: Vec<&Weight> = [&a.q.weight, &a.k.weight, &a.v.weight]
            .into_iter()
            .chain(gate_w)
            .collect();
        self.prepare(Src::Xn, h, 0..n, &inputs);
        // RoPE's cos and sin for each token, once per layer (layers may differ in frequencies).
        let mut angles = std::mem::take(&mut self.p.angles);
        if let Some(rope) = &a.rope {
            let half = rope.dims / 2;
            for (t, cs) in angles.chunks_exact_mut(2 * half).take(n).enumerate() {
                let (cos, sin) = cs.split_at_mut(half);
                rope.angles(p0 + t, cos, sin);
            }
        }
        // The projections, each finished per block of whole heads: q and k get their norms and
        // RoPE, and k and v go into the cache.
        let rope_heads = |buf: &SharedSlice<'_, f32>,
                          width: usize,
                          rows: Range<usize>,
                          tokens: Range<usize>,
                          norm: Option<&anelm_model::plan::Norm>| {
            for t in tokens {
                let heads = buf.range_mut(t * width + rows.start..t * width + rows.end);
                if let Some(nm) = norm {
                    heads.chunks_exact_mut(hd).for_each(|hh| norm_row(nm, hh));
                }
                if let Some(rope) = &a.rope {
                    let half = rope.dims / 2;
                    let (cos, sin) = angles[2 * half * t..2 * half * (t + 1)].split_at(half);
                    heads
                        .chunks_exact_mut(hd)
                        .for_each(|hh| rope_head(rope, hh, cos, sin));
                }
            }
        };
        let store = |buf: &SharedSlice<'_, f32>,
                     cache: &SharedSlice<'_, E>,
                     rows: Range<usize>,
                     tokens: Range<usize>| {
            for t in tokens {
                let at = cache_at + (p0 + t) * kvd;
                let dst = cache.range_mut(at + rows.start..at + rows.end);
                let src = buf.range(t * kvd + rows.start..t * kvd + rows.end);
                E::from_f32_slice(dst, src);
            }
        };
        self.product(&a.q.weight, a.q.bias.as_deref(), &v.q, hd, |r, t| {
            rope_heads(&v.q, qd, r, t, a.q_norm.as_ref())
        });
        self.product(&a.k.weight, a.k.bias.as_deref(), &v.k, hd, |r, t| {
            rope_heads(&v.k, kvd, r.clone(), t.clone(), a.k_norm.as_ref());
            store(&v.k, &v.kc, r, t);
        });
        self.product(&a.v.weight, a.v.bias.as_deref(), &v.v, hd, |r, t| {
            store(&v.v, &v.vc, r, t)
        });
        if let Some(g) = &a.output_gate {
            self.linear(g, &v.z);
        }
        self.p.angles = angles;
        ctx.barrier();

        let cache = Cache {
            k: v.kc.range(cache_at..cache_at + self.capacity * kvd),
            v: v.vc.range(cache_at..cache_at + self.capacity * kvd),
            kv_dim: kvd,
        };
        if n == 1 {
            self.decode_attention(a, &cache);
            self.prepare(Src::Xn, qd, 0..1, &[&a.o.weight]);
        } else {
            // (Block of query tokens, KV head) pairs: a head's keys and values are read once for
            // its group of query heads (adjacent in a row of q) and a block of tokens.
            let g = a.n_heads / a.n_kv_heads;
            let gw = g * hd;
            let p = &mut *self.p;
            let (scores, po, ps) = (&mut p.scratch, &mut p.part, &mut p.part_stats);
            ctx.chunks(n.div_ceil(ATTN_BLOCK) * a.n_kv_heads, |item| {
                let (blk, kvh) = (item / a.n_kv_heads, item % a.n_kv_heads);
                for t in blk * ATTN_BLOCK..((blk + 1) * ATTN_BLOCK).min(n) {
                    let at = t * qd + kvh * gw;
                    let (q, out) = (v.q.range(at..at + gw), v.att.range_mut(at..at + gw));
                    let over = positions(a, p0 + t);
                    attend_parts(isa, a, kvh, q, over, &cache, scores, po, ps, out);
                    if a.output_gate.is_some() {
                        output_gate(out, v.z.range(at..at + gw));
                    }
                }
            });
            ctx.barrier();
            self.prepare(Src::Shared(&v.att), qd, 0..n, &[&a.o.weight]);
        }
        self.linear(&a.o, &v.o);
        ctx.barrier();
        self.residual(layer.post_attn_norm.as_ref());
    }

    /// Attention of the one new token, into `xn`. The threads share items of a part of the
    /// positions and some query heads of one KV head — enough items for two per thread where the
    /// heads allow (how the heads are grouped does not change a head's result; how the
    /// positions are split does, and [`parts`] splits them by their number only). After the
    /// barrier every thread combines the parts for itself (no barrier of its own).
    unsafe fn decode_attention(&mut self, a: &Attention, cache: &Cache<'_, E>) {
        let (ctx, v, isa) = (self.ctx, self.v, self.isa);
        let (hd, nh, g) = (a.head_dim, a.n_heads, a.n_heads / a.n_kv_heads);
        let over = positions(a, self.c.p0);
        let n_parts = parts(over.clone()).count();
        let groups = (2 * ctx.n).div_ceil(a.n_kv_heads * n_parts).clamp(1, g);
        // Head `j`'s output and statistics over part `s` go to row `s * nh + j`.
        let scores = &mut self.p.scratch;
        ctx.chunks(a.n_kv_heads * groups * n_parts, |item| {
            let (kvh, sg, s) = (
                item / (groups * n_parts),
                item / n_parts % groups,
                item % n_parts,
            );
            let heads = kvh * g + sg * g / groups..kvh * g + (sg + 1) * g / groups;
            let q = v.q.range(heads.start * hd..heads.end * hd);
            let rows = s * nh + heads.start..s * nh + heads.end;
            let out = v.part.range_mut(rows.start * hd..rows.end * hd);
            let stats = v.part_stats.range_mut(rows);
            let part = parts(over.clone()).nth(s).expect("s < n_parts");
            attend(isa, a, kvh, q, part, cache, scores, out, stats);
        });
        ctx.barrier();
        let (part, stats) = (
            v.part.range(0..n_parts * nh * hd),
            v.part_stats.range(0..n_parts * nh),
        );
        for j in 0..nh {
            let pieces =
                (0..n_parts).map(|s| (&part[(s * nh + j) * hd..][..hd], stats[s * nh + j]));
            let out = &mut self.p.xn[j * hd..(j + 1) * hd];
            combine(pieces, out);
            if a.output_gate.is_some() {
                output_gate(out, v.z.range(j * hd..(j + 1) * hd));
            }
        }
    }

    /// A gated DeltaNet layer: the four input projections, then the conv and recurrence with
    /// key-head groups spread over the threads, then the output projection.
    unsafe fn deltanet(&mut self, layer: &Layer, d: &DeltaNet, conv_at: usize, s_at: usize) {
        let (ctx, v, n) = (self.ctx, self.v, self.n);
        let h = self.m.config.hidden_size;
        let (channels, vd, nv) = (d.conv_channels(), d.n_v_heads * d.v_dim, d.n_v_heads);
        self.norm_into_xn(&layer.attn_norm);
        self.prepare(
            Src::Xn,
            h,
            0..n,
            &[&d.qkv.weight, &d.z.weight, &d.b.weight, &d.a.weight],
        );
        self.linear(&d.qkv, &v.q);
        self.linear(&d.z, &v.z);
        self.linear(&d.b, &v.b);
        self.linear(&d.a, &v.a);
        ctx.barrier();

        let io = deltanet::Inputs {
            qkv: v.q.range(0..n * channels),
            z: v.z.range(0..n * vd),
            b: v.b.range(0..n * nv),
            a: v.a.range(0..n * nv),
        };
        let conv_len = channels * (d.conv_kernel - 1);
        let s_len = nv * d.k_dim * d.v_dim;
        let scratch = &mut self.p.scratch;
        ctx.chunks(d.n_k_heads, |g| {
            // Each group writes only its own channels, heads and output columns.
            let mut st = deltanet::GroupState {
                conv: v.conv.range_mut(conv_at..conv_at + conv_len),
                s: v.s.range_mut(s_at..s_at + s_len),
                out: v.att.range_mut(0..n * vd),
            };
            deltanet::run_group(d, g, n, &io, &mut st, scratch);
        });
        ctx.barrier();

        self.prepare(Src::Shared(&v.att), vd, 0..n, &[&d.out.weight]);
        self.linear(&d.out, &v.o);
        ctx.barrier();
        self.residual(layer.post_attn_norm.as_ref());
    }

    /// A mixture of experts: route every token, run each chosen expert over the tokens routed
    /// to it, sum the weighted outputs (and the gated shared expert) into `moe_acc`.
    unsafe fn moe(&mut self, layer: &Layer, moe: &Moe) {
        let (ctx, v, n) = (self.ctx, self.v, self.n);
        let h = self.m.config.hidden_size;
        let n_exp = moe.router.rows;
        self.norm_into_xn(&layer.ffn_norm);
        self.prepare(Src::Xn, h, 0..n, &[&moe.router]);
        self.product(&moe.router, None, &v.r, 1, |_, _| {});
        ctx.barrier();
        {
            let p = &mut *self.p;
            p.moe_x[..n * h].copy_from_slice(&p.xn[..n * h]);
            p.moe_acc[..n * h].fill(0.0);
            p.routes.iter_mut().for_each(Vec::clear);
            for t in 0..n {
                route(
                    v.r.range(t * n_exp..(t + 1) * n_exp),
                    moe.top_k,
                    moe.norm_top_k,
                    &mut p.probs,
                    &mut p.picked,
                );
                for &(e, w) in &p.picked {
                    p.routes[e].push((t, w));
                }
            }
        }
        for (e, expert) in moe.experts.iter().enumerate() {
            let routes = std::mem::take(&mut self.p.routes[e]);
            if !routes.is_empty() {
                let rows: Vec<usize> = routes.iter().map(|r| r.0).collect();
                self.expert(moe.act, expert, &rows, |i| routes[i].1, h);
            }
            self.p.routes[e] = routes;
        }
        if let Some(shared) = &moe.shared {
            // sigmoid(x · gate) per token, from this thread's copy of the inputs.
            let mut scale = vec![1f32; n];
            if let Some(gw) = &shared.gate {
                let p = &mut *self.p;
                let row = &mut p.scratch[..h];
                gw.dequantize_row(0, row)
                    .expect("gate rows are whole blocks (checked at load)");
                for (t, sc) in scale.iter_mut().enumerate() {
                    let dot: f32 = p.moe_x[t * h..(t + 1) * h]
                        .iter()
                        .zip(row.iter())
                        .map(|(x, w)| x * w)
                        .sum();
                    *sc = 1.0 / (1.0 + (-dot).exp());
                }
            }
            let rows: Vec<usize> = (0..n).collect();
            self.expert(moe.act, &shared.mlp, &rows, |i| scale[i], h);
        }
        self.n = n;
        self.residual_moe(layer.post_ffn_norm.as_ref());
    }

    /// Runs `mlp` over the tokens `rows` (of `moe_x`) and adds `weight(i)` times the output of
    /// the `i`-th into `moe_acc`.
    unsafe fn expert(
        &mut self,
        act: Activation,
        mlp: &GatedMlp,
        rows: &[usize],
        weight: impl Fn(usize) -> f32,
        h: usize,
    ) {
        let v = self.v;
        let count = rows.len();
        {
            let p = &mut *self.p;
            for (i, &t) in rows.iter().enumerate() {
                p.xn[i * h..(i + 1) * h].copy_from_slice(&p.moe_x[t * h..(t + 1) * h]);
            }
        }
        self.n = count;
        self.mlp(act, Some(&mlp.gate), &mlp.up, &mlp.down);
        let p = &mut *self.p;
        let o = v.o.range(0..count * h);
        for (i, &t) in rows.iter().enumerate() {
            let w = weight(i);
            p.moe_acc[t * h..(t + 1) * h]
                .iter_mut()
                .zip(&o[i * h..(i + 1) * h])
                .for_each(|(a, y)| *a += w * y);
        }
    }

    unsafe fn ffn(&mut self, layer: &Layer) {
        match &layer.ffn {
            Ffn::Gated {
                act,
                gate,
                up,
                down,
            } => self.dense_ffn(layer, *act, Some(gate), up, down),
            Ffn::Plain { act, up, down } => self.dense_ffn(layer, *act, None, up, down),
            Ffn::Moe(moe) => self.moe(layer, moe),
        }
    }

    /// `down(act(gate(x)) * up(x))`, or `down(act(up(x)))` without a gate.
    unsafe fn dense_ffn(
        &mut self,
        layer: &Layer,
        act: Activation,
        gate_lin: Option<&Linear>,
        up: &Linear,
        down: &Linear,
    ) {
        self.norm_into_xn(&layer.ffn_norm);
        self.mlp(act, gate_lin, up, down);
        self.residual(layer.post_ffn_norm.as_ref());
    }

    /// `o = down(act(gate(xn)) * up(xn))`, or `down(act(up(xn)))` without a gate, for the
    /// tokens in this thread's `xn`. The activation runs on each tile of gate and up rows as
    /// soon as both are computed, so it costs no barrier of its own.
    unsafe fn mlp(
        &mut self,
        act: Activation,
        gate_lin: Option<&Linear>,
        up: &Linear,
        down: &Linear,
    ) {
        let (ctx, v, n) = (self.ctx, self.v, self.n);
        let (h, f) = (self.m.config.hidden_size, up.out_features());
        let (act, isa) = (gate_of(act), self.isa);
        let activate =
            |u: Option<&SharedSlice<'_, f32>>, rows: Range<usize>, tokens: Range<usize>| {
                for t in tokens {
                    let at = t * f + rows.start..t * f + rows.end;
                    gate(isa, act, v.g.range_mut(at.clone()), u.map(|u| u.range(at)));
                }
            };
        match gate_lin {
            Some(g) => {
                self.prepare(Src::Xn, h, 0..n, &[&g.weight, &up.weight]);
                let gw = (&g.weight, g.bias.as_deref(), &v.g);
                let uw = (&up.weight, up.bias.as_deref(), &v.u);
                self.products([gw, uw], 1, |r, t| activate(Some(&v.u), r, t));
            }
            None => {
                self.prepare(Src::Xn, h, 0..n, &[&up.weight]);
                self.product(&up.weight, up.bias.as_deref(), &v.g, 1, |r, t| {
                    activate(None, r, t)
                });
            }
        }
        ctx.barrier();
        self.prepare(Src::Shared(&v.g), f, 0..n, &[&down.weight]);
        self.linear(down, &v.o);
        ctx.barrier();
    }

    /// The final norm and the output head for the wanted rows.
    unsafe fn head(&mut self) {
        let rows = self.c.rows.clone();
        if rows.is_empty() {
            return;
        }
        let h = self.m.config.hidden_size;
        let p = &mut *self.p;
        for (i, t) in rows.clone().enumerate() {
            let xn = &mut p.xn[i * h..(i + 1) * h];
            xn.copy_from_slice(&p.x[t * h..(t + 1) * h]);
            norm_row(&self.m.final_norm, xn);
        }
        self.n = rows.len();
        let w = &self.m.lm_head;
        self.prepare(Src::Xn, h, 0..rows.len(), &[w]);
        self.product(w, None, &self.v.out, 1, |_, _| {});
    }
}

/// `out *= sigmoid(z)`: the attention output gate (one gate value per element of a head).
fn output_gate(out: &mut [f32], z: &[f32]) {
    out.iter_mut()
        .zip(z)
        .for_each(|(o, g)| *o /= 1.0 + (-g).exp());
}

fn gate_of(act: Activation) -> Gate {
    match act {
        Activation::Silu => Gate::Silu,
        Activation::GeluTanh => Gate::GeluTanh,
    }
}

/// `x += post_norm(o)` for `n` tokens of width `h`, into `p`'s residual stream.
fn add_residual(p: &mut Private, h: usize, n: usize, o: &[f32], post: Option<&Norm>) {
    for t in 0..n {
        let x = &mut p.x[t * h..(t + 1) * h];
        let ot = &o[t * h..(t + 1) * h];
        match post {
            Some(pn) => {
                let tmp = &mut p.scratch[..h];
                tmp.copy_from_slice(ot);
                norm_row(pn, tmp);
                x.iter_mut().zip(tmp.iter()).for_each(|(x, o)| *x += o);
            }
            None => x.iter_mut().zip(ot).for_each(|(x, o)| *x += o),
        }
    }
}

/// A weight of a product, its bias, and the buffer of its outputs.
type Target<'a> = (&'a Weight, Option<&'a [f32]>, &'a SharedSlice<'a, f32>);

/// Where the input of a product comes from.
#[derive(Clone, Copy)]
enum Src<'a> {
    /// This thread's `xn`.
    Xn,
    /// Rows of a shared buffer.
    Shared(&'a SharedSlice<'a, f32>),
}
