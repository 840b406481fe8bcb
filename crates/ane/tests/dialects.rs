//! Both MIL dialects end to end on the tiny fixtures: every program of both strategies is emitted
//! in dialect A (ios18) and B (ios16), lints without errors, prints and parses back in its
//! dialect, runs on the simulator matching the CPU, and its Core ML packages (multifunction and
//! stateful in A; one package per function, KV as inputs/outputs in B) pass coremltools'
//! validator at the matching specification version.

use std::sync::Arc;

use anelm_ane::compare::diff;
use anelm_ane::exec::FusedExecutor;
use anelm_ane::lower::fused::{build_chunk, fused_plan, KvForm};
use anelm_ane::lower::{build_unit, projection_kernels};
use anelm_ane::unit::coreml_packages;
use anelm_ane::{CompileUnit, LoweringOptions, MilDialect, ProjectionExecutor, SimDevice};
use anelm_cpu::CpuExecutor;
use anelm_mil::blob::BlobPolicy;
use anelm_mil::lint::{lint_with, LintConfig, Severity};
use anelm_mil::package::{write_package, PackageOptions};
use anelm_model::{Executor, Logits, Model};

fn tiny(family: &str) -> Arc<Model> {
    Arc::new(anelm_model::load(&anelm_testkit::tiny(family)).unwrap())
}

fn opts(dialect: MilDialect) -> LoweringOptions {
    LoweringOptions {
        context: 64,
        chunk_layers: 2,
        dialect,
        ..Default::default()
    }
}

/// Every program of both strategies (fused with the KV cache as inputs).
fn units(m: &Model, o: &LoweringOptions) -> Vec<CompileUnit> {
    let mut out: Vec<_> = projection_kernels(m, o)
        .unwrap()
        .iter()
        .map(|s| build_unit(m, s, o).unwrap().unit)
        .collect();
    let plan = fused_plan(m, o).unwrap();
    for i in 0..plan.chunks.len() {
        out.push(build_chunk(m, &plan, i, KvForm::Inputs).unwrap());
    }
    out
}

#[test]
fn every_program_in_both_dialects_lints_and_round_trips() {
    for family in ["llama", "gemma3", "gpt2"] {
        let m = tiny(family);
        for d in MilDialect::ALL {
            let header = match d {
                MilDialect::A => "program(1.3)",
                MilDialect::B => "program(1.0)",
            };
            let tag = format!("<{}>", d.opset().ios_name());
            for u in units(&m, &opts(d)) {
                assert!(u.text.starts_with(header), "{family} {d} {}", u.name);
                assert!(u.text.contains(&tag), "{family} {d} {}", u.name);
                assert!(u.program.functions.iter().all(|f| f.opset == d.opset()));
                let errors: Vec<_> = lint_with(&u.program, &LintConfig::default())
                    .into_iter()
                    .filter(|f| f.severity == Severity::Error)
                    .collect();
                assert!(errors.is_empty(), "{family} {d} {}: {errors:?}", u.name);
                let back = anelm_mil::text::parse_program(&u.text).unwrap();
                assert_eq!(back.dialect, d.mil(), "{family} {d} {}", u.name);
            }
        }
    }
}

