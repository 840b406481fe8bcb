//! What each column of a step holds — consecutive tokens of one sequence (the prefill and
//! decode functions) or one token of each of several, column `j` in slot `j` (the batch
//! function) — and the per-column tables the chunks take: embeddings, RoPE angles, masks.

use anelm_model::Model;

use crate::error::Result;
use crate::exec::embed;
use crate::lower::fused::{FusedPlan, MASKED};

/// A column's token: of the step's sequence `seq`, at position `pos`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Col {
    pub seq: usize,
    pub pos: usize,
    pub token: u32,
}

/// The columns of one evaluation: `None` where a batch function's slot is idle.
pub(super) struct Columns {
    pub cols: Vec<Option<Col>>,
    /// The batch function (each column its own sequence) rather than one sequence's tokens.
    pub batch: bool,
}

impl Columns {
    /// `tokens` of sequence 0 from position `p0`.
    pub fn run(tokens: &[u32], p0: usize) -> Columns {
        let cols = (tokens.iter().enumerate())
            .map(|(t, &token)| {
                Some(Col {
                    seq: 0,
                    pos: p0 + t,
                    token,
                })
            })
            .collect();
        Columns { cols, batch: false }
    }

    /// The columns in use.
    pub fn live(&self) -> impl Iterator<Item = (usize, Col)> + '_ {
        (self.cols.iter().enumerate()).filter_map(|(c, col)| col.map(|col| (c, col)))
    }

    /// Sequence `seq`'s columns, in order (its positions ascend with them).
    pub fn of(&self, seq: usize) -> impl Iterator<Item = (usize, Col)> + '_ {
        self.live().filter(move |(_, c)| c.seq == seq)
    }

    /// The embeddings (times `scale`), token-major; zero for idle columns.
    pub fn embeddings(&self, m: &Model, scale: f32) -> Result<Vec<f32>> {
        let h = m.config.hidden_size;
        let mut x = vec![0f32; self.cols.len() * h];
        for (c, col) in self.live() {
            embed(m, &[col.token], col.pos, &mut x[c * h..(c + 1) * h])?;
        }
        x.iter_mut().for_each(|v| *v *= scale);
        Ok(x)
    }

    /// Per distinct RoPE of the plan: cos and sin, token-major (`dims / 2` per column).
    pub fn ropes(&self, plan: &FusedPlan) -> Vec<(Vec<f32>, Vec<f32>)> {
        (plan.ropes.iter())
            .map(|r| {
                let d2 = r.dims / 2;
                let n = self.cols.len();
                let (mut cos, mut sin) = (vec![0f32; n * d2], vec![0f32; n * d2]);
                for (c, col) in self.cols.iter().enumerate() {
                    let pos = col.map_or(0, |col| col.pos);
                    r.angles(
                        pos,
                        &mut cos[c * d2..(c + 1) * d2],
                        &mut sin[c * d2..(c + 1) * d2],
                    );
                }
                (cos, sin)
            })
            .collect()
    }

    /// Per distinct window of the plan, the attention mask of a function of `w` columns, laid
    /// out as its input takes it (position-major, a query's row across the channels). One
    /// sequence: the cached positions then the `w` new ones, rows past the last token repeating
    /// it. The batch function: each column over its own slot's cache and itself (an idle
    /// column sees only itself).
    pub fn masks(&self, plan: &FusedPlan, w: usize) -> Vec<Vec<f32>> {
        let s = plan.context;
        (plan.windows.iter())
            .map(|&win| {
                if self.batch {
                    let mut m = vec![MASKED; (s + 1) * w];
                    for (c, col) in self.cols.iter().enumerate() {
                        let pos = col.map_or(0, |col| col.pos);
                        let row = mask(s, win, pos, 1, 1);
                        for (j, v) in row.into_iter().enumerate() {
                            m[j * w + c] = v;
                        }
                    }
                    m
                } else {
                    let p0 = self
                        .cols
                        .first()
                        .and_then(|c| c.map(|c| c.pos))
                        .unwrap_or(0);
                    mask(s, win, p0, self.cols.len(), w)
                }
            })
            .collect()
    }
}

/// The attention mask of `window` for `n` tokens at `p0` in a function of width `w` over
/// `context` cached positions: position-major rows of `w` values over the cached positions then
/// the `w` new ones; rows past `n` repeat row `n - 1`.
fn mask(context: usize, window: Option<usize>, p0: usize, n: usize, w: usize) -> Vec<f32> {
    let s = context;
    let mut m = vec![MASKED; (s + w) * w];
    for t in 0..w {
        let q = p0 + t.min(n - 1);
        let sees = |pos: usize| pos <= q && window.is_none_or(|win| q - pos < win);
        for j in 0..p0.min(s) {
            if sees(j) {
                m[j * w + t] = 0.0;
            }
        }
        for u in 0..n.min(w) {
            if sees(p0 + u) {
                m[(s + u) * w + t] = 0.0;
            }
        }
    }
    m
}

/// An input named `{prefix}{layer}` or, in the batch function, `{prefix}{layer}_s{slot}`.
pub(super) fn layer_input(name: &str, prefix: &str) -> Option<(usize, Option<usize>)> {
    let rest = name.strip_prefix(prefix)?;
    match rest.split_once("_s") {
        Some((l, j)) => Some((l.parse().ok()?, Some(j.parse().ok()?))),
        None => Some((rest.parse().ok()?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_inputs_name_their_slot() {
        assert_eq!(layer_input("k12", "k"), Some((12, None)));
        assert_eq!(layer_input("k12_s3", "k"), Some((12, Some(3))));
        assert_eq!(layer_input("s4_s0", "s"), Some((4, Some(0))));
        assert_eq!(layer_input("k12_new", "k"), None);
        assert_eq!(layer_input("kx", "k"), None);
    }

    #[test]
    fn a_slot_sees_its_cache_to_its_position_and_itself() {
        // Context 4; one column at position 2 with no window, one at 3 with a window of 2.
        let m = mask(4, None, 2, 1, 1);
        assert_eq!(m, vec![0.0, 0.0, MASKED, MASKED, 0.0]);
        let m = mask(4, Some(2), 3, 1, 1);
        assert_eq!(m, vec![MASKED, MASKED, 0.0, MASKED, 0.0]);
    }
}
