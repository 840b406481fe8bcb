//! The gated DeltaNet mixer of one layer: its input projections, the conv and recurrence over
//! the layer's recurrent state (key-head groups spread over the threads), the output.

use anelm_model::plan::{DeltaNet, Layer};

use super::layer::{Forward, Src};
use crate::deltanet;

impl Forward<'_> {
    /// Layer `li`, a gated DeltaNet: the four input projections, then the conv and recurrence
    /// of each sequence over its own state, with (sequence, key-head group) items spread over
    /// the threads, then the output projection.
    pub(super) unsafe fn deltanet(&mut self, layer: &Layer, d: &DeltaNet, li: usize) {
        let (ctx, v, n, c) = (self.ctx, self.v, self.n, self.c);
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

        let conv_len = channels * (d.conv_kernel - 1);
        let s_len = nv * d.k_dim * d.v_dim;
        let scratch = &mut self.p.scratch;
        ctx.chunks(c.seqs.len() * d.n_k_heads, |item| {
            let (seq, g) = (&c.seqs[item / d.n_k_heads], item % d.n_k_heads);
            let rows = seq.rows.clone();
            let io = deltanet::Inputs {
                qkv: v.q.range(rows.start * channels..rows.end * channels),
                z: v.z.range(rows.start * vd..rows.end * vd),
                b: v.b.range(rows.start * nv..rows.end * nv),
                a: v.a.range(rows.start * nv..rows.end * nv),
            };
            // Each group writes only its own channels, heads and output columns.
            let (conv_at, s_at) = (seq.conv_at[li], seq.s_at[li]);
            let mut st = deltanet::GroupState {
                conv: seq.conv.range_mut(conv_at..conv_at + conv_len),
                s: seq.s.range_mut(s_at..s_at + s_len),
                out: v.att.range_mut(rows.start * vd..rows.end * vd),
            };
            deltanet::run_group(d, g, rows.len(), &io, &mut st, scratch);
        });
        ctx.barrier();

        self.prepare(Src::Shared(&v.att), vd, 0..n, &[&d.out.weight]);
        self.linear(&d.out, &v.o);
        ctx.barrier();
        self.residual(layer.post_attn_norm.as_ref());
    }
}
