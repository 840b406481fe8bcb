//! The executor of the projection strategy: the linear layers as kernels ([`Projections`]:
//! compiled on a device, or the f32 reference), the rest on the CPU in f32 — embeddings, norms,
//! the mixers between their projections ([`mixers`]: attention and its KV cache, the DeltaNet
//! and short-conv recurrences and their state), expert routing, residuals, soft-caps.

mod device;
mod fallback;
mod fused;
mod kv;
mod mixers;
mod reference;
mod routes;

pub use device::DeviceProjections;
pub use fallback::FallbackExecutor;
pub use fused::{FusedExecutor, FusedKv};
pub use kv::{attend, ProjectionKv};
pub use reference::{activation, ReferenceProjections};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anelm_cpu::moe::{route, route_forced};
use anelm_cpu::ops::{norm_row, softcap};
use anelm_model::plan::{Ffn, Moe, Norm};
use anelm_model::{checked_state, ExecError, Executor, KvState, Logits, Model, RouteChoice};

use crate::compare::NEAR_TIE;
use crate::device::Device;
use crate::error::Result;
use crate::lower::{LoweringOptions, Projection};

/// Runs the linear layers of a model.
pub trait Projections: Send {
    /// `out` = projection `p` of the `n` token-major rows of `x`, token-major; a row of `out`
    /// is as wide as the whole projection's result (`q + 2 kv`, hidden, vocabulary).
    fn project(&mut self, p: Projection, x: &[f32], n: usize, out: &mut [f32]) -> Result<()>;

    /// Most tokens one call takes.
    fn max_tokens(&self) -> usize {
        usize::MAX
    }
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// Most logits recomputed per row.
const MAX_RECOMPUTED: usize = 64;

/// The input of the first layer for `tokens` at positions `p0..`: embeddings (scaled, plus
/// learned positions where the model has them), token-major into `x`.
pub(crate) fn embed(m: &Model, tokens: &[u32], p0: usize, x: &mut [f32]) -> Result<()> {
    let h = m.config.hidden_size;
    let mut p = vec![0f32; h];
    for (t, row) in x.chunks_exact_mut(h).enumerate() {
        m.embedding.dequantize_row(tokens[t] as usize, row)?;
        if let Some(s) = m.embed_scale {
            row.iter_mut().for_each(|v| *v *= s);
        }
        if let Some(pe) = &m.pos_embedding {
            pe.dequantize_row(p0 + t, &mut p)?;
            row.iter_mut().zip(&p).for_each(|(v, p)| *v += p);
        }
    }
    Ok(())
}

/// Where the two largest logits are closer than fp16 noise, recomputes every logit that close
/// to the top in f32 on the CPU (from the f32 final-normed hidden state `x`), so that the
/// argmax does not hang on the head kernel's rounding.
pub(crate) fn settle_near_ties(
    head: &anelm_model::Weight,
    x: &[f32],
    logits: &mut [f32],
) -> Result<()> {
    let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    let margin = NEAR_TIE * scale;
    let mut top: Vec<usize> = Vec::new();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for (i, &v) in logits.iter().enumerate() {
        if v >= max - margin {
            top.push(i);
        }
    }
    if top.len() < 2 {
        return Ok(());
    }
    top.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    top.truncate(MAX_RECOMPUTED);
    let mut row = vec![0f32; head.cols];
    for i in top {
        head.dequantize_row(i, &mut row)?;
        logits[i] = row.iter().zip(x).map(|(w, x)| w * x).sum();
    }
    Ok(())
}

pub struct ProjectionExecutor<P> {
    model: Arc<Model>,
    proj: P,
    id: usize,
    /// Whether near-tied top logits are recomputed in f32 ([`settle_near_ties`]).
    settle_ties: bool,
    /// Expert choices to follow ([`Executor::force_routes`]).
    forced: Vec<RouteChoice>,
}

fn norm_rows(norm: &Norm, x: &mut [f32], width: usize) {
    x.chunks_exact_mut(width).for_each(|r| norm_row(norm, r));
}

impl<P: Projections> ProjectionExecutor<P> {
    pub fn new(model: Arc<Model>, proj: P) -> Self {
        ProjectionExecutor {
            model,
            proj,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            settle_ties: true,
            forced: Vec::new(),
        }
    }

