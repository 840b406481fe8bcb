//! Our GGUF tokenizers against llama.cpp's own output for the two real models
//! (../shared/fixtures/llamacpp/*.tokenize.json and the prompt ids of *.prompts.json).

mod support;

use anelm_tokenize::Tokenizer;
use support::{gguf_tokenizer, hex, ids, llamacpp_fixture, GEMMA3, SMOLLM2};

const CONVENTIONS: [(&str, bool, bool); 3] = [
    ("plain", false, false),
    ("parse_special", false, true),
    ("add_special+parse_special", true, true),
];

/// Every string under every convention, the pieces of the plain ids, and the round trip.
/// Returns the number of checks made.
fn check_tokenize_fixture(tok: &Tokenizer, fixture: &str) -> usize {
    let f = llamacpp_fixture(fixture);
    let strings = f["strings"].as_array().expect("strings");
    assert!(strings.len() >= 10, "{fixture}: too few strings");
    let mut failures = Vec::new();
    let mut checks = 0;
    for s in strings {
        let text = s["text"].as_str().expect("text");
        for (name, add_special, parse_special) in CONVENTIONS {
            let want = ids(&s[name]);
            let got = tok
                .encode(text, add_special, parse_special)
                .expect("encode");
            checks += 1;
            if got != want {
                failures.push(format!(
                    "{text:?} [{name}]: ours {got:?}, llama.cpp {want:?}"
                ));
            }
        }
        let plain = ids(&s["plain"]);
        let want_pieces: Vec<&str> = s["plain_pieces_hex"]
            .as_array()
            .expect("pieces")
            .iter()
            .map(|p| p.as_str().expect("hex"))
            .collect();
        let got_pieces: Vec<String> = plain
            .iter()
            .map(|&id| hex(&tok.token_to_piece(id)))
            .collect();
        checks += 1;
        if got_pieces != want_pieces {
            failures.push(format!(
                "{text:?} pieces: ours {got_pieces:?}, llama.cpp {want_pieces:?}"
            ));
        }
        // The parse_special pieces are given as text (partial UTF-8 shown as U+FFFD).
        let special_pieces: Vec<String> = ids(&s["parse_special"])
            .iter()
            .map(|&id| String::from_utf8_lossy(&tok.token_to_piece(id)).into())
            .collect();
        let want: Vec<&str> = s["parse_special_pieces"]
            .as_array()
            .expect("pieces")
            .iter()
            .map(|p| p.as_str().expect("text"))
            .collect();
        checks += 1;
        if special_pieces != want {
            failures.push(format!(
                "{text:?} parse_special pieces: ours {special_pieces:?}, llama.cpp {want:?}"
            ));
        }
        if s["plain_roundtrip_equal"].as_bool() == Some(true) {
            checks += 1;
            let back = tok.decode(&plain);
            if back != text.as_bytes() {
                failures.push(format!(
                    "{text:?} decodes to {:?}",
                    String::from_utf8_lossy(&back)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{fixture}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    checks
}

/// The prompts llama.cpp evaluated: tokenized as a prompt (add_special + parse_special).
fn check_prompt_ids(tok: &Tokenizer, fixture: &str) {
    let f = llamacpp_fixture(fixture);
    for p in f["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().expect("text");
        assert_eq!(
            tok.encode(text, true, true).expect("encode"),
            ids(&p["ids"]),
            "{fixture}: prompt {text:?}"
        );
        assert_eq!(
            tok.encode(text, false, true).expect("encode"),
            ids(&p["ids_without_special"]),
            "{text:?}"
        );
    }
}

/// bos/eos/eot/eog and the add flags as llama.cpp reported them.
fn check_model_block(tok: &Tokenizer, fixture: &str) {
    let m = &llamacpp_fixture(fixture)["model"];
    let id = |k: &str| m[k].as_u64().map(|v| v as u32);
    assert_eq!(
        tok.vocab_size() as u64,
        m["n_vocab"].as_u64().expect("n_vocab")
    );
    assert_eq!(tok.bos(), id("bos_id"));
    assert_eq!(tok.eos(), id("eos_id"));
    assert_eq!(tok.eot(), id("eot_id"));
    assert_eq!(tok.eog_ids(), ids(&m["eog_ids"]));
    assert_eq!(
        Some(tok.add_bos()),
        m["add_bos (llama_vocab_get_add_bos)"].as_bool()
    );
    assert_eq!(
        Some(tok.add_eos()),
        m["add_eos (llama_vocab_get_add_eos)"].as_bool()
    );
    for (eog, piece) in ids(&m["eog_ids"])
        .into_iter()
        .zip(m["eog_pieces"].as_array().expect("eog_pieces"))
    {
        assert_eq!(
            tok.token_to_piece(eog),
            piece.as_str().expect("piece").as_bytes()
        );
        assert!(tok.is_eog(eog));
    }
}

#[test]
fn smollm2_matches_llama_cpp() {
    let tok = gguf_tokenizer(SMOLLM2);
    let n = check_tokenize_fixture(&tok, "smollm2-135m-instruct-q4_1.tokenize.json");
    check_prompt_ids(&tok, "smollm2-135m-instruct-q4_1.prompts.json");
    check_model_block(&tok, "smollm2-135m-instruct-q4_1.tokenize.json");
    println!("SmolLM2: {n} tokenize checks passed");
}

#[test]
fn gemma3_matches_llama_cpp() {
    let tok = gguf_tokenizer(GEMMA3);
    let n = check_tokenize_fixture(&tok, "gemma-3-270m-q4_k_m.tokenize.json");
    check_prompt_ids(&tok, "gemma-3-270m-q4_k_m.prompts.json");
    check_model_block(&tok, "gemma-3-270m-q4_k_m.tokenize.json");
    println!("Gemma 3: {n} tokenize checks passed");
}
