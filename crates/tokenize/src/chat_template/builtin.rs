//! Built-in chat templates, one per model family, for models that ship none (gemma-3-270m,
//! the tiny test configs). Each is the family's official template text as published with its
//! instruction-tuned models; the special-token strings are what those models' tokenizers use,
//! for when a model has no tokenizer to ask.

/// A family's template and the special-token strings its tokenizers define.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuiltinTemplate {
    /// A short name for messages (`gemma3`, `chatml`, ...).
    pub name: &'static str,
    pub source: &'static str,
    pub bos_token: Option<&'static str>,
    pub eos_token: Option<&'static str>,
}

const LLAMA3: BuiltinTemplate = BuiltinTemplate {
    name: "llama3",
    source: include_str!("builtin/llama3.jinja"),
    bos_token: Some("<|begin_of_text|>"),
    eos_token: Some("<|eot_id|>"),
};

/// Qwen2-Instruct's ChatML template.
const CHATML: BuiltinTemplate = BuiltinTemplate {
    name: "chatml",
    source: include_str!("builtin/chatml.jinja"),
    bos_token: None,
    eos_token: Some("<|im_end|>"),
};

/// Mistral-7B-Instruct-v0.1's template.
const MISTRAL: BuiltinTemplate = BuiltinTemplate {
    name: "mistral",
    source: include_str!("builtin/mistral.jinja"),
    bos_token: Some("<s>"),
    eos_token: Some("</s>"),
};

/// Gemma and Gemma 2 instruction-tuned models' template (no system role).
const GEMMA: BuiltinTemplate = BuiltinTemplate {
    name: "gemma",
    source: include_str!("builtin/gemma.jinja"),
    bos_token: Some("<bos>"),
    eos_token: Some("<eos>"),
};

/// Gemma 3's template (the system message joins the first user turn).
const GEMMA3: BuiltinTemplate = BuiltinTemplate {
    name: "gemma3",
    source: include_str!("builtin/gemma3.jinja"),
    bos_token: Some("<bos>"),
    eos_token: Some("<eos>"),
};

/// The default transformers once gave GPT-2: each message's text followed by EOS.
const GPT2: BuiltinTemplate = BuiltinTemplate {
    name: "gpt2",
    source: include_str!("builtin/gpt2.jinja"),
    bos_token: Some("<|endoftext|>"),
    eos_token: Some("<|endoftext|>"),
};

/// The built-in template of a model family, by the family's name (`llama`, `mistral`, `qwen2`,
/// `qwen3`, `gemma`, `gemma2`, `gemma3`, `gpt2`).
pub fn builtin_template(family: &str) -> Option<BuiltinTemplate> {
    Some(match family {
        "llama" => LLAMA3,
        "mistral" => MISTRAL,
        "qwen2" | "qwen3" => CHATML,
        "gemma" | "gemma2" => GEMMA,
        "gemma3" => GEMMA3,
        "gpt2" => GPT2,
        _ => return None,
    })
}
