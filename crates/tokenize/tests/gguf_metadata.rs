//! GGUF tokenizers built from synthetic metadata: the vocabulary settings that steer encoding,
//! and the errors for metadata we cannot use.

use std::path::PathBuf;

use anelm_formats::{MetaValue, Metadata};
use anelm_tokenize::{TokenizeError, Tokenizer};

fn strs(items: &[&str]) -> MetaValue {
    MetaValue::Array(
        items
            .iter()
            .map(|s| MetaValue::Str(s.as_bytes().to_vec()))
            .collect(),
    )
}

fn s(v: &str) -> MetaValue {
    MetaValue::Str(v.as_bytes().to_vec())
}

/// The 256 byte stand-ins of byte-level BPE, then `extra` tokens.
fn byte_level_tokens(extra: &[&str]) -> Vec<String> {
    let mut printable: Vec<u32> = (0x21..=0x7E)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut next = 256;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(next);
            next += 1;
        }
    }
    let mut v: Vec<String> = printable
        .iter()
        .map(|&c| char::from_u32(c).unwrap().to_string())
        .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A small byte-level BPE: merges "h e", "l l", "he ll", "hell o", "Ġ w".
fn bpe_meta(pre: Option<&str>, more: Vec<(&str, MetaValue)>) -> Metadata {
    let tokens = byte_level_tokens(&["he", "ll", "hell", "hello", "Ġw", "<|end|>"]);
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let mut types = vec![MetaValue::I32(1); tokens.len()];
    *types.last_mut().unwrap() = MetaValue::I32(3);
    let mut entries = vec![
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.tokens".to_string(), strs(&token_refs)),
        (
            "tokenizer.ggml.token_type".to_string(),
            MetaValue::Array(types),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            strs(&["h e", "l l", "he ll", "hell o", "Ġ w"]),
        ),
    ];
    if let Some(p) = pre {
        entries.push(("tokenizer.ggml.pre".to_string(), s(p)));
    }
    entries.extend(more.into_iter().map(|(k, v)| (k.to_string(), v)));
    Metadata::new(PathBuf::from("synthetic.gguf"), entries)
}

fn err(meta: &Metadata) -> TokenizeError {
    match Tokenizer::from_gguf(meta) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn byte_level_bpe_merges_by_rank() {
    // Without an eos_token_id, llama.cpp's default for gpt2 vocabularies (11) applies.
    assert_eq!(
        Tokenizer::from_gguf(&bpe_meta(Some("gpt-2"), vec![]))
            .unwrap()
            .eos(),
        Some(11)
    );
    let eos = vec![("tokenizer.ggml.eos_token_id", MetaValue::U32(261))];
    let tok = Tokenizer::from_gguf(&bpe_meta(Some("gpt-2"), eos)).unwrap();
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(tok.encode("hello", false, false).unwrap(), [id("hello")]);
    // " w" merges; "orld" has no merges and stays bytes.
    let ids = tok.encode("hello world", false, false).unwrap();
    assert_eq!(
        ids,
        [id("hello"), id("Ġw"), id("o"), id("r"), id("l"), id("d")]
    );
    assert_eq!(tok.decode(&ids), b"hello world");
    // "<|end|>" is a control token: text unless special tokens are parsed.
    assert_eq!(
        tok.encode("hi<|end|>", false, true).unwrap(),
        [id("h"), id("i"), id("<|end|>")]
    );
    assert_eq!(tok.encode("<|end|>", false, false).unwrap().len(), 7);
    assert!(tok.is_special(id("<|end|>")) && !tok.is_special(id("he")));
    assert_eq!(tok.eog_ids(), [id("<|end|>")]);
    assert_eq!(
        tok.eot(),
        Some(id("<|end|>")),
        "recognised as end of turn by its text"
    );
}

#[test]
fn add_special_follows_the_metadata_flags() {
    let more = vec![
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(261)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(259)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(true)),
        ("tokenizer.ggml.add_eos_token", MetaValue::Bool(true)),
    ];
    let tok = Tokenizer::from_gguf(&bpe_meta(Some("gpt-2"), more)).unwrap();
    assert!(tok.add_bos() && tok.add_eos());
    assert_eq!(tok.encode("hello", true, false).unwrap(), [261, 259, 259]);
    assert_eq!(tok.encode("", true, false).unwrap(), [261, 259]);
    assert_eq!(tok.encode("hello", false, false).unwrap(), [259]);
}

#[test]
fn llama3_pre_adds_bos_by_default() {
    let more = vec![("tokenizer.ggml.bos_token_id", MetaValue::U32(0))];
    let tok = Tokenizer::from_gguf(&bpe_meta(Some("llama-bpe"), more)).unwrap();
    assert!(tok.add_bos());
    assert_eq!(
        tok.encode("he", true, false).unwrap(),
        [0, tok.token_id("he").unwrap()]
    );
}

