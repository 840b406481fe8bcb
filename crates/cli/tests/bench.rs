//! `anelm bench -d` on the real SmolLM2: pp and tg run on top of a prompt already in the KV
//! cache and report the depth; a depth past the model's context is a one-line error.

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
