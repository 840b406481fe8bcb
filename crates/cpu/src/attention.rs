//! Causal (optionally sliding-window, soft-capped) softmax attention of query heads over the KV
//! cache, grouped-query: KV head `j` serves query heads `j*g .. j*g+g-1`, and its keys and values
//! are read once for all the heads of a call.
//!
//! A query's positions are split into [`parts`] (by their number only), each part's softmax
//! is taken on its own and [`combine`] merges them. A part longer than a [`TILE`] of positions
//! is read a tile at a time with a running (online) softmax, so that no score row is longer than
//! a tile; a shorter one is one softmax. Decode hands the parts to different threads (with few KV
//! heads — one in Gemma 3 — and a long context, the heads alone would not keep the threads
//! busy); prefill takes a block of queries at once ([`attend_block`]), tile by tile, so that a
//! tile of keys and values is read (and converted to f32, exactly) once for all of them. Each (query, part) sees the same
//! updates in the same order either way, so a position's output is the same bits whether it
//! was decoded or prefilled, and a conversation continued from the cache equals one prefilled
//! afresh.

use std::ops::Range;

use anelm_model::plan::Attention;

use crate::kernels::prefetch;
use crate::kv::Rows;
use crate::kvblock::{each_format, KvBlock};
use crate::kvdot;
use crate::ops::softcap;
use crate::simd::Isa;
use crate::vecmath::{exp, exp_shift, max, softmax};

/// The cache of one layer as attention reads it: KV head `h`'s keys (and values) of position
/// `pos` are the `hd` values from `(h · slots + pos - base) · hd` on, each in its format —
/// a head's positions one after the other, so that attention reads each head's rows as one
/// stream (`base` above 0: a sliding window's cache that has forgotten older positions).
pub struct Cache<'a> {
    pub k: Rows<'a>,
    pub v: Rows<'a>,
    /// Positions each head holds.
    pub slots: usize,
    pub base: usize,
}

impl Cache<'_> {
    /// The first value of position `pos`'s keys (or values) of KV head `kvh`.
    fn at(&self, pos: usize, kvh: usize, hd: usize) -> usize {
        debug_assert!(pos >= self.base, "position {pos} was forgotten");
        debug_assert!(pos - self.base < self.slots, "position {pos} is not held");
        (kvh * self.slots + pos - self.base) * hd
    }
}

impl Cache<'_> {
    /// Asks for KV head `kvh`'s keys and values of the positions `over` ahead of their use, at
    /// most `budget` bytes of each; returns the bytes asked for.
    pub fn prefetch(&self, over: Range<usize>, kvh: usize, hd: usize, budget: usize) -> usize {
        let at = self.at(over.start, kvh, hd);
        let values = at..at + over.len() * hd;
        let mut asked = 0;
        for rows in [&self.k, &self.v] {
            let bytes = rows.bytes(values.clone());
            let bytes = &bytes[..bytes.len().min(budget)];
            prefetch(bytes);
            asked += bytes.len();
        }
        asked
    }
}

/// The rows of `rows` from value `at` on, and the distance between positions (`hd` values),
/// in blocks.
fn from<B: KvBlock>(rows: &[B], at: usize, hd: usize) -> (&[B], usize) {
    (&rows[at / B::N..], hd / B::N)
}

/// The positions a query at `pos` attends to: all up to it, or the window ending there.
pub fn positions(a: &Attention, pos: usize) -> Range<usize> {
    a.window.map_or(0, |w| (pos + 1).saturating_sub(w))..pos + 1
}

/// The most parts a query's positions are split into, and the fewest positions in a part.
/// Each part costs a softmax, a kernel call per tile and a share of [`combine`]: parts of 16
/// made attention 22 % of a four-sequence SmolLM2 decode step 128 positions deep (`perf`), parts
/// of 64 about 15 %, with the same kernel work.
pub const MAX_PARTS: usize = 8;
const MIN_PART: usize = 64;

/// Positions of the cache read at once: the longest score row.
pub const TILE: usize = 64;

/// The f32 values of the window [`attend_block`] converts keys and values of `hd` wide heads
/// into.
pub const fn window_len(hd: usize) -> usize {
    2 * (2 * TILE - 1) * hd
}

/// The parts of the positions `over`: as many as [`MIN_PART`] allows, at most [`MAX_PARTS`],
/// of (nearly) equal length.
pub fn parts(over: Range<usize>) -> impl Iterator<Item = Range<usize>> + Clone {
    let n = over.len().div_ceil(MIN_PART).clamp(1, MAX_PARTS);
    let at = move |s: usize| over.start + s * over.len() / n;
    (0..n).map(move |s| at(s)..at(s + 1))
}

