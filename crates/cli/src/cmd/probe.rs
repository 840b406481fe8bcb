//! `anelm probe`: the smallest end-to-end check of a driver on the real ANE — one 1×1
//! convolution (the most widely hardware-proven op, FACTS §1.5) built with anelm-mil's
//! FunctionBuilder, compiled, loaded and evaluated, its output compared with the same product
//! computed on the CPU. Off a Mac it fails with the driver's "no ANE here" error.

use std::time::Instant;

use anelm_macos::staging::ModelFiles;
use anelm_macos::{
    CoreMl, DeclaredFunction, DeclaredTensor, ElemType, Input, LoadOptions, Planar, PrivateAne,
};
use anelm_mil::blob::BlobPolicy;
use anelm_mil::package::{write_package, PackageOptions};
use anelm_mil::{FunctionBuilder, Opset, Program, TensorType, WeightData};
use anyhow::{bail, Context, Result};
use serde_json::json;

use super::common::{Device, Driver};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value_t = Driver::Private)]
    pub driver: Driver,
    /// Input and output channels of the convolution.
    #[arg(long, default_value_t = 64)]
    pub channels: usize,
    /// Columns (tokens) of the activation.
    #[arg(long, default_value_t = 64)]
    pub width: usize,
    /// Timed evaluations.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Also print the model's modelAttributes (private driver), even when their layout cannot
    /// be resolved; they are saved as JSON next to the staged program either way.
    #[arg(long)]
    pub attributes: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The whole suite instead of one conv: the open hardware questions and one program per op
    /// form the lowering emits for --model, each compared with the simulator; one report, and
    /// what failed remembered for this machine ($ANELM_PROGRAMS/probe.json).
    #[arg(long)]
    pub all: bool,
    /// --all: where the suite runs (sim checks the suite itself).
    #[arg(long, value_enum, default_value_t = Device::Ane, requires = "all")]
    pub device: Device,
    /// --all: the model whose lowering gives the op census (default: the default model).
    #[arg(short, long, requires = "all")]
    pub model: Option<String>,
    /// --all: the MIL dialects to probe.
    #[arg(long, value_enum, default_value_t = super::probe_all::Dialects::All, requires = "all")]
    pub mil_dialect: super::probe_all::Dialects,
    /// --all: also write the JSON report to this file.
    #[arg(long, requires = "all")]
    pub out: Option<std::path::PathBuf>,
}

/// Largest relative error accepted: fp16 products summed exactly and rounded once to fp16
/// (FACTS §3.6b) stay well inside it.
const TOLERANCE: f64 = 1e-2;

/// The probe's data: `y = W x` with `x` `[1, C, 1, W]` and `W` `[C, C, 1, 1]`, values spread
/// over [-0.5, 0.5) so no product is an fp16 denormal.
struct Case {
    channels: usize,
    width: usize,
    x: Vec<f32>,
    w: Vec<f32>,
}

impl Case {
    fn new(channels: usize, width: usize) -> Result<Case> {
        if channels == 0 || width == 0 || channels > 4096 || width > 4096 {
            bail!("--channels and --width must be between 1 and 4096");
        }
        let spread = |i: usize, m: usize| (i % m) as f32 / m as f32 - 0.5;
        let x = (0..channels * width)
            .map(|i| spread(i * 7 + 3, 17))
            .collect();
        let w = (0..channels * channels)
            .map(|i| spread(i * 5 + 1, 13))
            .collect();
        Ok(Case {
            channels,
            width,
            x,
            w,
        })
    }

    fn program(&self) -> Result<Program> {
        let mut f = FunctionBuilder::new("main", Opset::Ios18);
        let x = f.input("x", TensorType::fp16([1, self.channels, 1, self.width]))?;
        let w = f.weight(
            "w",
            TensorType::fp16([self.channels, self.channels, 1, 1]),
            WeightData::f16_from_f32(&self.w),
        )?;
        let y = f.name_next("y").conv1x1(x, w)?;
        f.output(y)?;
        Ok(Program::single(f.finish()?))
    }

    fn declared(&self) -> DeclaredFunction {
        let t = |name: &str| DeclaredTensor {
            name: name.into(),
            dtype: ElemType::Fp16,
            channels: self.channels,
            width: self.width,
        };
        DeclaredFunction {
            name: "main".into(),
            inputs: vec![t("x")],
            outputs: vec![t("y")],
        }
    }

    /// `y` on the CPU from the fp16-rounded operands, in f64.
    fn reference(&self) -> Vec<f64> {
        let fp16 = |v: &[f32]| {
            WeightData::f16_from_f32(v)
                .to_f32()
                .into_iter()
                .map(f64::from)
                .collect::<Vec<_>>()
        };
        let (x, w) = (fp16(&self.x), fp16(&self.w));
        let (c, n) = (self.channels, self.width);
        (0..c * n)
            .map(|i| (0..c).map(|k| w[(i / n) * c + k] * x[k * n + i % n]).sum())
            .collect()
    }

