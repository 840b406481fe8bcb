//! The tokenizer embedded in a GGUF file: vocabulary and settings read from `tokenizer.ggml.*`
//! metadata the way llama.cpp's llama_vocab::load reads them.

use std::path::Path;

use anelm_formats::Metadata;

use crate::bpe::Bpe;
use crate::error::{Result, TokenizeError};
use crate::pretokenize::PreTokenizer;
use crate::special::{self, Fragment, SpecialMatcher};
use crate::spm::{Spm, SPACE_MARK};
use crate::unicode;
use crate::vocab::{Attr, Entry, SpecialIds, Vocab};
use crate::wpm::{Normalizer, Wpm};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";

enum Model {
    Bpe(Bpe),
    Spm(Box<Spm>),
    Wpm(Wpm),
}

/// The tokenizer kinds of `tokenizer.ggml.model` we run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `gpt2`: byte-level BPE with a named pre-tokenizer.
    Bpe,
    /// `gemma4`: SentencePiece-style BPE (merges over raw UTF-8, spaces as U+2581).
    Gemma4,
    /// `llama`: SentencePiece BPE by token scores.
    Spm,
    /// `bert`: WordPiece.
    Wpm,
}

/// Why a `tokenizer.ggml.model` we know of is not run, for the error message.
fn refusal(model: &str) -> Option<&'static str> {
    Some(match model {
        "t5" => {
            "the Unigram (UGM) model with its precompiled normalizer charsmap is not implemented"
        }
        "rwkv" => "the RWKV world tokenizer (trie over escaped byte strings) is not implemented",
        "plamo2" => "the PLaMo-2 Aho-Corasick/Viterbi tokenizer is not implemented",
        "none" | "no_vocab" => "the file has no vocabulary",
        _ => return None,
    })
}

pub(crate) struct GgufTokenizer {
    pub vocab: Vocab,
    model: Model,
    matcher: SpecialMatcher,
}

fn bad(path: &Path, key: &str, msg: impl Into<String>) -> TokenizeError {
    TokenizeError::BadValue {
        path: path.to_path_buf(),
        key: key.to_string(),
        msg: msg.into(),
    }
}

fn missing(path: &Path, key: &str) -> TokenizeError {
    TokenizeError::MissingKey {
        path: path.to_path_buf(),
        key: key.to_string(),
    }
}