/// Tile `k` of the part `part`: its positions from `part.start + k * TILE`, at most a tile.
fn tile(part: &Range<usize>, k: usize) -> Range<usize> {
    let at = part.start + k * TILE;
    at..(at + TILE).min(part.end)
}

/// A running softmax of `g` heads that has seen no position: `acc` (`g × hd`) their
/// exp-weighted values, `run[h]` head `h`'s (max score, Σ exp(score - max)).
fn start(acc: &mut [f32], run: &mut [(f32, f32)]) {
    acc.fill(0.0);
    run.fill((f32::NEG_INFINITY, 0.0));
}

/// Adds the positions `keys` (at most a tile) to the running softmax of the heads of `q`.
#[allow(clippy::too_many_arguments)]
fn update(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    q: &[f32],
    keys: Range<usize>,
    cache: &Cache<'_>,
    scores: &mut [f32],
    acc: &mut [f32],
    run: &mut [(f32, f32)],
) {
    let hd = a.head_dim;
    let (g, n) = (q.len() / hd, keys.len());
    let at = cache.at(keys.start, kvh, hd);
    let s = &mut scores[..g * n];
    each_format!(cache.k, Rows, k => {
        let (k, stride) = from(k, at, hd);
        kvdot::scores(isa, q, g, hd, k, stride, n, a.scale, s)
    });
    for (h, row) in s.chunks_exact_mut(n).enumerate() {
        if let Some(cap) = a.softcap {
            softcap(row, cap);
        }
        let (m, l) = run[h];
        let top = m.max(max(isa, row));
        let sum = exp_shift(isa, row, top);
        let rescale = exp(m - top);
        run[h] = (top, l * rescale + sum);
        if rescale != 1.0 {
            acc[h * hd..(h + 1) * hd]
                .iter_mut()
                .for_each(|x| *x *= rescale);
        }
    }
    each_format!(cache.v, Rows, v => {
        let (v, stride) = from(v, at, hd);
        kvdot::mix(isa, s, g, hd, v, stride, n, acc)
    });
}

/// Normalises a running softmax's outputs in place (its statistics stay, for [`combine`]).
fn finish(hd: usize, acc: &mut [f32], run: &[(f32, f32)]) {
    for (h, &(_, sum)) in run.iter().enumerate() {
        let inv = 1.0 / sum;
        acc[h * hd..(h + 1) * hd].iter_mut().for_each(|x| *x *= inv);
    }
}

/// Tile `k` of the part `part` into the attention of the heads of `q` (`acc`, `run`): a part of
/// one tile is one softmax, normalised here; a longer one runs from [`start`] to [`finish`].
#[allow(clippy::too_many_arguments)]
fn part_tile(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    q: &[f32],
    part: &Range<usize>,
    k: usize,
    cache: &Cache<'_>,
    scores: &mut [f32],
    acc: &mut [f32],
    run: &mut [(f32, f32)],
) {
    if part.len() > TILE {
        if k == 0 {
            start(acc, run);
        }
        update(isa, a, kvh, q, tile(part, k), cache, scores, acc, run);
        if k + 1 == part.len().div_ceil(TILE) {
            finish(a.head_dim, acc, run);
        }
        return;
    }
    let hd = a.head_dim;
    let (g, n) = (q.len() / hd, part.len());
    let at = cache.at(part.start, kvh, hd);
    let s = &mut scores[..g * n];
    each_format!(cache.k, Rows, k => {
        let (k, stride) = from(k, at, hd);
        kvdot::scores(isa, q, g, hd, k, stride, n, a.scale, s)
    });
    for (h, row) in s.chunks_exact_mut(n).enumerate() {
        if let Some(cap) = a.softcap {
            softcap(row, cap);
        }
        run[h] = softmax(isa, row);
    }
    acc.fill(0.0);
    each_format!(cache.v, Rows, v => {
        let (v, stride) = from(v, at, hd);
        kvdot::mix(isa, s, g, hd, v, stride, n, acc)
    });
}

/// `out` = attention of `g` query heads of KV head `kvh` (`q`: their `g × head_dim` values) over
/// the cached positions `over`, normalised within them; `stats[h]` gets head `h`'s softmax
/// statistics (to [`combine`] parts of the positions). `scores` is scratch of at least
/// `g × TILE` values.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    q: &[f32],
    over: Range<usize>,
    cache: &Cache<'_>,
    scores: &mut [f32],
    out: &mut [f32],
    stats: &mut [(f32, f32)],
) {
    let g = q.len() / a.head_dim;
    let (out, stats) = (&mut out[..q.len()], &mut stats[..g]);
    for k in 0..over.len().div_ceil(TILE).max(1) {
        part_tile(isa, a, kvh, q, &over, k, cache, scores, out, stats);
    }
}