    /// On (the default): near-tied top logits are recomputed in f32 on the CPU. Off: the
    /// logits are the device's alone.
    pub fn set_settle_ties(&mut self, on: bool) {
        self.settle_ties = on;
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn projections(&self) -> &P {
        &self.proj
    }

    pub fn projections_mut(&mut self) -> &mut P {
        &mut self.proj
    }

    /// [`Executor::forward`], calling `on_layer(layer, hidden)` with the hidden state (`n`
    /// token-major rows) after every layer of every chunk.
    pub fn forward_traced(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        on_layer: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ExecError> {
        let vocab = self.model.config.vocab_size;
        let kv: &mut ProjectionKv = checked_state(state, self.id, tokens, vocab)?;
        out.clear();
        let n = tokens.len();
        let want = n - logits.rows(n)..n;
        out.resize(want.len() * vocab, 0.0);
        let step = self.proj.max_tokens().max(1);
        let mut done = 0;
        while done < n {
            let len = step.min(n - done);
            let (lo, hi) = (want.start.max(done), done + len);
            let rows = if lo < hi { lo - done..hi - done } else { 0..0 };
            let dst = if lo < hi {
                &mut out[(lo - want.start) * vocab..(hi - want.start) * vocab]
            } else {
                &mut [][..]
            };
            self.chunk(kv, &tokens[done..done + len], rows, dst, on_layer)?;
            kv.len += len;
            done += len;
        }
        if let Some(cap) = self.model.final_softcap {
            softcap(out, cap);
        }
        Ok(())
    }

    /// One chunk of tokens at positions `kv.len..`; logits of chunk rows `rows` into `out`.
    fn chunk(
        &mut self,
        kv: &mut ProjectionKv,
        tokens: &[u32],
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        on_layer: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let n = tokens.len();
        self.step(&mut [Segment { kv, rows: n }], tokens, rows, out, on_layer)
    }

    /// One pass over the rows of several sequences (`segments`, in order: each its state and
    /// how many of `tokens` are its own, at its positions `kv.len..`): every projection one
    /// dispatch over all the rows, the mixers' host work per sequence over its own state;
    /// logits of rows `rows` into `out`. The states' lengths are the caller's to advance.
    fn step(
        &mut self,
        segments: &mut [Segment<'_>],
        tokens: &[u32],
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        on_layer: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let m = Arc::clone(&self.model);
        let (n, h) = (tokens.len(), m.config.hidden_size);
        let mut x = vec![0f32; n * h];
        let mut at = 0;
        for seg in segments.iter() {
            let end = at + seg.rows;
            embed(&m, &tokens[at..end], seg.kv.len, &mut x[at * h..end * h])?;
            at = end;
        }
        let mut xn = vec![0f32; n * h];
        let mut y = vec![0f32; n * h];
        for (li, layer) in m.layers.iter().enumerate() {
            xn.copy_from_slice(&x);
            norm_rows(&layer.attn_norm, &mut xn, h);
            self.mixer(li, layer, segments, &xn, n, &mut y)?;
            if let Some(pn) = &layer.post_attn_norm {
                norm_rows(pn, &mut y, h);
            }
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
            xn.copy_from_slice(&x);
            norm_rows(&layer.ffn_norm, &mut xn, h);
            match &layer.ffn {
                Ffn::Moe(moe) => {
                    // A single sequence's positions, for forced choices.
                    let first = (segments.len() == 1).then(|| segments[0].kv.len);
                    self.routed(li, moe, &xn, first, &mut y)?
                }
                _ => self.proj.project(Projection::Ffn(li), &xn, n, &mut y)?,
            }
            if let Some(pn) = &layer.post_ffn_norm {
                norm_rows(pn, &mut y, h);
            }
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
            on_layer(li, &x);
        }
        if !rows.is_empty() {
            let mut xr = x[rows.start * h..rows.end * h].to_vec();
            norm_rows(&m.final_norm, &mut xr, h);
            self.proj.project(Projection::Head, &xr, rows.len(), out)?;
            let vocab = m.config.vocab_size;
            if self.settle_ties {
                for (logits, x) in out.chunks_exact_mut(vocab).zip(xr.chunks_exact(h)) {
                    settle_near_ties(&m.lm_head, x, logits)?;
                }
            }
        }
        Ok(())
    }
}

/// One sequence's share of a pass: its state, and how many of the pass's rows are its tokens.
pub(super) struct Segment<'a> {
    pub kv: &'a mut ProjectionKv,
    pub rows: usize,
}

impl<P: Projections> ProjectionExecutor<P> {
    /// A mixture of experts over the `n` normed rows `xn`, into `y`: the router in f32 on the
    /// host (an `experts × hidden` product, small beside the experts, exact where routing is
    /// decided — a choice that flips on fp16 rounding changes the output by a whole expert —
    /// and one dispatch fewer per layer), the CPU engine's selection, then each chosen expert's
    /// kernel once over the tokens routed to it, and the shared expert's kernel over all of
    /// them, scaled by its gate. Rows at positions `first..` (a single sequence) follow the
    /// forced choices ([`Executor::force_routes`]) that name them.
    fn routed(
        &mut self,
        li: usize,
        m: &Moe,
        xn: &[f32],
        first: Option<usize>,
        y: &mut [f32],
    ) -> Result<()> {
        let h = self.model.config.hidden_size;
        let n = xn.len() / h;
        let ne = m.experts.len();
        let (mut logits, mut probs, mut picked) = (vec![0f32; ne], Vec::new(), Vec::new());
        let mut row = vec![0f32; h];
        let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); ne];
        for (t, x) in xn.chunks_exact(h).enumerate() {
            for (e, l) in logits.iter_mut().enumerate() {
                m.router.dequantize_row(e, &mut row)?;
                *l = dot(&row, x);
            }
            let forced = first.and_then(|p0| {
                (self.forced.iter()).find(|c| c.position == p0 + t && c.layer == li)
            });
            match forced {
                Some(c) => route_forced(&logits, &c.experts, m.norm_top_k, &mut probs, &mut picked),
                None => route(&logits, m.top_k, m.norm_top_k, &mut probs, &mut picked),
            }
            for &(e, w) in &picked {
                per_expert[e].push((t, w));
            }
        }
        y.fill(0.0);
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for (e, tokens) in per_expert.iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            xs.clear();
            for &(t, _) in tokens {
                xs.extend_from_slice(&xn[t * h..(t + 1) * h]);
            }
            ys.resize(tokens.len() * h, 0.0);
            self.proj
                .project(Projection::Expert(li, e), &xs, tokens.len(), &mut ys)?;
            for (&(t, w), out) in tokens.iter().zip(ys.chunks_exact(h)) {
                axpy(w, out, &mut y[t * h..(t + 1) * h]);
            }
        }
        if let Some(shared) = &m.shared {
            ys.resize(n * h, 0.0);
            self.proj.project(Projection::Shared(li), xn, n, &mut ys)?;
            if let Some(g) = &shared.gate {
                g.dequantize_row(0, &mut row)?;
            }
            for (t, x) in xn.chunks_exact(h).enumerate() {
                let g = match &shared.gate {
                    Some(_) => 1.0 / (1.0 + (-dot(&row, x)).exp()),
                    None => 1.0,
                };
                axpy(g, &ys[t * h..(t + 1) * h], &mut y[t * h..(t + 1) * h]);
            }
        }
        Ok(())
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `y += a · x`.
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x);
}

