//! Generation over a scripted executor (its logits make the next token whatever the script
//! says) with SmolLM2's real tokenizer: UTF-8 streaming across split tokens, stop-string
//! hold-back, stop ids, length and context limits, cancellation, logprobs, prefix reuse, the
//! overflow policy, and input checks.

use std::ops::ControlFlow;
use std::sync::Arc;

use anelm_engine::{
    EngineError, Event, Finish, FinishReason, GenerateParams, Input, LoadedModel, Message,
    Overflow, SamplingParams, Session,
};
use anelm_model::Executor;
use anelm_testkit::{model as model_path, FnExec, GEMMA3, SMOLLM2};

fn load(path: &std::path::Path) -> std::sync::Arc<LoadedModel> {
    std::sync::Arc::new(
        LoadedModel::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

/// After `prompt_len` tokens, the logits favour `script[i]` for the i-th generated token (then
/// token 0). Records the size of every forward pass.
fn scripted(vocab: usize, prompt_len: usize, script: &[u32]) -> FnExec {
    let script = script.to_vec();
    FnExec::new(vocab, move |history, row| {
        let favoured = history
            .len()
            .checked_sub(prompt_len)
            .and_then(|i| script.get(i))
            .copied()
            .unwrap_or(0);
        row[favoured as usize] = 10.0;
    })
}

fn smollm2() -> Arc<LoadedModel> {
    load(&model_path(SMOLLM2))
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..GenerateParams::default()
    }
}

/// Runs a generation to the end, returning the events.
fn collect(
    session: &mut Session,
    exec: &mut dyn Executor,
    model: &LoadedModel,
    input: &Input,
    params: GenerateParams,
) -> Vec<Event> {
    let mut events = Vec::new();
    session
        .generate_with(exec, model, input, params, |e| {
            events.push(e.clone());
            ControlFlow::Continue(())
        })
        .unwrap();
    events
}

fn texts(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::Text(t) = e {
                Some(t.clone())
            } else {
                None
            }
        })
        .collect()
}

fn token_ids(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::Token { id, .. } = e {
                Some(*id)
            } else {
                None
            }
        })
        .collect()
}

fn finish(events: &[Event]) -> Finish {
    match events.last() {
        Some(Event::Finish(f)) => f.clone(),
        other => panic!("the last event is not a finish: {other:?}"),
    }
}

const PROMPT: [u32; 3] = [1, 504, 3575];
const EOS: u32 = 2;

/// Streams `text` (scripted token by token) through a generation with `file`'s tokenizer.
fn split_characters_stream_whole(file: &str) {
    let model = load(&model_path(file));
    let tok = model.tokenizer().unwrap();
    let text = "Emoji 😀🎉 and 中文字 and é! 𠜎𠜱 🫠";
    let ids = tok.encode(text, false, false).unwrap();
    // The test means something only if some token carries part of a character.
    assert!(
        ids.iter()
            .any(|&id| std::str::from_utf8(&tok.token_to_piece(id)).is_err()),
        "{file}: no split character in {ids:?}"
    );
    let eos = tok.eos().unwrap();
    let mut script = ids.clone();
    script.push(eos);
    let mut exec = scripted(model.model.config.vocab_size, PROMPT.len(), &script);
    let mut session = Session::new(&exec, 64).unwrap();
    let events = collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(PROMPT.to_vec()),
        greedy(64),
    );
    let pieces = texts(&events);
    assert_eq!(pieces.concat(), text, "{file}");
    assert!(
        pieces.iter().all(|p| !p.contains('\u{FFFD}')),
        "{file}: {pieces:?}"
    );
    assert!(
        pieces.len() < ids.len(),
        "{file}: tokens holding part of a character emit nothing: {pieces:?}"
    );
    assert_eq!(
        token_ids(&events),
        script,
        "every token is reported, the end-of-generation token too"
    );
    let f = finish(&events);
    assert_eq!(f.reason, FinishReason::Stop);
    assert_eq!(f.usage.completion_tokens, script.len());
}

#[test]
fn split_utf8_characters_stream_whole_smollm2() {
    split_characters_stream_whole(SMOLLM2);
}

#[test]
fn split_utf8_characters_stream_whole_gemma3() {
    split_characters_stream_whole(GEMMA3);
}