/// Attention of a block of queries of KV head `kvh` (`queries[b]`: the `g` heads' values and
/// the positions they attend to) into `outs[b]`, each as [`attend`] over its [`parts`] and
/// [`combine`] would give it, bit for bit. The cache is walked a window of `TILE` positions at
/// a time, each (query, part) taking its tile that starts in the window, so that a window's
/// keys and values are read from memory once for the block — and converted to f32 once, into
/// `window` (at least [`window_len`] values), which gives the products the same bits as the
/// cache's own format. `acc` and `run` are scratch for `queries.len() × MAX_PARTS` running
/// softmaxes (`g × hd` and `g` values each).
#[allow(clippy::too_many_arguments)]
pub fn attend_block(
    isa: Isa,
    a: &Attention,
    kvh: usize,
    queries: &[(&[f32], Range<usize>)],
    cache: &Cache<'_>,
    scores: &mut [f32],
    window: &mut [f32],
    acc: &mut [f32],
    run: &mut [(f32, f32)],
    outs: &mut [&mut [f32]],
) {
    let Some(gw) = queries.first().map(|q| q.0.len()) else {
        return;
    };
    let (hd, g) = (a.head_dim, gw / a.head_dim);
    let slot = |b: usize, s: usize| b * MAX_PARTS + s;
    let lo = queries.iter().map(|q| q.1.start).min().unwrap_or(0);
    let hi = queries.iter().map(|q| q.1.end).max().unwrap_or(0);
    let (kw, vw) = window[..window_len(hd)].split_at_mut(window_len(hd) / 2);
    for w in (lo..hi.max(lo + 1)).step_by(TILE) {
        // Every tile that starts in the window ends before `w + 2 * TILE - 1`.
        let span = w..(w + 2 * TILE - 1).min(hi);
        for (rows, out) in [(&cache.k, &mut *kw), (&cache.v, &mut *vw)] {
            each_format!(rows, Rows, r => {
                let (r, stride) = from(r, cache.at(w, kvh, hd), hd);
                kvdot::to_f32(isa, r, stride, span.len(), hd, out)
            });
        }
        let here = Cache {
            k: Rows::F32(&kw[..span.len() * hd]),
            v: Rows::F32(&vw[..span.len() * hd]),
            slots: span.len(),
            base: w,
        };
        for (b, (q, over)) in queries.iter().enumerate() {
            if over.end <= w || w + TILE <= over.start {
                continue;
            }
            for (s, part) in parts(over.clone()).enumerate() {
                // The part's tile that starts in the window, if any.
                let k = w.saturating_sub(part.start).div_ceil(TILE);
                let at = part.start + k * TILE;
                if at >= w + TILE || (k > 0 && at >= part.end) {
                    continue;
                }
                let i = slot(b, s);
                let (acc, run) = (&mut acc[i * gw..][..gw], &mut run[i * g..][..g]);
                part_tile(isa, a, 0, q, &part, k, &here, scores, acc, run);
            }
        }
    }
    for (b, (_, over)) in queries.iter().enumerate() {
        let n = parts(over.clone()).count();
        for h in 0..g {
            let pieces = (0..n).map(|s| {
                let i = slot(b, s);
                (&acc[i * gw + h * hd..][..hd], run[i * g + h])
            });
            combine(pieces, &mut outs[b][h * hd..(h + 1) * hd]);
        }
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
    use crate::kvblock::{BlockQ4_0, BlockQ8_0};
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

    /// Attention of query heads `q` over positions `over`, in f64 from the definition.
    fn reference(
        a: &Attention,
        kvh: usize,
        q: &[f32],
        over: Range<usize>,
        k: &[f32],
        v: &[f32],
        slots: usize,
    ) -> Vec<f64> {
        let hd = a.head_dim;
        let mut out = vec![0f64; q.len()];
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            let s: Vec<f64> = over
                .clone()
                .map(|j| {
                    let kj = &k[(kvh * slots + j) * hd..][..hd];
                    let d: f64 = qh.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let cap = a.softcap.unwrap() as f64;
                    cap * (d * a.scale as f64 / cap).tanh()
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (j, x) in over.clone().zip(&s) {
                let w = (x - m).exp() / total;
                for i in 0..hd {
                    out[h * hd + i] += w * v[(kvh * slots + j) * hd + i] as f64;
                }
            }
        }
        out
    }

    #[test]
    fn blocks_of_queries_give_the_bits_of_parts_combined_and_match_the_definition() {
        let (hd, heads, kvh, len) = (32, 4, 2, 1100);
        let g = heads / kvh;
        let a = layer(hd, heads, kvh);
        let kv_dim = kvh * hd;
        let val = |i: usize| ((i * 7919 % 211) as f32 / 105.0 - 1.0) * 1.5;
        let k: Vec<f32> = (0..len * kv_dim).map(val).collect();
        let v: Vec<f32> = (0..len * kv_dim).map(|i| val(i + 3)).collect();
        // Every format, each with the values it holds (the reference's input).
        fn held<B: KvBlock>(x: &[f32]) -> (Vec<B>, Vec<f32>) {
            let mut r = vec![B::ZERO; x.len() / B::N];
            B::quantize(&mut r, x);
            let mut back = vec![0f32; x.len()];
            B::dequantize(&r, &mut back);
            (r, back)
        }
        let (k16, v16) = (held::<half::f16>(&k), held::<half::f16>(&v));
        let (k8, v8) = (held::<BlockQ8_0>(&k), held::<BlockQ8_0>(&v));
        let (k4, v4) = (held::<BlockQ4_0>(&k), held::<BlockQ4_0>(&v));
        let cache = |k, v| Cache {
            k,
            v,
            slots: len,
            base: 0,
        };
        let caches = [
            (cache(Rows::F32(&k), Rows::F32(&v)), &k, &v),
            (cache(Rows::F16(&k16.0), Rows::F16(&v16.0)), &k16.1, &v16.1),
            (cache(Rows::Q8_0(&k8.0), Rows::Q8_0(&v8.0)), &k8.1, &v8.1),
            (cache(Rows::Q4_0(&k4.0), Rows::Q4_0(&v4.0)), &k4.1, &v4.1),
        ];
        // Queries whose parts span one tile or several (longer than 512 positions), and start
        // off a tile boundary.
        let overs = [0..5, 0..37, 10..200, 0..len, 129..len, 600..1099];
        assert!(parts(0..len).all(|p| p.len() > TILE) && parts(0..37).all(|p| p.len() < TILE));
        let qs: Vec<Vec<f32>> = (0..overs.len())
            .map(|b| (0..g * hd).map(|i| val(i + 11 + 7 * b)).collect())
            .collect();
        let mut scratch = vec![0f32; g * TILE];
        let mut window = vec![0f32; window_len(hd)];
        for (isa, (cache, k, v)) in Isa::available()
            .into_iter()
            .flat_map(|i| caches.iter().map(move |c| (i, c)))
        {
            let queries: Vec<(&[f32], Range<usize>)> = qs
                .iter()
                .zip(&overs)
                .map(|(q, o)| (&q[..], o.clone()))
                .collect();
            let (mut acc, mut run) = (
                vec![0f32; overs.len() * MAX_PARTS * g * hd],
                vec![(0f32, 0f32); overs.len() * MAX_PARTS * g],
            );
            let mut outs = vec![vec![0f32; g * hd]; overs.len()];
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[..]).collect();
            attend_block(
                isa,
                &a,
                1,
                &queries,
                cache,
                &mut scratch,
                &mut window,
                &mut acc,
                &mut run,
                &mut refs,
            );
            for (b, (q, over)) in queries.iter().enumerate() {
                // As decode computes it: each part alone, then combined.
                let n = parts(over.clone()).count();
                let mut po = vec![0f32; n * g * hd];
                let mut ps = vec![(0f32, 0f32); n * g];
                for (s, part) in parts(over.clone()).enumerate() {
                    let (o, st) = (&mut po[s * g * hd..][..g * hd], &mut ps[s * g..][..g]);
                    attend(isa, &a, 1, q, part, cache, &mut scratch, o, st);
                }
                let mut want = vec![0f32; g * hd];
                for h in 0..g {
                    let pieces = (0..n).map(|s| (&po[(s * g + h) * hd..][..hd], ps[s * g + h]));
                    combine(pieces, &mut want[h * hd..(h + 1) * hd]);
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&outs[b]), bits(&want), "{isa:?} query {b}");
                let exact = reference(&a, 1, q, over.clone(), k, v, len);
                for (x, y) in outs[b].iter().zip(&exact) {
                    assert!(
                        (*x as f64 - y).abs() <= 2e-6,
                        "{isa:?} query {b}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
