//! `verify`'s account of greedy decoding that parts: a device that really differs is reported
//! as a difference at the step where it parted, one that parts where the reference itself is at
//! a near-tie is reported as such — both with an executor whose logits are perturbed at a chosen
//! step, on the tiny llama fixture.

use std::sync::Arc;

use anelm_ane::compare::{compare_greedy, top2_gap, PromptCase, PromptComparison, NEAR_TIE};
use anelm_cpu::CpuExecutor;
use anelm_model::{Executor, Logits};
use anelm_testkit::{ids, shared_json, tiny, Around};

const N_GREEDY: usize = 12;

/// How the logits of one greedy step are changed.
#[derive(Clone, Copy)]
enum Nudge {
    None,
    /// The runner-up rises `by` above the top logit.
    RaiseRunnerUp {
        by: f32,
    },
    /// The runner-up comes to `by` below the top logit.
    CloseRunnerUp {
        by: f32,
    },
}

/// The CPU engine with the logits of forward call `step` of every sequence (0: after the
/// prompt, then one per greedy token) nudged. A call's number is read off its sequence's
/// length: the prompt goes in whole, then a token a call.
fn perturbed(step: usize, nudge: Nudge) -> Around {
    let model = Arc::new(anelm_model::load(&tiny("llama")).unwrap());
    let prompt_len = prompt().ids.len();
    Around::new(
        CpuExecutor::new(model, 2),
        move |e, state, tokens, logits, out| {
            let before = state.len();
            e.forward(state, tokens, logits, out)?;
            let call = if before == 0 {
                0
            } else {
                before + 1 - prompt_len
            };
            if call == step {
                let (first, second) = top2(out);
                match nudge {
                    Nudge::None => {}
                    Nudge::RaiseRunnerUp { by } => out[second] = out[first] + by,
                    Nudge::CloseRunnerUp { by } => out[second] = out[first] - by,
                }
            }
            Ok(())
        },
    )
}

fn top2(row: &[f32]) -> (usize, usize) {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    (idx[0], idx[1])
}

fn prompt() -> PromptCase {
    let reference = shared_json("fixtures/hf-tiny/llama/reference.json");
    PromptCase {
        name: "short".into(),
        ids: ids(&reference["cases"]["short"]["input_ids"]),
    }
}

fn compare(device: &mut Around, reference: &mut Around) -> PromptComparison {
    let (mut out, _, _) = compare_greedy(device, reference, &[prompt()], N_GREEDY).unwrap();
    out.remove(0)
}

/// The reference's logits before every greedy step.
fn reference_steps() -> Vec<Vec<f32>> {
    let mut e = perturbed(usize::MAX, Nudge::None);
    let p = prompt();
    let mut state = e.new_state(p.ids.len() + N_GREEDY).unwrap();
    let mut logits = Vec::new();
    e.forward(state.as_mut(), &p.ids, Logits::Last, &mut logits)
        .unwrap();
    let mut steps = vec![logits.clone()];
    for _ in 1..N_GREEDY {
        let next = anelm_testkit::argmax(&logits);
        e.forward(state.as_mut(), &[next], Logits::Last, &mut logits)
            .unwrap();
        steps.push(logits.clone());
    }
    steps
}

#[test]
fn identical_runs_are_the_same() {
    let r = compare(
        &mut perturbed(usize::MAX, Nudge::None),
        &mut perturbed(usize::MAX, Nudge::None),
    );
    assert!(r.greedy_same() && r.same_but_near_ties(), "{r:?}");
    assert_eq!(r.divergence, None);
    assert_eq!(r.max_abs_diff, 0.0);
}

#[test]
fn a_real_difference_is_reported_where_it_parts() {
    let steps = reference_steps();
    // The step of the clearest choice: parting there is a difference, not a near-tie.
    let step = (1..N_GREEDY)
        .max_by(|&a, &b| top2_gap(&steps[a]).total_cmp(&top2_gap(&steps[b])))
        .unwrap();
    let gap = top2_gap(&steps[step]);
    assert!(gap > NEAR_TIE, "the clearest step's gap {gap}");
    let r = compare(
        &mut perturbed(step, Nudge::RaiseRunnerUp { by: 1.0 }),
        &mut perturbed(usize::MAX, Nudge::None),
    );
    let d = r.divergence.expect("the runs part");
    assert_eq!(d.step, step, "{r:?}");
    assert_eq!(d.reference_gap, gap);
    assert!(!r.greedy_same() && !r.same_but_near_ties(), "{r:?}");
    assert_eq!(r.greedy_device[..step], r.greedy_reference[..step]);
    assert_ne!(r.greedy_device[step], r.greedy_reference[step]);
    // The nudged step is the last compared one: its logits count in the error.
    assert!(r.max_abs_diff >= 1.0, "{r:?}");
}

#[test]
fn parting_at_a_near_tie_of_the_reference_is_called_so() {
    let steps = reference_steps();
    let step = 3;
    let scale = steps[step].iter().fold(0f32, |m, v| m.max(v.abs()));
    let tiny_gap = 1e-4 * scale;
    // The reference holds its choice by a hair; the device takes the other one.
    let r = compare(
        &mut perturbed(step, Nudge::RaiseRunnerUp { by: tiny_gap }),
        &mut perturbed(step, Nudge::CloseRunnerUp { by: tiny_gap }),
    );
    let d = r.divergence.expect("the runs part");
    assert_eq!(d.step, step, "{r:?}");
    assert!(d.reference_gap < NEAR_TIE, "{r:?}");
    assert!(!r.greedy_same(), "{r:?}");
    assert!(r.same_but_near_ties(), "{r:?}");
}
