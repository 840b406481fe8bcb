//! Causal (optionally sliding-window, soft-capped) softmax attention of query heads over the KV
//! cache, grouped-query: KV head `j` serves query heads `j*g .. j*g+g-1`, and its keys and values
//! are read once for all the heads of a call.
//!
//! A query's positions are split into [`parts`] (by their number only), each part's softmax
//! is taken on its own and [`combine`] merges them. Decode hands the parts to different threads
//! (with few KV heads — one in Gemma 3 — and a long context, the heads alone would not keep the
//! threads busy) and prefill runs the parts of each of its queries in turn ([`attend_parts`]):
//! the same operations in the same order, so a position's output is the same bits whether it
//! was decoded or prefilled, and a conversation continued from the cache equals one prefilled
//! afresh.

use std::ops::Range;

use anelm_model::plan::Attention;

use crate::ops::softcap;
use crate::simd::Isa;
use crate::vecmath::{softmax, KvElem};

/// The cache of one layer as attention reads it: `[pos][kv_dim]` keys and values.
pub struct Cache<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub kv_dim: usize,
}

/// The positions a query at `pos` attends to: all up to it, or the window ending there.
pub fn positions(a: &Attention, pos: usize) -> Range<usize> {
    a.window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
}

/// The most parts a query's positions are split into, and the fewest positions in a part.
pub const MAX_PARTS: usize = 8;
const MIN_PART: usize = 16;

/// The parts of the positions `over`: as many as [`MIN_PART`] allows, at most [`MAX_PARTS`],
/// of (nearly) equal length.
pub fn parts(over: Range<usize>) -> impl Iterator<Item = Range<usize>> + Clone {
    let n = over.len().div_ceil(MIN_PART).clamp(1, MAX_PARTS);
    let at = move |s: usize| over.start + s * over.len() / n;
    (0..n).map(move |s| at(s)..at(s + 1))
}

/// `out` = attention of `g` query heads of KV head `kvh` (`q`: their `g × head_dim` values) over
/// the cached positions `over`, normalised within them; `stats[h]` gets head `h`'s softmax
/// statistics (to [`combine`] parts of the positions). `scores` is scratch of at least `g × over.len()` values.
#[allow(clippy::too_many_arguments)]
pub fn attend<E: KvElem>(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    q: &[f32],
    over: Range<usize>,
    cache: &Cache<'_, E>,
    scores: &mut [f32],
    out: &mut [f32],
    stats: &mut [(f32, f32)],
) {
    let hd = a.head_dim;
    let g = q.len() / hd;
    let n = over.len();
    let at = over.start * cache.kv_dim + kvh * hd;
    let scores = &mut scores[..g * n];
    E::scores(
        isa,
        q,
        g,
        hd,
        &cache.k[at..],
        cache.kv_dim,
        n,
        a.scale,
        scores,
    );
    for (h, row) in scores.chunks_exact_mut(n).enumerate() {
        if let Some(cap) = a.softcap {
            softcap(row, cap);
        }
        stats[h] = softmax(isa, row);
    }
    E::mix(isa, scores, g, hd, &cache.v[at..], cache.kv_dim, n, out);
}

/// `out` = attention of `g` query heads (as [`attend`]) over the positions `over`, part by
/// part; `part_out` and `part_stats` are scratch for [`MAX_PARTS`] × `g` heads.
#[allow(clippy::too_many_arguments)]
pub fn attend_parts<E: KvElem>(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    q: &[f32],
    over: Range<usize>,
    cache: &Cache<'_, E>,
    scores: &mut [f32],
    part_out: &mut [f32],
    part_stats: &mut [(f32, f32)],
    out: &mut [f32],
) {
    let hd = a.head_dim;
    let g = q.len() / hd;
    let mut n = 0;
    for (s, part) in parts(over).enumerate() {
        let (o, st) = (
            &mut part_out[s * g * hd..(s + 1) * g * hd],
            &mut part_stats[s * g..][..g],
        );
        attend(isa, a, kvh, q, part, cache, scores, o, st);
        n += 1;
    }
    for h in 0..g {
        let pieces = (0..n).map(|s| (&part_out[(s * g + h) * hd..][..hd], part_stats[s * g + h]));
        combine(pieces, &mut out[h * hd..(h + 1) * hd]);
    }
}

