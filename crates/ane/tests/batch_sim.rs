//! Batched decode on the ANE path, on the simulator: in the projection strategy one step of N
//! sequences (each at its own position, over its own KV cache or recurrent state) is one
//! dispatch per kernel over N columns — the dispatches of a single token's step, not N times
//! them — and each sequence's logits are bit for bit those of its token decoded alone.

use std::sync::Arc;

use anelm_ane::{AneExecutor, DevicePath, LoweringOptions, SimDevice, Strategy};
use anelm_engine::LoadedModel;
use anelm_model::{Executor, KvState, Logits};
use anelm_testkit::{ids, repo_tiny, shared_json, tiny};

/// Prompts of different lengths for three sequences (the fixture's ids, cut).
fn prompts(reference: &serde_json::Value) -> Vec<Vec<u32>> {
    let long = ids(&reference["cases"]["long"]["input_ids"]);
    vec![long[..5].to_vec(), long[..17].to_vec(), long.clone()]
}

fn argmax(row: &[f32]) -> u32 {
    anelm_testkit::argmax(row)
}

fn check(dir: &std::path::Path, reference: serde_json::Value) {
    let loaded = LoadedModel::load(dir).unwrap();
    let model: Arc<_> = loaded.model.clone();
    let vocab = model.config.vocab_size;
    let opts = LoweringOptions {
        context: 128,
        ..LoweringOptions::default()
    };
    let mut exec =
        AneExecutor::new(model.clone(), SimDevice::new(), Strategy::Projection, &opts).unwrap();
    let prompts = prompts(&reference);
    // Each sequence twice: one state steps in the batch, its twin alone.
    let mut batched: Vec<Box<dyn KvState>> = Vec::new();
    let mut alone: Vec<Box<dyn KvState>> = Vec::new();
    let mut next = Vec::new();
    let mut out = Vec::new();
    for p in &prompts {
        for states in [&mut batched, &mut alone] {
            let mut s = exec.new_state(96).unwrap();
            exec.forward(s.as_mut(), p, Logits::Last, &mut out).unwrap();
            states.push(s);
        }
        next.push(argmax(&out));
    }
    let mut single = Vec::new();
    for step in 0..6 {
        let before = exec.dispatches();
        let mut refs: Vec<&mut dyn KvState> = batched.iter_mut().map(|s| s.as_mut()).collect();
        exec.forward_batch(&mut refs, &next, &mut out).unwrap();
        let batch_dispatches = exec.dispatches() - before;
        assert_eq!(out.len(), prompts.len() * vocab);
        let mut singles = Vec::new();
        for (i, s) in alone.iter_mut().enumerate() {
            let before = exec.dispatches();
            exec.forward(s.as_mut(), &[next[i]], Logits::Last, &mut single)
                .unwrap();
            singles.push(exec.dispatches() - before);
            let row = &out[i * vocab..(i + 1) * vocab];
            assert!(
                row == &single[..],
                "{}: step {step}, sequence {i}: the batched row differs from the token alone",
                dir.display()
            );
            assert_eq!(batched[i].len(), s.len());
        }
        let moe = model
            .layers
            .iter()
            .any(|l| matches!(l.ffn, anelm_model::plan::Ffn::Moe(_)));
        if moe {
            // Each chosen expert runs once over the tokens routed to it: the union of the
            // sequences' experts, fewer than their sum.
            let (max, sum) = (*singles.iter().max().unwrap(), singles.iter().sum::<u64>());
            assert!(
                (max..sum).contains(&batch_dispatches),
                "{}: {batch_dispatches} dispatches batched, {singles:?} alone",
                dir.display()
            );
        } else {
            assert!(
                singles.iter().all(|&d| d == batch_dispatches),
                "{}: a batched step costs the dispatches of one token: {batch_dispatches} vs {singles:?}",
                dir.display()
            );
        }
        next = (0..prompts.len())
            .map(|i| argmax(&out[i * vocab..(i + 1) * vocab]))
            .collect();
    }
}

