//! Fuzz entry points for tokenizers and chat templates, called by the libFuzzer harnesses in
//! `fuzz/` and by the corpus replay tests: each returns on any input, never panics or hangs.

use std::path::{Path, PathBuf};

use crate::gguf::GgufTokenizer;
use crate::hf::HfTokenizer;
use crate::{ChatTemplate, Message, RenderOptions, TemplateOrigin};

const SAMPLE: &str = "Hello world! 123 <s> ünïcödé 😀\n\t  spaces";

/// A `tokenizer.json` (no tokenizer_config.json), then an encode/decode round of a sample text.
pub fn tokenizer_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let dir = Path::new("fuzz-tokenizer");
    let Ok(t) = HfTokenizer::from_parts(
        dir.join("tokenizer.json"),
        text,
        dir.join("tokenizer_config.json"),
        None,
        None,
    ) else {
        return;
    };
    if let Ok(ids) = t.encode(SAMPLE, true, true) {
        let _ = t.decode(&ids);
    }
}

/// A GGUF file's tokenizer metadata, then an encode/decode round of a sample text.
pub fn gguf_tokenizer(data: &[u8]) {
    let Ok((_, meta, _)) = anelm_formats::gguf::parse(Path::new("fuzz.gguf"), data) else {
        return;
    };
    if let Ok(t) = GgufTokenizer::from_metadata(&meta) {
        let ids = t.encode(SAMPLE, true, true);
        let _ = t.decode(&ids);
    }
}

/// An untrusted chat template rendered over a short conversation with a tool.
pub fn chat_template(data: &[u8]) {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let origin = TemplateOrigin::HfFile(PathBuf::from("fuzz.jinja"));
    let Ok(t) = ChatTemplate::new(source, origin, Some("<s>".into()), Some("</s>".into())) else {
        return;
    };
    let msgs = [
        Message::system("Be brief."),
        Message::user(SAMPLE),
        Message::assistant("Hi."),
    ];
    let tool = serde_json::json!({"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}});
    let opts = RenderOptions {
        add_generation_prompt: true,
        tools: Some(vec![tool]),
        ..RenderOptions::default()
    };
    let _ = t.render(&msgs, &opts);
}
