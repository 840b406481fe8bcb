//! Batched generation on the real models: four conversations advanced together (one batched
//! executor pass per token), joining and finishing at different steps, give exactly what each
//! gives alone — greedy, and sampled with a seed — tokens, text and finish; and so do they when
//! some of them decode speculatively (prompt lookup, a draft model), their verifying runs in the
//! same passes as the others' tokens.

use std::ops::ControlFlow;
use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_engine::{
    Batch, DraftModel, Event, FinishReason, GenerateParams, Generation, Input, LoadedModel,
    Message, PromptLookup, SamplingParams, Session, SpecStats, Speculation,
};
use anelm_testkit::{model as model_path, GEMMA3, SMOLLM2};

/// What one generation produced.
#[derive(Debug, Default, PartialEq)]
struct Output {
    ids: Vec<u32>,
    text: String,
    reason: Option<FinishReason>,
    completion_tokens: usize,
}

impl Output {
    fn take(&mut self, e: Event) {
        match e {
            Event::Token { id, .. } => self.ids.push(id),
            Event::Text(t) => self.text.push_str(&t),
            Event::Finish(f) => {
                self.reason = Some(f.reason);
                self.completion_tokens = f.usage.completion_tokens;
            }
        }
    }
}

const PROMPTS: [&str; 4] = [
    "Name three colours.",
    "What is the capital of France? Answer in one word.",
    "Write a short poem about the rain falling on a quiet town at night.",
    "Count from one to ten.",
];

/// Each prompt's parameters: different limits, so that they finish at different steps.
fn params(i: usize, sampled: bool) -> GenerateParams {
    let sampling = if sampled {
        SamplingParams {
            temperature: 0.9,
            seed: Some(7 + i as u64),
            ..SamplingParams::default()
        }
    } else {
        SamplingParams::greedy()
    };
    GenerateParams {
        sampling,
        max_tokens: [40, 12, 48, 30][i],
        ..GenerateParams::default()
    }
}

fn input(i: usize) -> Input {
    Input::Messages(vec![Message::user(PROMPTS[i])])
}

fn solo(exec: &mut CpuExecutor, model: &LoadedModel, i: usize, sampled: bool) -> Output {
    let mut session = Session::new(&*exec, 512).unwrap();
    let mut out = Output::default();
    session
        .generate_with(exec, model, &input(i), params(i, sampled), |e| {
            out.take(e.clone());
            ControlFlow::Continue(())
        })
        .unwrap();
    out
}

/// With `spec`, prompts 0 and 2 decode by prompt lookup and prompt 3 with a draft model (the
/// model itself, on its own executor); prompt 1 plainly.
fn speculation(model: &LoadedModel, i: usize) -> Option<Speculation> {
    match i {
        0 | 2 => Some(Speculation::new(Box::new(PromptLookup::default()), 6).unwrap()),
        3 => {
            let exec = CpuExecutor::new(model.model.clone(), 1);
            let drafter = DraftModel::new(Box::new(exec), 512).unwrap();
            Some(Speculation::new(Box::new(drafter), 3).unwrap())
        }
        _ => None,
    }
}

/// Prompt `i` alone, with its speculation.
fn solo_speculative(
    exec: &mut CpuExecutor,
    model: &LoadedModel,
    i: usize,
    sampled: bool,
) -> Output {
    let mut session = Session::new(&*exec, 512).unwrap();
    let mut g = session
        .generate(model, &input(i), params(i, sampled))
        .unwrap();
    if let Some(s) = speculation(model, i) {
        g.speculate(s).unwrap();
    }
    let mut out = Output::default();
    while let Some(e) = g.next_event(exec).unwrap() {
        out.take(e);
    }
    out
}

/// All four in batched steps; prompt `i` joins at step `join[i]`; with `spec`, speculative as
/// [`speculation`] says.
fn batched(
    exec: &mut CpuExecutor,
    model: &LoadedModel,
    join: [usize; 4],
    sampled: bool,
    spec: bool,
) -> (Vec<Output>, usize, Vec<SpecStats>) {
    let mut stats = vec![SpecStats::default(); 4];
    let mut sessions: Vec<Session> = (0..4).map(|_| Session::new(&*exec, 512).unwrap()).collect();
    let mut gens: Vec<Option<Generation<'_>>> = (0..4).map(|_| None).collect();
    let mut outs: Vec<Output> = (0..4).map(|_| Output::default()).collect();
    let mut batch = Batch::new();
    let mut pending: Vec<Option<&mut Session>> = sessions.iter_mut().map(Some).collect();
    let mut widest = 0;
    for step in 0.. {
        for i in 0..4 {
            if join[i] == step {
                let s = pending[i].take().unwrap();
                let mut g = s.generate(model, &input(i), params(i, sampled)).unwrap();
                if let Some(sp) = speculation(model, i).filter(|_| spec) {
                    g.speculate(sp).unwrap();
                }
                gens[i] = Some(g);
            }
        }
        let mut live: Vec<&mut Generation<'_>> = gens
            .iter_mut()
            .flatten()
            .filter(|g| !g.is_finished())
            .collect();
        if live.is_empty() && step > *join.iter().max().unwrap() {
            break;
        }
        widest = widest.max(live.len());
        batch.step(exec, &mut live).unwrap();
        for ((g, out), stats) in gens.iter_mut().zip(&mut outs).zip(&mut stats) {
            if let Some(g) = g {
                while let Some(e) = g.pop_event() {
                    if let Event::Finish(f) = &e {
                        *stats = f.speculative;
                    }
                    out.take(e);
                }
            }
        }
    }
    (outs, widest, stats)
}

