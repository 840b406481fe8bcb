//! Bad input ends with a one-line error naming the file and the problem, a non-zero exit and no
//! panic: truncated GGUF, wrong magic, unknown tensor type, data past the end, a missing tensor,
//! a config.json without a required field, a prompt id outside the vocabulary, a prompt longer
//! than the context, a KV cache type the model's heads or the device cannot hold.

use std::path::{Path, PathBuf};
use std::process::Command;

use anelm_formats::gguf_writer::GgufWriter;
use anelm_formats::{GgmlType, MetaValue};

fn anelm(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `anelm eval` on `model` and checks the failure is one clean line mentioning `needles`.
fn expect_error(model: &Path, ids: &str, needles: &[&str]) {
    let (code, stderr) = anelm(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids,
        "--json",
    ]);
    assert_eq!(code, 1, "exit code; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "'{n}' missing from: {stderr}");
    }
}

/// A minimal valid llama GGUF: 1 layer, hidden 8, 2 heads, vocab 4, F32.
fn tiny_llama() -> GgufWriter {
    let (h, f, v) = (8usize, 16usize, 4usize);
    let mut w = GgufWriter::new();
    w.meta_str("general.architecture", "llama")
        .meta("llama.block_count", MetaValue::U32(1))
        .meta("llama.embedding_length", MetaValue::U32(h as u32))
        .meta("llama.feed_forward_length", MetaValue::U32(f as u32))
        .meta("llama.attention.head_count", MetaValue::U32(2))
        .meta("llama.attention.head_count_kv", MetaValue::U32(2))
        .meta("llama.context_length", MetaValue::U32(64))
        .meta_str("tokenizer.ggml.model", "gpt2")
        .meta_str("tokenizer.ggml.pre", "gpt-2")
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                ["a", "b", "c", "d"]
                    .iter()
                    .map(|s| MetaValue::Str(s.as_bytes().to_vec()))
                    .collect(),
            ),
        )
        .meta("tokenizer.ggml.merges", MetaValue::Array(vec![]));
    let m = |r: usize, c: usize| vec![0.01f32; r * c];
    w.tensor_f32("token_embd.weight", &[v, h], &m(v, h))
        .tensor_f32("output_norm.weight", &[h], &m(1, h))
        .tensor_f32("blk.0.attn_norm.weight", &[h], &m(1, h))
        .tensor_f32("blk.0.attn_q.weight", &[h, h], &m(h, h))
        .tensor_f32("blk.0.attn_k.weight", &[h, h], &m(h, h))
        .tensor_f32("blk.0.attn_v.weight", &[h, h], &m(h, h))
        .tensor_f32("blk.0.attn_output.weight", &[h, h], &m(h, h))
        .tensor_f32("blk.0.ffn_norm.weight", &[h], &m(1, h))
        .tensor_f32("blk.0.ffn_gate.weight", &[f, h], &m(f, h))
        .tensor_f32("blk.0.ffn_up.weight", &[f, h], &m(f, h))
        .tensor_f32("blk.0.ffn_down.weight", &[h, f], &m(h, f));
    w
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn a_valid_tiny_model_runs() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "ok.gguf", &tiny_llama().to_bytes());
    let (code, stderr) = anelm(&[
        "eval",
        "--model",
        p.to_str().unwrap(),
        "--ids",
        "1,2,3",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn truncated_gguf() {
    let d = tempfile::tempdir().unwrap();
    let b = tiny_llama().to_bytes();
    let p = write(d.path(), "cut.gguf", &b[..200]);
    expect_error(&p, "1", &["cut.gguf", "truncated"]);
}

#[test]
fn wrong_magic() {
    let d = tempfile::tempdir().unwrap();
    let mut b = tiny_llama().to_bytes();
    b[..4].copy_from_slice(b"GGML");
    let p = write(d.path(), "magic.gguf", &b);
    expect_error(&p, "1", &["magic.gguf", "not a GGUF file"]);
}

#[test]
fn unknown_tensor_type() {
    let d = tempfile::tempdir().unwrap();
    let mut w = tiny_llama();
    w.tensor("blk.0.extra.weight", GgmlType::F32, &[8], vec![0; 32]);
    let mut b = w.to_bytes();
    // Patch the type id of the last tensor info (it follows its name and one u64 dim).
    let name = b"blk.0.extra.weight";
    let at = b.windows(name.len()).position(|x| x == name).unwrap() + name.len() + 4 + 8;
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    let p = write(d.path(), "type.gguf", &b);
    expect_error(
        &p,
        "1",
        &["type.gguf", "unknown ggml type id 99", "blk.0.extra.weight"],
    );
}

#[test]
fn tensor_data_past_the_end() {
    let d = tempfile::tempdir().unwrap();
    let b = tiny_llama().to_bytes();
    let p = write(d.path(), "short.gguf", &b[..b.len() - 8]);
    expect_error(&p, "1", &["short.gguf", "runs past the end"]);
}

#[test]
fn missing_tensor() {
    let d = tempfile::tempdir().unwrap();
    let full = tiny_llama().to_bytes();
    // Rename one tensor so the loader cannot find attn_q.
    let name = b"blk.0.attn_q.weight";
    let mut b = full.clone();
    let at = b.windows(name.len()).position(|x| x == name).unwrap();
    b[at..at + name.len()].copy_from_slice(b"blk.0.attn_x.weight");
    let p = write(d.path(), "missing.gguf", &b);
    expect_error(
        &p,
        "1",
        &["missing.gguf", "missing tensor 'blk.0.attn_q.weight'"],
    );
}

#[test]
fn config_without_a_required_field() {
    let d = tempfile::tempdir().unwrap();
    let src = anelm_testkit::tiny("llama");
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    json.as_object_mut().unwrap().remove("num_hidden_layers");
    std::fs::write(d.path().join("config.json"), json.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        d.path().join("model.safetensors"),
    )
    .unwrap();
    expect_error(d.path(), "1", &["config.json", "num_hidden_layers"]);
}

#[test]
fn prompt_id_outside_the_vocabulary() {
    let model = anelm_testkit::tiny("llama");
    expect_error(
        &model,
        "5,512",
        &["hf-tiny/llama", "token id 512", "outside the vocabulary"],
    );
}

#[test]
fn a_prompt_longer_than_the_context() {
    // The tiny model's context holds 64 positions.
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "short.gguf", &tiny_llama().to_bytes());
    let ids = vec!["1"; 65].join(",");
    expect_error(&p, &ids, &["65", "64"]);
    // Generation too: the prompt alone does not fit.
    {
        let args = [
            "run",
            "--model",
            p.to_str().unwrap(),
            "--ids",
            &ids,
            "-n",
            "4",
        ];
        let (code, stderr) = anelm(&args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line expected: {stderr}");
        assert!(lines[0].contains("64"), "{args:?}: {stderr}");
    }
}

/// `anelm args` fails with one `error:` line mentioning `needles`.
fn expect_one_line(args: &[&str], needles: &[&str]) {
    let (code, stderr) = anelm(args);
    assert_ne!(code, 0, "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    for n in needles {
        assert!(
            lines[0].contains(n),
            "{args:?}: '{n}' missing from: {stderr}"
        );
    }
    // clap follows its one-line error with a pointer to --help; ours is the line alone.
    assert!(
        lines.len() == 1 || (lines.len() == 2 && lines[1].contains("--help")),
        "{args:?}: {stderr}"
    );
}

#[test]
fn cache_types_the_heads_or_the_device_cannot_hold() {
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "ok.gguf", &tiny_llama().to_bytes());
    let m = p.to_str().unwrap();
    let eval = |extra: &[&'static str]| {
        let mut a = vec!["eval", "--model", m, "--ids", "1,2", "--json"];
        a.extend_from_slice(extra);
        a
    };
    // Heads of 4 dimensions are not whole blocks of 32.
    expect_one_line(
        &eval(&["--cache-type-k", "q8_0"]),
        &["--cache-type-k q8_0", "4 dimensions"],
    );
    expect_one_line(&eval(&["--cache-type-v", "q5_1"]), &["q5_1", "q8_0"]);
    // The ANE path keeps its own f16 cache.
    expect_one_line(
        &eval(&["--device", "sim", "--cache-type-v", "f32"]),
        &["--cache-type-v f32", "f16"],
    );
    let (code, stderr) = anelm(&eval(&["--cache-type-k", "f32", "--cache-type-v", "f16"]));
    assert_eq!(code, 0, "{stderr}");
}
