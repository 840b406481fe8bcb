//! `anelm probe --all` on the simulator: the suite's report, what it remembers for the machine,
//! and the lowering taking its alternative for an op the "device" refused.

use std::path::Path;
use std::process::Command;

use anelm_testkit::{model, tiny, SMOLLM2};
use serde_json::Value;

fn anelm(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_anelm"));
    c.args(args).env_remove("ANELM_SIM_FAIL");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn probe_all(m: &Path, dialects: &str, env: &[(&str, &str)]) -> Value {
    let args = [
        "probe",
        "--all",
        "--device",
        "sim",
        "--model",
        m.to_str().unwrap(),
        "--mil-dialect",
        dialects,
        "--json",
    ];
    let (ok, out, err) = anelm(&args, env);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn cases<'a>(v: &'a Value, prefix: &str) -> Vec<&'a Value> {
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with(prefix))
        .collect()
}

#[test]
fn the_suite_passes_on_the_simulator_and_is_remembered() {
    let programs = tempfile::tempdir().unwrap();
    let p = programs.path().to_str().unwrap();
    let v = probe_all(&tiny("llama"), "all", &[("ANELM_PROGRAMS", p)]);
    assert_eq!(v["device"], "sim");
    assert_eq!(v["machine"], "simulator");
    // Every question and census case passes in both dialects, except the state case, which
    // the simulator cannot run (its reason says so).
    for c in v["cases"].as_array().unwrap() {
        if c["name"] == "state.update" && c["dialect"] == "a" {
            assert_eq!(c["result"], "fail", "{c}");
            assert!(c["reason"].as_str().unwrap().contains("simulator"), "{c}");
        } else if c["name"] == "state.update" {
            assert_eq!(c["result"], "skip", "{c}");
            assert!(c["reason"].as_str().unwrap().contains("no states"), "{c}");
        } else {
            assert_eq!(c["result"], "pass", "{c}");
            assert_eq!(c["rel_err"], 0.0, "{c}");
        }
    }
    // The census is the lowering's: the ops every layer uses are there, each form once.
    for op in ["abs", "conv", "matmul", "reshape", "reduce_max", "exp"] {
        let n = cases(&v, &format!("census.{op}."))
            .iter()
            .filter(|c| c["dialect"] == "a")
            .count();
        assert!(n >= 1, "no census case for {op}");
    }
    let forms: Vec<&str> = cases(&v, "census.")
        .iter()
        .filter(|c| c["dialect"] == "a")
        .map(|c| c["form"].as_str().unwrap())
        .collect();
    let mut unique = forms.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), forms.len());
    assert!(
        forms
            .iter()
            .any(|f| f.starts_with("matmul(") && f.contains("r3:fp16")),
        "{forms:#?}"
    );
    let memory: Value =
        serde_json::from_str(&std::fs::read_to_string(programs.path().join("probe.json")).unwrap())
            .unwrap();
    assert_eq!(memory["machines"]["simulator"]["dialects"]["a"], "accepted");
    assert_eq!(memory["machines"]["simulator"]["dialects"]["b"], "accepted");
}

