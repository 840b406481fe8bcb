//! Causal (optionally sliding-window, soft-capped) softmax attention of one query head over the
//! KV cache, grouped-query: KV head `j` serves query heads `j*g .. j*g+g-1`. The forward pass
//! hands out (block of tokens, head) pairs to the threads, so in prefill the keys and values of
//! a head are read from cache once per block of queries rather than once per query.

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

/// `out` = attention of `g` query heads of KV head `kvh` (`q`: their `g × head_dim` values, at
/// position `pos`; all the heads the KV head serves, or some) over the cached positions
/// `0..=pos`, or the window ending there. `scores` is scratch of at least `g × (pos + 1)` values.
#[allow(clippy::too_many_arguments)]
pub fn attend_group<E: KvElem>(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    q: &[f32],
    pos: usize,
    cache: &Cache<'_, E>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = a.head_dim;
    let g = q.len() / hd;
    let start = a.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let n = pos + 1 - start;
    let at = start * cache.kv_dim + kvh * hd;
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
    for row in scores.chunks_exact_mut(n) {
        if let Some(cap) = a.softcap {
            softcap(row, cap);
        }
        softmax(isa, row);
    }
    E::mix(isa, scores, g, hd, &cache.v[at..], cache.kv_dim, n, out);
}
