//! Tokenizers for anelm.
//!
//! GGUF vocabularies are tokenized exactly as llama.cpp does it: byte-level BPE (`gpt2`, with the
//! pre-tokenizer named by `tokenizer.ggml.pre`), SentencePiece BPE (`llama`), Gemma 4's
//! SentencePiece-style BPE (`gemma4`) and WordPiece (`bert`), special tokens
//! cut out of the text only when asked, BOS/EOS per the model's flags. Hugging Face directories
//! go through the `tokenizers` crate. [`Tokenizer`] is the one public type over both.

mod bpe;
mod chat_template;
mod error;
pub mod fuzz;
mod gguf;
mod hf;
mod merge;
mod pretokenize;
mod special;
mod spm;
mod tokenizer;
mod unicode;
mod vocab;
mod wpm;

pub use chat_template::{
    builtin_template, gguf_chat_template, hf_chat_template, template_kwargs, BuiltinTemplate,
    ChatTemplate, ChatTemplateError, Message, RenderOptions, TemplateKwargs, TemplateOrigin,
};
pub use error::{Result, TokenizeError};
pub use tokenizer::Tokenizer;
