//! The gated DeltaNet mixer of one layer: its input projections, the conv and recurrence over
//! the layer's recurrent state (key-head groups spread over the threads), the output.

use anelm_model::plan::{DeltaNet, Layer};

use super::layer::{Forward, Src};
use crate::deltanet;
use crate::vecmath::KvElem;

impl<E: KvElem> Forward<'_, E> {
    /// A gated DeltaNet layer: the four input projections, then the conv and recurrence with
    /// key-head groups spread over the threads, then the output projection.
    pub(super) unsafe fn deltanet(
        &mut self,
        layer: &Layer,
        d: &DeltaNet,
        conv_at: usize,
        s_at: usize,
    ) {
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
}
