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
    probs.clear();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    probs.extend(logits.iter().map(|l| (l - max).exp()));
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
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
        let s: f32 = out.iter().map(|(_, w)| w).sum();
        out.iter_mut().for_each(|(_, w)| *w /= s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
