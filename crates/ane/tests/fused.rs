//! The fused strategy on the simulator: segmentation, the dense tiny fixtures (safetensors and
//! GGUF, prompts longer than the sliding windows) against the CPU engine, and the stateful
//! multifunction packages it emits against coremltools' validator. (Both real models: through
//! the binary, crates/cli/tests/ane_sim.rs.)

use std::sync::Arc;

use anelm_ane::compare::{argmax, diff};
use anelm_ane::exec::FusedExecutor;
use anelm_ane::lower::fused::{build_chunk, fused_plan, KvForm};
use anelm_ane::{LoweringOptions, SimDevice};
use anelm_cpu::CpuExecutor;
use anelm_mil::blob::BlobPolicy;
use anelm_mil::package::{write_package, PackageOptions};
use anelm_model::{Executor, Logits, Model};

/// Top-2 gaps below this are near-ties for fp16 execution (see hf_tiny.rs).
const NEAR_TIE: f32 = 0.01;

fn tiny(family: &str) -> Arc<Model> {
    Arc::new(anelm_model::load(&anelm_testkit::tiny(family)).unwrap())
}

fn all_logits(exec: &mut dyn Executor, ids: &[u32]) -> Vec<f32> {
    let mut state = exec.new_state(ids.len()).unwrap();
    let mut out = Vec::new();
    exec.forward(state.as_mut(), ids, Logits::All, &mut out)
        .unwrap();
    out
}

/// `n` greedy tokens after `prompt`, with the logits each was chosen from.
fn greedy(exec: &mut dyn Executor, prompt: &[u32], n: usize) -> Vec<(u32, Vec<f32>)> {
    let mut state = exec.new_state(prompt.len() + n).unwrap();
    let mut logits = Vec::new();
    exec.forward(state.as_mut(), prompt, Logits::Last, &mut logits)
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let id = argmax(&logits);
        out.push((id, logits.clone()));
        exec.forward(state.as_mut(), &[id], Logits::Last, &mut logits)
            .unwrap();
    }
    out
}

fn top2_gap(row: &[f32]) -> f32 {
    let mut v = row.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}