#[test]
fn a_stop_string_is_held_back_and_never_emitted() {
    let model = smollm2();
    let tok = model.tokenizer().unwrap();
    let ids = tok
        .encode("Sure thing.\nUser: and more text", false, false)
        .unwrap();
    let mut exec = scripted(model.model.config.vocab_size, PROMPT.len(), &ids);
    let mut session = Session::new(&exec, 64).unwrap();
    let params = GenerateParams {
        stop: vec!["\nUser:".into()],
        ..greedy(64)
    };
    let events = collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(PROMPT.to_vec()),
        params,
    );
    let pieces = texts(&events);
    let mut so_far = String::new();
    for p in &pieces {
        so_far += p;
        assert!(
            !so_far.contains('\n'),
            "part of the stop string was emitted: {so_far:?}"
        );
    }
    assert_eq!(so_far, "Sure thing.");
    let f = finish(&events);
    assert_eq!(f.reason, FinishReason::StopString);
    assert!(
        f.usage.completion_tokens < ids.len(),
        "generation ended at the stop string"
    );
}

#[test]
fn limits_end_the_generation_with_their_reason() {
    let model = smollm2();
    let vocab = model.model.config.vocab_size;
    let script: Vec<u32> = (100..200).collect();
    // max_tokens
    let mut exec = scripted(vocab, PROMPT.len(), &script);
    let mut session = Session::new(&exec, 64).unwrap();
    let f = finish(&collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(PROMPT.to_vec()),
        greedy(5),
    ));
    assert_eq!(
        (f.reason, f.usage.completion_tokens, f.usage.prompt_tokens),
        (FinishReason::Length, 5, 3)
    );
    assert_eq!(f.reason.openai(), "length");
    // A full context is reported, not an error: 8 positions hold the prompt and 5 fed tokens,
    // and the 6th drawn token cannot be fed.
    let mut session = Session::new(&exec, 8).unwrap();
    let events = collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(PROMPT.to_vec()),
        greedy(100),
    );
    let f = finish(&events);
    assert_eq!(
        (f.reason, f.usage.completion_tokens),
        (FinishReason::ContextFull, 6)
    );
    assert_eq!(token_ids(&events), script[..6]);
}

#[test]
fn cancelling_stops_within_a_token() {
    let model = smollm2();
    let script: Vec<u32> = (100..200).collect();
    let mut exec = scripted(model.model.config.vocab_size, PROMPT.len(), &script);
    let passes = exec.passes.clone();
    let mut session = Session::new(&exec, 64).unwrap();
    let mut seen = 0;
    let f = session
        .generate_with(
            &mut exec,
            &model,
            &Input::Ids(PROMPT.to_vec()),
            greedy(50),
            |e| {
                if matches!(e, Event::Token { .. }) {
                    seen += 1;
                }
                if seen == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )
        .unwrap();
    assert_eq!(
        (f.reason, f.usage.completion_tokens),
        (FinishReason::Cancelled, 3)
    );
    // One prefill pass and two single-token passes: nothing ran after the cancel.
    assert_eq!(*passes.lock().unwrap(), [3, 1, 1]);
}

#[test]
fn logprobs_come_from_the_logits() {
    let model = smollm2();
    let vocab = model.model.config.vocab_size;
    let mut exec = scripted(vocab, PROMPT.len(), &[42, 43]);
    let mut session = Session::new(&exec, 64).unwrap();
    let params = GenerateParams {
        logprobs: Some(3),
        ..greedy(2)
    };
    let events = collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(PROMPT.to_vec()),
        params,
    );
    // One logit of 10, the rest 0.
    let want = 10.0 - ((10.0f64).exp() + (vocab - 1) as f64).ln();
    let mut n = 0;
    for e in &events {
        if let Event::Token {
            id,
            logprob: Some(lp),
        } = e
        {
            assert!((lp.logprob as f64 - want).abs() < 1e-4, "{lp:?}");
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, *id);
            n += 1;
        }
    }
    assert_eq!(n, 2);
}

#[test]
fn a_prompt_extending_the_cache_prefills_only_the_suffix() {
    let model = smollm2();
    let script = [500u32, 501, 502, EOS];
    let mut exec = scripted(model.model.config.vocab_size, PROMPT.len(), &script);
    let passes = exec.passes.clone();
    let mut session = Session::new(&exec, 64).unwrap();
    collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(PROMPT.to_vec()),
        greedy(10),
    );
    // The session holds the prompt and the fed tokens (not the final EOS).
    assert_eq!(session.tokens(), [1, 504, 3575, 500, 501, 502]);
    passes.lock().unwrap().clear();
    let mut next = session.tokens().to_vec();
    next.extend([EOS, 7, 8]);
    let events = collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(next.clone()),
        greedy(1),
    );
    let f = finish(&events);
    assert_eq!(f.usage.cached_tokens, 6);
    assert_eq!(f.timings.prefilled_tokens, 3);
    assert_eq!(passes.lock().unwrap()[0], 3, "only the suffix was computed");
    // The same prompt again recomputes only its last token (its logits are needed).
    let f = finish(&collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(next.clone()),
        greedy(1),
    ));
    assert_eq!(f.usage.cached_tokens, next.len() - 1);
    // A prompt that diverges early keeps only the common prefix.
    let f = finish(&collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(vec![1, 504, 9, 9]),
        greedy(1),
    ));
    assert_eq!(f.usage.cached_tokens, 2);
}

