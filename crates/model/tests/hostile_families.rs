//! The MoE and hybrid GGUF families given broken files (copies of the tiny converted fixtures with
//! one thing changed): a missing expert tensor, an expert count the tensors do not have, a layer
//! pattern that is not booleans, a recurrent layer without its DeltaNet tensors — each one error
//! naming the file and the tensor or key, never a panic.

use anelm_formats::gguf_writer::GgufWriter;
use anelm_formats::{Gguf, MetaValue};
use anelm_testkit::tiny_gguf;

/// `name`'s fixture rewritten: `meta` may replace or drop a key, `keep` may drop a tensor.
fn edited(
    name: &str,
    meta: impl Fn(&str, &MetaValue) -> Option<MetaValue>,
    keep: impl Fn(&str) -> bool,
) -> Vec<u8> {
    let g = Gguf::open(tiny_gguf(name)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata.entries() {
        if let Some(v) = meta(k, v) {
            w.meta(k, v);
        }
    }
    for t in g.tensors.iter() {
        if keep(t.name) {
            w.tensor(t.name, t.dtype, t.shape, t.data.to_vec());
        }
    }
    w.to_bytes()
}

fn load_error(bytes: &[u8]) -> String {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("broken.gguf");
    std::fs::write(&p, bytes).unwrap();
    let e = match anelm_model::load(&p) {
        Ok(_) => panic!("a broken file loaded"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("broken.gguf"),
        "error does not name the file: {e}"
    );
    assert_eq!(e.lines().count(), 1, "not one line: {e}");
    e
}

fn same(_: &str, v: &MetaValue) -> Option<MetaValue> {
    Some(v.clone())
}

#[test]
fn an_unchanged_copy_loads() {
    // The edit machinery itself keeps a loadable file, so the refusals below are the edits'.
    for name in ["qwen2_moe", "qwen3_next", "qwen3_5"] {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("copy.gguf");
        std::fs::write(&p, edited(name, same, |_| true)).unwrap();
        anelm_model::load(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_missing_expert_tensor_is_named() {
    for (name, tensor) in [
        ("qwen2_moe", "blk.1.ffn_up_exps.weight"),
        ("qwen3_moe", "blk.2.ffn_down_exps.weight"),
        ("qwen3_next", "blk.0.ffn_gate_shexp.weight"),
        ("qwen3_next-fused", "blk.3.ffn_gate_up_exps.weight"),
    ] {
        let e = load_error(&edited(name, same, |t| t != tensor));
        // The fused file falls back to the separate tensors, which it does not have either.
        let want = tensor.replace("gate_up_exps", "gate_exps");
        assert!(e.contains(&want), "{name}: {e}");
    }
}

#[test]
fn an_expert_count_the_tensors_do_not_have_is_named() {
    for (name, arch) in [("qwen3_moe", "qwen3moe"), ("qwen3_5_moe", "qwen35moe")] {
        let key = format!("{arch}.expert_count");
        let bytes = edited(
            name,
            |k, v| {
                Some(if k == key {
                    MetaValue::U32(8)
                } else {
                    v.clone()
                })
            },
            |_| true,
        );
        let e = load_error(&bytes);
        assert!(
            e.contains("ffn_gate_inp.weight") || e.contains("_exps.weight"),
            "{name}: {e}"
        );
        assert!(e.contains('8'), "{name}: the wrong count is not shown: {e}");
    }
    // More experts per token than experts.
    let e = load_error(&edited(
        "qwen2_moe",
        |k, v| {
            Some(if k == "qwen2moe.expert_used_count" {
                MetaValue::U32(5)
            } else {
                v.clone()
            })
        },
        |_| true,
    ));
    assert!(e.contains("top-5 of 4 experts"), "{e}");
    // A missing expert key is named.
    let e = load_error(&edited(
        "qwen2_moe",
        |k, v| (k != "qwen2moe.expert_feed_forward_length").then(|| v.clone()),
        |_| true,
    ));
    assert!(e.contains("qwen2moe.expert_feed_forward_length"), "{e}");
}

#[test]
fn a_layer_pattern_that_is_not_booleans_is_named() {
    let key = "qwen3next.attention.recurrent_layers";
    let bytes = edited(
        "qwen3_next",
        |k, v| {
            Some(if k == key {
                MetaValue::Array(vec![MetaValue::Str(b"mamba".to_vec()); 4])
            } else {
                v.clone()
            })
        },
        |_| true,
    );
    let e = load_error(&bytes);
    assert!(e.contains(key) && e.contains("booleans"), "{e}");
    // Too short a pattern.
    let bytes = edited(
        "qwen3_5",
        |k, v| {
            Some(if k == "qwen35.attention.recurrent_layers" {
                MetaValue::Array(vec![MetaValue::Bool(true); 2])
            } else {
                v.clone()
            })
        },
        |_| true,
    );
    let e = load_error(&bytes);
    assert!(e.contains("2 entries for 4 layers"), "{e}");
}

#[test]
fn a_recurrent_layer_without_its_deltanet_tensors_is_named() {
    // Layer 3 is full attention; calling it recurrent asks for DeltaNet tensors it lacks.
    let bytes = edited(
        "qwen3_5",
        |k, v| {
            Some(if k == "qwen35.attention.recurrent_layers" {
                MetaValue::Array(vec![MetaValue::Bool(true); 4])
            } else {
                v.clone()
            })
        },
        |_| true,
    );
    let e = load_error(&bytes);
    assert!(e.contains("blk.3.ssm_"), "{e}");
    let e = load_error(&edited("qwen3_next", same, |t| t != "blk.1.ssm_a"));
    assert!(e.contains("blk.1.ssm_a"), "{e}");
}

#[test]
fn lfm2_layer_patterns_that_do_not_fit_are_named() {
    // GGUF: per-layer KV heads (0 = short conv) of the wrong length.
    let key = "lfm2.attention.head_count_kv";
    let e = load_error(&edited(
        "lfm2",
        |k, v| {
            Some(if k == key {
                MetaValue::Array(vec![MetaValue::U32(2); 3])
            } else {
                v.clone()
            })
        },
        |_| true,
    ));
    assert!(
        e.contains(key) && e.contains("3 entries for 6 layers"),
        "{e}"
    );
    // transformers: an unknown layer type.
    let d = tempfile::tempdir().unwrap();
    let src = anelm_testkit::repo_tiny("lfm2");
    std::fs::copy(
        src.join("model.safetensors"),
        d.path().join("model.safetensors"),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replacen("\"conv\"", "\"mamba\"", 1);
    std::fs::write(d.path().join("config.json"), cfg).unwrap();
    let e = anelm_model::load(d.path())
        .err()
        .expect("loaded")
        .to_string();
    assert!(e.contains("unknown layer type 'mamba'"), "{e}");
}