#[test]
fn dialect_b_has_no_states() {
    let m = tiny("llama");
    let plan = fused_plan(&m, &opts(MilDialect::B)).unwrap();
    let e = build_chunk(&m, &plan, 0, KvForm::States)
        .unwrap_err()
        .to_string();
    assert!(e.contains("inputs and outputs"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

fn logits(exec: &mut dyn Executor, ids: &[u32]) -> Vec<f32> {
    let mut state = exec.new_state(ids.len() + 1).unwrap();
    let mut out = Vec::new();
    exec.forward(state.as_mut(), ids, Logits::All, &mut out)
        .unwrap();
    // One decode step as well (the fused decode function).
    let mut last = Vec::new();
    exec.forward(state.as_mut(), &[1], Logits::Last, &mut last)
        .unwrap();
    out.extend(last);
    out
}

#[test]
fn dialect_b_runs_on_the_simulator_like_the_cpu() {
    for family in ["llama", "gemma3"] {
        let m = tiny(family);
        let fx = anelm_testkit::shared_json(&format!("fixtures/hf-tiny/{family}/reference.json"));
        let ids = anelm_testkit::ids(&fx["cases"]["long"]["input_ids"]);
        let cpu = logits(&mut CpuExecutor::new(m.clone(), 1), &ids);
        let o = opts(MilDialect::B);
        let mut proj = ProjectionExecutor::on_device(m.clone(), SimDevice::new(), &o).unwrap();
        let mut fused = FusedExecutor::new(m.clone(), SimDevice::new(), &o, |_| {}).unwrap();
        for (what, exec) in [
            ("projection", &mut proj as &mut dyn Executor),
            ("fused", &mut fused),
        ] {
            let (_, rel) = diff(&logits(exec, &ids), &cpu);
            println!("{family} {what} dialect b: relative {rel:.2e}");
            assert!(rel > 0.0 && rel <= 2e-2, "{family} {what}: {rel}");
        }
    }
}

fn validate(program: &anelm_mil::Program, path: &std::path::Path, spec: i64) {
    write_package(
        program,
        path,
        &PackageOptions::default(),
        &BlobPolicy::default(),
    )
    .unwrap();
    let (code, report) = anelm_testkit::validate_mlpackage(path);
    assert_eq!(code, 0, "{}: {report}", path.display());
    assert_eq!(report["warnings"], serde_json::json!([]), "{report}");
    assert_eq!(
        report["summary"]["specificationVersion"],
        spec,
        "{}",
        path.display()
    );
}

#[test]
fn packages_of_both_dialects_validate() {
    let dir = tempfile::tempdir().unwrap();
    for family in ["llama", "gpt2"] {
        let m = tiny(family);
        for (d, spec) in [(MilDialect::A, 9), (MilDialect::B, 7)] {
            let o = opts(d);
            let mut n = 0;
            for u in units(&m, &o) {
                let packages = coreml_packages(&u.program);
                let functions = u.program.functions.len();
                match d {
                    MilDialect::A => assert_eq!(packages.len(), 1),
                    MilDialect::B => assert_eq!(packages.len(), functions),
                }
                for (function, program) in packages {
                    let name = format!("{family}_{d}_{}_{}", u.name, function.unwrap_or_default());
                    validate(
                        &program,
                        &dir.path().join(format!("{name}.mlpackage")),
                        spec,
                    );
                    n += 1;
                }
            }
            assert!(n > 0);
        }
    }
}

/// The projection kernels of a hybrid (Qwen3-Next: gated DeltaNet `qkv | z | b | a` and `out`,
/// output-gated attention, experts) and of LFM2 (short-conv `B | C | x` and `out`) in both
/// dialects: they lint without errors and print and parse back, and coremltools' validator
/// accepts their packages — dialect A all kernels in one multifunction package, dialect B one
/// package per kernel of the first layer, of the first attention layer, and the head.
#[test]
fn hybrid_projection_kernels_lint_and_validate_in_both_dialects() {
    use anelm_model::plan::Mixer;
    let dir = tempfile::tempdir().unwrap();
    let fixtures = [
        ("qwen3_next", anelm_testkit::tiny("qwen3_next")),
        ("lfm2", anelm_testkit::repo_tiny("lfm2")),
    ];
    for (family, path) in fixtures {
        let m = Arc::new(anelm_model::load(&path).unwrap());
        let attn = (m.layers.iter())
            .position(|l| matches!(l.mixer, Mixer::Attention(_)))
            .unwrap();
        assert!(
            !matches!(m.layers[0].mixer, Mixer::Attention(_)),
            "{family}"
        );
        let picked = |name: &str| {
            let layer = ["layer00_", &format!("layer{attn:02}_")]
                .iter()
                .any(|p| name.starts_with(p));
            let first_expert = !name.contains("expert") || name.ends_with("expert000");
            name == "lm_head" || (layer && first_expert)
        };
        for (d, spec) in [(MilDialect::A, 9), (MilDialect::B, 7)] {
            let o = opts(d);
            let mut package = anelm_mil::Program::new(d.mil());
            let mut singles = 0;
            for s in projection_kernels(&m, &o).unwrap() {
                let u = build_unit(&m, &s, &o).unwrap().unit;
                let errors: Vec<_> = lint_with(&u.program, &LintConfig::default())
                    .into_iter()
                    .filter(|f| f.severity == Severity::Error)
                    .collect();
                assert!(errors.is_empty(), "{family} {d} {}: {errors:?}", u.name);
                let back = anelm_mil::text::parse_program(&u.text).unwrap();
                assert_eq!(back.dialect, d.mil(), "{family} {d} {}", u.name);
                match d {
                    MilDialect::A => {
                        let mut f = u.program.functions.into_iter().next().unwrap();
                        f.name = s.name.clone();
                        package.add_function(f).unwrap();
                    }
                    MilDialect::B if picked(&s.name) => {
                        let name = format!("{family}_{d}_{}.mlpackage", s.name);
                        validate(&u.program, &dir.path().join(name), spec);
                        singles += 1;
                    }
                    MilDialect::B => {}
                }
            }
            match d {
                MilDialect::A => {
                    let name = format!("{family}_{d}.mlpackage");
                    validate(&package, &dir.path().join(name), spec);
                }
                MilDialect::B => assert!(singles >= 5, "{family}: {singles}"),
            }
        }
    }
}

/// A mixture's fused chunks (every expert dense, the top-k choice in the graph), LFM2's
/// (short convs, their history an input) and Qwen3-Next's (DeltaNet state and conv history
/// inputs, output-gated attention) in dialect B: one package per function, the KV cache
/// as inputs and outputs (and the batch function of 3 sequences, each over its own), valid at
/// specification 7 (dialect A's stateful packages: tests/fused.rs).
#[test]
fn fused_mixture_short_conv_and_deltanet_chunks_validate_in_dialect_b() {
    let dir = tempfile::tempdir().unwrap();
    let lfm2 = Arc::new(anelm_model::load(&anelm_testkit::repo_tiny("lfm2")).unwrap());
    // With batch functions of 3 sequences: per-slot caches, histories and states.
    let b = LoweringOptions {
        decode_batch: 3,
        ..opts(MilDialect::B)
    };
    // A ceiling under a tiny Qwen2-MoE layer (98944 bytes): each mixture split by experts,
    // the later part taking the pre-FFN residual `hm` and the partial sum.
    let split = LoweringOptions {
        chunk_bytes: 90_000,
        ..b.clone()
    };
    let families = [
        ("qwen2_moe", tiny("qwen2_moe"), &b),
        ("qwen2_moe_split", tiny("qwen2_moe"), &split),
        ("lfm2", lfm2, &b),
        ("qwen3_next", tiny("qwen3_next"), &b),
    ];
    for (family, m, o) in families {
        let plan = fused_plan(&m, o).unwrap();
        if family.ends_with("split") {
            assert!(plan.chunks.iter().any(|c| c.resume.is_some()), "{family}");
        }
        let mut n = 0;
        for i in 0..plan.chunks.len() {
            let u = build_chunk(&m, &plan, i, KvForm::Inputs).unwrap();
            for (function, program) in coreml_packages(&u.program) {
                let name = format!("{family}_{}_{}.mlpackage", u.name, function.unwrap());
                validate(&program, &dir.path().join(name), 7);
                n += 1;
            }
        }
        assert_eq!(
            n,
            3 * plan.chunks.len(),
            "{family}: prefill, decode and batch of every chunk"
        );
    }
}
