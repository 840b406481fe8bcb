//! The mixers of the projection strategy: the input projection and the output projection on
//! the device, between them on the host in f32 what the CPU engine does (its own code for the
//! DeltaNet recurrence and the short conv): QK-norm, RoPE, the KV cache and attention, the
//! output gate; the conv and the delta rule over the recurrent state; the gated short conv.

use anelm_cpu::ops::{norm_row, output_gate, rope_head};
use anelm_cpu::{deltanet, shortconv};
use anelm_model::plan::{Attention, DeltaNet, Layer, Mixer, Norm, ShortConv};

use super::{attend, ProjectionExecutor, ProjectionKv, Projections, Segment};
use crate::error::Result;
use crate::lower::Projection;

fn norm_rows(norm: &Norm, x: &mut [f32], width: usize) {
    x.chunks_exact_mut(width).for_each(|r| norm_row(norm, r));
}

/// Columns `at..at + width` of every row of `rows` (`ld` wide), packed.
fn columns(rows: &[f32], ld: usize, at: usize, width: usize) -> Vec<f32> {
    rows.chunks_exact(ld)
        .flat_map(|r| &r[at..at + width])
        .copied()
        .collect()
}

impl<P: Projections> ProjectionExecutor<P> {
    /// Layer `li`'s mixer over the `n` normed rows `xn` into `y` (before any post-norm): the
    /// input and output projections one dispatch each over all the rows, between them each
    /// segment's rows over its own state at its positions `kv.len..`.
    pub(super) fn mixer(
        &mut self,
        li: usize,
        layer: &Layer,
        segments: &mut [Segment<'_>],
        xn: &[f32],
        n: usize,
        y: &mut [f32],
    ) -> Result<()> {
        let rows: usize = crate::support::mixer_inputs(layer)
            .iter()
            .map(|l| l.out_features())
            .sum();
        let mut inp = vec![0f32; n * rows];
        self.proj.project(Projection::Qkv(li), xn, n, &mut inp)?;
        let h = self.model.config.hidden_size;
        let mut mixed = Vec::new();
        let mut at = 0;
        for seg in segments.iter_mut() {
            let (kv, r) = (&mut *seg.kv, seg.rows);
            let part = &mut inp[at * rows..(at + r) * rows];
            mixed.extend(match &layer.mixer {
                Mixer::Attention(a) => attention(a, li, kv, part, r, rows),
                Mixer::DeltaNet(d) => delta_net(d, li, kv, part, r, rows),
                Mixer::ShortConv(c) => short_conv(c, li, kv, part, r, h),
            });
            at += r;
        }
        self.proj.project(Projection::O(li), &mixed, n, y)
    }
}

/// Softmax attention from the `q | k | v (| gate)` rows `qkv`: QK-norm and RoPE, the new keys
/// and values into the cache, attention over it, the output gate.
fn attention(
    a: &Attention,
    li: usize,
    kv: &mut ProjectionKv,
    qkv: &mut [f32],
    n: usize,
    ld: usize,
) -> Vec<f32> {
    let (hd, qd, kvd) = (
        a.head_dim,
        a.n_heads * a.head_dim,
        a.n_kv_heads * a.head_dim,
    );
    let p0 = kv.len;
    let mut q = vec![0f32; n * qd];
    let half = a.rope.as_ref().map_or(0, |r| r.dims / 2);
    let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
    for (t, row) in qkv.chunks_exact_mut(ld).enumerate() {
        let (qt, rest) = row.split_at_mut(qd);
        let (kt, rest) = rest.split_at_mut(kvd);
        let vt = &rest[..kvd];
        if let Some(qn) = &a.q_norm {
            norm_rows(qn, qt, hd);
        }
        if let Some(kn) = &a.k_norm {
            norm_rows(kn, kt, hd);
        }
        if let Some(rope) = &a.rope {
            rope.angles(p0 + t, &mut cos, &mut sin);
            qt.chunks_exact_mut(hd)
                .chain(kt.chunks_exact_mut(hd))
                .for_each(|head| rope_head(rope, head, &cos, &sin));
        }
        q[t * qd..(t + 1) * qd].copy_from_slice(qt);
        let at = (p0 + t) * kvd;
        kv.k[li][at..at + kvd].copy_from_slice(kt);
        kv.v[li][at..at + kvd].copy_from_slice(vt);
    }
    let mut att = vec![0f32; n * qd];
    attend(a, &q, n, p0, &kv.k[li], &kv.v[li], &mut att);
    if a.output_gate.is_some() {
        for (t, out) in att.chunks_exact_mut(qd).enumerate() {
            let g = &qkv[t * ld + qd + 2 * kvd..t * ld + 2 * qd + 2 * kvd];
            output_gate(out, g);
        }
    }
    att
}

/// A gated DeltaNet from the `qkv | z | b | a` rows `inp`: the CPU engine's conv and delta
/// rule over the layer's conv history and states.
fn delta_net(
    d: &DeltaNet,
    li: usize,
    kv: &mut ProjectionKv,
    inp: &[f32],
    n: usize,
    ld: usize,
) -> Vec<f32> {
    let (c, vd, nv) = (d.conv_channels(), d.n_v_heads * d.v_dim, d.n_v_heads);
    let (qkv, z) = (columns(inp, ld, 0, c), columns(inp, ld, c, vd));
    let (b, a) = (
        columns(inp, ld, c + vd, nv),
        columns(inp, ld, c + vd + nv, nv),
    );
    let io = deltanet::Inputs {
        qkv: &qkv,
        z: &z,
        b: &b,
        a: &a,
    };
    let mut out = vec![0f32; n * vd];
    deltanet::run_layer(d, n, &io, &mut kv.conv[li], &mut kv.s[li], &mut out);
    out
}

/// LFM2's short conv from the `B | C | x` rows `bcx`: the CPU engine's conv over the layer's
/// history.
fn short_conv(
    c: &ShortConv,
    li: usize,
    kv: &mut ProjectionKv,
    bcx: &[f32],
    n: usize,
    h: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; n * h];
    shortconv::run(c, h, 0..h, n, bcx, &mut kv.conv[li], &mut out);
    out
}
