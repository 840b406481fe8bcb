//! The attention mixer of one layer: the q/k/v projections finished per block of heads (norms,
//! RoPE, cache writes), attention over the cache (split over positions in decode), the output.

use std::ops::Range;

use anelm_model::plan::{Attention, Layer};
use anelm_model::Weight;

use super::layer::{Forward, Src};
use super::ATTN_BLOCK;
use crate::attention::{attend, attend_parts, combine, parts, positions, Cache};
use crate::ops::{norm_row, rope_head};
use crate::shared::SharedSlice;
use crate::vecmath::KvElem;

impl<E: KvElem> Forward<'_, E> {
    pub(super) unsafe fn attention(&mut self, layer: &Layer, a: &Attention, cache_at: usize) {
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
    pub(super) unsafe fn decode_attention(&mut self, a: &Attention, cache: &Cache<'_, E>) {
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
}

/// `out *= sigmoid(z)`: the attention output gate (one gate value per element of a head).
fn output_gate(out: &mut [f32], z: &[f32]) {
    out.iter_mut()
        .zip(z)
        .for_each(|(o, g)| *o /= 1.0 + (-g).exp());
}