fn batched_equals_solo(file: &str) {
    let model =
        Arc::new(LoadedModel::load(&model_path(file)).unwrap_or_else(|e| panic!("{file}: {e}")));
    let mut exec = CpuExecutor::new(model.model.clone(), 2);
    for sampled in [false, true] {
        let want: Vec<Output> = (0..4)
            .map(|i| solo(&mut exec, &model, i, sampled))
            .collect();
        assert!(want.iter().all(|o| o.reason.is_some() && !o.ids.is_empty()));
        for join in [[0, 0, 0, 0], [0, 3, 1, 6]] {
            let (got, widest, _) = batched(&mut exec, &model, join, sampled, false);
            let all = if join == [0; 4] { 4 } else { 3 };
            assert!(widest >= all, "{file}: {widest} at most in one step");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g, w,
                    "{file}: prompt {i} (sampled {sampled}, joins {join:?}) differs from alone"
                );
            }
        }
        // Speculative beside plain, in the same passes: greedy, the plain output itself;
        // seeded sampling (whose drafting schedule depends on the tokens alone), what the same
        // speculation gives alone.
        let want_spec: Vec<Output> = if sampled {
            (0..4)
                .map(|i| solo_speculative(&mut exec, &model, i, sampled))
                .collect()
        } else {
            want
        };
        let (got, widest, stats) = batched(&mut exec, &model, [0, 2, 0, 1], sampled, true);
        assert!(widest >= 4, "{file}: {widest} at most in one step");
        // The model drafting for itself has its drafts kept: fewer passes than tokens.
        let own = (stats[3], got[3].completion_tokens);
        assert!(
            own.0.accepted > 0 && own.0.target_passes < own.1,
            "{file}: the self-draft of prompt 3 did not speculate: {own:?}"
        );
        assert_eq!(stats[1], SpecStats::default(), "{file}: prompt 1 is plain");
        for (i, (g, w)) in got.iter().zip(&want_spec).enumerate() {
            assert_eq!(
                g, w,
                "{file}: speculative prompt {i} (sampled {sampled}) differs from alone"
            );
        }
    }
}

#[test]
fn smollm2_batched_generations_equal_solo_generations() {
    batched_equals_solo(SMOLLM2);
}

#[test]
fn gemma3_batched_generations_equal_solo_generations() {
    batched_equals_solo(GEMMA3);
}

/// Steps until a long prompt's first token, beside a decoding generation (`beside`) or alone,
/// with `batch`; and what the long prompt's generation gave.
fn long_prompt_steps(
    exec: &mut CpuExecutor,
    model: &LoadedModel,
    batch: &mut Batch,
    beside: bool,
) -> (usize, Output) {
    let text = "The river ran past the old mill and the quiet farms. ".repeat(90);
    let long = Input::Messages(vec![Message::user(&format!("Summarise: {text}"))]);
    let mut s_long = Session::new(&*exec, 2048).unwrap();
    let mut s_other = Session::new(&*exec, 2048).unwrap();
    let mut other = s_other
        .generate(model, &input(3), params(3, false))
        .unwrap();
    // The other generation is decoding before the long prompt comes.
    if beside {
        while other.pop_event().is_none() {
            batch.step(exec, &mut [&mut other]).unwrap();
        }
    }
    let mut g = s_long
        .generate(
            model,
            &long,
            GenerateParams {
                max_tokens: 4,
                ..params(0, false)
            },
        )
        .unwrap();
    let mut out = Output::default();
    let mut first = None;
    for step in 1.. {
        if g.is_finished() {
            break;
        }
        let mut live: Vec<&mut Generation<'_>> = vec![&mut g];
        if beside && !other.is_finished() {
            live.push(&mut other);
        }
        batch.step(exec, &mut live).unwrap();
        while let Some(e) = g.pop_event() {
            if first.is_none() && matches!(e, Event::Token { .. }) {
                first = Some(step);
            }
            out.take(e);
        }
        while other.pop_event().is_some() {}
    }
    (
        first.expect("the long prompt's generation drew a token"),
        out,
    )
}

// A long prompt beside a decoding generation goes in chunks sized to the step budget (here so
// small that every chunk is the fewest allowed), alone in full chunks; its output is the same.
#[test]
fn a_long_prompt_beside_decoding_takes_budgeted_chunks() {
    let model = Arc::new(LoadedModel::load(&model_path(SMOLLM2)).unwrap());
    let mut exec = CpuExecutor::new(model.model.clone(), 2);
    let (alone, want) = long_prompt_steps(&mut exec, &model, &mut Batch::new(), false);
    let tight = &mut Batch::with_step_budget(std::time::Duration::from_micros(1));
    let (beside, got) = long_prompt_steps(&mut exec, &model, tight, true);
    let prompt_len: usize = 1000; // at least: 90 sentences of 11 words
    assert!(
        alone <= prompt_len.div_ceil(anelm_engine::session::PREFILL_CHUNK) + 2,
        "{alone}"
    );
    assert!(
        beside >= prompt_len / anelm_engine::batch::MIN_CHUNK,
        "{beside} steps beside a decoding generation, {alone} alone"
    );
    assert!(!want.ids.is_empty());
    assert_eq!(got, want, "the long prompt's output depends on its chunks");
}
