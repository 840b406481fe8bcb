//! Batched decode on the ANE path, on the simulator: one step of N sequences (each at its own
//! position, over its own KV cache or recurrent state) is one dispatch per kernel over N
//! columns in the projection strategy and one per chunk of its batch function in the fused
//! strategy — the dispatches of a single token's step, not N times them — and each sequence's
//! logits are bit for bit those of its token decoded alone.

use std::sync::Arc;

use anelm_ane::{AneExecutor, DevicePath, LoweringOptions, SimDevice, Strategy};
use anelm_engine::LoadedModel;
use anelm_model::{Executor, KvState, Logits};
use anelm_testkit::{argmax, ids, repo_tiny, shared_json, tiny};

/// Prompts of different lengths for three sequences (the fixture's ids, cut).
fn prompts(reference: &serde_json::Value) -> Vec<Vec<u32>> {
    let long = ids(&reference["cases"]["long"]["input_ids"]);
    vec![long[..5].to_vec(), long[..17].to_vec(), long.clone()]
}

/// `slots`: the fused strategy's batch width (ignored by the projection strategy).
fn check(dir: &std::path::Path, reference: serde_json::Value, strategy: Strategy, slots: usize) {
    let loaded = LoadedModel::load(dir).unwrap();
    let model: Arc<_> = loaded.model.clone();
    let vocab = model.config.vocab_size;
    let opts = LoweringOptions {
        context: 128,
        decode_batch: slots,
        ..LoweringOptions::default()
    };
    let mut exec = AneExecutor::new(model.clone(), SimDevice::new(), strategy, &opts).unwrap();
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
        if step == 3 {
            // The first sequence goes on alone for a token (its batched twin too): the copies
            // of its cache the batch functions hold must follow.
            for s in [&mut batched[0], &mut alone[0]] {
                exec.forward(s.as_mut(), &[next[0]], Logits::Last, &mut single)
                    .unwrap();
            }
            next[0] = argmax(&single);
        }
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
        let groups = prompts.len().div_ceil(slots) as u64;
        if strategy == Strategy::Fused {
            // One evaluation per chunk per group of `slots` sequences (and, in a mixture, a
            // repeat where the host settles a router near-tie).
            let one = *singles.iter().min().unwrap();
            assert!(
                batch_dispatches >= groups * one
                    && batch_dispatches <= groups * *singles.iter().max().unwrap() + 2,
                "{}: {batch_dispatches} dispatches batched in {groups} groups, {singles:?} alone",
                dir.display()
            );
        } else if moe {
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

fn every_family(strategy: Strategy, slots: usize) {
    for arch in ["llama", "qwen3", "gemma3", "qwen2_moe", "qwen3_next"] {
        let reference = shared_json(&format!("fixtures/hf-tiny/{arch}/reference.json"));
        check(&tiny(arch), reference, strategy, slots);
    }
    let lfm2 = repo_tiny("lfm2");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lfm2.join("reference.json")).unwrap())
            .unwrap();
    check(&lfm2, reference, strategy, slots);
}

#[test]
fn batched_decode_is_each_token_alone_in_one_pass_of_dispatches() {
    every_family(Strategy::Projection, 1);
}

/// Four slots for three sequences: one slot idle every step.
#[test]
fn fused_batch_functions_decode_each_sequence_in_its_own_slot() {
    every_family(Strategy::Fused, 4);
}

/// Two slots for three sequences: two groups a step, so the third sequence takes a slot from
/// the first every step and each moves its cache in again.
#[test]
fn fused_batch_slots_change_hands_between_groups() {
    let reference = shared_json("fixtures/hf-tiny/qwen3/reference.json");
    check(&tiny("qwen3"), reference, Strategy::Fused, 2);
    let lfm2 = repo_tiny("lfm2");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lfm2.join("reference.json")).unwrap())
            .unwrap();
    check(&lfm2, reference, Strategy::Fused, 2);
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

/// Dispatches of a step of 4 sequences: the projection strategy's kernels and the fused
/// strategy's batch functions take them in one pass; a fused lowering without batch functions
/// runs the sequences one after the other. Reported, and the rows are the same each way.
#[test]
fn dispatches_of_a_batched_step_in_both_strategies() {
    let dir = tiny("llama");
    let loaded = LoadedModel::load(&dir).unwrap();
    let vocab = loaded.model.config.vocab_size;
    let mut per_step = Vec::new();
    for (strategy, slots) in [
        (Strategy::Projection, 1),
        (Strategy::Fused, 1),
        (Strategy::Fused, 4),
    ] {
        let opts = LoweringOptions {
            context: 64,
            decode_batch: slots,
            ..LoweringOptions::default()
        };
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
        let mut one = 0;
        for (i, &t) in tokens.iter().enumerate() {
            let mut s = exec.new_state(16).unwrap();
            exec.forward(s.as_mut(), &[3 + i as u32, 40], Logits::Last, &mut single)
                .unwrap();
            let before = exec.dispatches();
            exec.forward(s.as_mut(), &[t], Logits::Last, &mut single)
                .unwrap();
            one = exec.dispatches() - before;
            assert!(
                out[i * vocab..(i + 1) * vocab] == single[..],
                "{strategy:?} ({slots} slots) sequence {i}"
            );
        }
        println!(
            "{strategy:?} (batch functions of {slots}): a step of 4 sequences takes {batched} \
             dispatches, one token {one}"
        );
        per_step.push((one, batched));
    }
    assert_eq!(
        per_step[0].1, per_step[0].0,
        "projection: one pass for the batch"
    );
    assert_eq!(
        per_step[1].1,
        4 * per_step[1].0,
        "fused, no batch functions: one per sequence"
    );
    assert_eq!(
        per_step[2].1, per_step[2].0,
        "fused batch functions: one pass"
    );
}
