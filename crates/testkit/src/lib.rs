//! Where tests find what they need: the workspace, `../shared` (fixtures, tools), the cached
//! models and the Python checkers. Every lookup fails with a message saying how to provide the
//! missing piece — tests never skip silently.

use std::path::{Path, PathBuf};

pub mod fake_hub;

use serde_json::Value;

pub mod exec;
pub use exec::{Around, FnExec, TokenState};

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// The dense tiny HF fixtures (../shared/fixtures/hf-tiny).
pub const DENSE_TINY: [&str; 8] = [
    "llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "gpt2",
];
/// The tiny mixture-of-experts and hybrid (gated DeltaNet) fixtures.
pub const MOE_HYBRID_TINY: [&str; 5] = [
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
];
/// The tiny fixtures that also ship a model.gguf.
pub const TINY_WITH_GGUF: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The read-only shared material, present at `../shared` beside the repository (in CI too).
pub fn shared_dir() -> PathBuf {
    let d = workspace_root().join("../shared");
    assert!(
        d.is_dir(),
        "{} is missing: the shared fixtures must sit beside the repository",
        d.display()
    );
    d
}

/// A path under `../shared`.
pub fn shared(rel: &str) -> PathBuf {
    shared_dir().join(rel)
}

/// A tiny HF fixture directory, e.g. `tiny("gemma3")`.
pub fn tiny(arch: &str) -> PathBuf {
    shared(&format!("fixtures/hf-tiny/{arch}"))
}

/// Runs the program `exe` with `args`: (success, stdout, stderr).
pub fn run_program(exe: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{exe}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A tiny HF fixture kept in this repository (families ../shared/fixtures/hf-tiny lacks; made by
/// a generator in scripts/, e.g. scripts/gen-lfm2-fixture.py), e.g. `repo_tiny("lfm2")`.
pub fn repo_tiny(arch: &str) -> PathBuf {
    workspace_root().join(format!("crates/testkit/fixtures/hf-tiny/{arch}"))
}

/// Tiny families that between them hold every kind of layer the engines run: dense with and
/// without sliding windows and soft-caps, GPT-2's fused projections, MoE (with a shared
/// expert), and hybrids whose DeltaNet or short-conv (LFM2) layers carry recurrent state.
pub const EVERY_LAYER_KIND: [&str; 10] = [
    "llama",
    "gemma2",
    "gemma3",
    "mistral",
    "gpt2",
    "qwen3",
    "qwen2_moe",
    "qwen3_next",
    "qwen3_5_moe",
    "lfm2",
];

/// A tiny HF fixture wherever it is kept: this repository's (`repo_tiny`) for the families
/// ../shared lacks, else ../shared's (`tiny`).
pub fn any_tiny(arch: &str) -> PathBuf {
    let here = repo_tiny(arch);
    if here.is_dir() {
        here
    } else {
        tiny(arch)
    }
}

/// `n` token ids below `vocab` from a xorshift stream, different for each `seed`.
pub fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// A GGUF that llama.cpp's converter made from a tiny HF fixture (scripts/gen-gguf-fixtures.py),
/// e.g. `tiny_gguf("qwen3_moe")` for `crates/testkit/fixtures/gguf-tiny/qwen3_moe.gguf`.
pub fn tiny_gguf(name: &str) -> PathBuf {
    workspace_root().join(format!("crates/testkit/fixtures/gguf-tiny/{name}.gguf"))
}

/// A JSON file under `../shared`.
pub fn shared_json(rel: &str) -> Value {
    let p = shared(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The model cache: `$ANELM_MODELS`, else `~/.cache/anelm/models`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("ANELM_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
            .join(".cache/anelm/models"),
    }
}

/// A cached model file; fails when it is missing.
pub fn model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(
        p.exists(),
        "model {} is missing: run scripts/fetch-models.py",
        p.display()
    );
    p
}

/// The Python with the checkers (coremltools, gguf-py): `$ANELM_PYTHON`, else
/// `<workspace>/.venv/bin/python`; fails when neither exists.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("ANELM_PYTHON") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "ANELM_PYTHON={} does not exist", p.display());
        return p;
    }
    let venv = workspace_root().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no Python checker: {} is missing and ANELM_PYTHON is not set; run scripts/setup-python.sh",
        venv.display()
    );
    venv
}

/// A JSON array of integers as token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

pub use anelm_model::argmax;

/// Runs ../shared/tools/validate_mlpackage.py --json on a package: (exit code, report). Exit 0
/// means valid, 1 invalid; a setup problem (exit 2) fails the test.
pub fn validate_mlpackage(pkg: &Path) -> (i32, Value) {
    let tool = shared("tools/validate_mlpackage.py");
    let out = std::process::Command::new(python())
        .arg(&tool)
        .arg("--json")
        .arg(pkg)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python().display()));
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        code != 2,
        "validator setup problem: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("validator output is not JSON ({e}): {stdout}"));
    (code, report)
}