    /// A planar fp16 buffer with 64-byte rows (FACTS §4), for the Core ML path.
    fn planar(&self) -> Planar {
        Planar {
            dtype: ElemType::Fp16,
            channels: self.channels,
            width: self.width,
            channel_stride: anelm_macos::layout::fallback_channel_stride(
                ElemType::Fp16,
                self.width,
            ),
        }
    }
}

/// What `--attributes` prints when the layout cannot be resolved, before the error says why:
/// the attributes and where they were saved, as text or (`json`) one JSON object.
fn attributes_report(a: &serde_json::Value, saved: &std::path::Path, json: bool) -> Result<String> {
    Ok(if json {
        serde_json::to_string_pretty(&json!({
            "pass": false,
            "layout_resolved": false,
            "attributes_file": saved,
            "attributes": a,
        }))?
    } else {
        format!(
            "modelAttributes (saved at {}; their layout did not resolve):\n{}",
            saved.display(),
            serde_json::to_string_pretty(a)?
        )
    })
}

/// Largest absolute difference, and that over the largest reference magnitude.
fn compare(got: &[f32], want: &[f64]) -> (f64, f64) {
    let max_abs = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    let scale = want
        .iter()
        .map(|w| w.abs())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    (max_abs, max_abs / scale)
}

fn median_ms(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN) * 1e3
}

/// What one driver did.
struct Outcome {
    load_ms: f64,
    eval_ms: f64,
    output: Vec<f32>,
    notes: Vec<String>,
    attributes: Option<serde_json::Value>,
}

fn run_private(
    case: &Case,
    program: &Program,
    runs: usize,
    show_attributes: Option<bool>,
) -> Result<Outcome> {
    let driver = PrivateAne::open(LoadOptions::default())?;
    let art = anelm_mil::text::to_artifacts(program, &BlobPolicy::PerTensor)?;
    let files: Vec<(String, Vec<u8>)> = art
        .layout
        .files()
        .iter()
        .map(|f| (f.mil_path(), f.to_bytes()))
        .collect();
    let weights: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(k, b)| (k.as_str(), b.as_slice()))
        .collect();
    let start = Instant::now();
    let model = driver.load(&ModelFiles {
        name: "probe",
        mil_text: &art.text,
        weights: &weights,
    })?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    let io = match model.io(&case.declared(), 1) {
        Ok(io) => io,
        Err(e) => {
            if let Some(json) = show_attributes {
                let saved = model.saved_files().attributes_path();
                println!(
                    "{}",
                    attributes_report(model.attributes_json(), &saved, json)?
                );
            }
            return Err(model.saved_files().fail(e, &art.text).into());
        }
    };
    let mut notes = vec![format!(
        "modelAttributes saved at {}",
        model.saved_files().attributes_path().display()
    )];
    notes.extend(io.notes.iter().map(|n| format!("assumed: {n}")));
    notes.push(format!(
        "hexStringIdentifier {} ({})",
        model.identifier(),
        if model.compiled() {
            "compiled"
        } else {
            "loaded from the daemon's cache"
        }
    ));
    let (used, limit) = (driver.budget().used(), driver.budget().limit());
    notes.push(format!("compiles in this process: {used} of {limit}"));
    for d in &io.unbound {
        notes.push(format!("{}: unbound (the compiler dropped it)", d.name));
    }
    for s in io.inputs.iter().chain(&io.outputs) {
        notes.push(format!(
            "{}: symbol {}, channel stride {} B, surface {} B",
            s.name, s.symbol, s.channel_stride, s.bytes
        ));
    }
    let planar = |s: &anelm_macos::TensorSlot| Planar {
        dtype: s.dtype,
        channels: s.channels,
        width: s.width,
        channel_stride: s.channel_stride,
    };
    let (xl, yl) = (planar(&io.inputs[0]), planar(&io.outputs[0]));
    let mut req = model.request(&io)?;
    req.input(0)
        .context("the request has no input surface")?
        .write(|b| xl.write_f32(&case.x, b))??;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        model.evaluate(&req)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let output = req
        .output(0)
        .context("the request has no output surface")?
        .read(|b| yl.read_f32(b))??;
    Ok(Outcome {
        load_ms,
        eval_ms: median_ms(times),
        output,
        notes,
        attributes: Some(model.attributes_json().clone()),
    })
}

fn run_coreml(case: &Case, program: &Program, runs: usize) -> Result<Outcome> {
    let driver = CoreMl::open()?;
    let dir = std::env::temp_dir().join(format!("anelm-probe-{}", std::process::id()));
    let package = dir.join("probe.mlpackage");
    let written = write_package(
        program,
        &package,
        &PackageOptions::default(),
        &BlobPolicy::default(),
    );
    let start = Instant::now();
    let compiled = written
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(driver.compile(&package)?));
    let _ = std::fs::remove_dir_all(&dir);
    let compiled = compiled?;
    let model = driver.load(&compiled, None)?;
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    let layout = case.planar();
    let mut x = vec![0u8; layout.bytes()];
    layout.write_f32(&case.x, &mut x)?;
    let mut y = vec![0u8; layout.bytes()];
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let prediction = model.predict(
            &mut [Input {
                name: "x",
                layout,
                bytes: &mut x,
            }],
            None,
        )?;
        prediction.copy_output("y", &layout, &mut y)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let notes = vec![format!("compiled model {}", compiled.path().display())];
    Ok(Outcome {
        load_ms,
        eval_ms: median_ms(times),
        output: layout.read_f32(&y)?,
        notes,
        attributes: None,
    })
}

