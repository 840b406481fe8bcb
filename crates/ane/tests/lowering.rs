//! The projection programs of the tiny fixtures: their shape, what they avoid (ops and forms the
//! ANE rejects), and head tiling.

use std::sync::Arc;

use anelm_ane::compare::{argmax, diff};
use anelm_ane::lower::{build_unit, projection_kernels, Projection};
use anelm_ane::{LoweringOptions, ProjectionExecutor, SimDevice};
use anelm_mil::lint::{lint, Severity};
use anelm_model::{Executor, Logits};

fn tiny(family: &str) -> Arc<anelm_model::Model> {
    Arc::new(anelm_model::load(&anelm_testkit::tiny(family)).unwrap())
}

fn ops(u: &anelm_ane::CompileUnit) -> Vec<String> {
    u.program.functions[0]
        .ops()
        .iter()
        .filter(|o| !o.is_const())
        .map(|o| o.op_type.clone())
        .collect()
}

#[test]
fn kernels_per_layer_and_what_they_contain() {
    // (family, q/k/v biases, muls in the FFN: a descale per input conv, the activation's
    // (silu 1, gelu-tanh 4), the gate product, and the hidden state's normalisation (3))
    for (family, biases, ffn_muls) in [
        ("llama", false, 7),
        ("qwen2", true, 7),
        ("gpt2", true, 8),
        ("gemma", false, 10),
    ] {
        let m = tiny(family);
        let opts = LoweringOptions::default();
        let specs = projection_kernels(&m, &opts).unwrap();
        assert_eq!(specs.len(), 3 * m.n_layers() + 1, "{family}");
        for spec in &specs {
            let lowered = build_unit(&m, spec, &opts).unwrap();
            let errors: Vec<_> = lint(&lowered.unit.program)
                .into_iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            assert!(errors.is_empty(), "{family} {}: {errors:?}", spec.name);
            assert!(lowered.input_bound > 0.0);
            let ops = ops(&lowered.unit);
            assert!(
                !ops.iter()
                    .any(|o| o == "gelu" || o == "rsqrt" || o == "linear"),
                "{family} {}: {ops:?}",
                spec.name
            );
            let f = &lowered.unit.program.functions[0];
            let inputs: Vec<_> = f.inputs().iter().map(|&i| f.name_of(i)).collect();
            assert_eq!(inputs, ["x", "descale"]);
            match spec.projection {
                Projection::Qkv(_) => assert_eq!(
                    ops,
                    if biases {
                        vec!["conv", "mul", "add"]
                    } else {
                        vec!["conv", "mul"]
                    },
                    "{family}"
                ),
                Projection::Ffn(_) => {
                    assert_eq!(
                        ops.iter().filter(|o| *o == "conv").count(),
                        if family == "gpt2" { 2 } else { 3 }
                    );
                    assert!(ops.iter().any(|o| o == "sigmoid"));
                    assert_eq!(
                        ops.iter().filter(|o| *o == "mul").count(),
                        ffn_muls,
                        "{family}: {ops:?}"
                    );
                }
                _ => {}
            }
        }
    }
}

#[test]
fn a_tiled_head_gives_the_same_logits() {
    let m = tiny("gemma3");
    let ids: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 512).collect();
    let run = |opts: &LoweringOptions| {
        let mut e = ProjectionExecutor::on_device(m.clone(), SimDevice::new(), opts).unwrap();
        let mut s = e.new_state(ids.len()).unwrap();
        let mut out = Vec::new();
        e.forward(s.as_mut(), &ids, Logits::All, &mut out).unwrap();
        (
            out,
            e.projections().n_kernels(),
            e.projections().dispatches(),
        )
    };
    let (whole, k1, d1) = run(&LoweringOptions::default());
    // 512 rows in tiles of 200 (200, 200, 112), at most two tiles per program: two programs.
    let opts = LoweringOptions {
        head_tile_rows: 200,
        head_program_bytes: 2 * 200 * 64 * 2,
        ..Default::default()
    };
    let specs = projection_kernels(&m, &opts).unwrap();
    let heads: Vec<_> = specs
        .iter()
        .filter(|s| s.projection == Projection::Head)
        .collect();
    assert_eq!(
        heads.iter().map(|s| s.outputs.len()).collect::<Vec<_>>(),
        [2, 1]
    );
    assert_eq!(heads[1].outputs[0].first, 400);
    let (tiled, k2, d2) = run(&opts);
    assert_eq!(
        (k2, d2),
        (k1 + 1, d1 + 1),
        "one more program, one more dispatch per head evaluation"
    );
    let (_, rel) = diff(&tiled, &whole);
    assert!(rel < 1e-3, "relative difference {rel}");
    let am = |v: &[f32]| v.chunks_exact(512).map(argmax).collect::<Vec<_>>();
    assert_eq!(am(&tiled), am(&whole));
}

#[test]
fn both_strategies_lower_every_mixture_and_hybrid() {
    let opts = LoweringOptions::default();
    for family in anelm_testkit::MOE_HYBRID_TINY {
        let m = tiny(family);
        let plan = anelm_ane::lower::fused::fused_plan(&m, &opts).unwrap();
        assert_eq!(plan.chunks.len(), 1, "{family}: one chunk");
        // A gated DeltaNet's prefill is chunked: the full width, as every other family.
        assert_eq!(plan.width, opts.width, "{family}");
        assert_eq!(plan.delta_chunk, opts.delta_chunk, "{family}");
        // Per layer the mixer's input and output kernels, the FFN (4 experts and a shared
        // expert where there is one), and the head.
        let ffn = match &m.layers[0].ffn {
            anelm_model::plan::Ffn::Moe(moe) => 4 + usize::from(moe.shared.is_some()),
            _ => 1,
        };
        let kernels = projection_kernels(&m, &opts).unwrap();
        assert_eq!(kernels.len(), m.layers.len() * (2 + ffn) + 1, "{family}");
        anelm_ane::dequant::dequantized(&m).unwrap();
    }
}
