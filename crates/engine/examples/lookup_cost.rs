//! Prompt lookup's speedup under a fixed pass cost, free of the machine's noise: each prompt
//! file is one user message, answered greedily (at most 128 tokens) by speculative decoding
//! whose schedule takes a verifying pass of `n` drafted tokens to cost `1 + cost·n` plain
//! passes (`Speculation::fix_cost`), and the speedup is the tokens over the passes so weighed.
//! The same tokens give the same figure on every machine: for comparing drafting policies.
//!
//! `cargo run --release -p anelm-engine --example lookup_cost -- MODEL.gguf 0.25 bench/speculative/*.txt`

use anelm_cpu::CpuExecutor;
use anelm_engine::{
    Event, GenerateParams, Input, LoadedModel, Message, PromptLookup, SamplingParams, Session,
    Speculation,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, cost, files @ ..] = args.as_slice() else {
        return Err("usage: lookup_cost MODEL COST PROMPT_FILE...".into());
    };
    let cost: f64 = cost.parse()?;
    if files.is_empty() || !cost.is_finite() || cost < 0.0 {
        return Err("a cost ≥ 0 and at least one prompt file".into());
    }
    let model = std::sync::Arc::new(LoadedModel::load(std::path::Path::new(model))?);
    let mut exec = CpuExecutor::new(model.model.clone(), 0);
    let mut log_sum = 0.0;
    for file in files {
        let text = std::fs::read_to_string(file)?;
        let input = Input::Messages(vec![Message::user(text.trim())]);
        let mut session = Session::new(&exec, 2048)?;
        let params = GenerateParams {
            sampling: SamplingParams::greedy(),
            max_tokens: 128,
            ..GenerateParams::default()
        };
        let mut generation = session.generate(&model, &input, params)?;
        let mut lookup = Speculation::new(Box::new(PromptLookup::default()), 8)?;
        lookup.fix_cost(cost);
        generation.speculate(lookup)?;
        let mut tokens = 0;
        let finish = loop {
            match generation.next_event(&mut exec)? {
                Some(Event::Token { .. }) => tokens += 1,
                Some(Event::Text(_)) => {}
                Some(Event::Finish(f)) => break f,
                None => return Err("the generation ended without finishing".into()),
            }
        };
        let s = finish.speculative;
        let weighed = s.target_passes as f64 + cost * s.drafted as f64;
        let speedup = tokens as f64 / weighed;
        log_sum += speedup.ln();
        println!(
            "{file}: {tokens} tokens, {} passes, {}/{} drafted tokens kept, speedup {speedup:.3}",
            s.target_passes, s.accepted, s.drafted
        );
    }
    println!(
        "geometric mean speedup {:.4}",
        (log_sum / files.len() as f64).exp()
    );
    Ok(())
}
