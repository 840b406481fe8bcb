//! The simulator on whole programs: a SwiGLU FFN written as MIL text + blob files and read
//! back, run at full and at narrowed width, against an f64 reference; ops it does not run.

use anelm_mil::sim::{Simulator, Tensor};
use anelm_mil::{blob::BlobPolicy, FunctionBuilder, Opset, Program, TensorType, WeightData};

const H: usize = 64;
const F: usize = 96;
const W: usize = 32;

fn values(n: usize, seed: u64, scale: f64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * scale) as f32
        })
        .collect()
}

fn ffn(wg: &[f32], wu: &[f32], wd: &[f32]) -> Program {
    let mut f = FunctionBuilder::new("main", Opset::Ios18);
    let x = f.input("x", TensorType::fp16([1, H, 1, W])).unwrap();
    let g = f
        .weight(
            "wg",
            TensorType::fp16([F, H, 1, 1]),
            WeightData::f16_from_f32(wg),
        )
        .unwrap();
    let u = f
        .weight(
            "wu",
            TensorType::fp16([F, H, 1, 1]),
            WeightData::f16_from_f32(wu),
        )
        .unwrap();
    let d = f
        .weight(
            "wd",
            TensorType::fp16([H, F, 1, 1]),
            WeightData::f16_from_f32(wd),
        )
        .unwrap();
    let gx = f.conv1x1(x, g).unwrap();
    let ux = f.conv1x1(x, u).unwrap();
    let s = f.sigmoid(gx).unwrap();
    let a = f.mul(gx, s).unwrap();
    let h = f.mul(a, ux).unwrap();
    let y = f.name_next("y").conv1x1(h, d).unwrap();
    f.output(y).unwrap();
    Program::single(f.finish().unwrap())
}

#[test]
fn swiglu_from_text_matches_f64_at_any_width() {
    let (wg, wu, wd) = (
        values(F * H, 1, 0.25),
        values(F * H, 2, 0.25),
        values(H * F, 3, 0.2),
    );
    let dir = tempfile::tempdir().unwrap();
    anelm_mil::text::write_model_dir(&ffn(&wg, &wu, &wd), dir.path(), &BlobPolicy::PerTensor)
        .unwrap();
    let program = anelm_mil::text::read_model_dir(dir.path()).unwrap();
    let sim = Simulator::new(&program.functions[0]).unwrap();
    assert_eq!(sim.column_width(), Some(W));

    let x = Tensor::fp16([1, H, 1, W], values(H * W, 4, 4.0)).unwrap();
    let xs = x.floats().unwrap().to_vec();
    let y = sim.run(vec![x.clone()]).unwrap().remove(0);
    let got = y.floats().unwrap();
    let (mut max_err, mut max_ref) = (0f64, 0f64);
    for t in 0..W {
        let col: Vec<f64> = (0..H).map(|c| xs[c * W + t] as f64).collect();
        let dot = |w: &[f32], r: usize, k: usize, v: &[f64]| {
            (0..k).map(|c| w[r * k + c] as f64 * v[c]).sum::<f64>()
        };
        let h: Vec<f64> = (0..F)
            .map(|r| {
                let g = dot(&wg, r, H, &col);
                g / (1.0 + (-g).exp()) * dot(&wu, r, H, &col)
            })
            .collect();
        for o in 0..H {
            let want = dot(&wd, o, F, &h);
            max_err = max_err.max((got[o * W + t] as f64 - want).abs());
            max_ref = max_ref.max(want.abs());
        }
    }
    assert!(
        max_ref > 0.1,
        "a meaningful test needs non-trivial outputs ({max_ref})"
    );
    assert!(
        max_err / max_ref < 1e-2,
        "relative error {}",
        max_err / max_ref
    );
    assert!(max_err > 0.0, "fp16 numerics are not exact");

    // The first 5 columns alone give exactly the first 5 columns of the full run.
    let narrow: Vec<f32> = (0..H).flat_map(|c| xs[c * W..c * W + 5].to_vec()).collect();
    let yn = sim
        .run(vec![Tensor::float(
            anelm_mil::DType::Fp16,
            [1, H, 1, 5],
            narrow,
        )
        .unwrap()])
        .unwrap()
        .remove(0);
    let full_cols: Vec<f32> = (0..H)
        .flat_map(|c| got[c * W..c * W + 5].to_vec())
        .collect();
    assert_eq!(yn.floats().unwrap(), &full_cols[..]);
}

#[test]
fn unsupported_ops_and_bad_inputs_are_named() {
    let src = "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 4]> x) {\n        tensor<fp16, [1, 4]> y = gelu(x = x);\n    } -> (y);\n}\n";
    let p = anelm_mil::text::parse_program(src).unwrap();
    let e = Simulator::new(&p.functions[0]).unwrap_err().to_string();
    assert!(e.contains("gelu") && e.contains("not supported"), "{e}");

    let (wg, wu, wd) = (
        values(F * H, 1, 0.25),
        values(F * H, 2, 0.25),
        values(H * F, 3, 0.2),
    );
    let sim = Simulator::new(&ffn(&wg, &wu, &wd).functions[0]).unwrap();
    let e = sim
        .run(vec![
            Tensor::fp16([1, H + 1, 1, W], vec![0.0; (H + 1) * W]).unwrap()
        ])
        .unwrap_err()
        .to_string();
    assert!(e.contains("input x"), "{e}");
}
