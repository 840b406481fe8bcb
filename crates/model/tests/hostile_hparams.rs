//! Crafted hyperparameters (zero heads, zero widths, layer counts no tensors back) are one clear
//! error naming the key, never a division by zero or a per-layer table sized by a corrupt count.

use anelm_formats::gguf_writer::GgufWriter;
use anelm_formats::{GgmlType, MetaValue};
use anelm_testkit::tiny as fixture;
use serde_json::{json, Value};

/// A Gemma-family GGUF with the given hyperparameters and one small tensor.
fn gemma_gguf(arch: &str, kv: &[(&str, u32)]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.meta_str("general.architecture", arch);
    for (k, v) in kv {
        w.meta(&format!("{arch}.{k}"), MetaValue::U32(*v));
    }
    w.tensor("token_embd.weight", GgmlType::F32, &[2, 4], vec![0; 32]);
    w.to_bytes()
}

fn gguf_error(bytes: &[u8]) -> String {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    let e = anelm_model::load(&p)
        .err()
        .expect("expected an error")
        .to_string();
    assert!(e.contains("m.gguf"), "error does not name the file: {e}");
    e
}

const BASE: [(&str, u32); 4] = [
    ("block_count", 1),
    ("embedding_length", 4),
    ("attention.head_count", 1),
    ("attention.head_count_kv", 1),
];

fn with(key: &str, value: u32) -> Vec<(&'static str, u32)> {
    let mut kv: Vec<_> = BASE.iter().filter(|(k, _)| *k != key).copied().collect();
    let k = BASE
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(k, _)| *k)
        .unwrap();
    kv.push((k, value));
    kv
}

#[test]
fn zero_heads_in_a_gemma_gguf_name_the_key() {
    // Gemma 2's 46-layer scale divides the width by the head count before any other check.
    for arch in ["gemma", "gemma2", "gemma3"] {
        let mut kv = with("attention.head_count", 0);
        kv.retain(|(k, _)| *k != "block_count");
        kv.push(("block_count", 46));
        let e = gguf_error(&gemma_gguf(arch, &kv));
        assert!(
            e.contains(&format!(
                "'{arch}.attention.head_count': must be at least 1, found 0"
            )),
            "{arch}: {e}"
        );
    }
}

#[test]
fn other_zero_hyperparameters_name_their_key() {
    for key in ["block_count", "embedding_length", "attention.head_count_kv"] {
        let e = gguf_error(&gemma_gguf("gemma2", &with(key, 0)));
        assert!(
            e.contains(&format!("'gemma2.{key}': must be at least 1")),
            "{key}: {e}"
        );
    }
    let e = gguf_error(&gemma_gguf(
        "gemma2",
        &[&BASE[..], &[("attention.key_length", 0)]].concat(),
    ));
    assert!(e.contains("'gemma2.attention.key_length'"), "{e}");
    // More heads than the width: no head dimension is left.
    let e = gguf_error(&gemma_gguf("gemma2", &with("attention.head_count", 8)));
    assert!(e.contains("8 heads in a width of 4"), "{e}");
}

#[test]
fn a_layer_count_the_tensors_cannot_back_is_refused() {
    let e = gguf_error(&gemma_gguf("gemma3", &with("block_count", u32::MAX)));
    assert!(
        e.contains("gemma3.block_count is 4294967295 but the weights hold only 1 tensors"),
        "{e}"
    );
}

fn config(arch: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("config.json")).unwrap())
        .unwrap()
}

fn hf_error(arch: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut cfg = config(arch);
    edit(cfg.as_object_mut().unwrap());
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture(arch).join("model.safetensors"),
        d.path().join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(d.path().join("config.json"), cfg.to_string()).unwrap();
    anelm_model::load(d.path())
        .err()
        .expect("expected an error")
        .to_string()
}

#[test]
fn zero_and_oversized_counts_in_config_json_name_the_key() {
    for key in [
        "num_attention_heads",
        "num_key_value_heads",
        "hidden_size",
        "num_hidden_layers",
        "head_dim",
    ] {
        let e = hf_error("gemma2", |o| {
            o.insert(key.into(), json!(0));
        });
        assert!(
            e.contains(&format!("'{key}'")) && e.contains("must be at least 1"),
            "{key}: {e}"
        );
    }
    let e = hf_error("gemma2", |o| {
        o.insert("num_hidden_layers".into(), json!(1u64 << 40));
        o.remove("layer_types");
    });
    assert!(e.contains("num_hidden_layers is 1099511627776"), "{e}");
}
