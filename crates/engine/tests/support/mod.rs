//! Finding the test models: the real ones in $ANELM_MODELS (default ~/.cache/anelm/models) and
//! the tiny Hugging Face configs in ../shared/fixtures/hf-tiny. A missing model fails the test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anelm_engine::LoadedModel;

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

pub fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("ANELM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/anelm/models"));
    let p = dir.join(file);
    assert!(p.exists(), "{} is missing: run `python3 scripts/fetch-models.py`", p.display());
    p
}

pub fn hf_tiny(arch: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/hf-tiny").join(arch);
    assert!(p.exists(), "{} is missing (../shared/fixtures/hf-tiny)", p.display());
    p
}

pub fn load(path: &Path) -> Arc<LoadedModel> {
    Arc::new(LoadedModel::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}