impl<D: Device> ProjectionExecutor<DeviceProjections<D>> {
    /// Lowers `model`, compiles every kernel on `device` and binds their buffers.
    pub fn on_device(model: Arc<Model>, device: D, opts: &LoweringOptions) -> Result<Self> {
        let proj = DeviceProjections::new(&model, device, opts, |_| {})?;
        Ok(Self::new(model, proj))
    }
}

impl<P: Projections> Executor for ProjectionExecutor<P> {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        let max = self.model.max_positions();
        if capacity > max {
            return Err(ExecError::ContextFull {
                needed: capacity,
                capacity: max,
            });
        }
        let sizes = kv::state_sizes(&self.model);
        Ok(Box::new(ProjectionKv::new(self.id, &sizes, capacity)))
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        self.forward_traced(state, tokens, logits, out, &mut |_, _| {})
    }

    fn force_routes(&mut self, routes: &[RouteChoice]) -> bool {
        self.forced = routes.to_vec();
        true
    }

    /// N sequences' decode tokens in one pass: each projection is one dispatch over the N
    /// rows (as wide as the kernels' width; a wider batch goes in several passes), the
    /// attention and recurrences per sequence over its own state.
    fn forward_batch(
        &mut self,
        states: &mut [&mut dyn KvState],
        tokens: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let (model, id) = (Arc::clone(&self.model), self.id);
        let width = self.proj.max_tokens().max(1);
        let group = |kvs: Vec<&mut ProjectionKv>, tokens: &[u32], out: &mut [f32]| {
            let mut segments: Vec<Segment> =
                kvs.into_iter().map(|kv| Segment { kv, rows: 1 }).collect();
            let n = tokens.len();
            self.step(&mut segments, tokens, 0..n, out, &mut |_, _| {})?;
            segments.iter_mut().for_each(|s| s.kv.len += 1);
            Ok(())
        };
        batch_in_groups(&model, id, (states, tokens), width, out, group)
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }
}

