//! The two real models through the simulator: every kernel against the f32 reference, and the
//! whole model against the CPU engine on the shared llama.cpp prompts (16 greedy tokens each).

use std::sync::Arc;

use anelm_ane::check::check_kernels;
use anelm_ane::compare::PromptCase;
use anelm_ane::verify::{verify, Reference};
use anelm_ane::{LoweringOptions, ProjectionExecutor, SimDevice};

fn model(file: &str) -> Arc<anelm_model::Model> {
    Arc::new(anelm_model::load(&anelm_testkit::model(file)).unwrap())
}

fn prompts(file: &str) -> Vec<PromptCase> {
    let v = anelm_testkit::shared_json(&format!("fixtures/llamacpp/{file}"));
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| PromptCase {
            name: p["name"].as_str().unwrap().into(),
            ids: anelm_testkit::ids(&p["ids"]),
        })
        .collect()
}

fn kernels_within(m: &Arc<anelm_model::Model>, prompt: &[u32]) {
    let checks = check_kernels(m, SimDevice::new(), &LoweringOptions::default(), prompt).unwrap();
    assert_eq!(
        checks.len(),
        2 * (3 * m.n_layers() + 1),
        "every kernel in prefill and in decode"
    );
    let worst = checks
        .iter()
        .max_by(|a, b| a.rel_err.total_cmp(&b.rel_err))
        .unwrap();
    println!(
        "worst kernel {} ({} tokens): max |diff| {:.4}, relative {:.2e}",
        worst.kernel, worst.tokens, worst.max_abs_diff, worst.rel_err
    );
    assert!(worst.rel_err <= 5e-3, "{worst:?}");
}

fn verify_model(m: &Arc<anelm_model::Model>, fixture: &str) {
    let mut dev =
        ProjectionExecutor::on_device(m.clone(), SimDevice::new(), &LoweringOptions::default())
            .unwrap();
    let report = verify(m, &mut dev, &prompts(fixture), 16, Reference::CpuF32, 0).unwrap();
    for p in &report.prompts {
        println!(
            "{:14} rel {:.2e} abs {:.4} same {}",
            p.name,
            p.max_rel_err,
            p.max_abs_diff,
            p.greedy_same()
        );
    }
    assert_eq!(report.prompts.len(), 4);
    assert!(
        report.max_rel_err() <= 2e-2,
        "max relative error {}",
        report.max_rel_err()
    );
    for p in &report.prompts {
        assert_eq!(
            p.greedy_device, p.greedy_reference,
            "{}: greedy tokens",
            p.name
        );
        assert_eq!(p.greedy_device.len(), 16);
    }
}

#[test]
fn smollm2_kernels_and_whole_model() {
    let m = model(anelm_testkit::SMOLLM2);
    kernels_within(
        &m,
        &prompts("smollm2-135m-instruct-q4_1.prompts.json")[1].ids,
    );
    verify_model(&m, "smollm2-135m-instruct-q4_1.prompts.json");
}

#[test]
fn gemma3_kernels_and_whole_model() {
    let m = model(anelm_testkit::GEMMA3);
    kernels_within(&m, &prompts("gemma-3-270m-q4_k_m.prompts.json")[3].ids);
    verify_model(&m, "gemma-3-270m-q4_k_m.prompts.json");
}
