//! The state of the projection strategy (on the CPU, f32): every attention layer's KV cache,
//! every recurrent layer's conv history and DeltaNet state; attention over the cache: causal,
//! optionally sliding-window and soft-capped, grouped-query.

use std::any::Any;

use anelm_cpu::ops::softcap;
use anelm_model::plan::{Attention, Mixer};
use anelm_model::{KvState, Model, OwnedState};
use rayon::prelude::*;

/// Per layer: keys and values (`[position][kv_dim]`, empty for recurrent layers), the conv
/// history and the DeltaNet states (empty for attention layers), kept as the CPU engine keeps
/// them.
pub struct ProjectionKv {
    pub(crate) owner: usize,
    pub(crate) len: usize,
    capacity: usize,
    pub(crate) k: Vec<Vec<f32>>,
    pub(crate) v: Vec<Vec<f32>>,
    pub(crate) conv: Vec<Vec<f32>>,
    pub(crate) s: Vec<Vec<f32>>,
}

/// Floats of each layer's (KV row, conv history, recurrent state).
pub(crate) fn state_sizes(m: &Model) -> Vec<(usize, usize, usize)> {
    let h = m.config.hidden_size;
    (m.layers.iter())
        .map(|l| match &l.mixer {
            Mixer::Attention(a) => (a.n_kv_heads * a.head_dim, 0, 0),
            Mixer::DeltaNet(d) => (
                0,
                d.conv_channels() * (d.conv_kernel - 1),
                d.n_v_heads * d.k_dim * d.v_dim,
            ),
            Mixer::ShortConv(c) => (0, (c.kernel - 1) * h, 0),
        })
        .collect()
}

impl ProjectionKv {
    pub(crate) fn new(
        owner: usize,
        sizes: &[(usize, usize, usize)],
        capacity: usize,
    ) -> ProjectionKv {
        let each = |f: fn(&(usize, usize, usize)) -> usize, times: usize| {
            sizes.iter().map(|s| vec![0f32; f(s) * times]).collect()
        };
        ProjectionKv {
            owner,
            len: 0,
            capacity,
            k: each(|s| s.0, capacity),
            v: each(|s| s.0, capacity),
            conv: each(|s| s.1, 1),
            s: each(|s| s.2, 1),
        }
    }

    fn recurrent(&self) -> bool {
        self.conv.iter().chain(&self.s).any(|v| !v.is_empty())
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
    /// Keys and values can be forgotten from any position; a recurrent state cannot go back,
    /// so a model with one starts over (len 0) when asked to keep fewer positions than it has
    /// (as the CPU engine's state does).
    fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if self.recurrent() {
            self.conv
                .iter_mut()
                .chain(&mut self.s)
                .for_each(|v| v.fill(0.0));
            self.len = 0;
        } else {
            self.len = len;
        }
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
    fn a_recurrent_state_restarts_instead_of_going_back() {
        let mut kv = ProjectionKv::new(1, &[(4, 0, 0), (0, 6, 8)], 10);
        kv.len = 5;
        kv.s[1][3] = 1.0;
        kv.truncate(7);
        assert_eq!(kv.len(), 5, "keeping more than held changes nothing");
        kv.truncate(3);
        assert_eq!(kv.len(), 0);
        assert!(kv.s[1].iter().all(|&x| x == 0.0));
        let mut plain = ProjectionKv::new(1, &[(4, 0, 0)], 10);
        plain.len = 5;
        plain.truncate(3);
        assert_eq!(plain.len(), 3);
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
