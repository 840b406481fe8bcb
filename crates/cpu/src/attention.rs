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

/// `out` = attention of `q` (query head `head`, at position `pos`) over the cached positions
/// `0..=pos`, or the window ending there. `scores` is scratch of at least `pos + 1` values.
pub fn attend_head<E: KvElem>(isa: Isa, a: &Attention, head: usize, q: &[f32], pos: usize, cache: &Cache<'_, E>, scores: &mut [f32], out: &mut [f32]) {
    let hd = a.head_dim;
    let kvh = head / (a.n_heads / a.n_kv_heads);
    let start = a.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let scores = &mut scores[..pos + 1 - start];
    let at = |j: usize| j * cache.kv_dim + kvh * hd;
    for (s, j) in scores.iter_mut().zip(start..=pos) {
        *s = E::dot(isa, q, &cache.k[at(j)..at(j) + hd]) * a.scale;
    }
    if let Some(cap) = a.softcap {
        softcap(scores, cap);
    }
    softmax(isa, scores);
    out.fill(0.0);
    for (&p, j) in scores.iter().zip(start..=pos) {
        E::axpy(isa, out, p, &cache.v[at(j)..at(j) + hd]);
    }
}
