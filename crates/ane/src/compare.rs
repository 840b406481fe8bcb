//! How two runs of a model are compared: errors of vectors relative to the reference's largest
//! magnitude, and greedy decoding side by side.

use std::time::Instant;

use anelm_model::{ExecError, Executor, Logits, RouteChoice};

/// max |a - b| and that divided by max |b| (b is the reference).
pub fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    let max_abs = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        );
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    (
        max_abs,
        if scale > 0.0 {
            max_abs / scale
        } else {
            max_abs
        },
    )
}

pub use anelm_model::argmax;

/// A top-2 gap below this fraction of the largest |logit| is within fp16 noise.
pub const NEAR_TIE: f32 = 3e-3;

/// The top-2 gap of a row of logits relative to its largest |logit| (compare [`NEAR_TIE`]).
pub fn top2_gap(row: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    let scale = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    if scale > 0.0 {
        (first - second) / scale
    } else {
        0.0
    }
}

pub use anelm_model::ROUTE_NEAR_TIE;
/// Positions a flipped expert choice is counted to move the logits at, itself included (it
/// reaches later tokens through their attention to it and the recurrent states; measured
/// 2026-12-05: 3e-2 and more up to 4 positions on).
pub const ROUTE_REACH: usize = 5;

/// Where greedy decoding of the two runs first parted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Divergence {
    pub step: usize,
    /// [`top2_gap`] of the reference's logits at that step.
    pub reference_gap: f32,
    /// Whether the parting follows a router near-tie of the reference: one within
    /// [`ROUTE_REACH`], or the device agrees further with the reference's near-tied choices
    /// forced.
    pub after_router_tie: bool,
}

/// A near-tie of the reference's routers ([`ROUTE_NEAR_TIE`]) within reach of a compared step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterTie {
    /// The token's position in the sequence (prompt, then greedy tokens).
    pub position: usize,
    /// Its narrowest router boundary, relative to the largest |router logit|.
    pub gap: f32,
}

/// A prompt of a comparison.
#[derive(Clone, Debug)]
pub struct PromptCase {
    pub name: String,
    pub ids: Vec<u32>,
}

/// One prompt through both executors.
#[derive(Clone, Debug)]
pub struct PromptComparison {
    pub name: String,
    pub n_prompt: usize,
    /// Largest relative error of the logits over the steps where both runs had seen the same
    /// tokens (after the prompt, then after each agreeing greedy token).
    pub max_rel_err: f32,
    pub max_abs_diff: f32,
    /// The arithmetic's error alone (the same as [`Self::max_rel_err`] for a model without
    /// mixtures): where the device can follow them ([`Executor::force_routes`]), of a second
    /// device run with the reference's near-tied router choices forced, over the steps where
    /// it agrees with the reference — a flipped choice reaches every later token through
    /// attention and recurrent states; otherwise over the steps no router near-tie of the
    /// reference reaches ([`ROUTE_REACH`]).
    pub max_rel_err_clear: f32,
    /// How many of the reference's near-tied router choices the second device run followed;
    /// None when there were none or the device cannot follow them.
    pub forced_routes: Option<usize>,
    /// The first router near-tie of the reference that reaches a compared step.
    pub router_tie: Option<RouterTie>,
    pub greedy_reference: Vec<u32>,
    pub greedy_device: Vec<u32>,
    pub divergence: Option<Divergence>,
}

impl PromptComparison {
    pub fn greedy_same(&self) -> bool {
        self.greedy_reference == self.greedy_device
    }

    /// The runs agree, or part where the reference itself is at a near-tie: of its top two
    /// logits, or of a router within reach.
    pub fn same_but_near_ties(&self) -> bool {
        self.divergence
            .is_none_or(|d| d.reference_gap < NEAR_TIE || d.after_router_tie)
    }
}

/// One executor's greedy run: the tokens, the logits before each, and the router gaps of every
/// token it ran ([`Executor::route_gaps`]; empty if it reports none).
struct Greedy {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    gaps: Vec<f32>,
    ties: Vec<RouteChoice>,
}

fn greedy(exec: &mut dyn Executor, prompt: &[u32], n: usize) -> Result<Greedy, ExecError> {
    let mut state = exec.new_state(prompt.len() + n)?;
    let mut logits = Vec::new();
    exec.forward(state.as_mut(), prompt, Logits::Last, &mut logits)?;
    let mut gaps = exec.route_gaps().to_vec();
    let mut ties = exec.tied_routes().to_vec();
    let (mut ids, mut all) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let next = argmax(&logits);
        ids.push(next);
        all.push(std::mem::take(&mut logits));
        if i + 1 < n {
            exec.forward(state.as_mut(), &[next], Logits::Last, &mut logits)?;
            gaps.extend_from_slice(exec.route_gaps());
            ties.extend_from_slice(exec.tied_routes());
        }
    }
    Ok(Greedy {
        ids,
        logits: all,
        gaps,
        ties,
    })
}

