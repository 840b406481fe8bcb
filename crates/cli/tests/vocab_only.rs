//! `anelm tokenize` and `anelm template` on vocabulary-only GGUF files (llama.cpp's test
//! vocabularies, no tensors, fetched by scripts/fetch-models.py): they need no weights, while
//! commands that do say the weights are missing.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn vocab(name: &str) -> String {
    let p: PathBuf = anelm_testkit::models_dir()
        .join("llama.cpp-vocabs")
        .join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.py",
        p.display()
    );
    p.to_str().unwrap().to_string()
}

fn anelm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout_of_success(args: &[&str]) -> String {
    let out = anelm(args);
    assert!(
        out.status.success(),
        "anelm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tokenize_json(name: &str, text: &str) -> Value {
    let m = vocab(name);
    serde_json::from_str(&stdout_of_success(&[
        "tokenize", "--model", &m, "--json", text,
    ]))
    .unwrap()
}

#[test]
fn tokenize_reads_only_the_vocabulary() {
    // Ids as in llama.cpp's ggml-vocab-*.gguf.out for these strings.
    let q = tokenize_json("qwen2", " Hello World!");
    assert_eq!(q["ids"], serde_json::json!([21927, 4337, 0]));
    assert_eq!(q["pieces"], serde_json::json!([" Hello", " World", "!"]));
    let bert = tokenize_json("bert-bge", "Hello world");
    assert_eq!(bert["pieces"], serde_json::json!([" hello", " world"]));
    let m = vocab("gemma-4");
    let with_bos = stdout_of_success(&[
        "tokenize",
        "--model",
        &m,
        "--add-special",
        "--json",
        "Hello world",
    ]);
    let ids: Value = serde_json::from_str(&with_bos).unwrap();
    assert_eq!(ids["ids"], serde_json::json!([2, 9259, 1902]));
}

#[test]
fn template_reads_only_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.json");
    std::fs::write(&file, r#"[{"role": "user", "content": "Hi"}]"#).unwrap();
    let f = file.to_str().unwrap();
    let m = vocab("qwen2");
    let text = stdout_of_success(&["template", "--model", &m, "--messages", f]);
    assert!(
        text.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    // A vocabulary without a template, of a family with no built-in one, is named.
    let m = vocab("bert-bge");
    let out = anelm(&["template", "--model", &m, "--messages", f]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no chat template") && err.contains("'bert'"),
        "{err}"
    );
}

#[test]
fn running_a_vocabulary_names_the_missing_weights() {
    let m = vocab("qwen2");
    let out = anelm(&["run", "--model", &m, "--prompt", "Hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no tensors") && err.contains("vocabulary-only"),
        "{err}"
    );
}