/// A batch step ([`Executor::forward_batch`]) in groups of at most `width` sequences:
/// `group(states, tokens, rows)` once per group, each state checked to be this executor's `S`
/// with room for its token, `rows` the group's logits in `out`; the final softcap after.
pub(crate) fn batch_in_groups<S: anelm_model::OwnedState>(
    model: &Model,
    owner: usize,
    (states, tokens): (&mut [&mut dyn KvState], &[u32]),
    width: usize,
    out: &mut Vec<f32>,
    mut group: impl FnMut(Vec<&mut S>, &[u32], &mut [f32]) -> Result<()>,
) -> std::result::Result<(), ExecError> {
    let vocab = model.config.vocab_size;
    anelm_model::check_batch(states, tokens, vocab)?;
    out.clear();
    out.resize(tokens.len() * vocab, 0.0);
    for ((states, tokens), out) in (states.chunks_mut(width))
        .zip(tokens.chunks(width))
        .zip(out.chunks_mut(width * vocab))
    {
        let mut kvs = Vec::with_capacity(states.len());
        for (state, token) in states.iter_mut().zip(tokens) {
            kvs.push(checked_state::<S>(
                &mut **state,
                owner,
                std::slice::from_ref(token),
                vocab,
            )?);
        }
        group(kvs, tokens, out)?;
    }
    if let Some(cap) = model.final_softcap {
        softcap(out, cap);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_model::Weight;

    #[test]
    fn near_ties_are_recomputed_in_f32() {
        // Rows: logit = 1.0 * x0 + w1 * x1 with x = [1, 1].
        let head = Weight::from_f32("head", 3, 2, &[10.0, 0.004, 10.0, 0.0, 1.0, 0.0]);
        let x = [1.0, 1.0];
        // fp16-rounded logits: rows 0 and 1 tie (10.004 is 10.0 in fp16), row 2 is far.
        let mut logits = [10.0, 10.0, 1.0];
        settle_near_ties(&head, &x, &mut logits).unwrap();
        assert_eq!(logits, [10.004, 10.0, 1.0]);
        // A clear winner is left alone.
        let mut clear = [10.0, 9.0, 1.0];
        settle_near_ties(&head, &x, &mut clear).unwrap();
        assert_eq!(clear, [10.0, 9.0, 1.0]);
    }
}