#[test]
fn batched_decode_is_each_token_alone_in_one_pass_of_dispatches() {
    for arch in ["llama", "qwen3", "gemma3", "qwen2_moe", "qwen3_next"] {
        let reference = shared_json(&format!("fixtures/hf-tiny/{arch}/reference.json"));
        check(&tiny(arch), reference);
    }
    let lfm2 = repo_tiny("lfm2");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lfm2.join("reference.json")).unwrap())
            .unwrap();
    check(&lfm2, reference);
}

#[test]
fn a_batch_wider_than_the_kernels_goes_in_several_passes() {
    let dir = tiny("llama");
    let loaded = LoadedModel::load(&dir).unwrap();
    let opts = LoweringOptions {
        width: 2,
        context: 64,
        ..LoweringOptions::default()
    };
    let mut exec = AneExecutor::new(
        loaded.model.clone(),
        SimDevice::new(),
        Strategy::Projection,
        &opts,
    )
    .unwrap();
    let vocab = exec.vocab_size();
    let mut states: Vec<Box<dyn KvState>> = (0..5).map(|_| exec.new_state(16).unwrap()).collect();
    let tokens: Vec<u32> = (1..=5).collect();
    let mut out = Vec::new();
    let mut refs: Vec<&mut dyn KvState> = states.iter_mut().map(|s| s.as_mut()).collect();
    exec.forward_batch(&mut refs, &tokens, &mut out).unwrap();
    assert_eq!(out.len(), 5 * vocab);
    let mut single = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        let mut s = exec.new_state(16).unwrap();
        exec.forward(s.as_mut(), &[t], Logits::Last, &mut single)
            .unwrap();
        assert!(
            out[i * vocab..(i + 1) * vocab] == single[..],
            "sequence {i}"
        );
        assert_eq!(states[i].len(), 1);
    }
}

/// The fused strategy has no width-N decode program yet: its batched step runs the sequences
/// one after the other — the same rows, N times one token's dispatches. Reported, so the gap
/// shows.
#[test]
fn the_fused_strategy_steps_a_batch_one_sequence_at_a_time() {
    let dir = tiny("llama");
    let loaded = LoadedModel::load(&dir).unwrap();
    let vocab = loaded.model.config.vocab_size;
    let opts = LoweringOptions {
        context: 64,
        ..LoweringOptions::default()
    };
    let mut per_step = Vec::new();
    for strategy in [Strategy::Projection, Strategy::Fused] {
        let mut exec =
            AneExecutor::new(loaded.model.clone(), SimDevice::new(), strategy, &opts).unwrap();
        let mut states: Vec<Box<dyn KvState>> =
            (0..4).map(|_| exec.new_state(16).unwrap()).collect();
        let mut out = Vec::new();
        for (i, s) in states.iter_mut().enumerate() {
            exec.forward(s.as_mut(), &[3 + i as u32, 40], Logits::Last, &mut out)
                .unwrap();
        }
        let tokens = [7, 8, 9, 10];
        let before = exec.dispatches();
        let mut refs: Vec<&mut dyn KvState> = states.iter_mut().map(|s| s.as_mut()).collect();
        exec.forward_batch(&mut refs, &tokens, &mut out).unwrap();
        let batched = exec.dispatches() - before;
        let mut single = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            let mut s = exec.new_state(16).unwrap();
            exec.forward(s.as_mut(), &[3 + i as u32, 40], Logits::Last, &mut single)
                .unwrap();
            let before = exec.dispatches();
            exec.forward(s.as_mut(), &[t], Logits::Last, &mut single)
                .unwrap();
            let one = exec.dispatches() - before;
            assert!(
                out[i * vocab..(i + 1) * vocab] == single[..],
                "{strategy:?} sequence {i}"
            );
            per_step.push((strategy, one, batched));
        }
        println!(
            "{strategy:?}: a step of 4 sequences takes {batched} dispatches, one token {}",
            per_step.last().unwrap().1
        );
    }
    let (_, one_p, batch_p) = per_step[0];
    let (_, one_f, batch_f) = *per_step.last().unwrap();
    assert_eq!(batch_p, one_p, "projection: one pass for the batch");
    assert_eq!(batch_f, 4 * one_f, "fused: one pass per sequence");
}