#[test]
fn a_refused_op_is_remembered_and_the_lowering_writes_it_another_way() {
    let programs = tempfile::tempdir().unwrap();
    let p = programs.path().to_str().unwrap();
    let m = tiny("llama");
    let v = probe_all(
        &m,
        "a",
        &[
            ("ANELM_PROGRAMS", p),
            ("ANELM_SIM_FAIL", "compile:census_abs"),
        ],
    );
    let abs = cases(&v, "census.abs.");
    assert!(!abs.is_empty());
    for c in &abs {
        assert_eq!(c["result"], "fail", "{c}");
        assert_eq!(c["stage"], "compiling", "{c}");
        assert!(c["reason"].as_str().unwrap().contains("refused"), "{c}");
    }
    assert_eq!(v["failed_ops"]["a"], serde_json::json!(["abs"]));
    assert!(cases(&v, "census.conv.")
        .iter()
        .all(|c| c["result"] == "pass"));
    // Lowered for the same machine, the programs hold no abs, and still verify.
    let out = tempfile::tempdir().unwrap();
    let env = [("ANELM_PROGRAMS", p)];
    let (ok, _, err) = anelm(
        &[
            "compile",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--mil-dialect",
            "a",
            "--out",
            out.path().to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{err}");
    let (mut texts, mut replaced) = (0, 0);
    for e in std::fs::read_dir(out.path()).unwrap() {
        let mil = e.unwrap().path().join("model.mil");
        let text = std::fs::read_to_string(&mil).unwrap();
        assert!(!text.contains("abs("), "{}", mil.display());
        replaced += usize::from(text.contains("maximum("));
        texts += 1;
    }
    // The QKV and FFN kernels normalise their inputs by the largest magnitude.
    assert!(texts > 1 && replaced > 1, "{replaced} of {texts}");
    for strategy in ["projection", "fused"] {
        let (ok, out, err) = anelm(
            &[
                "verify",
                "--model",
                m.to_str().unwrap(),
                "--device",
                "sim",
                "--strategy",
                strategy,
                "--mil-dialect",
                "a",
                "--ids",
                "5,17,300,42,7,99",
                "--json",
            ],
            &env,
        );
        assert!(ok, "{strategy}: {err}");
        let r: Value = serde_json::from_str(&out).unwrap();
        assert!(
            r["max_rel_err"].as_f64().unwrap() <= 2e-2,
            "{strategy}: {r}"
        );
        assert_eq!(r["greedy_same_but_near_ties"], true, "{strategy}: {r}");
    }
}

#[test]
fn a_quantised_model_puts_its_weight_forms_in_the_census() {
    let programs = tempfile::tempdir().unwrap();
    let p = programs.path().to_str().unwrap();
    let v = probe_all(&model(SMOLLM2), "a", &[("ANELM_PROGRAMS", p)]);
    let forms: Vec<&str> = cases(&v, "census.conv.")
        .iter()
        .map(|c| c["form"].as_str().unwrap())
        .collect();
    assert!(
        forms
            .iter()
            .any(|f| f.contains("weight=constexpr_blockwise_shift_scale:")),
        "{forms:#?}"
    );
    assert_eq!(v["fail"], 1, "only the state case: {v}");
}

#[test]
fn bad_probe_arguments_are_one_line_errors() {
    let (ok, _, err) = anelm(&["probe", "--all", "--device", "cpu"], &[]);
    assert!(!ok);
    assert!(err.contains("not cpu"), "{err}");
    let (ok, _, err) = anelm(&["probe", "--model", "x.gguf"], &[]);
    assert!(!ok && err.contains("--all"), "{err}");
    let (ok, _, err) = anelm(
        &[
            "probe",
            "--all",
            "--device",
            "sim",
            "--model",
            "/no/such.gguf",
        ],
        &[],
    );
    assert!(!ok && err.contains("no such file"), "{err}");
}

/// Every op the fused chunks use that no hardware-proven program does, refused at once: the
/// chunks are written without them (explicit transposes, slices, channel concats) and verify.
#[test]
fn the_unproven_ops_refused_are_all_written_another_way() {
    let programs = tempfile::tempdir().unwrap();
    let p = programs.path().to_str().unwrap();
    let m = tiny("qwen3");
    let v = probe_all(
        &m,
        "a",
        &[
            ("ANELM_PROGRAMS", p),
            (
                "ANELM_SIM_FAIL",
                "compile:census_matmul,census_split,census_concat,census_abs",
            ),
        ],
    );
    assert_eq!(
        v["failed_ops"]["a"],
        serde_json::json!(["abs", "concat", "matmul", "split"])
    );
    let env = [("ANELM_PROGRAMS", p)];
    let out = tempfile::tempdir().unwrap();
    let (ok, _, err) = anelm(
        &[
            "compile",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--strategy",
            "fused",
            "--out",
            out.path().to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "{err}");
    let mut chunks = 0;
    for e in std::fs::read_dir(out.path()).unwrap() {
        let mil = e.unwrap().path().join("model.mil");
        let Ok(text) = std::fs::read_to_string(&mil) else {
            continue;
        };
        chunks += 1;
        assert!(
            text.contains("_scores_xt = transpose("),
            "{}",
            mil.display()
        );
        assert!(text.contains("_pv_yt = transpose("), "{}", mil.display());
    }
    assert!(chunks >= 1);
    let (ok, out, err) = anelm(
        &[
            "verify",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--strategy",
            "fused",
            "--ids",
            "5,17,300,42,7,99",
            "--json",
        ],
        &env,
    );
    assert!(ok, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert!(r["max_rel_err"].as_f64().unwrap() <= 2e-2, "{r}");
    assert_eq!(r["greedy_same_but_near_ties"], true, "{r}");
}

/// `anelm compile --json` of SmolLM2 for the simulator's "machine" with `probe.json` in `programs`.
fn compile_json(programs: &Path) -> Value {
    let out = tempfile::tempdir().unwrap();
    let m = model(SMOLLM2);
    let (ok, stdout, err) = anelm(
        &[
            "compile",
            "--model",
            m.to_str().unwrap(),
            "--device",
            "sim",
            "--out",
            out.path().to_str().unwrap(),
            "--json",
        ],
        &[("ANELM_PROGRAMS", programs.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    let line = stdout.lines().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

/// What the probe saw of the weight forms decides them: a failed 4-bit blockwise form holds the
/// file's integers as int8; a failed int8 form keeps fp16, saying why.
#[test]
fn the_weight_forms_follow_what_the_probe_saw() {
    let programs = tempfile::tempdir().unwrap();
    let memory = |forms: Value| {
        let v = serde_json::json!({"format": 1, "machines": {"simulator": {
            "dialects": {"a": "accepted"}, "forms": {"a": forms}}}});
        std::fs::write(programs.path().join("probe.json"), v.to_string()).unwrap();
    };
    let int4 = "conv(weight=constexpr_blockwise_shift_scale:uint4, x=r4:fp16) -> r4:fp16";
    let int8 = "conv(weight=constexpr_blockwise_shift_scale:int8, x=r4:fp16) -> r4:fp16";
    let plain = compile_json(programs.path());
    let encodings = |v: &Value| -> Vec<String> {
        let mut e: Vec<String> = (v["tensors"].as_array().unwrap().iter())
            .map(|t| t["encoding"].as_str().unwrap().to_string())
            .collect();
        e.sort();
        e.dedup();
        e
    };
    assert!(
        encodings(&plain).iter().any(|e| e.starts_with("uint4/")),
        "{:?}",
        encodings(&plain)
    );
    memory(serde_json::json!({int4: "fail", int8: "pass"}));
    let wide = compile_json(programs.path());
    assert!(
        encodings(&wide).iter().all(|e| e.starts_with("int8/")),
        "{:?}",
        encodings(&wide)
    );
    let (p, w) = (
        plain["weight_bytes"].as_u64().unwrap(),
        wide["weight_bytes"].as_u64().unwrap(),
    );
    assert!(
        w > p && w < plain["fp16_bytes"].as_u64().unwrap(),
        "{p} {w}"
    );
    memory(serde_json::json!({int4: "fail", int8: "fail"}));
    let none = compile_json(programs.path());
    assert_eq!(encodings(&none), ["fp16"]);
    let t = &none["tensors"][0];
    assert!(
        t["kept_fp16"].as_str().unwrap().contains("probe --all"),
        "{t}"
    );
}
