//! llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf, tensor-free, with the
//! .inp/.out test strings its test-tokenizer-0 checks), fetched by scripts/fetch-models.py into
//! the model cache: every string must give llama.cpp's ids exactly, or the vocabulary is refused
//! with the reason named here.

use std::path::{Path, PathBuf};

use anelm_formats::Gguf;
use anelm_testkit::models_dir;
use anelm_tokenize::{TokenizeError, Tokenizer};

/// Every vocabulary llama.cpp ships, and whether it has test strings.
const VOCABS: [(&str, bool); 19] = [
    ("aquila", false),
    ("baichuan", false),
    ("bert-bge", true),
    ("command-r", true),
    ("deepseek-coder", true),
    ("deepseek-llm", true),
    ("falcon", true),
    ("gemma-4", true),
    ("gpt-2", true),
    ("gpt-neox", false),
    ("llama-bpe", true),
    ("llama-spm", true),
    ("mpt", true),
    ("nomic-bert-moe", false),
    ("phi-3", true),
    ("qwen2", true),
    ("qwen35", true),
    ("refact", true),
    ("starcoder", true),
];

/// Vocabularies we refuse, with the words the refusal must contain.
const REFUSED: [(&str, &[&str]); 1] = [("nomic-bert-moe", &["'t5'", "Unigram"])];

fn vocab_path(name: &str) -> PathBuf {
    let p = models_dir()
        .join("llama.cpp-vocabs")
        .join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.py",
        p.display()
    );
    p
}

fn load(path: &Path) -> Result<Tokenizer, TokenizeError> {
    let gguf = Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&gguf.metadata)
}

/// The test cases of `<vocab>.inp` / `.out`, read as test-tokenizer-0 reads them: inputs split
/// on "\n__ggml_vocab_test__\n", one line of space-separated ids per input.
fn read_cases(path: &Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let p = PathBuf::from(format!("{}.{ext}", path.display()));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(i) => {
                inputs.push(rest[..i].to_string());
                rest = &rest[i + sep.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("token id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: inputs and outputs differ in number",
        path.display()
    );
    inputs.into_iter().zip(outputs).collect()
}

#[test]
fn every_llama_cpp_test_vocabulary_matches_or_is_refused_by_name() {
    let mut failures = Vec::new();
    let (mut vocabs, mut strings, mut exact) = (0, 0, 0);
    for (name, has_cases) in VOCABS {
        let path = vocab_path(name);
        let tok = match load(&path) {
            Ok(tok) => tok,
            Err(e) => {
                let msg = e.to_string();
                match REFUSED.iter().find(|(n, _)| *n == name) {
                    Some((_, words)) if words.iter().all(|w| msg.contains(w)) => {
                        println!("{name}: refused: {msg}");
                    }
                    _ => failures.push(format!("{name}: {msg}")),
                }
                continue;
            }
        };
        assert!(
            !REFUSED.iter().any(|(n, _)| *n == name),
            "{name} loads now: take it out of REFUSED"
        );
        vocabs += 1;
        if !has_cases {
            // No reference ids: the vocabulary loads and text survives a round trip.
            let text = "Hello world, 123!";
            let ids = tok.encode(text, false, false).expect("encode");
            assert!(!ids.is_empty(), "{name}: no tokens");
            let back = tok.decode_lossy(&ids);
            assert_eq!(back.trim_start(), text, "{name}: round trip");
            continue;
        }
        let cases = read_cases(&path);
        assert!(cases.len() >= 10, "{name}: only {} cases", cases.len());
        let mut ok = 0;
        for (text, want) in &cases {
            let got = tok.encode(text, false, false).expect("encode");
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!("{name} {text:?}: ours {got:?}, llama.cpp {want:?}"));
            }
        }
        println!("{name}: {ok}/{} strings exact", cases.len());
        strings += cases.len();
        exact += ok;
    }
    println!(
        "{vocabs} vocabularies load ({} refused); {exact}/{strings} test strings exact",
        REFUSED.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// WordPiece adds [CLS] ... [SEP] with special tokens, and decodes its `▁` pieces to spaces.
#[test]
fn wordpiece_special_tokens_and_decoding() {
    let tok = load(&vocab_path("bert-bge")).expect("bert-bge loads");
    let plain = tok.encode("Hello world", false, false).expect("encode");
    let special = tok.encode("Hello world", true, false).expect("encode");
    assert_eq!(special.first(), Some(&101));
    assert_eq!(special.last(), Some(&102));
    assert_eq!(&special[1..special.len() - 1], plain.as_slice());
    assert_eq!(tok.decode_lossy(&plain), " hello world");
}

/// Gemma 4 adds BOS even where the file says not to, and its pieces carry spaces as `▁`.
#[test]
fn gemma4_bos_and_pieces() {
    let tok = load(&vocab_path("gemma-4")).expect("gemma-4 loads");
    assert!(tok.add_bos());
    let ids = tok.encode("Hello world", true, false).expect("encode");
    assert_eq!(Some(ids[0]), tok.bos());
    assert_eq!(tok.decode_lossy(&ids[1..]), "Hello world");
}
