//! The program cache, the CPU fallback and `--layers-per-chunk` through the `anelm` binary on
//! the simulator: a second verify with the same ANELM_PROGRAMS compiles nothing and a damaged
//! entry is rebuilt with one warning; a unit the device refuses (the ANELM_SIM_FAIL testing
//! hook) is one warning line and the CPU engine's text with `--fallback cpu`, one error line
//! naming the unit with `--fallback none`; one layer per chunk gives a program per layer and
//! the same greedy tokens.

use std::path::Path;
use std::process::Command;

use anelm_testkit::tiny;
use serde_json::Value;

fn anelm(args: &[&str], env: &[(&str, &Path)], fail: Option<&str>) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_anelm"));
    c.args(args)
        .env_remove("ANELM_SIM_FAIL")
        .env_remove("ANELM_PROGRAMS");
    for (k, v) in env {
        c.env(k, v);
    }
    if let Some(f) = fail {
        c.env("ANELM_SIM_FAIL", f);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Stderr lines that are not the loading spinner.
fn lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("loading"))
        .collect()
}

#[test]
fn a_second_verify_loads_every_program_from_the_cache() {
    let m = tiny("qwen3");
    let dir = tempfile::tempdir().unwrap();
    let env = [("ANELM_PROGRAMS", dir.path())];
    let args = [
        "verify",
        "--model",
        m.to_str().unwrap(),
        "--device",
        "sim",
        "--ids",
        "5,17,300,42",
        "--greedy",
        "4",
        "--json",
    ];
    let run = || {
        let (ok, out, err) = anelm(&args, &env, None);
        assert!(ok, "{err}");
        (json(&out), err)
    };
    let (first, _) = run();
    let programs = first["programs"].as_u64().unwrap();
    assert!(programs > 1);
    assert_eq!(
        first["cache"]["compiled"].as_u64(),
        Some(programs),
        "{first}"
    );
    assert_eq!(first["cache"]["loaded"], 0);
    let (second, err) = run();
    assert_eq!(second["cache"]["compiled"], 0, "{second}");
    assert_eq!(second["cache"]["loaded"].as_u64(), Some(programs));
    assert!(!err.contains("program cache"), "{err}");
    assert_eq!(
        second["prompts"], first["prompts"],
        "the cached programs compute the same"
    );

    // Damage one entry: one warning, that unit compiled again, the rest loaded.
    let tag = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let entry = std::fs::read_dir(&tag)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(entry.join("model.mil"), "program(1.3)\n{}").unwrap();
    let (third, err) = run();
    assert_eq!(third["cache"]["repaired"], 1, "{third}");
    assert_eq!(third["cache"]["compiled"], 1);
    assert_eq!(third["cache"]["loaded"].as_u64(), Some(programs - 1));
    let warnings: Vec<_> = lines(&err)
        .into_iter()
        .filter(|l| l.contains("program cache"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("model.mil has changed"), "{err}");
    assert_eq!(third["prompts"], first["prompts"]);
}

fn run_ids(m: &Path, extra: &[&str], fail: Option<&str>) -> (bool, Option<Value>, String) {
    let mut args = vec![
        "run",
        "--model",
        m.to_str().unwrap(),
        "--ids",
        "1,2,3",
        "-n",
        "12",
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = anelm(&args, &[], fail);
    (ok, ok.then(|| json(&out)), err)
}

#[test]
fn a_refused_unit_falls_back_to_the_cpu_or_fails_in_one_line() {
    let m = tiny("llama");
    let (ok, cpu, err) = run_ids(&m, &[], None);
    assert!(ok, "{err}");
    let cpu_ids = cpu.unwrap()["ids"].clone();
    assert_eq!(cpu_ids.as_array().unwrap().len(), 12);
    let sim = ["--device", "sim"];
    let (ok, plain, err) = run_ids(&m, &sim, None);
    assert!(ok && lines(&err).is_empty(), "{err}");
    assert_eq!(
        plain.unwrap()["ids"],
        cpu_ids,
        "the fixture's greedy text agrees on both"
    );

    for (fail, unit, stage) in [
        ("layer02_ffn", "layer02_ffn", "compiling"),
        ("bind:layer00_o", "layer00_o", "binding"),
        ("evaluate:lm_head", "lm_head", "evaluating"),
    ] {
        let fallback = ["--device", "sim", "--fallback", "cpu"];
        let (ok, out, err) = run_ids(&m, &fallback, Some(fail));
        assert!(ok, "{fail}: {err}");
        assert_eq!(
            out.unwrap()["ids"],
            cpu_ids,
            "{fail}: the CPU engine's greedy tokens"
        );
        let l = lines(&err);
        assert_eq!(l.len(), 1, "{fail}: one warning line: {err}");
        assert!(
            l[0].starts_with(&format!("warning: sim: {stage} {unit}: refused"))
                && l[0].ends_with("continuing on the CPU engine (--fallback none to fail instead)"),
            "{fail}: {err}"
        );

        for none in [&["--device", "sim", "--fallback", "none"][..], &sim[..]] {
            let (ok, _, err) = run_ids(&m, none, Some(fail));
            assert!(!ok, "{fail} {none:?}: exits non-zero");
            let l = lines(&err);
            assert_eq!(l.len(), 1, "{fail}: {err}");
            assert!(
                l[0].starts_with(&format!("error: sim: {stage} {unit}: refused")),
                "{err}"
            );
        }
    }
    let (ok, _, err) = run_ids(&m, &sim, Some("load:x"));
    assert!(
        !ok && err.contains("stage load is not compile, bind or evaluate"),
        "{err}"
    );
}

#[test]
fn one_layer_per_chunk_gives_a_program_per_layer_and_the_same_tokens() {
    let m = tiny("llama");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("config.json")).unwrap()).unwrap();
    let layers = config["num_hidden_layers"].as_u64().unwrap();
    assert!(layers > 1);
    let verify = |extra: &[&str]| {
        let mut args = vec![
            "verify",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--strategy",
            "fused",
            "--ids",
            "1,2,3",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (ok, out, err) = anelm(&args, &[], None);
        assert!(ok, "{err}");
        json(&out)
    };
    let whole = verify(&[]);
    let split = verify(&["--layers-per-chunk", "1"]);
    assert_eq!(whole["programs"], 1, "{whole}");
    // The head joins the last chunk when it fits there, as here.
    assert_eq!(split["programs"].as_u64(), Some(layers), "{split}");
    assert_eq!(split["dispatches_per_token"].as_u64(), Some(layers));
    assert_eq!(split["greedy_same"], true);
    assert_eq!(
        split["prompts"][0]["greedy_device"], whole["prompts"][0]["greedy_device"],
        "the same greedy tokens"
    );
    let units = split["cache"]["units"].as_object().unwrap();
    assert_eq!(units.len() as u64, layers);
    assert!(units.contains_key("chunk0") && units.contains_key(&format!("chunk{}", layers - 1)));

    let d = tempfile::tempdir().unwrap();
    let (ok, out, err) = anelm(
        &[
            "compile",
            "--model",
            m.to_str().unwrap(),
            "--strategy",
            "fused",
            "--layers-per-chunk",
            "1",
            "--out",
            d.path().to_str().unwrap(),
        ],
        &[],
        None,
    );
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("{layers} chunks (at most 1 layers")),
        "{out}"
    );
    for bad in [
        &["--layers-per-chunk", "0", "--strategy", "fused"][..],
        &["--layers-per-chunk", "2"][..],
    ] {
        let mut args = vec![
            "run",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--ids",
            "1",
        ];
        args.extend_from_slice(bad);
        let (ok, _, err) = anelm(&args, &[], None);
        assert!(!ok, "{bad:?}");
        assert!(
            lines(&err)[0].starts_with("error: ") && err.contains("--layers-per-chunk"),
            "{err}"
        );
    }
}
