//! Causal (optionally sliding-window, soft-capped) softmax attention of new queries over the KV
//! cache, grouped-query: KV head `j` serves query heads `j*g .. j*g+g-1`.

use anelm_model::plan::Attention;
use rayon::prelude::*;

use crate::ops::{dot, softcap, softmax};

/// `out[t]` = attention of query row `t` (position `p0 + t`) over cached positions
/// `0..=p0 + t` (or the window ending there). `k_cache`/`v_cache` are `[pos][n_kv * hd]`.
pub fn attend(a: &Attention, q: &[f32], k_cache: &[f32], v_cache: &[f32], p0: usize, out: &mut [f32]) {
    let hd = a.head_dim;
    let qd = a.n_heads * hd;
    let kvd = a.n_kv_heads * hd;
    let group = a.n_heads / a.n_kv_heads;
    out.par_chunks_mut(qd).enumerate().for_each_init(Vec::new, |scores: &mut Vec<f32>, (t, out_row)| {
        let pos = p0 + t;
        let start = a.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..a.n_heads {
            let kvh = h / group;
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            scores.clear();
            scores.extend((start..=pos).map(|j| dot(qh, &k_cache[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd]) * a.scale));
            if let Some(cap) = a.softcap {
                softcap(scores, cap);
            }
            softmax(scores);
            let o = &mut out_row[h * hd..(h + 1) * hd];
            o.fill(0.0);
            for (i, &p) in scores.iter().enumerate() {
                let j = start + i;
                let vj = &v_cache[j * kvd + kvh * hd..j * kvd + (kvh + 1) * hd];
                o.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
            }
        }
    });
}
