//! The encoder pass against transformers and sentence-transformers on the tiny BERT
//! (scripts/gen-bert-fixture.py): every token's last hidden state, and the pooled, normalised
//! embedding; the GGUF llama.cpp's converter wrote from it gives the same numbers.

use std::sync::Arc;

use anelm_cpu::encoder::EncoderRunner;
use anelm_model::encoder::{self, pool, Pooling};
use anelm_testkit::{repo_tiny, tiny_gguf};
use serde_json::Value;

fn reference() -> Value {
    let p = repo_tiny("bert").join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|x| match x {
            Value::Array(row) => row.iter().map(|y| y.as_f64().unwrap() as f32).collect(),
            y => vec![y.as_f64().unwrap() as f32],
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn bert_hidden_states_and_embeddings_match_transformers() {
    let reference = reference();
    for (path, threads) in [(repo_tiny("bert"), 2), (tiny_gguf("bert"), 1)] {
        let enc = encoder::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!((enc.hidden, enc.layers.len(), enc.n_heads), (64, 2, 4));
        assert_eq!((enc.pooling, enc.normalize), (Pooling::Mean, true));
        let runner = EncoderRunner::new(Arc::new(enc), threads);
        let mut worst = (0f32, 0f32);
        for case in reference["cases"].as_array().unwrap() {
            let ids: Vec<u32> = (case["input_ids"].as_array().unwrap().iter())
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let hidden = runner.hidden(&ids).unwrap();
            let d = max_abs_diff(&hidden, &floats(&case["hidden"]));
            let e = max_abs_diff(&runner.embed(&ids).unwrap(), &floats(&case["embedding"]));
            worst = (worst.0.max(d), worst.1.max(e));
        }
        // Hidden states are O(1) after the last LayerNorm; f32 with another summation order.
        assert!(
            worst.0 < 2e-5,
            "{}: hidden states off by {}",
            path.display(),
            worst.0
        );
        assert!(
            worst.1 < 2e-6,
            "{}: embeddings off by {}",
            path.display(),
            worst.1
        );
        println!(
            "{}: hidden {:.1e}, embedding {:.1e}",
            path.display(),
            worst.0,
            worst.1
        );
    }
}

#[test]
fn bad_input_is_one_line_each() {
    let enc = Arc::new(encoder::load(&repo_tiny("bert")).unwrap());
    let runner = EncoderRunner::new(enc.clone(), 1);
    assert!(runner.hidden(&[]).unwrap_err().contains("no tokens"));
    let long = vec![5u32; enc.max_positions + 1];
    assert!(runner
        .hidden(&long)
        .unwrap_err()
        .contains("65 tokens are more"));
    let err = runner.hidden(&[2, 100_000, 3]).unwrap_err();
    assert!(err.contains("token id 100000"), "{err}");
    // A decoder's loader names the encoder for what it is.
    let err = anelm_model::load(&repo_tiny("bert"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("embedding (encoder) model"), "{err}");
    let err = encoder::load(&anelm_testkit::tiny("llama"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an encoder"), "{err}");
}

#[test]
fn pooling_modes_pool_the_reference_hidden_states() {
    let reference = reference();
    let case = &reference["cases"][1];
    let hidden = floats(&case["hidden"]);
    let n = hidden.len() / 64;
    let cls = pool(&hidden, 64, Pooling::Cls, false);
    assert_eq!(cls, hidden[..64]);
    let last = pool(&hidden, 64, Pooling::Last, false);
    assert_eq!(last, hidden[(n - 1) * 64..]);
    let mean = pool(&hidden, 64, Pooling::Mean, true);
    assert!(max_abs_diff(&mean, &floats(&case["embedding"])) < 1e-6);
}
