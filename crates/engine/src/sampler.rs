//! Choosing the next token from a row of logits, in llama.cpp's order: logit bias, penalties,
//! then top-k, top-p and min-p over the (untempered) distribution, temperature last, and a draw
//! from a seeded generator. Temperature 0 is greedy.
//!
//! A Gemma vocabulary has 262,144 entries, so nothing here sorts the whole row: top-k keeps a
//! k-element heap, top-p grows a partial selection until the kept mass is reached, min-p is a
//! threshold on the logit.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::rng::Rng;

/// How to pick tokens. `Default` is llama.cpp's default sampler chain.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits before the draw; 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    /// Keep tokens at least this fraction as likely as the most likely one; 0 keeps all.
    pub min_p: f32,
    /// llama.cpp's repetition penalty on tokens among the last `repeat_last_n` of the context
    /// (prompt included): positive logits are divided by it, negative ones multiplied. 1 is off.
    pub repeat_penalty: f32,
    /// The window of the repetition penalty; 0 turns it off.
    pub repeat_last_n: usize,
    /// OpenAI's presence penalty: subtracted once from every token generated so far.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted once per time a token was generated so far.
    pub frequency_penalty: f32,
    /// Added to a token's logit before anything else (`f32::NEG_INFINITY` bans it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Makes the draws reproducible; None takes a seed from the clock (reported back).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Always the most likely token (after bias and penalties).
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every value; the message names the bad parameter.
    pub fn validate(&self, vocab: usize) -> Result<(), String> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number, got {v}"))
            }
        };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("repeat_penalty", self.repeat_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        if self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        for &(id, bias) in &self.logit_bias {
            if id as usize >= vocab {
                return Err(format!(
                    "logit_bias: token id {id} is outside the vocabulary (size {vocab})"
                ));
            }
            if bias.is_nan() || bias == f32::INFINITY {
                return Err(format!(
                    "logit_bias: the bias of token {id} must be a number or -inf, got {bias}"
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

pub use anelm_model::argmax;

/// A token still in the running.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// Most likely first; equal logits by id, so every order is deterministic.
fn descending(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Heap entry ordered so that the heap's top is the weakest kept candidate.
struct Weakest(Candidate);

impl PartialEq for Weakest {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Weakest {}
impl PartialOrd for Weakest {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Weakest {
    fn cmp(&self, other: &Self) -> Ordering {
        descending(&self.0, &other.0)
    }
}

/// The `k` largest logits, most likely first: one pass with a k-element heap.
pub fn top_k(logits: &[f32], k: usize) -> Vec<Candidate> {
    let mut heap = BinaryHeap::with_capacity(k + 1);
    for (i, &logit) in logits.iter().enumerate() {
        let c = Candidate {
            id: i as u32,
            logit,
        };
        if heap.len() < k {
            heap.push(Weakest(c));
        } else if let Some(weakest) = heap.peek() {
            if descending(&c, &weakest.0) == Ordering::Less {
                heap.pop();
                heap.push(Weakest(c));
            }
        }
    }
    // into_sorted_vec is ascending by Ord, i.e. most likely first.
    heap.into_sorted_vec().into_iter().map(|w| w.0).collect()
}

/// Keeps the smallest most-likely-first prefix whose probability mass reaches `p` of `total`
/// (`total`: the sum of `exp(logit - max)` over the distribution the mass is measured in).
/// Sorts only a growing head of the candidates.
fn keep_top_p(cands: &mut Vec<Candidate>, target: f64, max: f32) {
    let n = cands.len();
    let mut k = n.min(64);
    loop {
        if k < n {
            cands.select_nth_unstable_by(k - 1, descending);
        }
        cands[..k].sort_unstable_by(descending);
        let mut cum = 0.0f64;
        for i in 0..k {
            cum += (cands[i].logit - max).exp() as f64;
            if cum >= target {
                cands.truncate(i + 1);
                return;
            }
        }
        if k == n {
            return;
        }
        k = (k * 8).min(n);
    }
}

/// The log-probability of the chosen token and the `n` most likely tokens with theirs, from a
/// row of logits (OpenAI's `logprobs` / `top_logprobs`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

pub fn logprobs(logits: &[f32], chosen: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - log_z) as f32;
    let top = if n == 0 { Vec::new() } else { top_k(logits, n) };
    TokenLogprob {
        logprob: lp(logits
            .get(chosen as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY)),
        top: top.into_iter().map(|c| (c.id, lp(c.logit))).collect(),
    }
}

/// The largest logit among `cands` (-inf when there are none).
fn top_logit(cands: &[Candidate]) -> f32 {
    cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// A candidate's unnormalised weight at inverse temperature `inv_t`, relative to `max`.
fn tempered(c: &Candidate, max: f32, inv_t: f32) -> f64 {
    (((c.logit - max) * inv_t) as f64).exp()
}

/// A sampler for one generation: the parameters, the generator, and the counts of the tokens
/// generated so far (for the OpenAI penalties).
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    generated: HashMap<u32, u32>,
    cands: Vec<Candidate>,
    window: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(Rng::entropy_seed);
        Sampler {
            params,
            seed,
            rng: Rng::new(seed),
            generated: HashMap::new(),
            cands: Vec::new(),
            window: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (the given one, or the one taken from the clock).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Applies the logit bias and the penalties in place. `context` holds every token before
    /// the one being chosen (prompt and generated).
    pub fn adjust(&mut self, logits: &mut [f32], context: &[u32]) {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        let p = &self.params;
        if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
            self.window.clear();
            self.window
                .extend_from_slice(&context[context.len().saturating_sub(p.repeat_last_n)..]);
            self.window.sort_unstable();
            self.window.dedup();
            for &id in &self.window {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l <= 0.0 {
                        *l * p.repeat_penalty
                    } else {
                        *l / p.repeat_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &count) in &self.generated {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
    }

    /// The tokens top-k, top-p and min-p leave, from adjusted logits (in no particular order).
    pub fn candidates(&mut self, logits: &[f32]) -> &[Candidate] {
        let p = &self.params;
        let use_top_k = p.top_k > 0 && p.top_k < logits.len();
        self.cands.clear();
        if use_top_k {
            self.cands.extend(top_k(logits, p.top_k));
        }
        let max = if use_top_k {
            self.cands.first().map_or(f32::NEG_INFINITY, |c| c.logit)
        } else {
            logits.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        };
        let mass = |l: f32| (l - max).exp() as f64;
        // The top-p mass is measured over what top-k left, before min-p (llama.cpp's order).
        let top_p_target = (p.top_p < 1.0).then(|| {
            let total: f64 = if use_top_k {
                self.cands.iter().map(|c| mass(c.logit)).sum()
            } else {
                logits.iter().map(|&l| mass(l)).sum()
            };
            total * p.top_p as f64
        });
        // Min-p keeps a most-likely-first prefix, as top-p does, so it may go first: the
        // result is the shorter prefix either way. Its threshold is the first floor.
        let mut floor = if p.min_p > 0.0 {
            max + p.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        if use_top_k {
            self.cands.retain(|c| c.logit >= floor);
        } else {
            if let Some(target) = top_p_target {
                // Over the whole vocabulary, look only as far below the top as it takes to hold
                // the top-p mass: the prefix top-p keeps lies within.
                let mut width = 8.0f32;
                while max - width > floor && width < 1e4 {
                    let low = max - width;
                    let held: f64 = logits.iter().filter(|&&l| l >= low).map(|&l| mass(l)).sum();
                    if held >= target {
                        floor = low;
                        break;
                    }
                    width *= 2.0;
                }
            }
            self.cands
                .extend(logits.iter().enumerate().filter(|(_, &l)| l >= floor).map(
                    |(i, &logit)| Candidate {
                        id: i as u32,
                        logit,
                    },
                ));
        }
        if let Some(target) = top_p_target {
            keep_top_p(&mut self.cands, target, max);
        }
        &self.cands
    }

    /// Picks a token from adjusted logits.
    pub fn choose(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.params.temperature;
        self.candidates(logits);
        let cands = &self.cands;
        let max = top_logit(cands);
        let weight = |c: &Candidate| tempered(c, max, inv_t);
        let total: f64 = cands.iter().map(weight).sum();
        let mut u = self.rng.next_f64() * total;
        for c in cands {
            u -= weight(c);
            if u < 0.0 {
                return c.id;
            }
        }
        // Rounding left a sliver of mass: the last candidate takes it.
        cands.last().map_or_else(|| argmax(logits), |c| c.id)
    }

    /// Records a generated token (for the presence and frequency penalties).
    pub fn accept(&mut self, id: u32) {
        *self.generated.entry(id).or_insert(0) += 1;
    }

    /// Adjusts `logits` in place, picks a token and records it.
    pub fn sample(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        self.adjust(logits, context);
        let id = self.choose(logits);
        self.accept(id);
        id
    }
}

mod dist;
pub use dist::Prob;

#[cfg(test)]
mod tests;
