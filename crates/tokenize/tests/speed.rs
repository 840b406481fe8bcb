//! Speed guards: building Gemma 3's 262k-token vocabulary, and encoding long text, must stay
//! far from quadratic. The bounds are loose (shared 2-core machines, debug builds); the
//! printed times are the measurement.

mod support;

use std::time::{Duration, Instant};

use anelm_formats::Gguf;
use anelm_tokenize::Tokenizer;
use support::{gguf_tokenizer, model, GEMMA3, SMOLLM2};

/// About 1000 words of mixed prose, code, digits and non-ASCII text.
fn thousand_words() -> String {
    let para = "The quick brown fox jumps over the lazy dog near the riverbank, while 42 ducks \
                quack loudly. Café naïve Привет мир 👍🏽 — fn main() { println!(\"{}\", x + 1); }\n";
    para.repeat(1000 / para.split_whitespace().count() + 1)
}

fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

#[test]
fn gemma3_builds_and_encodes_quickly() {
    let gguf = Gguf::open(model(GEMMA3)).unwrap();
    let (tok, build) = time(|| Tokenizer::from_gguf(&gguf.metadata).unwrap());
    let text = thousand_words();
    let (ids, enc) = time(|| tok.encode(&text, true, true).unwrap());
    let long = text.repeat(10);
    let (long_ids, enc_long) = time(|| tok.encode(&long, true, true).unwrap());
    println!(
        "Gemma 3: build {build:?}; {} words -> {} tokens in {enc:?}; 10x in {enc_long:?}",
        text.split_whitespace().count(),
        ids.len()
    );
    assert_eq!(tok.decode(&ids[1..]), text.as_bytes());
    assert!(long_ids.len() > 9 * ids.len());
    assert!(build < Duration::from_secs(5), "building took {build:?}");
    assert!(
        enc_long < enc * 40 + Duration::from_millis(200),
        "10x the text took {enc_long:?} vs {enc:?}"
    );
}

#[test]
fn smollm2_encodes_quickly() {
    let tok = gguf_tokenizer(SMOLLM2);
    let text = thousand_words();
    let (ids, enc) = time(|| tok.encode(&text, true, true).unwrap());
    let long = text.repeat(10);
    let (_, enc_long) = time(|| tok.encode(&long, true, true).unwrap());
    println!(
        "SmolLM2: {} tokens in {enc:?}; 10x in {enc_long:?}",
        ids.len()
    );
    assert_eq!(tok.decode(&ids), text.as_bytes());
    assert!(
        enc_long < enc * 40 + Duration::from_millis(200),
        "10x the text took {enc_long:?} vs {enc:?}"
    );
}
