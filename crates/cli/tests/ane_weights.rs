//! `anelm compile --weights`: the programs hold the file's own integer blocks. Both real
//! models, both strategies: bytes against fp16 and against the file, every Q8_0/Q5_0 tensor
//! exact, nothing kept at fp16, and the peak memory of lowering within 1.5x the
//! file plus one layer's fp16 weights.

use std::process::Command;

use anelm_testkit::{model, GEMMA3, SMOLLM2};
use serde_json::Value;

/// Runs `anelm compile` and returns its JSON report.
fn compile(file: &str, strategy: &str, weights: &str) -> Value {
    let out_dir = tempfile::tempdir().unwrap();
    let m = model(file);
    let out = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(["compile", "--model", m.to_str().unwrap(), "--out"])
        .arg(out_dir.path())
        .args(["--strategy", strategy, "--weights", weights, "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "compile {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in:\n{stdout}"));
    serde_json::from_str(line).unwrap()
}

/// The largest resident set of the children this process has waited for, in bytes.
fn children_max_rss() -> u64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) }, 0);
    u.ru_maxrss as u64 * 1024 // kilobytes on Linux
}

/// Lowers `file` with `--weights auto` under both strategies; checks every tensor's report and
/// that the children's peak memory stays within `1.5 x file + layer_fp16` bytes.
fn lower_auto(file: &str, layer_fp16: u64, max_of_file: f64) -> Vec<Value> {
    let size = std::fs::metadata(model(file)).unwrap().len();
    let reports: Vec<Value> = ["projection", "fused"]
        .iter()
        .map(|s| compile(file, s, "auto"))
        .collect();
    let rss = children_max_rss();
    eprintln!(
        "{file}: peak RSS of lowering {:.1} MB, file {:.1} MB",
        rss as f64 / 1e6,
        size as f64 / 1e6
    );
    assert!(
        rss as f64 <= 1.5 * size as f64 + layer_fp16 as f64,
        "{file}: lowering peaked at {rss} bytes"
    );
    for auto in &reports {
        // At most the file's own bytes, but where a type has no storage of its width
        // (Q5_0's 5-bit integers are held as int8).
        let held = auto["weight_bytes"].as_f64().unwrap();
        assert!(
            held <= max_of_file * size as f64,
            "{file}: {held} of {size}"
        );
        for t in auto["tensors"].as_array().unwrap() {
            let ty = t["file_type"].as_str().unwrap();
            assert!(t["kept_fp16"].is_null(), "{file}: {t}");
            if matches!(ty, "q8_0" | "q5_0" | "q4_0") {
                assert_eq!(t["exact"], true, "{file}: {t}");
            } else {
                let rel = t["max_abs_err"].as_f64().unwrap() / t["max_abs"].as_f64().unwrap();
                assert!(rel < 1e-3, "{file}: {t}");
            }
        }
    }
    reports
}

/// The auto reports against fp16 lowering of the same model.
fn against_fp16(file: &str, autos: &[Value], max_ratio: f64) {
    for (strategy, auto) in ["projection", "fused"].iter().zip(autos) {
        let fp16 = compile(file, strategy, "fp16");
        assert_eq!(
            auto["fp16_bytes"], fp16["weight_bytes"],
            "{file} {strategy}"
        );
        let ratio = auto["weight_bytes"].as_f64().unwrap() / fp16["weight_bytes"].as_f64().unwrap();
        eprintln!("{file} {strategy}: {ratio:.3}x fp16");
        assert!(ratio <= max_ratio, "{file} {strategy}: {ratio:.3}x fp16");
        assert!((fp16["tensors"].as_array().unwrap().iter()).all(|t| t["encoding"] == "fp16"));
    }
}

#[test]
fn the_programs_hold_the_files_blocks() {
    // Ascending sizes: the children's peak only grows. One layer's fp16 weights:
    // SmolLM2 576x(576+192+192+576) + 3x576x1536, Gemma 3 640x(1024+256+256) + 1024x640 + 3x640x2048.
    let smol = lower_auto(
        SMOLLM2,
        2 * (576 * (576 + 192 + 192 + 576) + 3 * 576 * 1536),
        1.0,
    );
    let gemma = lower_auto(
        GEMMA3,
        2 * (640 * (1024 + 256 + 256) + 1024 * 640 + 3 * 640 * 2048),
        1.1,
    );
    against_fp16(SMOLLM2, &smol, 0.37);
    against_fp16(GEMMA3, &gemma, 0.52);
}
