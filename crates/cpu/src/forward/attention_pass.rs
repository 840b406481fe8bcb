//! The attention mixer of one layer: the q/k/v projections finished per block of heads (norms,
//! RoPE, cache writes), attention over the cache (split over positions in decode), the output.

use std::ops::Range;

use anelm_model::plan::{Attention, Layer};
use anelm_model::Weight;

use super::layer::{Forward, Src};
use super::{ATTN_BLOCK, SHORT_PASS};
use crate::attention::{attend, attend_block, combine, parts, positions, MAX_PARTS};
use crate::ops::{attention_rotations, hadamard, norm_row, output_gate, rope_head};
use crate::shared::SharedSlice;

impl Forward<'_> {
    /// Layer `li`'s attention (`a`) over every row's own sequence.
    pub(super) unsafe fn attention(&mut self, layer: &Layer, a: &Attention, li: usize) {
        let (ctx, v, n, isa) = (self.ctx, self.v, self.n, self.isa);
        let h = self.m.config.hidden_size;
        let (hd, qd, kvd) = (
            a.head_dim,
            a.n_heads * a.head_dim,
            a.n_kv_heads * a.head_dim,
        );
        let c = self.c;

        self.norm_into_xn(&layer.attn_norm);
        let gate_w = a.output_gate.as_ref().map(|g| &g.weight);
        let inputs: Vec<&Weight> = [&a.q.weight, &a.k.weight, &a.v.weight]
            .into_iter()
            .chain(gate_w)
            .collect();
        self.prepare(Src::Xn, h, 0..n, &inputs);
        // A decode step or a short pass: decode attention's items, counted once for the layer,
        // and their keys and values asked for while the projections compute.
        let decode = (c.decode() || n <= SHORT_PASS).then(|| self.decode_items(a));
        if let Some(total) = decode {
            self.prefetch_decode(a, li, total);
        }
        // RoPE's cos and sin for each token, once per layer (layers may differ in frequencies).
        let mut angles = std::mem::take(&mut self.p.angles);
        if let Some(rope) = &a.rope {
            let half = rope.dims / 2;
            for (t, cs) in angles.chunks_exact_mut(2 * half).take(n).enumerate() {
                let (cos, sin) = cs.split_at_mut(half);
                rope.angles(c.at(t).1, cos, sin);
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
        // A quantised cache holds keys and queries, and values, rotated (undone on the output).
        let (rot_k, rot_v) =
            attention_rotations(hd, c.seqs[0].kc.quantized(), c.seqs[0].vc.quantized());
        let rotate = |buf: &SharedSlice<'_, f32>,
                      width: usize,
                      rows: Range<usize>,
                      tokens: Range<usize>,
                      block: Option<usize>| {
            let Some(block) = block else { return };
            for t in tokens {
                let heads = buf.range_mut(t * width + rows.start..t * width + rows.end);
                heads.chunks_exact_mut(block).for_each(hadamard);
            }
        };
        // Each row's keys or values (`values`) into its sequence's cache, head by head (`rows`
        // are whole heads).
        let store =
            |buf: &SharedSlice<'_, f32>, values: bool, rows: Range<usize>, tokens: Range<usize>| {
                for t in tokens {
                    let (seq, pos) = c.at(t);
                    let cache = if values { &seq.vc } else { &seq.kc };
                    debug_assert!(rows.start.is_multiple_of(hd) && rows.end.is_multiple_of(hd));
                    for h in rows.start / hd..rows.end / hd {
                        let src = buf.range(t * kvd + h * hd..t * kvd + (h + 1) * hd);
                        cache.store(seq.kv_value(li, h, hd, pos), src);
                    }
                }
            };
        self.product(&a.q.weight, a.q.bias.as_deref(), &v.q, hd, |r, t| {
            rope_heads(&v.q, qd, r.clone(), t.clone(), a.q_norm.as_ref());
            rotate(&v.q, qd, r, t, rot_k);
        });
        self.product(&a.k.weight, a.k.bias.as_deref(), &v.k, hd, |r, t| {
            rope_heads(&v.k, kvd, r.clone(), t.clone(), a.k_norm.as_ref());
            rotate(&v.k, kvd, r.clone(), t.clone(), rot_k);
            store(&v.k, false, r, t);
        });
        self.product(&a.v.weight, a.v.bias.as_deref(), &v.v, hd, |r, t| {
            rotate(&v.v, kvd, r.clone(), t.clone(), rot_v);
            store(&v.v, true, r, t)
        });
        if let Some(g) = &a.output_gate {
            self.linear(g, &v.z);
        }
        self.p.angles = angles;
        ctx.barrier();

        if let Some(total) = decode {
            self.decode_attention(a, li, rot_v, total);
            self.prepare(Src::Xn, qd, 0..n, &[&a.o.weight]);
        } else {
            // Runs of several tokens (a prefill; beside it, other sequences' runs, one token
            // or more). (Block of a sequence's query tokens, KV head) pairs: a head's keys and
            // values are read once for its group of query heads (adjacent in a row of q) and a
            // block of tokens. A sequence's blocks start at its first row, so its result does
            // not depend on the others.
            let blocks: Vec<(usize, Range<usize>)> = c
                .seqs
                .iter()
                .enumerate()
                .flat_map(|(i, s)| {
                    let end = s.rows.end;
                    s.rows
                        .clone()
                        .step_by(ATTN_BLOCK)
                        .map(move |r0| (i, r0..(r0 + ATTN_BLOCK).min(end)))
                })
                .collect();
            let g = a.n_heads / a.n_kv_heads;
            let gw = g * hd;
            let p = &mut *self.p;
            let (scores, window) = (&mut p.scratch, &mut p.window);
            let (acc, run) = (&mut p.part, &mut p.part_stats);
            ctx.chunks(blocks.len() * a.n_kv_heads, |item| {
                let ((si, rows), kvh) = (&blocks[item / a.n_kv_heads], item % a.n_kv_heads);
                let rows = rows.clone();
                let cache = c.seqs[*si].cache(li, kvd);
                let at = |t: usize| t * qd + kvh * gw..t * qd + (kvh + 1) * gw;
                let queries: [(&[f32], Range<usize>); ATTN_BLOCK] = std::array::from_fn(|b| {
                    let t = rows.start + b;
                    match t < rows.end {
                        true => (v.q.range(at(t)), positions(a, c.at(t).1)),
                        false => (&[][..], 0..0),
                    }
                });
                let mut outs: [&mut [f32]; ATTN_BLOCK] = std::array::from_fn(|b| {
                    let t = rows.start + b;
                    match t < rows.end {
                        true => v.att.range_mut(at(t)),
                        false => &mut [][..],
                    }
                });
                let nb = rows.len();
                let (queries, outs) = (&queries[..nb], &mut outs[..nb]);
                attend_block(isa, a, kvh, queries, &cache, scores, window, acc, run, outs);
                if let Some(block) = rot_v {
                    for out in outs.iter_mut() {
                        out.chunks_exact_mut(block).for_each(hadamard);
                    }
                }
                if a.output_gate.is_some() {
                    for (b, out) in outs.iter_mut().enumerate() {
                        output_gate(out, v.z.range(at(rows.start + b)));
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

    /// Fills `p.items` with each row's first item of [`Self::decode_attention`]; returns the
    /// number of items.
    fn decode_items(&mut self, a: &Attention) -> usize {
        let mut starts = std::mem::take(&mut self.p.items);
        starts.clear();
        let items = DecodeItems {
            a,
            n: self.n,
            threads: self.ctx.n,
            c: self.c,
            starts: &[],
        };
        let mut total = 0;
        for t in 0..self.n {
            starts.push(total);
            let (_, n_parts, groups) = items.split(t);
            total += a.n_kv_heads * groups * n_parts;
        }
        self.p.items = starts;
        total
    }

    /// Asks for the keys and values this thread's items of [`Self::decode_attention`] (`total`,
    /// from [`Self::decode_items`]) will read, at most [`PREFETCH_BYTES`]: called before the projections, so that the cache
    /// (evicted by a step's stream of weights) comes from memory while they compute instead of
    /// stalling attention's loads.
    pub(super) fn prefetch_decode(&mut self, a: &Attention, li: usize, total: usize) {
        let items = DecodeItems {
            a,
            n: self.n,
            threads: self.ctx.n,
            c: self.c,
            starts: &self.p.items,
        };
        let kvd = a.n_kv_heads * a.head_dim;
        let mine = self.ctx.own_chunks(total);
        // Each item's first rows (where the hardware has no stream to follow yet) before any
        // item's later ones.
        let each = (PREFETCH_BYTES / mine.len().max(1)).max(4 << 10);
        let mut budget = PREFETCH_BYTES;
        let mut last = None;
        for item in mine {
            let DecodeItem { t, kvh, part, .. } = items.get(item);
            // Another group of the same KV head's query heads reads the same rows.
            if last.replace((t, kvh, part.start)) == Some((t, kvh, part.start)) {
                continue;
            }
            // SAFETY: reads only; the rows are plain data whatever a thread writes into them.
            let cache = unsafe { self.c.at(t).0.cache(li, kvd) };
            let most = each.min(budget) / 2;
            budget = budget.saturating_sub(cache.prefetch(part, kvh, a.head_dim, most));
            if budget == 0 {
                break;
            }
        }
    }

    /// Attention of each row's token over its own sequence's positions up to its own (a decode
    /// step's one token per sequence, or the few tokens of a short pass), into `xn`. The threads
    /// share items of a row: a part of its positions and some query heads of one KV head —
    /// enough items for two per thread where the heads allow (how the heads are grouped does
    /// not change a head's result; how the positions are split does, and [`parts`] splits them
    /// by their number only, so a row's result does not depend on the others). After the
    /// barrier every thread combines the parts for itself (no barrier of its own).
    /// Values held rotated over blocks of `rot_v` are rotated back on the output. `total`: the
    /// items, from [`Self::decode_items`].
    pub(super) unsafe fn decode_attention(
        &mut self,
        a: &Attention,
        li: usize,
        rot_v: Option<usize>,
        total: usize,
    ) {
        let (ctx, v, isa, c, n) = (self.ctx, self.v, self.isa, self.c, self.n);
        let (hd, nh) = (a.head_dim, a.n_heads);
        let (qd, kvd) = (nh * hd, a.n_kv_heads * hd);
        let items = DecodeItems {
            a,
            n,
            threads: ctx.n,
            c,
            starts: &self.p.items,
        };
        // Head `j`'s output and statistics over part `s` of row `t` go to row
        // `t * MAX_PARTS * nh + s * nh + j`.
        let scores = &mut self.p.scratch;
        ctx.chunks(total, |item| {
            let DecodeItem {
                t,
                kvh,
                heads,
                s,
                part,
            } = items.get(item);
            let q =
                v.q.range(t * qd + heads.start * hd..t * qd + heads.end * hd);
            let base = t * MAX_PARTS * nh + s * nh;
            let rows = base + heads.start..base + heads.end;
            let out = v.part.range_mut(rows.start * hd..rows.end * hd);
            let stats = v.part_stats.range_mut(rows);
            let cache = c.at(t).0.cache(li, kvd);
            attend(isa, a, kvh, q, part, &cache, scores, out, stats);
        });
        ctx.barrier();
        for t in 0..n {
            let n_parts = items.split(t).1;
            let base = t * MAX_PARTS * nh;
            let (part, stats) = (
                v.part.range(base * hd..(base + n_parts * nh) * hd),
                v.part_stats.range(base..base + n_parts * nh),
            );
            for j in 0..nh {
                let pieces =
                    (0..n_parts).map(|s| (&part[(s * nh + j) * hd..][..hd], stats[s * nh + j]));
                let at = t * qd + j * hd..t * qd + (j + 1) * hd;
                let out = &mut self.p.xn[at.clone()];
                combine(pieces, out);
                if let Some(block) = rot_v {
                    out.chunks_exact_mut(block).for_each(hadamard);
                }
                if a.output_gate.is_some() {
                    output_gate(out, v.z.range(at));
                }
            }
        }
    }
}

/// The bytes of keys and values a thread asks for ahead of a decode step's attention, per
/// layer: what the core's L2 keeps beside the projections' weights. Beyond it (a deep cache)
/// the rows stream at the hardware prefetchers' pace anyway.
const PREFETCH_BYTES: usize = 256 << 10;

/// The items of a decode step's attention: (row, KV head, group of its query heads, part of
/// the row's positions), in that nesting; `starts[t]` is row `t`'s first.
struct DecodeItems<'a, 'c> {
    a: &'a Attention,
    n: usize,
    threads: usize,
    c: &'a super::Chunk<'c>,
    starts: &'a [usize],
}

/// One of [`DecodeItems`]: query heads `heads` of KV head `kvh` over `part`, part `s` of row
/// `t`'s positions.
struct DecodeItem {
    t: usize,
    kvh: usize,
    heads: Range<usize>,
    s: usize,
    part: Range<usize>,
}

impl DecodeItems<'_, '_> {
    /// Row `t`'s positions, their number of parts, and its groups of query heads: enough items
    /// for two per thread where the heads allow.
    fn split(&self, t: usize) -> (Range<usize>, usize, usize) {
        let a = self.a;
        let over = positions(a, self.c.at(t).1);
        let n_parts = parts(over.clone()).count();
        let g = a.n_heads / a.n_kv_heads;
        let groups = (2 * self.threads)
            .div_ceil(self.n * a.n_kv_heads * n_parts)
            .clamp(1, g);
        (over, n_parts, groups)
    }

    fn get(&self, item: usize) -> DecodeItem {
        let t = self.starts.partition_point(|&s| s <= item) - 1;
        let (over, n_parts, groups) = self.split(t);
        let g = self.a.n_heads / self.a.n_kv_heads;
        let i = item - self.starts[t];
        let (kvh, sg, s) = (i / (groups * n_parts), i / n_parts % groups, i % n_parts);
        let heads = kvh * g + sg * g / groups..kvh * g + (sg + 1) * g / groups;
        let part = parts(over).nth(s).expect("s < n_parts");
        DecodeItem {
            t,
            kvh,
            heads,
            s,
            part,
        }
    }
}
