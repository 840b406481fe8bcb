//! Mixture-of-experts routing (ARCHITECTURES.md §3): softmax over every expert in f32, the
//! `top_k` most probable, their probabilities renormalised when the model says so.

/// The experts of one token and their weights, most probable first; `probs` is scratch.
pub fn route(
    logits: &[f32],
    top_k: usize,
    normalise: bool,
    probs: &mut Vec<f32>,
    out: &mut Vec<(usize, f32)>,
) {
    softmax(logits, probs);
    out.clear();
    for _ in 0..top_k.min(probs.len()) {
        let mut best = None;
        for (e, &p) in probs.iter().enumerate() {
            if out.iter().any(|&(x, _)| x == e) {
                continue;
            }
            if best.is_none_or(|(_, bp)| p > bp) {
                best = Some((e, p));
            }
        }
        out.extend(best);
    }
    if normalise {
        renormalise(out);
    }
}

/// A choice made elsewhere: `experts` with their probabilities under `logits`, renormalised
/// when the model says so (a forced route, [`anelm_model::RouteChoice`]).
pub fn route_forced(
    logits: &[f32],
    experts: &[usize],
    normalise: bool,
    probs: &mut Vec<f32>,
    out: &mut Vec<(usize, f32)>,
) {
    softmax(logits, probs);
    out.clear();
    out.extend(
        experts
            .iter()
            .filter_map(|&e| probs.get(e).map(|&p| (e, p))),
    );
    if normalise {
        renormalise(out);
    }
}

fn softmax(logits: &[f32], probs: &mut Vec<f32>) {
    probs.clear();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    probs.extend(logits.iter().map(|l| (l - max).exp()));
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
}

fn renormalise(out: &mut [(usize, f32)]) {
    let s: f32 = out.iter().map(|(_, w)| w).sum();
    out.iter_mut().for_each(|(_, w)| *w /= s);
}

/// How near a router's `top_k` choice is to another: the gap between the k-th and the
/// (k+1)-th largest logit over the largest |logit| (at least 1). Infinite when every expert is
/// picked. A choice this close may flip under rounding elsewhere in the model, so comparisons
/// with other arithmetic (the ANE path's fp16) treat small gaps as near-ties.
pub fn boundary_gap(logits: &[f32], top_k: usize) -> f32 {
    if top_k == 0 || top_k >= logits.len() {
        return f32::INFINITY;
    }
    // The k-th largest and the largest below it, without sorting (E is small, k smaller).
    let mut top: Vec<f32> = Vec::with_capacity(top_k + 1);
    for &l in logits {
        let at = top.partition_point(|&t| t >= l);
        if at <= top_k {
            top.insert(at, l);
            top.truncate(top_k + 1);
        }
    }
    let scale = logits.iter().fold(1f32, |m, l| m.max(l.abs()));
    (top[top_k - 1] - top[top_k]) / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_choice_keeps_the_routers_weights() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let (mut probs, mut own, mut forced) = (Vec::new(), Vec::new(), Vec::new());
        route(&logits, 2, true, &mut probs, &mut own);
        assert_eq!(own.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 2]);
        route_forced(&logits, &[1, 3], true, &mut probs, &mut forced);
        assert_eq!(forced.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]);
        let want = probs[1] / (probs[1] + probs[3]);
        assert!((forced[0].1 - want).abs() < 1e-6, "{forced:?}");
        route_forced(&logits, &[1, 3], false, &mut probs, &mut forced);
        assert_eq!(
            forced[1].1, probs[3],
            "raw probabilities without renormalising"
        );
    }

    #[test]
    fn boundary_gaps() {
        assert_eq!(boundary_gap(&[0.0, 2.0, 1.0, -1.0], 2), 1.0 / 2.0);
        assert_eq!(boundary_gap(&[0.0, 2.0, 1.0, -1.0], 1), 1.0 / 2.0);
        assert_eq!(boundary_gap(&[0.5, 0.5, 0.2], 1), 0.0, "a tie");
        assert_eq!(boundary_gap(&[0.5, 0.25], 1), 0.25, "scale at least 1");
        assert_eq!(boundary_gap(&[1.0, 2.0], 2), f32::INFINITY);
    }

    #[test]
    fn picks_the_most_probable_and_renormalises() {
        let (mut p, mut r) = (Vec::new(), Vec::new());
        route(&[0.0, 2.0, 1.0, -1.0], 2, false, &mut p, &mut r);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
        let total: f32 = [0.0f32, 2.0, 1.0, -1.0].iter().map(|x| x.exp()).sum();
        assert!((r[0].1 - 2f32.exp() / total).abs() < 1e-6);
        route(&[0.0, 2.0, 1.0, -1.0], 2, true, &mut p, &mut r);
        assert!((r[0].1 + r[1].1 - 1.0).abs() < 1e-6 && r[0].1 > r[1].1);
    }
}
