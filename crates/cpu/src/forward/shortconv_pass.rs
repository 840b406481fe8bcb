//! LFM2's gated short convolution of one layer: its input projection, the conv over each
//! sequence's history (channel blocks spread over the threads), the output projection.

use anelm_model::plan::{Layer, ShortConv};

use super::layer::{Forward, Src};
use crate::shortconv;

/// Channels one work item convolves.
const BLOCK: usize = 16;

impl Forward<'_> {
    /// Layer `li`, a short convolution: `B | C | x` for every row, then each sequence's conv
    /// over its own history, (sequence, channel block) items spread over the threads, then
    /// the output projection.
    pub(super) unsafe fn short_conv(&mut self, layer: &Layer, s: &ShortConv, li: usize) {
        let (ctx, v, n, c) = (self.ctx, self.v, self.n, self.c);
        let h = self.m.config.hidden_size;
        self.norm_into_xn(&layer.attn_norm);
        self.prepare(Src::Xn, h, 0..n, &[&s.in_proj.weight]);
        self.linear(&s.in_proj, &v.q);
        ctx.barrier();

        let blocks = h.div_ceil(BLOCK);
        let hist = (s.kernel - 1) * h;
        ctx.chunks(c.seqs.len() * blocks, |item| {
            let (seq, b) = (&c.seqs[item / blocks], item % blocks);
            let rows = seq.rows.clone();
            let at = seq.conv_at[li];
            // Each block writes only its own channels of the history and the output.
            shortconv::run(
                s,
                h,
                b * BLOCK..((b + 1) * BLOCK).min(h),
                rows.len(),
                v.q.range(rows.start * 3 * h..rows.end * 3 * h),
                seq.conv.range_mut(at..at + hist),
                v.att.range_mut(rows.start * h..rows.end * h),
            );
        });
        ctx.barrier();

        self.prepare(Src::Shared(&v.att), h, 0..n, &[&s.out.weight]);
        self.linear(&s.out, &v.o);
        ctx.barrier();
        self.residual(layer.post_attn_norm.as_ref());
    }
}
