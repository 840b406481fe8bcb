//! What a verifying pass costs, learnt from the target's own passes: a pass of `n` tokens takes
//! about what one token's pass takes on an accelerator or a memory-bound CPU, and nearly `n`
//! times that where the weights sit in cache — the right number of drafted tokens differs as much.
//! In a batched step the other sequences' tokens are in the pass already: drafted tokens cost
//! what they add to that pass. A machine's speed drifts (memory bandwidth shared with other
//! work), so a length not seen for a while is read off the line through all recent passes.

/// Relative cost of the target's passes by their number of tokens, from their timings: a
/// decayed mean per length where it was seen lately, a decayed least-squares line `α + β·tokens`
/// elsewhere, and a fixed per-token cost until both lengths 1 and another were seen.
#[derive(Clone, Debug)]
pub(crate) struct PassCost {
    /// Per-token cost relative to a one-token pass used until timings say otherwise.
    default: f64,
    /// Decayed mean seconds of a pass of `i + 1` tokens, and the number of the observation
    /// that last updated it.
    mean: Vec<Option<(f64, u64)>>,
    /// Passes observed.
    seen: u64,
    /// Decayed sums for the line: weight, Σx, Σy, Σx², Σxy.
    sums: [f64; 5],
}

/// Weight of the past per observed pass.
const DECAY: f64 = 0.8;
/// A length's mean is stale once this many passes of other lengths followed its last one: the
/// line, which every pass updates, says more of the machine's speed now (its weight of a pass
/// that old is below 3 %).
const STALE: u64 = 16;

impl PassCost {
    /// For passes of at most `max_tokens` tokens.
    pub fn new(default: f64, max_tokens: usize) -> PassCost {
        PassCost {
            default,
            mean: vec![None; max_tokens.max(1)],
            seen: 0,
            sums: [0.0; 5],
        }
    }

    pub fn set_default(&mut self, default: f64) {
        self.default = default;
    }

    /// A pass of `tokens` tokens took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        self.seen += 1;
        if let Some(m) = self.mean.get_mut(tokens - 1) {
            let mean = m.map_or(secs, |(m, _)| DECAY * m + (1.0 - DECAY) * secs);
            *m = Some((mean, self.seen));
        }
        let x = tokens as f64;
        for (s, v) in self.sums.iter_mut().zip([1.0, x, secs, x * x, x * secs]) {
            *s = DECAY * *s + v;
        }
    }

    /// The seconds of a pass of `tokens` tokens by the fitted line, if the passes seen vary
    /// enough in length to fit one.
    fn line(&self, tokens: usize) -> Option<f64> {
        let [w, sx, sy, sxx, sxy] = self.sums;
        if w <= 0.0 {
            return None;
        }
        let var = sxx / w - (sx / w).powi(2);
        if var < 0.1 {
            return None;
        }
        let beta = ((sxy / w - sx / w * sy / w) / var).max(0.0);
        let alpha = sy / w - beta * sx / w;
        (alpha > 0.0).then_some(alpha + beta * tokens as f64)
    }

    fn secs(&self, tokens: usize) -> Option<f64> {
        let mean = self.mean.get(tokens.wrapping_sub(1)).copied().flatten();
        match mean {
            Some((m, at)) if self.seen - at < STALE => Some(m),
            _ => self.line(tokens).or(mean.map(|(m, _)| m)),
        }
    }

    /// What a pass of `base + drafted` tokens costs relative to one of `base` tokens (`base`
    /// ≥ 1: the fed token and the other sequences' tokens of a batched pass).
    pub fn relative(&self, base: usize, drafted: usize) -> f64 {
        let base = base.max(1);
        match (self.secs(base), self.secs(base + drafted)) {
            (Some(b), Some(n)) if b > 0.0 => (n / b).max(1.0),
            _ => self.fixed(base, drafted),
        }
    }

    /// [`PassCost::relative`] by the default cost per token alone.
    pub fn fixed(&self, base: usize, drafted: usize) -> f64 {
        let pass = |tokens: usize| 1.0 + self.default * (tokens - 1) as f64;
        pass(base.max(1) + drafted) / pass(base.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_holds_until_passes_are_timed() {
        let c = PassCost::new(0.2, 9);
        assert!((c.relative(1, 4) - 1.8).abs() < 1e-12);
        assert_eq!(c.relative(1, 0), 1.0);
        // Beside three other tokens: 2.4 / 1.6.
        assert!((c.relative(4, 4) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn timed_passes_replace_the_default() {
        let mut c = PassCost::new(0.2, 9);
        // A memory-bound target: one token 10 ms, every further token 0.5 ms.
        for _ in 0..3 {
            for n in [1, 3, 5] {
                c.observe(n, 0.010 + 0.0005 * (n - 1) as f64);
            }
        }
        // Seen lengths come from their means, the others from the line.
        assert!(
            (c.relative(1, 2) - 1.1).abs() < 1e-9,
            "{}",
            c.relative(1, 2)
        );
        assert!(
            (c.relative(1, 7) - 1.35).abs() < 1e-9,
            "{}",
            c.relative(1, 7)
        );
        // Beside four other tokens, from the line: 13 ms / 12 ms.
        assert!((c.relative(5, 2) - 13.0 / 12.0).abs() < 1e-9);
        // Seen only at one length apart from one: still a line through both.
        let mut c = PassCost::new(0.2, 9);
        c.observe(1, 0.01);
        c.observe(4, 0.04);
        assert!((c.relative(1, 3) - 4.0).abs() < 1e-9);
        assert!(
            (c.relative(1, 5) - 6.0).abs() < 1e-9,
            "{}",
            c.relative(1, 5)
        );
        // Where the weights sit in cache, beside 3 other tokens 4 more tokens double the pass.
        assert!((c.relative(4, 4) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_length_not_seen_lately_follows_the_line() {
        let mut c = PassCost::new(0.2, 9);
        // Plain passes while the machine was slow (20 ms), then only verifying passes of 4
        // and 5 tokens once it is twice as fast: 10 ms plus 1 ms a token.
        for _ in 0..4 {
            c.observe(1, 0.020);
        }
        for i in 0..8 {
            c.observe(4 + i % 2, 0.010 + 0.001 * (4 + i % 2) as f64);
        }
        // Still recent, the slow plain passes make drafting look free.
        assert_eq!(c.relative(1, 3), 1.0);
        for i in 0..STALE {
            c.observe(4 + (i % 2) as usize, 0.010 + 0.001 * (4 + i % 2) as f64);
        }
        // Stale, they give way to the line, which the recent passes dominate (11 ms for one
        // token through them alone; the old slow ones, far out at one token, still pull it up
        // a little): drafting is no longer taken to be free.
        let r = c.relative(1, 3);
        assert!((1.1..=14.0 / 11.0).contains(&r), "{r}");
    }

    #[test]
    fn a_single_length_or_junk_timings_keep_the_default() {
        let mut c = PassCost::new(0.25, 9);
        c.observe(3, 0.02);
        c.observe(3, 0.02);
        c.observe(0, 1.0);
        c.observe(2, f64::NAN);
        c.observe(2, -1.0);
        assert!((c.relative(1, 2) - 1.5).abs() < 1e-12);
    }
}
