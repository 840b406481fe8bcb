//! Generation on the real models with the CPU executor: a session that continues a
//! conversation from its cache gives what a fresh session gives, and a seed reproduces sampled
//! text.

use std::ops::ControlFlow;

use anelm_cpu::CpuExecutor;
use anelm_engine::{
    Event, Finish, GenerateParams, Input, LoadedModel, Message, SamplingParams, Session,
};
use anelm_model::Executor;
use anelm_testkit::{model as model_path, GEMMA3, SMOLLM2};

fn load(path: &std::path::Path) -> std::sync::Arc<LoadedModel> {
    std::sync::Arc::new(
        LoadedModel::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

fn run(
    session: &mut Session,
    exec: &mut dyn Executor,
    model: &LoadedModel,
    input: &Input,
    params: GenerateParams,
) -> (Vec<u32>, String, Finish) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    let finish = session
        .generate_with(exec, model, input, params, |e| {
            match e {
                Event::Token { id, .. } => ids.push(*id),
                Event::Text(t) => text.push_str(t),
                Event::Finish(_) => {}
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    (ids, text, finish)
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..GenerateParams::default()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prefix_reuse_equals_fresh(file: &str) {
    let model = load(&model_path(file));
    let mut exec = CpuExecutor::new(model.model.clone(), 0);
    let mut session = Session::new(&exec, 1024).unwrap();
    let mut chat = vec![Message::user("Write one sentence about the sea.")];
    let (_, answer, first) = run(
        &mut session,
        &mut exec,
        &model,
        &Input::Messages(chat.clone()),
        greedy(12),
    );
    assert_eq!(first.usage.cached_tokens, 0);
    chat.push(Message::assistant(&answer));
    chat.push(Message::user("Now one about the mountains."));
    let input = Input::Messages(chat);

    let (cached_ids, cached_text, cached) =
        run(&mut session, &mut exec, &model, &input, greedy(16));
    let mut fresh_session = Session::new(&exec, 1024).unwrap();
    let (fresh_ids, fresh_text, fresh) =
        run(&mut fresh_session, &mut exec, &model, &input, greedy(16));

    // The second turn extends the first prompt: at least all of it came from the cache.
    assert!(
        cached.usage.cached_tokens >= first.usage.prompt_tokens,
        "{:?} vs {:?}",
        cached.usage,
        first.usage
    );
    assert_eq!(
        cached.timings.prefilled_tokens,
        cached.usage.prompt_tokens - cached.usage.cached_tokens
    );
    assert_eq!(fresh.usage.cached_tokens, 0);
    assert_eq!(cached.usage.prompt_tokens, fresh.usage.prompt_tokens);
    assert_eq!(
        cached_ids, fresh_ids,
        "{file}: {cached_text:?} vs {fresh_text:?}"
    );
    assert_eq!(cached_text, fresh_text);

    // And the logits after the prompt are the same bits (the cached keys and values came from
    // single-token passes, the fresh ones from one batch: the engine computes each row the
    // same way either way).
    let prompt = match &input {
        Input::Messages(m) => anelm_engine::prompt::chat_ids(&model, m).unwrap(),
        _ => unreachable!(),
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    session.truncate(cached.usage.cached_tokens);
    let reused = session.prefill(&mut exec, &prompt, &mut a).unwrap();
    assert_eq!(reused, cached.usage.cached_tokens);
    let mut fresh_session = Session::new(&exec, 1024).unwrap();
    fresh_session.prefill(&mut exec, &prompt, &mut b).unwrap();
    let diff = max_abs_diff(&a, &b);
    assert!(
        a.iter()
            .map(|v| v.to_bits())
            .eq(b.iter().map(|v| v.to_bits())),
        "{file}: logits differ by up to {diff}"
    );
}

#[test]
fn smollm2_prefix_reuse_equals_a_fresh_session() {
    prefix_reuse_equals_fresh(SMOLLM2);
}

#[test]
fn gemma3_prefix_reuse_equals_a_fresh_session() {
    prefix_reuse_equals_fresh(GEMMA3);
}

#[test]
fn a_seed_reproduces_sampled_text() {
    let model = load(&model_path(SMOLLM2));
    let mut exec = CpuExecutor::new(model.model.clone(), 0);
    let input = Input::Text("Once upon a time".into());
    let sample = |seed: u64, exec: &mut CpuExecutor| {
        let params = GenerateParams {
            sampling: SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: Some(seed),
                ..SamplingParams::default()
            },
            max_tokens: 24,
            ..GenerateParams::default()
        };
        let mut session = Session::new(&*exec, 64).unwrap();
        let (ids, _, finish) = run(&mut session, exec, &model, &input, params);
        assert_eq!(finish.seed, seed);
        ids
    };
    let a = sample(11, &mut exec);
    assert_eq!(a, sample(11, &mut exec));
    assert_ne!(a, sample(12, &mut exec), "another seed, another story");
}

/// Speculative greedy decoding on the real models gives the plain greedy tokens, with prompt
/// lookup and with a draft model (the model itself: the only one of the same vocabulary here),
/// on a prompt whose answer repeats it.
fn speculative_greedy_is_plain_greedy(file: &str) {
    use anelm_engine::{DraftModel, PromptLookup, Speculation};
    let model = load(&model_path(file));
    let mut exec = CpuExecutor::new(model.model.clone(), 0);
    let text = "The Apple Neural Engine is a specialised processor found in Apple's chips. \
                It runs the matrix multiplications of neural networks at low power.";
    let input = Input::Messages(vec![Message::user(&format!(
        "{text}\n\nRepeat the text above word for word."
    ))]);
    let generate = |exec: &mut CpuExecutor, spec: Option<Speculation>, params: GenerateParams| {
        let mut session = Session::new(&*exec, 512).unwrap();
        let mut g = session.generate(&model, &input, params).unwrap();
        if let Some(s) = spec {
            g.speculate(s).unwrap();
        }
        let (mut ids, mut text) = (Vec::new(), String::new());
        loop {
            match g.next_event(exec).unwrap().unwrap() {
                Event::Token { id, .. } => ids.push(id),
                Event::Text(t) => text.push_str(&t),
                Event::Finish(f) => return (ids, text, f),
            }
        }
    };
    let itself = |k| {
        let draft = DraftModel::new(Box::new(CpuExecutor::new(model.model.clone(), 0)), 512);
        Speculation::new(Box::new(draft.unwrap()), k).unwrap()
    };
    let (want, text, _) = generate(&mut exec, None, greedy(48));
    let lookup = Speculation::new(Box::new(PromptLookup::default()), 8).unwrap();
    let (got, _, f) = generate(&mut exec, Some(lookup), greedy(48));
    assert_eq!(got, want, "{file}: prompt lookup");
    assert!(
        f.speculative.accepted > 0,
        "{file}: lookup kept nothing: {:?}",
        f.speculative
    );
    let (got, _, f) = generate(&mut exec, Some(itself(4)), greedy(48));
    assert_eq!(got, want, "{file}: draft model");
    // Tokens drafted past the end of the reply are not judged: the model agrees with itself
    // on every one that is.
    assert_eq!(
        f.speculative.accepted, f.speculative.drafted,
        "{file}: itself agrees"
    );

    // A stop string inside a verified run ends it there, as it ends a plain generation.
    let words: Vec<&str> = text.split_whitespace().collect();
    let stop = words[words.len() / 2].to_string();
    let params = GenerateParams {
        stop: vec![stop.clone()],
        ..greedy(48)
    };
    let (want, _, _) = generate(&mut exec, None, params.clone());
    assert!(
        want.len() < got.len(),
        "{file}: {stop:?} ends {text:?} early"
    );
    let (got, _, f) = generate(&mut exec, Some(itself(8)), params);
    assert_eq!(got, want, "{file}: stop at {stop:?}");
    let s = f.speculative;
    assert!(s.drafted > 0 && s.accepted == s.drafted, "{file}: {s:?}");
}

#[test]
fn smollm2_speculative_greedy_is_plain_greedy() {
    speculative_greedy_is_plain_greedy(SMOLLM2);
}

#[test]
fn gemma3_speculative_greedy_is_plain_greedy() {
    speculative_greedy_is_plain_greedy(GEMMA3);
}
