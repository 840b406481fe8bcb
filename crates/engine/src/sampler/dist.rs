//! The distribution a [`Sampler`] draws from, made explicit: exact speculative decoding accepts
//! a drafted token by comparing the target's probability of it with the draft's.

use super::{argmax, tempered, top_logit, Sampler};

/// A token and its probability.
pub type Prob = (u32, f64);

impl Sampler {
    /// The distribution [`Sampler::choose`] draws from, over logits already adjusted
    /// ([`Sampler::adjust`]): the candidates top-k, top-p and min-p leave, with their tempered
    /// probabilities (summing to 1, none of them 0); greedy, the most likely token with probability 1.
    pub fn distribution(&mut self, logits: &[f32], out: &mut Vec<Prob>) {
        out.clear();
        if self.params.is_greedy() {
            out.push((argmax(logits), 1.0));
            return;
        }
        let inv_t = 1.0 / self.params.temperature;
        self.candidates(logits);
        let max = top_logit(&self.cands);
        let total: f64 = self.cands.iter().map(|c| tempered(c, max, inv_t)).sum();
        if self.cands.is_empty() || !(total > 0.0 && total.is_finite()) {
            out.push((argmax(logits), 1.0));
            return;
        }
        // Candidates of weight 0 (logits of -inf) are left out: only tokens that can be drawn.
        out.extend(self.cands.iter().filter_map(|c| {
            let p = tempered(c, max, inv_t) / total;
            (p > 0.0).then_some((c.id, p))
        }));
    }

    /// A uniform draw in [0, 1) from the sampler's own generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Draws a token from `dist` (probabilities summing to 1, or weights: they are normalised).
    /// An empty distribution gives token 0.
    pub fn draw(&mut self, dist: &[Prob]) -> u32 {
        let total: f64 = dist.iter().map(|&(_, p)| p).sum();
        let mut u = self.rng.next_f64() * total;
        for &(id, p) in dist {
            u -= p;
            if u < 0.0 {
                return id;
            }
        }
        dist.last().map_or(0, |&(id, _)| id)
    }
}

#[cfg(test)]
mod tests {
    use crate::sampler::{Sampler, SamplingParams};

    #[test]
    fn the_distribution_is_what_choose_draws_from() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.02,
            seed: Some(5),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params.clone());
        let mut dist = Vec::new();
        s.distribution(&logits, &mut dist);
        let total: f64 = dist.iter().map(|p| p.1).sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
        let mut counts = vec![0usize; logits.len()];
        let n = 200_000;
        for _ in 0..n {
            counts[s.choose(&logits) as usize] += 1;
        }
        for id in 0..logits.len() as u32 {
            let p = dist.iter().find(|d| d.0 == id).map_or(0.0, |d| d.1);
            let f = counts[id as usize] as f64 / n as f64;
            // Five standard deviations of a binomial frequency.
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            assert!((f - p).abs() <= 5.0 * sd + 1e-9, "token {id}: p {p} f {f}");
        }
        let mut greedy = Sampler::new(SamplingParams::greedy());
        greedy.distribution(&logits, &mut dist);
        assert_eq!(dist, vec![(crate::argmax(&logits), 1.0)]);
    }
}
