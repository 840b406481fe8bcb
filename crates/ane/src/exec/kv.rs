//! The KV cache of the projection strategy (f32, on the CPU) and attention over it: causal,
//! optionally sliding-window and soft-capped, grouped-query.

use std::any::Any;

use anelm_cpu::ops::softcap;
use anelm_model::plan::Attention;
use anelm_model::{KvState, OwnedState};
use rayon::prelude::*;

/// Keys and values of every layer, `[position][kv_dim]` each.
pub struct ProjectionKv {
    pub(crate) owner: usize,
    pub(crate) len: usize,
    capacity: usize,
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
}

impl ProjectionKv {
    pub(crate) fn new(owner: usize, kv_dims: &[usize], capacity: usize) -> ProjectionKv {
        let zeros = || kv_dims.iter().map(|&d| vec![0f32; d * capacity]).collect();
        ProjectionKv {
            owner,
            len: 0,
            capacity,
            k: zeros(),
            v: zeros(),
        }
    }
}

impl OwnedState for ProjectionKv {
    fn owner(&self) -> usize {
        self.owner
    }
}

impl KvState for ProjectionKv {
    fn len(&self) -> usize {
        self.len
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// `out[t]` = attention of the `n` queries `q[t]` (positions `p0 + t`) over the cached keys and
/// values of positions `0..=p0 + t` (or the window ending there). Rows are `n_heads * head_dim`
/// wide; the cache rows `n_kv_heads * head_dim`.
pub fn attend(
    a: &Attention,
    q: &[f32],
    n: usize,
    p0: usize,
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) {
    let (hd, qd, kvd) = (
        a.head_dim,
        a.n_heads * a.head_dim,
        a.n_kv_heads * a.head_dim,
    );
    let group = a.n_heads / a.n_kv_heads;
    out[..n * qd]
        .par_chunks_mut(qd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (t, o)| {
            let pos = p0 + t;
            let start = a.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            for h in 0..a.n_heads {
                let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                let at = |j: usize| j * kvd + (h / group) * hd;
                scores.clear();
                scores.extend((start..=pos).map(|j| {
                    qh.iter()
                        .zip(&k[at(j)..at(j) + hd])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * a.scale
                }));
                if let Some(cap) = a.softcap {
                    softcap(scores, cap);
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let oh = &mut o[h * hd..(h + 1) * hd];
                oh.fill(0.0);
                for (p, j) in scores.iter().zip(start..=pos) {
                    let w = p / sum;
                    oh.iter_mut()
                        .zip(&v[at(j)..at(j) + hd])
                        .for_each(|(o, v)| *o += w * v);
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_model::plan::Linear;
    use anelm_model::Weight;

    fn attention(window: Option<usize>) -> Attention {
        let lin = || Linear {
            weight: Weight::from_f32("w", 1, 1, &[0.0]),
            bias: None,
        };
        Attention {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
            window,
            softcap: None,
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
    fn causal_windowed_grouped() {
        // Keys pick out one position each; values are the position number.
        let k = [10.0, 0.0, 0.0, 10.0, 0.0, 0.0];
        let v = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0];
        // Query at position 1: head 0 prefers key 0, head 1 key 1; both heads share the KV head.
        let q = [1.0, 0.0, 0.0, 1.0];
        let mut out = [0f32; 4];
        attend(&attention(None), &q, 1, 1, &k, &v, &mut out);
        assert!(
            (out[0] - 1.0).abs() < 1e-3 && (out[2] - 2.0).abs() < 1e-3,
            "{out:?}"
        );
        // A window of 1 sees only the query's own position, whatever the scores.
        attend(&attention(Some(1)), &q, 1, 2, &k, &v, &mut out);
        assert_eq!(out, [3.0; 4]);
    }
}
