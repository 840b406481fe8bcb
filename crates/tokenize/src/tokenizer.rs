//! The public tokenizer: one type over the GGUF and Hugging Face implementations.

use std::path::Path;

use anelm_formats::Metadata;

use crate::error::Result;
use crate::gguf::GgufTokenizer;
use crate::hf::HfTokenizer;
use crate::vocab::Attr;

pub struct Tokenizer {
    inner: Inner,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match self.inner {
            Inner::Gguf(_) => "gguf",
            Inner::Hf(_) => "hf",
        };
        f.debug_struct("Tokenizer")
            .field("source", &source)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

enum Inner {
    Gguf(Box<GgufTokenizer>),
    Hf(Box<HfTokenizer>),
}

impl Tokenizer {
    /// The tokenizer embedded in GGUF metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer> {
        Ok(Tokenizer {
            inner: Inner::Gguf(Box::new(GgufTokenizer::from_metadata(meta)?)),
        })
    }

    /// The tokenizer of a Hugging Face model directory: `tokenizer.json`, with
    /// `tokenizer_config.json` (and `generation_config.json`) where present.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        Ok(Tokenizer {
            inner: Inner::Hf(Box::new(HfTokenizer::from_dir(dir)?)),
        })
    }

    /// Token ids of `text`. `add_special` adds BOS/EOS as the model's flags say;
    /// `parse_special` turns the text of control tokens (e.g. `<|im_start|>`) into those tokens
    /// instead of tokenizing it as plain text. Only a Hugging Face tokenizer can fail here.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Gguf(t) => Ok(t.encode(text, add_special, parse_special)),
            Inner::Hf(t) => t.encode(text, add_special, parse_special),
        }
    }

    /// The bytes token `id` stands for, special tokens included (llama.cpp's
    /// `llama_token_to_piece(special = true)`). A piece can be part of a UTF-8 sequence. An id
    /// outside the vocabulary gives nothing.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        match &self.inner {
            Inner::Gguf(t) => t.token_to_piece(id),
            Inner::Hf(t) => t.token_to_piece(id),
        }
    }

    /// The bytes of a token sequence, special tokens rendered (llama.cpp's `llama_detokenize`
    /// with remove_special = false, unparse_special = true).
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        match &self.inner {
            Inner::Gguf(t) => t.decode(ids),
            Inner::Hf(t) => t.decode(ids),
        }
    }

    /// [`Tokenizer::decode`] as text; invalid UTF-8 becomes U+FFFD.
    pub fn decode_lossy(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode(ids)).into_owned()
    }

    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.len(),
            Inner::Hf(t) => t.vocab_size(),
        }
    }

    pub fn bos(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.special.bos,
            Inner::Hf(t) => t.bos,
        }
    }

    pub fn eos(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.special.eos,
            Inner::Hf(t) => t.eos,
        }
    }

    /// End of turn (e.g. `<end_of_turn>`, `<|im_end|>`), from metadata or recognised by text.
    pub fn eot(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.special.eot,
            Inner::Hf(t) => t.eot,
        }
    }

    /// Every id that ends generation, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.eog.iter().copied().collect(),
            Inner::Hf(t) => t.eog.iter().copied().collect(),
        }
    }

    pub fn is_eog(&self, id: u32) -> bool {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.eog.contains(&id),
            Inner::Hf(t) => t.eog.contains(&id),
        }
    }

    /// Whether encoding with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.add_bos,
            Inner::Hf(t) => t.add_bos,
        }
    }

    /// Whether encoding with `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.add_eos,
            Inner::Hf(t) => t.add_eos,
        }
    }

    /// Whether `id` is a control (or unknown) token: one that is not text, and that a text
    /// rendering without special tokens leaves out.
    pub fn is_special(&self, id: u32) -> bool {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.attr(id).has(Attr::CONTROL | Attr::UNKNOWN),
            Inner::Hf(t) => t.is_special(id),
        }
    }

    /// The id of the token whose text is exactly `text` (GGUF: its raw vocabulary text, e.g.
    /// `Ġthe` or `▁the`), if any.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(t) => t.vocab.token_id(text.as_bytes()),
            Inner::Hf(t) => t.token_id(text),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Sessions on several threads share one tokenizer.
    #[test]
    fn tokenizer_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Tokenizer>();
    }
}
