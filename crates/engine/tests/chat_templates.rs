//! Chat-template goldens: every conversation of tests/fixtures/chat_templates/conversations.json
//! rendered for each model, compared byte for byte with what transformers' apply_chat_template
//! produced (scripts/gen-template-goldens.py wrote the fixtures). The template is the one anelm
//! picks for the model: SmolLM2's own (GGUF metadata), Gemma 3's built-in fallback (its GGUF
//! has none), and the family fallbacks of the tiny Hugging Face configs (no tokenizer).

use std::path::PathBuf;

use anelm_engine::{LoadedModel, Message, RenderOptions};
use anelm_testkit::{model as model_path, tiny as hf_tiny, GEMMA3, SMOLLM2};
use anelm_tokenize::ChatTemplateError;
use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn load(path: &std::path::Path) -> std::sync::Arc<LoadedModel> {
    std::sync::Arc::new(
        LoadedModel::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

fn check(case: &str, model: PathBuf) {
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(&format!("chat_templates/{case}.json"))).unwrap(),
    )
    .unwrap();
    let conversations: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("chat_templates/conversations.json")).unwrap(),
    )
    .unwrap();
    let loaded: std::sync::Arc<LoadedModel> = load(&model);
    let template = loaded.chat_template().unwrap();

    // The same template and special-token strings the script used.
    let origin = template.origin().to_string();
    match golden["template"].as_str().unwrap() {
        "gguf" => assert!(
            origin.contains("tokenizer.chat_template"),
            "{case}: {origin}"
        ),
        builtin => assert_eq!(
            format!(
                "built-in template '{}'",
                builtin.trim_start_matches("builtin:")
            ),
            origin,
            "{case}"
        ),
    }
    assert_eq!(
        template.bos_token(),
        golden["bos_token"].as_str(),
        "{case}: bos_token"
    );
    assert_eq!(
        template.eos_token(),
        golden["eos_token"].as_str(),
        "{case}: eos_token"
    );

    let renders = golden["renders"].as_array().unwrap();
    assert_eq!(
        renders.len(),
        2 * conversations.as_object().unwrap().len(),
        "{case}: every conversation, both ways"
    );
    for r in renders {
        let name = r["conversation"].as_str().unwrap();
        let messages: Vec<Message> = serde_json::from_value(conversations[name].clone()).unwrap();
        let opts = RenderOptions {
            add_generation_prompt: r["add_generation_prompt"].as_bool().unwrap(),
            ..RenderOptions::default()
        };
        let got = template.render(&messages, &opts);
        let what = format!(
            "{case}/{name} (add_generation_prompt={})",
            opts.add_generation_prompt
        );
        match (
            r.get("expected").and_then(Value::as_str),
            r.get("error").and_then(Value::as_str),
            got,
        ) {
            (Some(want), _, Ok(text)) => assert_eq!(text, want, "{what}"),
            (None, Some("raised"), Err(ChatTemplateError::Raised { msg, .. })) => {
                assert_eq!(msg, r["message"].as_str().unwrap(), "{what}")
            }
            (None, Some("render"), Err(ChatTemplateError::Render { .. })) => {}
            (_, _, got) => panic!("{what}: expected {r}, got {got:?}"),
        }
    }
}

#[test]
fn smollm2_own_template() {
    check("smollm2", model_path(SMOLLM2));
}

#[test]
fn gemma3_builtin_template() {
    check("gemma3-270m", model_path(GEMMA3));
}

#[test]
fn hf_tiny_llama_builtin_llama3() {
    check("hf-tiny-llama", hf_tiny("llama"));
}

#[test]
fn hf_tiny_qwen2_builtin_chatml() {
    check("hf-tiny-qwen2", hf_tiny("qwen2"));
}

#[test]
fn hf_tiny_gemma_builtin_gemma() {
    check("hf-tiny-gemma", hf_tiny("gemma"));
}

#[test]
fn hf_tiny_mistral_builtin_mistral() {
    check("hf-tiny-mistral", hf_tiny("mistral"));
}

#[test]
fn hf_tiny_gpt2_builtin_gpt2() {
    check("hf-tiny-gpt2", hf_tiny("gpt2"));
}

/// llama.cpp stops SmolLM2 on {0, 2, 4} and Gemma 3 on {1, 106, 212}; the templates' end-of-turn
/// tokens (`<|im_end|>` = 2, `<end_of_turn>` = 106) are among them.
#[test]
fn stop_ids_are_llamacpp_eog_and_the_template_end_of_turn() {
    assert_eq!(load(&model_path(SMOLLM2)).stop_ids(), [0, 2, 4]);
    assert_eq!(load(&model_path(GEMMA3)).stop_ids(), [1, 106, 212]);
}
