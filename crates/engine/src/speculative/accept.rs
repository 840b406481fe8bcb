//! The acceptance rule of exact speculative decoding (Leviathan et al. 2023; Chen et al. 2023):
//! a token `x` drafted with probability `q(x)` is kept with probability `min(1, p(x) / q(x))`,
//! otherwise replaced by a draw from `max(0, p − q)` renormalised — so every emitted token is
//! distributed exactly as the target's `p`, whatever the draft does. A deterministic drafter
//! (prompt lookup) has `q` a point mass at `x`. Greedy targets have `p` a point mass, which
//! makes the rule "keep x if it is the target's choice".

use crate::sampler::Prob;

/// What became of a drafted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted(u32),
    /// Rejected: the token to emit instead.
    Replaced(u32),
}

fn prob(dist: &[Prob], id: u32) -> f64 {
    dist.iter().find(|d| d.0 == id).map_or(0.0, |d| d.1)
}

/// Judges the drafted `x` against the target's `p`; `q` is the draft's distribution (None: a
/// point mass at `x`). `u` is a uniform draw in [0, 1); `draw` samples a distribution (weights
/// need not sum to 1); `residual` is scratch.
pub fn judge(
    p: &[Prob],
    q: Option<&[Prob]>,
    x: u32,
    u: f64,
    residual: &mut Vec<Prob>,
    draw: impl FnOnce(&[Prob]) -> u32,
) -> Verdict {
    let px = prob(p, x);
    let qx = q.map_or(1.0, |q| prob(q, x));
    // qx is 0 only for a drafter that lies about its own draw: treat x as unsupported.
    let keep = if qx > 0.0 { (px / qx).min(1.0) } else { 0.0 };
    if u < keep {
        return Verdict::Accepted(x);
    }
    residual.clear();
    residual.extend(p.iter().filter_map(|&(id, pid)| {
        let qid = match q {
            Some(q) => prob(q, id),
            None => f64::from(u8::from(id == x)),
        };
        let r = pid - qid;
        (r > 0.0).then_some((id, r))
    }));
    if residual.is_empty() {
        // p ≤ q everywhere means p = q: rejection then has probability 0; a rounding sliver
        // can still land here, and p itself is the right law.
        return Verdict::Replaced(draw(p));
    }
    Verdict::Replaced(draw(residual))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The law of the emitted token, computed exactly: accept mass plus rejection mass.
    fn emitted_law(p: &[Prob], q: &[Prob], n_tokens: u32) -> Vec<f64> {
        let mut law = vec![0.0; n_tokens as usize];
        for &(x, qx) in q {
            let keep = (prob(p, x) / qx).min(1.0);
            law[x as usize] += qx * keep;
            let mut residual: Vec<Prob> = p
                .iter()
                .filter_map(|&(id, pid)| {
                    let r = pid - prob(q, id);
                    (r > 0.0).then_some((id, r))
                })
                .collect();
            let total: f64 = residual.iter().map(|r| r.1).sum();
            for r in &mut residual {
                law[r.0 as usize] += qx * (1.0 - keep) * r.1 / total;
            }
        }
        law
    }

    #[test]
    fn the_rule_emits_the_targets_law() {
        let p = [(0, 0.5), (1, 0.3), (2, 0.2)];
        let q = [(0, 0.2), (1, 0.1), (2, 0.3), (3, 0.4)];
        let law = emitted_law(&p, &q, 4);
        for (i, want) in [0.5, 0.3, 0.2, 0.0].iter().enumerate() {
            assert!((law[i] - want).abs() < 1e-12, "token {i}: {law:?}");
        }
    }

    #[test]
    fn greedy_keeps_only_the_targets_choice() {
        let p = [(7, 1.0)];
        let mut r = Vec::new();
        assert_eq!(
            judge(&p, None, 7, 0.999, &mut r, |_| 99),
            Verdict::Accepted(7)
        );
        let got = judge(&p, None, 3, 0.0, &mut r, |d| d[0].0);
        assert_eq!(got, Verdict::Replaced(7));
    }

    #[test]
    fn a_point_mass_draft_is_kept_with_the_targets_probability() {
        let p = [(0, 0.25), (1, 0.75)];
        let mut r = Vec::new();
        assert_eq!(judge(&p, None, 0, 0.2, &mut r, |_| 9), Verdict::Accepted(0));
        // Rejected: the replacement is drawn from p without the drafted token.
        let got = judge(&p, None, 0, 0.3, &mut r, |d| {
            assert_eq!(d, [(1, 0.75)]);
            d[0].0
        });
        assert_eq!(got, Verdict::Replaced(1));
    }
}
