//! The CPU executor: runs the LayerPlan over a batch of new tokens appended to a KV cache.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anelm_model::plan::{Ffn, Layer};
use anelm_model::{ExecError, Executor, KvState, Logits, Model};

use crate::attention::attend;
use crate::kv::CpuKv;
use crate::matmul::{linear, matmul};
use crate::ops::{activate, norm_row, norm_rows, rope_head, softcap};

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

pub struct CpuExecutor {
    model: Arc<Model>,
    pool: rayon::ThreadPool,
    id: usize,
}

impl CpuExecutor {
    /// An executor running on `threads` threads (0: one per available core).
    pub fn new(model: Arc<Model>, threads: usize) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("anelm-cpu-{i}"))
            .build()
            .expect("creating the CPU thread pool");
        CpuExecutor { model, pool, id: NEXT_ID.fetch_add(1, Ordering::Relaxed) }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

impl Executor for CpuExecutor {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        let max = self.model.max_positions();
        if capacity > max {
            return Err(ExecError::ContextFull { needed: capacity, capacity: max });
        }
        let dims = self.model.layers.iter().map(|l| l.attention().n_kv_heads * l.attention().head_dim).collect();
        Ok(Box::new(CpuKv::new(dims, capacity, self.id)))
    }

    fn forward(&mut self, state: &mut dyn KvState, tokens: &[u32], logits: Logits, out: &mut Vec<f32>) -> Result<(), ExecError> {
        let kv = state.as_any_mut().downcast_mut::<CpuKv>().ok_or(ExecError::ForeignState)?;
        if kv.owner != self.id {
            return Err(ExecError::ForeignState);
        }
        if tokens.is_empty() {
            out.clear();
            return Ok(());
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ExecError::TokenOutOfRange { id, vocab });
        }
        if kv.len + tokens.len() > kv.capacity {
            return Err(ExecError::ContextFull { needed: kv.len + tokens.len(), capacity: kv.capacity });
        }
        let model = &self.model;
        self.pool.install(|| run(model, kv, tokens, logits, out));
        Ok(())
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
}

fn run(m: &Model, kv: &mut CpuKv, tokens: &[u32], want: Logits, out: &mut Vec<f32>) {
    let n = tokens.len();
    let h = m.config.hidden_size;
    let p0 = kv.len;
    let mut x = vec![0f32; n * h];
    for (t, &id) in tokens.iter().enumerate() {
        let row = &mut x[t * h..(t + 1) * h];
        m.embedding.dequantize_row(id as usize, row).expect("embedding rows are whole blocks");
        if let Some(s) = m.embed_scale {
            row.iter_mut().for_each(|v| *v *= s);
        }
        if let Some(pe) = &m.pos_embedding {
            let mut p = vec![0f32; h];
            pe.dequantize_row(p0 + t, &mut p).expect("position rows are whole blocks");
            row.iter_mut().zip(&p).for_each(|(v, p)| *v += p);
        }
    }
    for (li, layer) in m.layers.iter().enumerate() {
        attention_block(layer, li, kv, p0, &mut x, n, h);
        ffn_block(layer, &mut x, n, h);
    }
    kv.len = p0 + n;

    let n_rows = want.rows(n);
    out.clear();
    if n_rows == 0 {
        return;
    }
    let mut hidden = x[(n - n_rows) * h..].to_vec();
    norm_rows(&m.final_norm, &mut hidden);
    out.resize(n_rows * m.config.vocab_size, 0.0);
    matmul(&m.lm_head, &hidden, n_rows, out);
    if let Some(cap) = m.final_softcap {
        softcap(out, cap);
    }
}

fn attention_block(layer: &Layer, li: usize, kv: &mut CpuKv, p0: usize, x: &mut [f32], n: usize, h: usize) {
    let a = layer.attention();
    let (hd, qd, kvd) = (a.head_dim, a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim);
    let mut xn = x.to_vec();
    norm_rows(&layer.attn_norm, &mut xn);
    let mut q = vec![0f32; n * qd];
    let mut k = vec![0f32; n * kvd];
    let mut v = vec![0f32; n * kvd];
    linear(&a.q, &xn, n, &mut q);
    linear(&a.k, &xn, n, &mut k);
    linear(&a.v, &xn, n, &mut v);
    if let Some(qn) = &a.q_norm {
        q.chunks_exact_mut(hd).for_each(|head| norm_row(qn, head));
    }
    if let Some(kn) = &a.k_norm {
        k.chunks_exact_mut(hd).for_each(|head| norm_row(kn, head));
    }
    if let Some(rope) = &a.rope {
        let mut cos = vec![0f32; rope.dims / 2];
        let mut sin = vec![0f32; rope.dims / 2];
        for t in 0..n {
            rope.angles(p0 + t, &mut cos, &mut sin);
            q[t * qd..(t + 1) * qd].chunks_exact_mut(hd).for_each(|head| rope_head(rope, head, &cos, &sin));
            k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd).for_each(|head| rope_head(rope, head, &cos, &sin));
        }
    }
    kv.k[li][p0 * kvd..(p0 + n) * kvd].copy_from_slice(&k);
    kv.v[li][p0 * kvd..(p0 + n) * kvd].copy_from_slice(&v);
    let mut att = vec![0f32; n * qd];
    attend(a, &q, &kv.k[li], &kv.v[li], p0, &mut att);
    let mut o = vec![0f32; n * h];
    linear(&a.o, &att, n, &mut o);
    if let Some(pn) = &layer.post_attn_norm {
        norm_rows(pn, &mut o);
    }
    x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
}

fn ffn_block(layer: &Layer, x: &mut [f32], n: usize, h: usize) {
    let mut xn = x.to_vec();
    norm_rows(&layer.ffn_norm, &mut xn);
    let f = layer.ffn.hidden_features();
    let mut y = vec![0f32; n * h];
    match &layer.ffn {
        Ffn::Gated { act, gate, up, down } => {
            let mut g = vec![0f32; n * f];
            let mut u = vec![0f32; n * f];
            linear(gate, &xn, n, &mut g);
            linear(up, &xn, n, &mut u);
            g.iter_mut().zip(&u).for_each(|(g, u)| *g = activate(*act, *g) * u);
            linear(down, &g, n, &mut y);
        }
        Ffn::Plain { act, up, down } => {
            let mut u = vec![0f32; n * f];
            linear(up, &xn, n, &mut u);
            u.iter_mut().for_each(|v| *v = activate(*act, *v));
            linear(down, &u, n, &mut y);
        }
    }
    if let Some(pn) = &layer.post_ffn_norm {
        norm_rows(pn, &mut y);
    }
    x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
}