/// How many greedy steps saw the same tokens in both runs: the first, and one more per
/// agreeing token.
fn agreeing(a: &[u32], b: &[u32]) -> usize {
    1 + a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// The first router near-tie in `gaps` (by position) within [`ROUTE_REACH`] of position `at`.
fn router_tie_near(gaps: &[f32], at: usize) -> Option<RouterTie> {
    let from = (at + 1).saturating_sub(ROUTE_REACH);
    (from..=at.min(gaps.len().saturating_sub(1)))
        .find(|&p| gaps.get(p).is_some_and(|&g| g < ROUTE_NEAR_TIE))
        .map(|position| RouterTie {
            position,
            gap: gaps[position],
        })
}

/// Runs every prompt and `n_greedy` greedy tokens (no end-of-text stop) through `device` and
/// `reference`; returns the comparisons and the seconds each executor took.
pub fn compare_greedy(
    device: &mut dyn Executor,
    reference: &mut dyn Executor,
    prompts: &[PromptCase],
    n_greedy: usize,
) -> Result<(Vec<PromptComparison>, f64, f64), ExecError> {
    let (mut t_dev, mut t_ref) = (0f64, 0f64);
    let mut out = Vec::new();
    for p in prompts {
        let t = Instant::now();
        let Greedy {
            ids: ids_ref,
            logits: logits_ref,
            gaps,
            ties,
        } = greedy(reference, &p.ids, n_greedy)?;
        t_ref += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let Greedy {
            ids: ids_dev,
            logits: logits_dev,
            ..
        } = greedy(device, &p.ids, n_greedy)?;
        // Again with the reference's near-tied router choices, where the device follows them.
        let forced = if !ties.is_empty() && device.force_routes(&ties) {
            let run = greedy(device, &p.ids, n_greedy);
            device.force_routes(&[]);
            Some(run?)
        } else {
            None
        };
        t_dev += t.elapsed().as_secs_f64();
        // Step i's logits follow the same tokens in both runs while all earlier ids agree.
        let agree = agreeing(&ids_ref, &ids_dev);
        // Step i's logits follow the token at position n_prompt - 1 + i.
        let tie_at = |step: usize| router_tie_near(&gaps, p.ids.len() - 1 + step);
        let agree_forced = forced.as_ref().map(|f| agreeing(&ids_ref, &f.ids));
        let divergence = (agree <= ids_ref.len()).then(|| Divergence {
            step: agree - 1,
            reference_gap: top2_gap(&logits_ref[agree - 1]),
            after_router_tie: tie_at(agree - 1).is_some() || agree_forced > Some(agree),
        });
        let (mut max_abs, mut max_rel, mut clear) = (0f32, 0f32, 0f32);
        let mut router_tie = None;
        for (i, (a, b)) in logits_dev.iter().zip(&logits_ref).take(agree).enumerate() {
            let (d, r) = diff(a, b);
            max_abs = max_abs.max(d);
            max_rel = max_rel.max(r);
            match tie_at(i) {
                Some(t) => {
                    router_tie.get_or_insert(t);
                }
                None => clear = clear.max(r),
            }
        }
        if let (Some(f), Some(n)) = (&forced, agree_forced) {
            clear = (f.logits.iter().zip(&logits_ref).take(n))
                .map(|(a, b)| diff(a, b).1)
                .fold(0f32, f32::max);
        }
        out.push(PromptComparison {
            name: p.name.clone(),
            n_prompt: p.ids.len(),
            max_rel_err: max_rel,
            max_abs_diff: max_abs,
            max_rel_err_clear: clear,
            forced_routes: forced.as_ref().map(|_| ties.len()),
            router_tie,
            greedy_reference: ids_ref,
            greedy_device: ids_dev,
            divergence,
        });
    }
    Ok((out, t_dev, t_ref))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_to_the_reference_scale() {
        assert_eq!(diff(&[1.0, 2.0], &[1.0, 4.0]), (2.0, 0.5));
        assert_eq!(
            diff(&[f32::NAN], &[1.0]).0,
            f32::INFINITY,
            "NaN is never close"
        );
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(top2_gap(&[1.0, -8.0, 2.0, 0.0]), 1.0 / 8.0);
        assert_eq!(top2_gap(&[3.0, 3.0]), 0.0);
    }

    #[test]
    fn router_ties_reach_the_next_positions() {
        let mut gaps = vec![1.0; 20];
        gaps[5] = 1e-3;
        assert_eq!(router_tie_near(&gaps, 4), None, "not before it");
        let t = router_tie_near(&gaps, 5).unwrap();
        assert_eq!((t.position, t.gap), (5, 1e-3));
        assert!(router_tie_near(&gaps, 5 + ROUTE_REACH - 1).is_some());
        assert_eq!(
            router_tie_near(&gaps, 5 + ROUTE_REACH),
            None,
            "out of reach"
        );
        assert_eq!(router_tie_near(&[], 3), None, "no mixtures");
    }
}