impl GgufTokenizer {
    pub fn from_metadata(meta: &Metadata) -> Result<GgufTokenizer> {
        let path = meta.path();
        let model_name = meta
            .str_opt(KEY_MODEL)?
            .ok_or_else(|| missing(path, KEY_MODEL))?;
        let kind = match model_name {
            "gpt2" => Kind::Bpe,
            "gemma4" => Kind::Gemma4,
            "llama" => Kind::Spm,
            "bert" => Kind::Wpm,
            other => {
                return Err(TokenizeError::UnsupportedModel {
                    path: path.to_path_buf(),
                    model: other.into(),
                    why: refusal(other).unwrap_or("not a tokenizer kind we know"),
                })
            }
        };

        let mut vocab = read_vocab(meta)?;
        let n = vocab.len();
        let in_vocab = |id: u32| (id as usize) < n;
        let mut ids = SpecialIds::default();
        let pre = match kind {
            Kind::Bpe | Kind::Gemma4 => {
                let name = match (kind, meta.str_opt(KEY_PRE)?) {
                    (Kind::Gemma4, _) => "gemma4",
                    (_, Some(name)) => name,
                    (_, None) => {
                        tracing::warn!(
                            "{}: no {KEY_PRE}; using llama.cpp's 'default' pre-tokenizer",
                            path.display()
                        );
                        "default"
                    }
                };
                let pre = PreTokenizer::new(name)
                    .map_err(|msg| bad(path, KEY_PRE, msg))?
                    .ok_or_else(|| TokenizeError::UnknownPre {
                        path: path.to_path_buf(),
                        pre: name.to_string(),
                    })?;
                if kind == Kind::Bpe {
                    ids.bos = Some(11).filter(|&id| in_vocab(id) && !pre.no_bos);
                    ids.eos = Some(11).filter(|&id| in_vocab(id));
                }
                vocab.add_bos = pre.add_bos;
                vocab.clean_spaces = pre.clean_spaces;
                Some(pre)
            }
            Kind::Spm => {
                ids.bos = Some(1).filter(|&id| in_vocab(id));
                ids.eos = Some(2).filter(|&id| in_vocab(id));
                ids.unk = Some(0).filter(|&id| in_vocab(id));
                vocab.add_bos = true;
                vocab.add_space_prefix = true;
                None
            }
            Kind::Wpm => {
                // BERT's [CLS] (as BOS), [UNK], [SEP].
                ids.bos = Some(101).filter(|&id| in_vocab(id));
                ids.unk = Some(100).filter(|&id| in_vocab(id));
                ids.sep = Some(102).filter(|&id| in_vocab(id));
                vocab.add_bos = true;
                vocab.add_sep = true;
                vocab.clean_spaces = true;
                None
            }
        };
        if let Some(v) = meta.bool_opt("tokenizer.ggml.add_space_prefix")? {
            vocab.add_space_prefix = v;
        }

        // Ids out of the vocabulary keep the default (llama.cpp warns and does the same).
        let id_key = |key: &str, slot: &mut Option<u32>| -> Result<()> {
            if let Some(v) = meta.usize_opt(key)? {
                match u32::try_from(v).ok().filter(|&id| in_vocab(id)) {
                    Some(id) => *slot = Some(id),
                    None => tracing::warn!(
                        "{}: {key} = {v} is outside the vocabulary; ignored",
                        path.display()
                    ),
                }
            }
            Ok(())
        };
        id_key(KEY_BOS, &mut ids.bos)?;
        id_key(KEY_EOS, &mut ids.eos)?;
        id_key("tokenizer.ggml.eot_token_id", &mut ids.eot)?;
        id_key("tokenizer.ggml.eom_token_id", &mut ids.eom)?;
        id_key("tokenizer.ggml.unknown_token_id", &mut ids.unk)?;
        id_key("tokenizer.ggml.seperator_token_id", &mut ids.sep)?;
        id_key("tokenizer.ggml.fim_pre_token_id", &mut ids.fim_pre)?;
        id_key("tokenizer.ggml.fim_suf_token_id", &mut ids.fim_suf)?;
        id_key("tokenizer.ggml.fim_mid_token_id", &mut ids.fim_mid)?;
        id_key("tokenizer.ggml.fim_pad_token_id", &mut ids.fim_pad)?;
        id_key("tokenizer.ggml.fim_rep_token_id", &mut ids.fim_rep)?;
        id_key("tokenizer.ggml.fim_sep_token_id", &mut ids.fim_sep)?;
        // Older names of the FIM keys.
        id_key("tokenizer.ggml.prefix_token_id", &mut ids.fim_pre)?;
        id_key("tokenizer.ggml.suffix_token_id", &mut ids.fim_suf)?;
        id_key("tokenizer.ggml.middle_token_id", &mut ids.fim_mid)?;
        if let Some(v) = meta.bool_opt(KEY_ADD_BOS)? {
            vocab.add_bos = v;
        }
        if let Some(v) = meta.bool_opt(KEY_ADD_EOS)? {
            vocab.add_eos = v;
        }
        if let Some(v) = meta.bool_opt("tokenizer.ggml.add_sep_token")? {
            vocab.add_sep = v;
        }
        // llama.cpp always adds BOS for Gemma 4, whatever the file says.
        if kind == Kind::Gemma4 {
            vocab.add_bos = true;
        }
        if kind == Kind::Wpm && ids.sep.is_none() {
            return Err(bad(
                path,
                "tokenizer.ggml.seperator_token_id",
                "WordPiece needs a separator token",
            ));
        }
        if vocab.add_bos && ids.bos.is_none() {
            return Err(bad(
                path,
                KEY_ADD_BOS,
                format!("is true, but {KEY_BOS} is not set"),
            ));
        }
        if vocab.add_eos && ids.eos.is_none() {
            return Err(bad(
                path,
                KEY_ADD_EOS,
                format!("is true, but {KEY_EOS} is not set"),
            ));
        }

        vocab.eog = special::assign_roles(&mut vocab, &mut ids);
        vocab.special = ids;
        vocab.build_partition_order();
        let matcher = SpecialMatcher::new(&vocab);
        let model = match (pre, kind) {
            (Some(pre), _) => {
                let merges = meta
                    .byte_strings_opt(KEY_MERGES)?
                    .ok_or_else(|| missing(path, KEY_MERGES))?;
                Model::Bpe(Bpe::new(pre, &merges))
            }
            (None, Kind::Wpm) => {
                let lowercase = meta
                    .bool_opt("tokenizer.ggml.normalizer.lowercase")?
                    .unwrap_or(true);
                let strip_accents = meta
                    .bool_opt("tokenizer.ggml.normalizer.strip_accents")?
                    .unwrap_or(lowercase);
                let normalizer = Normalizer {
                    lowercase,
                    strip_accents,
                };
                Model::Wpm(Wpm::new(&vocab, normalizer))
            }
            (None, _) => Model::Spm(Box::new(Spm::new(&vocab))),
        };
        Ok(GgufTokenizer {
            vocab,
            model,
            matcher,
        })
    }

    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let fragments = self.matcher.partition(v, text.as_bytes(), parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.special.bos);
        }
        match &self.model {
            Model::Wpm(wpm) => {
                // WordPiece always opens with [CLS] and closes with [SEP] when asked to.
                if add_special && !v.add_bos {
                    out.extend(v.special.bos);
                }
                for f in fragments {
                    match f {
                        Fragment::Text(t) => wpm.tokenize(v, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
                if add_special && v.add_sep {
                    out.extend(v.special.sep);
                }
            }
            Model::Bpe(bpe) => {
                for f in fragments {
                    match f {
                        Fragment::Text(t) => bpe.tokenize(v, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm(spm) => {
                // The space prefix goes before text at the start and after a special token.
                let mut prev_special = true;
                let mut buf = Vec::new();
                for f in fragments {
                    match f {
                        Fragment::Text(t) if v.add_space_prefix && prev_special => {
                            buf.clear();
                            buf.push(b' ');
                            buf.extend_from_slice(t);
                            spm.tokenize(v, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Text(t) => {
                            spm.tokenize(v, t, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.special.eos);
        }
        out
    }

    /// llama_token_to_piece(special = true): the bytes a token stands for.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        let v = &self.vocab;
        if id as usize >= v.len() {
            return Vec::new();
        }
        let attr = v.attr(id);
        let text = v.text(id);
        if attr.has(Attr::UNKNOWN | Attr::CONTROL | Attr::USER_DEFINED) {
            return text.to_vec();
        }
        if attr.has(Attr::NORMAL) {
            return match &self.model {
                Model::Spm(_) | Model::Wpm(_) => unescape_spaces(text),
                Model::Bpe(bpe) if bpe.spm_style() => unescape_spaces(text),
                Model::Bpe(_) => decode_byte_level(text),
            };
        }
        if attr.has(Attr::BYTE) {
            return vec![byte_token_value(text)];
        }
        Vec::new()
    }

    /// llama_detokenize(remove_special = false, unparse_special = true).
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_to_piece(id);
            // SentencePiece's space prefix is dropped again from the first token.
            let skip =
                usize::from(i == 0 && self.vocab.add_space_prefix && piece.first() == Some(&b' '));
            out.extend_from_slice(&piece[skip..]);
        }
        if self.vocab.clean_spaces {
            clean_spaces(&out)
        } else {
            out
        }
    }
}

fn read_vocab(meta: &Metadata) -> Result<Vocab> {
    let path = meta.path();
    let tokens = meta
        .byte_strings_opt(KEY_TOKENS)?
        .ok_or_else(|| missing(path, KEY_TOKENS))?;
    let n = tokens.len();
    let scores = meta.f32_array_opt(KEY_SCORES)?;
    let types = meta.i64_array_opt(KEY_TYPES)?;
    if let Some(s) = scores.as_ref().filter(|s| s.len() < n) {
        return Err(bad(
            path,
            KEY_SCORES,
            format!("{} scores for {n} tokens", s.len()),
        ));
    }
    if let Some(t) = types.as_ref().filter(|t| t.len() < n) {
        return Err(bad(
            path,
            KEY_TYPES,
            format!("{} token types for {n} tokens", t.len()),
        ));
    }
    let entries = tokens
        .into_iter()
        .enumerate()
        .map(|(i, text)| Entry {
            // An empty token would be unreachable by text; llama.cpp renames it the same way.
            text: if text.is_empty() {
                format!("[EMPTY_{i}]").into_bytes()
            } else {
                text.to_vec()
            },
            score: scores.as_ref().map_or(0.0, |s| s[i]),
            attr: types
                .as_ref()
                .map_or(Attr::NORMAL, |t| Attr::from_token_type(t[i])),
        })
        .collect();
    Vocab::new(entries).map_err(|msg| bad(path, KEY_TOKENS, msg))
}

fn unescape_spaces(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(SPACE_MARK) {
            out.push(b' ');
            i += SPACE_MARK.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// Maps a byte-level token text back to bytes. A character outside the byte map is kept as a
/// visible marker, as llama.cpp does.
fn decode_byte_level(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for cp in unicode::codepoints(text) {
        match char::from_u32(cp).and_then(unicode::char_to_byte) {
            Some(b) => out.push(b),
            None => {
                let mut utf8 = Vec::new();
                unicode::push_utf8(&mut utf8, cp);
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in utf8 {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    out
}

/// The value of a byte token `<0xXX>` (leading hex digits of its 4th and 5th bytes, as strtol
/// reads them).
fn byte_token_value(text: &[u8]) -> u8 {
    let digits = text.get(3..5).unwrap_or_default();
    digits
        .iter()
        .map_while(|&c| char::from(c).to_digit(16))
        .fold(0u32, |acc, d| acc * 16 + d) as u8
}

/// llama.cpp's clean_up_tokenization_spaces: no space before ? ! . , ; " ' " becomes "'";
/// no space before 's 'm 're 've.
fn clean_spaces(text: &[u8]) -> Vec<u8> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut a = vec![text[0]];
    for i in 1..text.len() {
        if text[i - 1] == b' ' && matches!(text[i], b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(text[i]);
    }
    let mut b = vec![a[0]];
    let mut i = 1;
    while i < a.len() {
        let x = a[i];
        if x == b'\'' && i + 1 < a.len() && a[i - 1] == b' ' && a[i + 1] == b' ' {
            b.pop();
            // The space after the apostrophe goes too; llama.cpp blanks it in place, so it no
            // longer counts as the space before the next character.
            a[i + 1] = 0;
            i += 1;
        }
        b.push(x);
        i += 1;
    }
    let mut c = vec![b[0]];
    for i in 1..b.len() {
        if b[i - 1] == b' ' && b[i] == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let x2 = b.get(i + 2).copied().filter(|_| i + 2 < b.len());
            let glue = matches!(x1, b's' | b'm')
                || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e')));
            if glue {
                c.pop();
            }
        }
        c.push(b[i]);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_spaces_follows_llama_cpp() {
        assert_eq!(clean_spaces(b"Hi , there !"), b"Hi, there!");
        assert_eq!(clean_spaces(b"a ' b"), b"a'b");
        assert_eq!(clean_spaces(b"it 's we 're I 'd"), b"it's we're I 'd");
        assert_eq!(clean_spaces(b""), b"");
    }

    #[test]
    fn byte_tokens() {
        assert_eq!(byte_token_value(b"<0x0A>"), 10);
        assert_eq!(byte_token_value(b"<0xFF>"), 255);
        assert_eq!(decode_byte_level("Ġhi".as_bytes()), b" hi");
    }
}
