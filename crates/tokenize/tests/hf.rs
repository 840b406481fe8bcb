//! The Hugging Face path: tokenizer.json (+ tokenizer_config.json) through the `tokenizers`
//! crate. There is no HF tokenizer in the fixtures, so the tests write their own: a tiny
//! byte-level BPE, and SmolLM2's tokenizer rebuilt from its GGUF vocabulary, which must then
//! tokenize every fixture string exactly like the GGUF path.

mod support;

use std::path::Path;

use anelm_formats::Gguf;
use anelm_tokenize::Tokenizer;
use serde_json::{json, Value};
use support::{gguf_tokenizer, ids, llamacpp_fixture, model, SMOLLM2};

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn added(id: u32, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": special})
}

/// A byte-level BPE over a few characters: vocab, merges, ByteLevel pre-tokenizer and decoder.
fn tiny_tokenizer_json() -> Value {
    let vocab = json!({"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "he": 8, "ll": 9,
                       "hell": 10, "hello": 11, "Ġw": 12, "Ã": 13, "©": 14, "Ã©": 15});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(16, "<s>", true), added(17, "</s>", true), added(18, "<|im_end|>", true)],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "Ã ©"]}
    })
}

#[test]
fn tiny_byte_level_bpe() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tokenizer.json", &tiny_tokenizer_json());
    write(
        dir.path(),
        "tokenizer_config.json",
        &json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true, "add_eos_token": false}),
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 19);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (Some(16), Some(17), Some(18))
    );
    assert!(tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.eog_ids(), [17, 18]);
    assert_eq!(
        tok.encode("hello world", false, false).unwrap(),
        [11, 12, 3, 6, 2, 7]
    );
    assert_eq!(tok.encode("hello", true, false).unwrap(), [16, 11]);
    assert_eq!(tok.encode("hello</s>", false, true).unwrap(), [11, 17]);
    assert_ne!(
        tok.encode("hello</s>", false, false).unwrap(),
        [11, 17],
        "special text stays text"
    );
    assert_eq!(tok.token_to_piece(12), b" w");
    assert_eq!(tok.token_to_piece(13), [0xC3], "half of é");
    assert_eq!(tok.encode("é", false, false).unwrap(), [15]);
    let ids = tok.encode("hello wé</s>", true, true).unwrap();
    assert_eq!(tok.decode(&ids), "<s>hello wé</s>".as_bytes());
    assert!(tok.is_special(17) && !tok.is_special(11));
    assert_eq!(tok.token_id("hell"), Some(10));
}

#[test]
fn post_processor_decides_without_explicit_flags() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tiny_tokenizer_json();
    t["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [16], "tokens": ["<s>"]}}
    });
    write(dir.path(), "tokenizer.json", &t);
    write(
        dir.path(),
        "tokenizer_config.json",
        &json!({"bos_token": "<s>", "eos_token": "</s>"}),
    );
    write(
        dir.path(),
        "generation_config.json",
        &json!({"eos_token_id": [17, 5]}),
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.encode("hello", true, false).unwrap(), [16, 11]);
    assert_eq!(tok.encode("hello", false, false).unwrap(), [11]);
    assert_eq!(
        tok.eog_ids(),
        [5, 17, 18],
        "generation_config's eos ids end generation too"
    );
}

#[test]
fn bad_hf_dirs_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let msg = Tokenizer::from_hf_dir(dir.path())
        .expect_err("no tokenizer.json")
        .to_string();
    assert!(msg.contains("tokenizer.json"), "{msg}");
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    let msg = Tokenizer::from_hf_dir(dir.path())
        .expect_err("bad json")
        .to_string();
    assert!(msg.contains("tokenizer.json"), "{msg}");
    write(dir.path(), "tokenizer.json", &tiny_tokenizer_json());
    write(
        dir.path(),
        "tokenizer_config.json",
        &json!({"add_bos_token": "yes"}),
    );
    let msg = Tokenizer::from_hf_dir(dir.path())
        .expect_err("bad flag")
        .to_string();
    assert!(
        msg.contains("tokenizer_config.json") && msg.contains("add_bos_token"),
        "{msg}"
    );
}

/// SmolLM2's tokenizer.json as Hugging Face ships it, rebuilt from the GGUF vocabulary:
/// digits isolated, then GPT-2's byte-level split; control tokens as special added tokens.
fn smollm2_tokenizer_json() -> Value {
    let gguf = Gguf::open(model(SMOLLM2)).unwrap();
    let meta = &gguf.metadata;
    let tokens = meta
        .byte_strings_opt("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap();
    let types = meta
        .i64_array_opt("tokenizer.ggml.token_type")
        .unwrap()
        .unwrap();
    let merges = meta
        .byte_strings_opt("tokenizer.ggml.merges")
        .unwrap()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (text(t), json!(i)))
        .collect();
    let added_tokens: Vec<Value> = (0..tokens.len())
        .filter(|&i| types[i] == 3)
        .map(|i| added(i as u32, &text(tokens[i]), true))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges.iter().map(|m| text(m)).collect::<Vec<_>>()}
    })
}

#[test]
fn smollm2_rebuilt_as_hf_matches_the_gguf_path() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tokenizer.json", &smollm2_tokenizer_json());
    write(
        dir.path(),
        "tokenizer_config.json",
        &json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": false}),
    );
    let hf = Tokenizer::from_hf_dir(dir.path()).unwrap();
    let gguf = gguf_tokenizer(SMOLLM2);
    assert_eq!(hf.vocab_size(), gguf.vocab_size());
    assert_eq!(
        (hf.bos(), hf.eos(), hf.eot()),
        (gguf.bos(), gguf.eos(), gguf.eot())
    );
    assert_eq!(hf.eog_ids(), gguf.eog_ids());
    let fixture = llamacpp_fixture("smollm2-135m-instruct-q4_1.tokenize.json");
    let mut texts: Vec<String> = fixture["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect();
    let prompts = llamacpp_fixture("smollm2-135m-instruct-q4_1.prompts.json");
    texts.extend(
        prompts["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["text"].as_str().unwrap().to_string()),
    );
    let mut checked = 0;
    for text in &texts {
        for (add_special, parse_special) in [(false, false), (false, true), (true, true)] {
            let want = gguf.encode(text, add_special, parse_special).unwrap();
            assert_eq!(
                hf.encode(text, add_special, parse_special).unwrap(),
                want,
                "{text:?} {add_special} {parse_special}"
            );
            assert_eq!(hf.decode(&want), gguf.decode(&want), "{text:?}");
            checked += 1;
        }
    }
    // And against llama.cpp directly.
    for s in fixture["strings"].as_array().unwrap() {
        assert_eq!(
            hf.encode(s["text"].as_str().unwrap(), false, false)
                .unwrap(),
            ids(&s["plain"])
        );
    }
    println!("{checked} encodings identical between the HF and GGUF paths");
}