/// Merges the attention outputs of one head over disjoint parts of its positions: `parts` holds
/// each part's output (`hd` values, normalised within the part) and its softmax statistics.
/// Each part weighs by its share of the whole softmax, `sum · exp(max - overall max)`.
pub fn combine<'a>(parts: impl Iterator<Item = (&'a [f32], (f32, f32))> + Clone, out: &mut [f32]) {
    let mut it = parts.clone();
    if let (Some((only, _)), None) = (it.next(), it.next()) {
        out.copy_from_slice(only);
        return;
    }
    let top = parts
        .clone()
        .map(|(_, (m, _))| m)
        .fold(f32::NEG_INFINITY, f32::max);
    out.fill(0.0);
    let mut total = 0.0;
    for (o, (m, sum)) in parts {
        let w = sum * (m - top).exp();
        total += w;
        out.iter_mut().zip(o).for_each(|(d, v)| *d += w * v);
    }
    let inv = 1.0 / total;
    out.iter_mut().for_each(|d| *d *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_model::plan::Linear;
    use anelm_model::Weight;

    fn layer(hd: usize, heads: usize, kv_heads: usize) -> Attention {
        let lin = || Linear {
            weight: Weight::from_f32("w", 1, 1, &[0.0]),
            bias: None,
        };
        Attention {
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: hd,
            scale: 0.25,
            window: None,
            softcap: Some(3.0),
            rope: None,
            q: lin(),
            k: lin(),
            v: lin(),
            o: lin(),
            q_norm: None,
            k_norm: None,
            output_gate: None,
        }
    }

    #[test]
    fn attention_over_parts_combines_to_attention_over_all() {
        let (hd, heads, kvh, len) = (16, 4, 2, 37);
        let g = heads / kvh;
        let a = layer(hd, heads, kvh);
        let kv_dim = kvh * hd;
        let val = |i: usize| ((i * 7919 % 211) as f32 / 105.0 - 1.0) * 1.5;
        let k: Vec<f32> = (0..len * kv_dim).map(val).collect();
        let v: Vec<f32> = (0..len * kv_dim).map(|i| val(i + 3)).collect();
        let q: Vec<f32> = (0..g * hd).map(|i| val(i + 11)).collect();
        let cache = Cache {
            k: &k[..],
            v: &v[..],
            kv_dim,
        };
        let mut scratch = vec![0f32; g * len];
        for isa in Isa::available() {
            let mut whole = vec![0f32; g * hd];
            attend(
                isa,
                &a,
                1,
                &q,
                0..len,
                &cache,
                &mut scratch,
                &mut whole,
                &mut [(0.0, 0.0); 8][..g],
            );
            let cuts = [0, 5, 6, 20, len];
            let mut outs = vec![vec![0f32; g * hd]; cuts.len() - 1];
            let mut stats = vec![vec![(0f32, 0f32); g]; cuts.len() - 1];
            for (i, w) in cuts.windows(2).enumerate() {
                let (o, s) = (&mut outs[i], &mut stats[i]);
                attend(isa, &a, 1, &q, w[0]..w[1], &cache, &mut scratch, o, s);
            }
            let (mut po, mut ps, mut by_parts) = (
                vec![0f32; MAX_PARTS * g * hd],
                vec![(0f32, 0f32); MAX_PARTS * g],
                vec![0f32; g * hd],
            );
            attend_parts(
                isa,
                &a,
                1,
                &q,
                0..len,
                &cache,
                &mut scratch,
                &mut po,
                &mut ps,
                &mut by_parts,
            );
            assert!(parts(0..len).count() > 1);
            for (x, y) in by_parts.iter().zip(&whole) {
                assert!((x - y).abs() <= 1e-5, "{isa:?}: {x} vs {y}");
            }
            for h in 0..g {
                let mut got = vec![0f32; hd];
                let parts = outs
                    .iter()
                    .zip(&stats)
                    .map(|(o, s)| (&o[h * hd..(h + 1) * hd], s[h]));
                combine(parts, &mut got);
                for (x, y) in got.iter().zip(&whole[h * hd..(h + 1) * hd]) {
                    assert!((x - y).abs() <= 1e-5, "{isa:?} head {h}: {x} vs {y}");
                }
            }
        }
    }
}
