//! Speculative decoding over the ANE path: the target verifies drafted tokens in one pass of its
//! prefill-width programs, on the simulator, in both strategies. Greedy output equals plain
//! greedy decoding, and the device dispatches per generated token are reported and fall.

use std::sync::Arc;

use anelm_ane::{AneExecutor, DevicePath, LoweringOptions, SimDevice, Strategy};
use anelm_engine::{
    DraftModel, Event, GenerateParams, Input, LoadedModel, PromptLookup, SamplingParams, Session,
    Speculation,
};
use anelm_model::{Executor, Logits};
use anelm_testkit::{ids, shared_json, tiny};

const N: usize = 32;

/// Greedy generation of `N` tokens; the tokens and the dispatches they took after the prompt.
fn generate(
    loaded: &LoadedModel,
    exec: &mut AneExecutor<SimDevice>,
    prompt: &[u32],
    spec: Option<Speculation>,
) -> (Vec<u32>, u64, anelm_engine::SpecStats) {
    // What the prompt alone costs, measured on a fresh state.
    let before = exec.dispatches();
    let mut state = exec.new_state(prompt.len() + N + 1).unwrap();
    exec.forward(state.as_mut(), prompt, Logits::Last, &mut Vec::new())
        .unwrap();
    let prefill = exec.dispatches() - before;

    let start = exec.dispatches();
    let mut session = Session::new(exec as &dyn Executor, prompt.len() + N + 1).unwrap();
    let params = GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: N,
        ..GenerateParams::default()
    };
    let mut g = session
        .generate(loaded, &Input::Ids(prompt.to_vec()), params)
        .unwrap();
    if let Some(s) = spec {
        g.speculate(s).unwrap();
    }
    let mut tokens = Vec::new();
    let finish = loop {
        match g.next_event(exec).unwrap().unwrap() {
            Event::Token { id, .. } => tokens.push(id),
            Event::Text(_) => {}
            Event::Finish(f) => break f,
        }
    };
    (
        tokens,
        exec.dispatches() - start - prefill,
        finish.speculative,
    )
}

#[test]
fn speculative_greedy_on_the_simulator_is_plain_greedy_with_fewer_dispatches() {
    let dir = tiny("llama");
    let loaded = LoadedModel::load(&dir).unwrap();
    let reference = shared_json("fixtures/hf-tiny/llama/reference.json");
    let prompt = ids(&reference["cases"]["long"]["input_ids"]);
    let model: Arc<_> = loaded.model.clone();
    for strategy in [Strategy::Projection, Strategy::Fused] {
        let opts = LoweringOptions {
            context: 128,
            ..LoweringOptions::default()
        };
        let mut exec = AneExecutor::new(model.clone(), SimDevice::new(), strategy, &opts).unwrap();
        let (want, plain, _) = generate(&loaded, &mut exec, &prompt, None);
        let per_token = |d: u64| d as f64 / (N - 1) as f64;
        println!(
            "{strategy:?}: plain greedy {} dispatches per decoded token",
            per_token(plain)
        );
        // The simulator's wall time says nothing of the device (where a pass of K tokens costs
        // about one of one token) and varies with the machine's load: the schedule takes a
        // fixed cost, so it depends on the tokens alone.
        let mut lookup = Speculation::new(Box::new(PromptLookup::default()), 6).unwrap();
        lookup.fix_cost(0.05);
        let draft_exec =
            AneExecutor::new(model.clone(), SimDevice::new(), strategy, &opts).unwrap();
        let draft = DraftModel::new(Box::new(draft_exec), 128).unwrap();
        let mut by_model = Speculation::new(Box::new(draft), 4).unwrap();
        by_model.fix_cost(0.05);
        for (name, spec) in [
            ("prompt lookup", lookup),
            ("draft model (itself)", by_model),
        ] {
            let (got, dispatches, s) = generate(&loaded, &mut exec, &prompt, Some(spec));
            assert_eq!(got, want, "{strategy:?} {name}");
            println!(
                "{strategy:?} {name}: {:.2} target dispatches per generated token ({} verifying passes, {}/{} drafted tokens kept)",
                per_token(dispatches),
                s.target_passes,
                s.accepted,
                s.drafted
            );
            assert!(
                s.accepted > 0,
                "{strategy:?} {name}: nothing was accepted: {s:?}"
            );
            assert!(
                dispatches < plain,
                "{strategy:?} {name}: {dispatches} dispatches, plain {plain}"
            );
        }
    }
}