fn long_chat(turns: usize) -> Vec<Message> {
    let mut m = vec![Message::system("You are terse.")];
    for i in 0..turns {
        m.push(Message::user(&format!(
            "Question number {i}: tell me something about the number {i}."
        )));
        m.push(Message::assistant(&format!(
            "The number {i} is a number, and that is all there is to say about {i}."
        )));
    }
    m.push(Message::user("Last question: what is the last number?"));
    m
}

#[test]
fn context_overflow_is_refused_or_reported() {
    let model = smollm2();
    let exec = scripted(model.model.config.vocab_size, 0, &[]);
    let chat = long_chat(10);
    let full = anelm_engine::prompt::chat_ids(&model, &chat).unwrap().len();
    let capacity = full / 2;
    let mut session = Session::new(&exec, capacity).unwrap();

    let err = session
        .generate(&model, &Input::Messages(chat.clone()), greedy(16))
        .err()
        .unwrap();
    match err {
        EngineError::ContextOverflow {
            prompt_tokens,
            capacity: c,
            dropped_messages,
        } => {
            assert_eq!((prompt_tokens, c, dropped_messages), (full, capacity, 0))
        }
        other => panic!("expected an overflow, got {other}"),
    }

    let params = GenerateParams {
        overflow: Overflow::DropOldestTurns,
        ..greedy(16)
    };
    let generation = session
        .generate(&model, &Input::Messages(chat.clone()), params.clone())
        .unwrap();
    let prompt = generation.prompt().to_vec();
    drop(generation);
    assert!(
        prompt.len() + 16 <= capacity,
        "{} + 16 > {capacity}",
        prompt.len()
    );
    let text = model.tokenizer().unwrap().decode_lossy(&prompt);
    assert!(
        text.contains("You are terse.") && text.contains("Last question"),
        "system and last turn stay: {text}"
    );
    assert!(
        !text.contains("Question number 0:"),
        "the oldest turn went first"
    );
    assert!(text.contains("Question number 9:"), "the newest turns stay");
    // Whole turns go: the count of dropped messages is even here and reported.
    let mut exec = scripted(model.model.config.vocab_size, prompt.len(), &[EOS]);
    let f = session
        .generate_with(
            &mut exec,
            &model,
            &Input::Messages(chat),
            params.clone(),
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
    assert!(
        f.usage.dropped_messages > 0 && f.usage.dropped_messages.is_multiple_of(2),
        "{:?}",
        f.usage
    );
    assert_eq!(f.usage.prompt_tokens, prompt.len());

    // A last turn that cannot fit by itself is refused, with what was dropped.
    let huge = vec![
        Message::user("Q"),
        Message::assistant("A"),
        Message::user(&"word ".repeat(capacity)),
    ];
    match session
        .generate(&model, &Input::Messages(huge), params)
        .err()
        .unwrap()
    {
        EngineError::ContextOverflow {
            dropped_messages, ..
        } => assert_eq!(dropped_messages, 2),
        other => panic!("expected an overflow, got {other}"),
    }
    // Other inputs cannot drop turns: refused.
    let ids = Input::Ids(vec![1; capacity]);
    assert!(matches!(
        session.generate(&model, &ids, greedy(1)).err().unwrap(),
        EngineError::ContextOverflow { .. }
    ));
}

#[test]
fn bad_requests_are_clear_errors() {
    let model = smollm2();
    let vocab = model.model.config.vocab_size;
    let exec = scripted(vocab, 0, &[]);
    let mut session = Session::new(&exec, 64).unwrap();
    let err = |input: Input, params: GenerateParams, session: &mut Session| {
        session
            .generate(&model, &input, params)
            .err()
            .unwrap()
            .to_string()
    };
    assert!(err(Input::Ids(vec![]), greedy(1), &mut session).contains("empty"));
    assert!(err(Input::Ids(vec![vocab as u32]), greedy(1), &mut session)
        .contains("outside the vocabulary"));
    let bad = GenerateParams {
        sampling: SamplingParams {
            top_p: 2.0,
            ..SamplingParams::default()
        },
        ..greedy(1)
    };
    assert!(err(Input::Ids(vec![1]), bad, &mut session).contains("top_p"));
    assert!(err(Input::Ids(vec![1]), greedy(0), &mut session).contains("max_tokens"));
}

#[test]
fn a_long_prompt_prefills_chunk_by_chunk_and_can_stop_between() {
    use anelm_engine::session::PREFILL_CHUNK;
    let model = smollm2();
    let prompt: Vec<u32> = (0..2 * PREFILL_CHUNK + 100)
        .map(|i| 100 + (i % 50) as u32)
        .collect();
    let mut exec = scripted(model.model.config.vocab_size, prompt.len(), &[500, EOS]);
    let passes = exec.passes.clone();
    let capacity = 4 * PREFILL_CHUNK;

    // Step by step: one chunk per call, then next_event decodes.
    let mut session = Session::new(&exec, capacity).unwrap();
    let mut generation = session
        .generate(&model, &Input::Ids(prompt.clone()), greedy(4))
        .unwrap();
    let steps: Vec<bool> = (0..4)
        .map(|_| generation.prefill_step(&mut exec).unwrap())
        .collect();
    assert_eq!(steps, [false, false, true, true]);
    assert_eq!(*passes.lock().unwrap(), [PREFILL_CHUNK, PREFILL_CHUNK, 100]);
    let mut events = Vec::new();
    while let Some(e) = generation.next_event(&mut exec).unwrap() {
        events.push(e);
    }
    let f = finish(&events);
    assert_eq!(
        (f.reason, f.usage.completion_tokens),
        (FinishReason::Stop, 2)
    );
    assert_eq!(
        (f.usage.cached_tokens, f.timings.prefilled_tokens),
        (0, prompt.len())
    );
    drop(generation);

    // Cancelled after one chunk: nothing more runs, and the session keeps that chunk.
    passes.lock().unwrap().clear();
    let mut session = Session::new(&exec, capacity).unwrap();
    let mut generation = session
        .generate(&model, &Input::Ids(prompt.clone()), greedy(4))
        .unwrap();
    assert!(!generation.prefill_step(&mut exec).unwrap());
    generation.cancel();
    let mut events = Vec::new();
    while let Some(e) = generation.next_event(&mut exec).unwrap() {
        events.push(e);
    }
    assert_eq!(finish(&events).reason, FinishReason::Cancelled);
    assert_eq!(*passes.lock().unwrap(), [PREFILL_CHUNK]);
    drop(generation);
    assert_eq!(session.tokens(), &prompt[..PREFILL_CHUNK]);

    // The next request with that prompt starts where the cancelled one stopped.
    let f = finish(&collect(
        &mut session,
        &mut exec,
        &model,
        &Input::Ids(prompt.clone()),
        greedy(4),
    ));
    assert_eq!(f.usage.cached_tokens, PREFILL_CHUNK);
    assert_eq!(f.timings.prefilled_tokens, PREFILL_CHUNK + 100);
}

#[test]
fn forced_tokens_replace_the_draws_and_count_as_drawn() {
    let model = smollm2();
    let script: Vec<u32> = (100..200).collect();
    let mut exec = scripted(model.model.config.vocab_size, PROMPT.len(), &script);
    let mut session = Session::new(&exec, 64).unwrap();
    let mut g = session
        .generate(&model, &Input::Ids(PROMPT.to_vec()), greedy(6))
        .unwrap();
    let mut ids = Vec::new();
    let mut forced = false;
    let mut last = None;
    while let Some(e) = g.next_event(&mut exec).unwrap() {
        match e {
            Event::Token { id, .. } => {
                ids.push(id);
                if ids.len() == 2 && !forced {
                    g.force(&[7, 8]);
                    forced = true;
                }
            }
            Event::Finish(f) => last = Some(f),
            Event::Text(_) => {}
        }
    }
    // The script's 100, 101, then the forced 7 and 8 in place of 102 and 103, then the
    // script again (its position, not its count of draws, names the token).
    assert_eq!(ids, [100, 101, 7, 8, 104, 105]);
    let f = last.expect("a finish");
    assert_eq!(
        (f.reason, f.usage.completion_tokens),
        (FinishReason::Length, 6)
    );
    // A forced end-of-generation token stops the generation as a drawn one does.
    let mut session = Session::new(&exec, 64).unwrap();
    let mut g = session
        .generate(&model, &Input::Ids(PROMPT.to_vec()), greedy(6))
        .unwrap();
    g.force(&[EOS]);
    let mut events = Vec::new();
    while let Some(e) = g.next_event(&mut exec).unwrap() {
        events.push(e);
    }
    assert_eq!(token_ids(&events), [EOS]);
    assert_eq!(finish(&events).reason, FinishReason::Stop);
}
