//! Every family of `tokenizer.ggml.pre` against llama.cpp: SmolLM2's vocabulary and merges
//! with the pre-tokenizer name replaced, on mixed text (tests/data/llamacpp_pre_tokenizers.json,
//! made with llama.cpp itself; its "about" field says how).

mod support;

use anelm_formats::{Gguf, MetaValue, Metadata};
use anelm_tokenize::Tokenizer;
use serde_json::Value;
use support::{hex, model, SMOLLM2};

fn with_pre(meta: &Metadata, pre: &str) -> Metadata {
    let entries = meta
        .entries()
        .map(|(k, v)| {
            let v = if k == "tokenizer.ggml.pre" {
                MetaValue::Str(pre.as_bytes().to_vec())
            } else {
                v.clone()
            };
            (k.to_string(), v)
        })
        .collect();
    Metadata::new(meta.path().to_path_buf(), entries)
}

#[test]
fn every_pre_tokenizer_family_matches_llama_cpp() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/llamacpp_pre_tokenizers.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let texts: Vec<&str> = data["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let gguf = Gguf::open(model(SMOLLM2)).unwrap();
    let pres = data["pre"].as_object().unwrap();
    assert!(pres.len() >= 20);
    let mut failures = Vec::new();
    let mut distinct = std::collections::HashSet::new();
    for (pre, expected) in pres {
        let tok = Tokenizer::from_gguf(&with_pre(&gguf.metadata, pre))
            .unwrap_or_else(|e| panic!("{pre}: {e}"));
        let want_ids = expected["ids"].as_array().unwrap();
        let decoded = expected["decoded"].as_object().unwrap();
        let mut all = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let got = tok.encode(text, false, false).unwrap();
            let got_str = got.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            if got_str != want_ids[i].as_str().unwrap() {
                failures.push(format!(
                    "{pre} {text:?}:\n  ours      {got_str}\n  llama.cpp {}",
                    want_ids[i]
                ));
            }
            let want_decoded = decoded
                .get(&i.to_string())
                .map_or_else(|| hex(text.as_bytes()), |d| d.as_str().unwrap().into());
            if hex(&tok.decode(&got)) != want_decoded {
                failures.push(format!("{pre} {text:?}: decode differs"));
            }
            all.push(got_str);
        }
        distinct.insert(all);
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        distinct.len() >= 15,
        "the pre-tokenizers should not all split alike ({} distinct)",
        distinct.len()
    );
    println!(
        "{} pre-tokenizers x {} texts identical to llama.cpp",
        pres.len(),
        texts.len()
    );
}