#[test]
fn segmentation_under_both_ceilings() {
    let m = tiny("llama");
    let bytes = fused_plan(&m, &LoweringOptions::default()).unwrap();
    assert_eq!(
        bytes.chunks.len(),
        1,
        "4 small layers and the head: one program"
    );
    assert!(bytes.chunks[0].head);
    let by_layers = fused_plan(
        &m,
        &LoweringOptions {
            chunk_layers: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let ranges: Vec<_> = by_layers.chunks.iter().map(|c| c.layers.clone()).collect();
    assert_eq!(
        ranges,
        [0..2, 2..4],
        "balanced: two chunks of two, not three and one"
    );
    let layer = by_layers.chunks[0].weight_bytes / 2;
    let head = (m.lm_head.rows * m.lm_head.cols * 2) as u64;
    let tight = fused_plan(
        &m,
        &LoweringOptions {
            chunk_bytes: 2 * layer,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        tight
            .chunks
            .iter()
            .map(|c| c.layers.len())
            .collect::<Vec<_>>(),
        [2, 2, 0],
        "the head does not fit beside two layers"
    );
    assert_eq!(tight.chunks[2].weight_bytes, head);
    assert_eq!(tight.dispatches_per_token(), 3);
    let e = fused_plan(
        &m,
        &LoweringOptions {
            chunk_bytes: layer / 2,
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("layer 0"), "{e}");
    let g3 = fused_plan(&tiny("gemma3"), &LoweringOptions::default()).unwrap();
    assert_eq!(
        (g3.ropes.len(), g3.windows.len()),
        (2, 2),
        "sliding and global layers: two RoPE tables, two masks"
    );
    assert_eq!(g3.layer_window, [0, 0, 0, 0, 0, 1]);
}

#[test]
fn tiny_fixtures_match_the_cpu() {
    for family in anelm_testkit::DENSE_TINY {
        let m = tiny(family);
        let opts = LoweringOptions {
            context: 128,
            ..Default::default()
        };
        let mut sim = FusedExecutor::new(m.clone(), SimDevice::new(), &opts, |_| {}).unwrap();
        let mut cpu = CpuExecutor::new(m.clone(), 1);
        let fx = anelm_testkit::shared_json(&format!("fixtures/hf-tiny/{family}/reference.json"));
        for (case, v) in fx["cases"].as_object().unwrap() {
            let ids = anelm_testkit::ids(&v["input_ids"]);
            let (_, rel) = diff(&all_logits(&mut sim, &ids), &all_logits(&mut cpu, &ids));
            let (a, b) = (greedy(&mut sim, &ids, 16), greedy(&mut cpu, &ids, 16));
            let same = a.iter().zip(&b).take_while(|(x, y)| x.0 == y.0).count();
            println!("{family:8} {case:6} ({:2} tokens): relative {rel:.2e}, greedy agrees for {same}/16", ids.len());
            assert!(rel <= 2e-2, "{family} {case}: relative error {rel}");
            if same < 16 {
                let gap = top2_gap(&b[same].1);
                assert!(
                    gap < NEAR_TIE,
                    "{family} {case}: greedy step {same} differs with a CPU top-2 gap of {gap}"
                );
            }
        }
    }
}

#[test]
fn gguf_tiny_fixtures_adjacent_rope_included() {
    for family in anelm_testkit::TINY_WITH_GGUF {
        let m =
            Arc::new(anelm_model::load(&anelm_testkit::tiny(family).join("model.gguf")).unwrap());
        let mut sim = FusedExecutor::new(
            m.clone(),
            SimDevice::new(),
            &LoweringOptions {
                context: 64,
                ..Default::default()
            },
            |_| {},
        )
        .unwrap();
        let mut cpu = CpuExecutor::new(m.clone(), 1);
        let ids = anelm_testkit::ids(
            &anelm_testkit::shared_json(&format!("fixtures/hf-tiny/{family}/reference.json"))
                ["cases"]["long"]["input_ids"],
        );
        let (_, rel) = diff(&all_logits(&mut sim, &ids), &all_logits(&mut cpu, &ids));
        println!("{family} gguf: relative {rel:.2e}");
        assert!(rel <= 2e-2, "{family}: {rel}");
    }
}

#[test]
fn stateful_multifunction_packages_validate() {
    // qwen2_moe: a mixture with every expert dense in the chunk and a shared expert; lfm2:
    // short convs (their history an input, B · x an output) between attention layers.
    // qwen3_next: DeltaNet layers (state and conv history inputs) and output-gated attention.
    // qwen2_moe_split: a ceiling (90000 bytes) under a layer (98944): every mixture split by
    // experts over two chunks.
    let families = [
        "llama",
        "gemma3",
        "gpt2",
        "qwen2_moe",
        "qwen2_moe_split",
        "lfm2",
        "qwen3_next",
    ];
    for family in families {
        let m = match family {
            "lfm2" => Arc::new(anelm_model::load(&anelm_testkit::repo_tiny("lfm2")).unwrap()),
            "qwen2_moe_split" => tiny("qwen2_moe"),
            _ => tiny(family),
        };
        let opts = LoweringOptions {
            context: 64,
            chunk_layers: 2,
            chunk_bytes: if family == "qwen2_moe_split" {
                90_000
            } else {
                LoweringOptions::default().chunk_bytes
            },
            ..Default::default()
        };
        let plan = fused_plan(&m, &opts).unwrap();
        assert!(plan.chunks.len() >= 2);
        if family == "qwen2_moe_split" {
            let resumed = plan.chunks.iter().filter(|c| c.resume.is_some()).count();
            assert_eq!(resumed, m.layers.len(), "{family}: {:?}", plan.chunks);
        }
        let dir = tempfile::tempdir().unwrap();
        for i in 0..plan.chunks.len() {
            let unit = build_chunk(&m, &plan, i, KvForm::States).unwrap();
            let path = dir.path().join(format!("{family}_{i}.mlpackage"));
            write_package(
                &unit.program,
                &path,
                &PackageOptions::default(),
                &BlobPolicy::default(),
            )
            .unwrap();
            let (code, report) = anelm_testkit::validate_mlpackage(&path);
            assert_eq!(code, 0, "{family} chunk {i}: {report}");
            let functions = report["summary"]["functions"].as_object().unwrap();
            assert_eq!(functions.len(), 2, "prefill and decode");
            let decode = &functions["decode"]["inputs"];
            let kv = (plan.chunks[i].layers.clone()).find(|&l| m.layers[l].attention().is_some());
            if let Some(kv) = kv {
                assert!(
                    decode[format!("k{kv}")]
                        .as_str()
                        .unwrap()
                        .starts_with("state<"),
                    "{decode}"
                );
                assert_eq!(decode["kv_begin"], "INT32[4]");
            }
            // One copy of the weights serves both functions; the prefill function alone
            // holds a DeltaNet's two triangular masks per sub-chunk of its chunked form.
            let deltas = (plan.chunks[i].layers.clone())
                .filter(|&l| matches!(m.layers[l].mixer, anelm_model::plan::Mixer::DeltaNet(_)))
                .count() as u64;
            let prefill_only = 2 * deltas * plan.width.div_ceil(plan.delta_chunk) as u64;
            let refs = report["summary"]["weights"]["blob_references"]
                .as_u64()
                .unwrap();
            assert_eq!(
                report["summary"]["weights"]["distinct_blobs"],
                (refs - prefill_only) / 2 + prefill_only,
                "{family} chunk {i}"
            );
        }
    }
}