#[test]
fn unknown_pre_is_an_error_naming_it() {
    let e = err(&bpe_meta(Some("my-new-pre"), vec![]));
    assert!(
        matches!(&e, TokenizeError::UnknownPre { pre, .. } if pre == "my-new-pre"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("synthetic.gguf") && msg.contains("'my-new-pre'"),
        "{msg}"
    );
}

#[test]
fn unsupported_model_is_an_error() {
    let meta = Metadata::new(
        PathBuf::from("m.gguf"),
        vec![("tokenizer.ggml.model".into(), s("t5"))],
    );
    let msg = err(&meta).to_string();
    assert!(msg.contains("m.gguf") && msg.contains("'t5'"), "{msg}");
}

#[test]
fn missing_keys_are_named() {
    let meta = Metadata::new(PathBuf::from("m.gguf"), vec![]);
    assert!(err(&meta).to_string().contains("tokenizer.ggml.model"));
    let meta = Metadata::new(
        PathBuf::from("m.gguf"),
        vec![("tokenizer.ggml.model".into(), s("llama"))],
    );
    assert!(err(&meta).to_string().contains("tokenizer.ggml.tokens"));
    let meta = Metadata::new(
        PathBuf::from("m.gguf"),
        vec![
            ("tokenizer.ggml.model".into(), s("gpt2")),
            ("tokenizer.ggml.pre".into(), s("gpt-2")),
            ("tokenizer.ggml.tokens".into(), strs(&["a", "b"])),
        ],
    );
    assert!(err(&meta).to_string().contains("tokenizer.ggml.merges"));
}

#[test]
fn inconsistent_metadata_is_an_error() {
    let short_types = vec![(
        "tokenizer.ggml.token_type",
        MetaValue::Array(vec![MetaValue::I32(1)]),
    )];
    let mut meta = bpe_meta(Some("gpt-2"), vec![]);
    // Replace token_type by a too-short array.
    let entries: Vec<(String, MetaValue)> = meta
        .entries()
        .filter(|(k, _)| *k != "tokenizer.ggml.token_type")
        .map(|(k, v)| (k.to_string(), v.clone()))
        .chain(short_types.into_iter().map(|(k, v)| (k.to_string(), v)))
        .collect();
    meta = Metadata::new(PathBuf::from("synthetic.gguf"), entries);
    let msg = err(&meta).to_string();
    assert!(
        msg.contains("tokenizer.ggml.token_type") && msg.contains("1 token types"),
        "{msg}"
    );

    let dup = Metadata::new(
        PathBuf::from("d.gguf"),
        vec![
            ("tokenizer.ggml.model".into(), s("llama")),
            ("tokenizer.ggml.tokens".into(), strs(&["<unk>", "a", "a"])),
        ],
    );
    let msg = err(&dup).to_string();
    assert!(msg.contains("duplicate token 'a' has ids 1 and 2"), "{msg}");

    let no_bos = bpe_meta(
        Some("chatglm-bpe"),
        vec![("tokenizer.ggml.add_bos_token", MetaValue::Bool(true))],
    );
    let msg = err(&no_bos).to_string();
    assert!(
        msg.contains("tokenizer.ggml.add_bos_token") && msg.contains("bos_token_id"),
        "{msg}"
    );

    let wrong_type = bpe_meta(
        Some("gpt-2"),
        vec![("tokenizer.ggml.add_bos_token", s("yes"))],
    );
    assert!(err(&wrong_type)
        .to_string()
        .contains("tokenizer.ggml.add_bos_token"));
}

#[test]
fn sentencepiece_prefix_space_and_byte_fallback() {
    let tokens = [
        "<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab", "<0x0A>", "<0xC3>", "<0xA9>",
    ];
    let scores: Vec<MetaValue> = (0..tokens.len())
        .map(|i| MetaValue::F32(-(i as f32)))
        .collect();
    let types: Vec<MetaValue> = [2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 6, 6]
        .iter()
        .map(|&t| MetaValue::I32(t))
        .collect();
    let meta = Metadata::new(
        PathBuf::from("spm.gguf"),
        vec![
            ("tokenizer.ggml.model".into(), s("llama")),
            ("tokenizer.ggml.tokens".into(), strs(&tokens)),
            ("tokenizer.ggml.scores".into(), MetaValue::Array(scores)),
            ("tokenizer.ggml.token_type".into(), MetaValue::Array(types)),
        ],
    );
    let tok = Tokenizer::from_gguf(&meta).unwrap();
    assert!(
        tok.add_bos(),
        "SentencePiece adds BOS unless the metadata says otherwise"
    );
    assert_eq!(tok.bos(), Some(1));
    // Space prefix: "ab" -> "▁ab"; the newline and é have no tokens and fall back to bytes.
    assert_eq!(tok.encode("ab\né", true, false).unwrap(), [1, 8, 9, 10, 11]);
    assert_eq!(
        tok.decode(&[8, 9, 10, 11]),
        "ab\né".as_bytes(),
        "the prefix space is dropped again"
    );
    assert_eq!(tok.token_to_piece(8), b" ab");
    assert_eq!(tok.token_to_piece(10), [0xC3]);
    // A character without a byte token becomes <unk>.
    assert_eq!(tok.encode("ab€", false, false).unwrap(), [8, 0, 0, 0]);
}
