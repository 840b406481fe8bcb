//! `anelm bench -d` on the real SmolLM2: pp and tg run on top of a prompt already in the KV
//! cache and report the depth; a depth past the model's context is a one-line error; with a
//! JSON schema, constrained and plain decoding are measured side by side.

use std::process::Command;

use anelm_testkit::{model, SMOLLM2};
use serde_json::Value;

fn bench(args: &[&str]) -> std::process::Output {
    let m = model(SMOLLM2);
    Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(["bench", "--model", m.to_str().unwrap(), "-t", "1"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bench_at_a_depth_reports_it() {
    let out = bench(&[
        "-d",
        "96",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "--stream-reads",
        "0",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["depth"], 96);
    assert_eq!(j["context"], 8192);
    assert!(j["pp_tok_s"].as_f64().unwrap() > 0.0, "{j}");
    assert!(j["tg_tok_s"].as_f64().unwrap() > 0.0, "{j}");
    let tests: Vec<&str> = j["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(
        tests,
        ["pp16 @ d96", "tg4 @ d96", "pp16 @ d96", "tg4 @ d96"]
    );

    // The table names the depth as llama-bench does.
    let out = bench(&[
        "-d",
        "32",
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "--stream-reads",
        "0",
    ]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("tg2 @ d32"), "{table}");
}

#[test]
fn a_depth_past_the_context_is_one_line() {
    for args in [
        ["-d", "9000", "-p", "0", "-n", "1"],
        ["-d", "8000", "-p", "512", "-n", "1"],
    ] {
        let out = bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line expected: {stderr}");
        assert!(
            lines[0].starts_with("error: ")
                && lines[0].contains("holds 8192 positions")
                && lines[0].contains(&format!("-d {}", args[1])),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

/// `bench --json-schema`: constrained against plain decoding, both measured, every
/// constrained reply valid JSON. (The ratio is a measurement, not asserted here.)
#[test]
fn bench_with_a_schema_measures_both_sides() {
    let schema = anelm_testkit::workspace_root().join("bench/schemas/cities.json");
    let out = bench(&[
        "-n",
        "120",
        "-r",
        "2",
        "--json-schema",
        schema.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["all_valid_json"], true, "{v}");
    assert!(v["generated_tokens"].as_u64().unwrap() > 20, "{v}");
    for k in ["plain_tok_s", "constrained_tok_s", "mask_us_per_token"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    let bad = bench(&["--json-schema", schema.to_str().unwrap(), "--lookup"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("separate benchmarks"));
}