pub fn run(args: Args) -> Result<()> {
    if args.all {
        return super::probe_all::run(super::probe_all::Options {
            device: args.device,
            driver: args.driver,
            dialects: args.mil_dialect,
            model: args.model.as_deref(),
            json: args.json,
            out: args.out,
        });
    }
    let case = Case::new(args.channels, args.width)?;
    let program = case.program()?;
    let outcome = match args.driver {
        Driver::Private => run_private(
            &case,
            &program,
            args.runs,
            args.attributes.then_some(args.json),
        ),
        Driver::Coreml => run_coreml(&case, &program, args.runs),
    }
    .with_context(|| format!("anelm probe --driver {:?}", args.driver).to_lowercase())?;
    let (max_abs, rel) = compare(&outcome.output, &case.reference());
    let pass = rel <= TOLERANCE;
    if args.json {
        let v = json!({
            "driver": format!("{:?}", args.driver).to_lowercase(),
            "shape": [1, case.channels, 1, case.width],
            "load_ms": outcome.load_ms,
            "eval_ms_median": outcome.eval_ms,
            "max_abs_diff": max_abs,
            "max_rel_err": rel,
            "tolerance": TOLERANCE,
            "pass": pass,
            "notes": outcome.notes,
            "attributes": if args.attributes { outcome.attributes.clone() } else { None },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "probe: 1×1 conv, x [1, {c}, 1, {w}] fp16 → y [1, {c}, 1, {w}], driver {:?}",
            args.driver,
            c = case.channels,
            w = case.width
        );
        for n in &outcome.notes {
            println!("  {n}");
        }
        println!(
            "  compile + load {:.1} ms, evaluate {:.3} ms (median of {})",
            outcome.load_ms,
            outcome.eval_ms,
            args.runs.max(1)
        );
        println!(
            "max |device - cpu| = {max_abs:.5}, relative {rel:.2e} (tolerance {TOLERANCE:.0e}): {}",
            if pass { "PASS" } else { "FAIL" }
        );
        if let Some(a) = outcome.attributes.filter(|_| args.attributes) {
            println!("modelAttributes:\n{}", serde_json::to_string_pretty(&a)?);
        }
    }
    if !pass {
        bail!("the device's output differs from the CPU's by {rel:.2e} (relative), more than {TOLERANCE:.0e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_is_the_matrix_product() {
        let case = Case {
            channels: 2,
            width: 3,
            x: vec![1.0, 2.0, 3.0, 0.5, 0.25, -1.0],
            w: vec![1.0, 2.0, -1.0, 0.5],
        };
        // y[o][s] = Σ_k w[o][k] x[k][s]
        assert_eq!(case.reference(), [2.0, 2.5, 1.0, -0.75, -1.875, -3.5]);
    }

    #[test]
    fn the_program_is_one_conv_with_a_blob() {
        let case = Case::new(8, 32).unwrap();
        let art = anelm_mil::text::to_artifacts(&case.program().unwrap(), &BlobPolicy::PerTensor)
            .unwrap();
        assert!(
            art.text.contains("conv(")
                && art
                    .text
                    .contains("BLOBFILE(path = string(\"@model_path/weights/w.bin\")"),
            "{}",
            art.text
        );
        assert_eq!(art.layout.files().len(), 1);
        assert!(case
            .x
            .iter()
            .chain(&case.w)
            .all(|v| (-0.5..0.5).contains(v)));
        assert!(Case::new(0, 4).is_err());
    }

    #[test]
    fn unresolved_attributes_are_printed_with_their_file() {
        let a = json!({"NetworkStatusList": [{"Name": "main"}]});
        let p = std::path::Path::new("/tmp/anelm-probe-ABC.attributes.json");
        let text = attributes_report(&a, p, false).unwrap();
        assert!(
            text.starts_with("modelAttributes (saved at /tmp/anelm-probe-ABC.attributes.json;")
                && text.contains("\"Name\": \"main\""),
            "{text}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&attributes_report(&a, p, true).unwrap()).unwrap();
        assert_eq!(v["attributes"], a);
        assert_eq!(v["attributes_file"], "/tmp/anelm-probe-ABC.attributes.json");
        assert_eq!(v["layout_resolved"], false);
    }

    #[test]
    fn comparison_is_relative_to_the_largest_reference_value() {
        let (abs, rel) = compare(&[1.0, -4.0], &[1.01, -4.0]);
        assert!(
            (abs - 0.01).abs() < 1e-6 && (rel - 0.0025).abs() < 1e-6,
            "{abs} {rel}"
        );
        assert_eq!(compare(&[0.0], &[0.0]), (0.0, 0.0));
    }
}
