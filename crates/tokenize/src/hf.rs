//! Hugging Face tokenizers: `tokenizer.json` through the `tokenizers` crate, with BOS/EOS
//! conventions from `tokenizer_config.json` and end-of-generation ids as llama.cpp would derive
//! them from the same vocabulary.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::error::{Result, TokenizeError};
use crate::special::{self, RoleVocab};
use crate::spm::SPACE_MARK_STR;
use crate::unicode;
use crate::vocab::{Attr, SpecialIds};

/// How a vocabulary entry's text maps to bytes, read off the tokenizer's decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PieceStyle {
    /// GPT-2 byte-to-character stand-ins.
    ByteLevel,
    /// SentencePiece: U+2581 is a space, `<0xXX>` a byte.
    Metaspace,
    /// The text as it stands.
    Plain,
}

pub(crate) struct HfTokenizer {
    path: PathBuf,
    tokenizer: tokenizers::Tokenizer,
    /// A copy that treats special-token text as plain text, made on first use.
    literal: OnceLock<tokenizers::Tokenizer>,
    style: PieceStyle,
    /// Spaces the decoder strips from the start of the decoded text.
    strip_leading: usize,
    /// Added tokens: content and whether they are special.
    added: HashMap<u32, (String, bool)>,
    /// BOS/EOS come from tokenizer_config.json's add_bos_token/add_eos_token rather than from
    /// the post-processor.
    explicit_flags: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizeError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizeError::Json {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })
}

/// Checks that every special token a `TemplateProcessing` template names is in its
/// `special_tokens` table: the tokenizers crate does not check on load and panics on encode.
fn check_post_processor(p: Option<&Value>) -> std::result::Result<(), String> {
    let Some(p) = p else { return Ok(()) };
    if let Some(list) = p.get("processors").and_then(Value::as_array) {
        return list.iter().try_for_each(|q| check_post_processor(Some(q)));
    }
    // The tokenizers crate reads a post-processor by its fields, whatever its `type` says
    // (an untagged enum): any object with a template is checked.
    let templated = p.get("type").and_then(Value::as_str) == Some("TemplateProcessing")
        || p.get("single").is_some()
        || p.get("pair").is_some();
    if !templated {
        return Ok(());
    }
    let table = p.get("special_tokens").and_then(Value::as_object);
    for key in ["single", "pair"] {
        let pieces: Vec<String> = match p.get(key) {
            Some(Value::String(t)) => t
                .split_whitespace()
                .filter(|w| !w.starts_with('$'))
                .map(|w| w.rsplit_once(':').map_or(w, |(name, _)| name).to_string())
                .collect(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|piece| piece.get("SpecialToken")?.get("id")?.as_str())
                .map(String::from)
                .collect(),
            _ => Vec::new(),
        };
        for name in pieces {
            if !table.is_some_and(|t| t.contains_key(&name)) {
                return Err(format!(
                    "post_processor.{key} uses special token '{name}', which post_processor.special_tokens does not define"
                ));
            }
        }
    }
    Ok(())
}

/// A token named in tokenizer_config.json: a string or an AddedToken object.
fn token_content(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

fn config_bool(config: &Option<Value>, key: &str, path: &Path) -> Result<Option<bool>> {
    match config.as_ref().and_then(|c| c.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(TokenizeError::Json {
            path: path.to_path_buf(),
            msg: format!("'{key}' should be a bool, found {other}"),
        }),
    }
}

/// The piece style and leading-space strip implied by a `decoder` section.
fn decoder_style(decoder: Option<&Value>) -> (PieceStyle, usize) {
    let Some(d) = decoder else {
        return (PieceStyle::Plain, 0);
    };
    let steps: Vec<&Value> = match d.get("decoders").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![d],
    };
    let kind = |s: &Value| {
        s.get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let mut style = PieceStyle::Plain;
    let mut strip = 0;
    for s in steps {
        match kind(s).as_str() {
            "ByteLevel" => style = PieceStyle::ByteLevel,
            "Metaspace" | "ByteFallback" => style = PieceStyle::Metaspace,
            "Replace"
                if s.pointer("/pattern/String").and_then(Value::as_str) == Some("\u{2581}") =>
            {
                style = PieceStyle::Metaspace
            }
            "Strip" if s.get("content").and_then(Value::as_str) == Some(" ") => {
                strip = s.get("start").and_then(Value::as_u64).unwrap_or(0) as usize;
            }
            _ => {}
        }
    }
    (style, strip)
}

/// The vocabulary as [`special::assign_roles`] sees it; HF tokens carry no llama.cpp
/// attributes, so attribute changes are dropped.
struct HfRoles<'a>(&'a tokenizers::Tokenizer);

impl RoleVocab for HfRoles<'_> {
    fn find(&self, text: &str) -> Option<u32> {
        self.0.token_to_id(text)
    }
    fn mark(&mut self, _: u32, _: Attr) {}
    fn set(&mut self, _: u32, _: Attr) {}
}

impl HfTokenizer {
    pub fn from_dir(dir: &Path) -> Result<HfTokenizer> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|source| TokenizeError::Io {
            path: path.clone(),
            source,
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?;
        let generation = read_json(&dir.join("generation_config.json"))?;
        Self::from_parts(path, &text, config_path, config, generation)
    }

    /// Builds the tokenizer from `tokenizer.json`'s text and the parsed `tokenizer_config.json`
    /// and `generation_config.json` (`path` and `config_path` name them in errors).
    pub fn from_parts(
        path: PathBuf,
        text: &str,
        config_path: PathBuf,
        config: Option<Value>,
        generation: Option<Value>,
    ) -> Result<HfTokenizer> {
        let hf_err = |msg: String| TokenizeError::HfTokenizer {
            path: path.clone(),
            msg,
        };
        let json: Value = serde_json::from_str(text).map_err(|e| TokenizeError::Json {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        check_post_processor(json.get("post_processor")).map_err(hf_err)?;
        let tokenizer: tokenizers::Tokenizer = text
            .parse()
            .map_err(|e: tokenizers::Error| hf_err(e.to_string()))?;
        let (style, strip_leading) = decoder_style(json.get("decoder"));
        let added = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, (t.content, t.special)))
            .collect();

        let named = |key: &str| {
            config
                .as_ref()
                .and_then(|c| c.get(key))
                .and_then(token_content)
                .and_then(|t| tokenizer.token_to_id(t))
        };
        let mut ids = SpecialIds {
            bos: named("bos_token"),
            eos: named("eos_token"),
            ..SpecialIds::default()
        };
        let mut eog = special::assign_roles(&mut HfRoles(&tokenizer), &mut ids);
        if let Some(v) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
            let listed: Vec<&Value> = v.as_array().map_or_else(|| vec![v], |a| a.iter().collect());
            eog.extend(
                listed
                    .into_iter()
                    .filter_map(Value::as_u64)
                    .filter_map(|id| u32::try_from(id).ok()),
            );
        }

        let explicit_bos = config_bool(&config, "add_bos_token", &config_path)?;
        let explicit_eos = config_bool(&config, "add_eos_token", &config_path)?;
        let explicit_flags = explicit_bos.is_some() || explicit_eos.is_some();
        // Without explicit flags the post-processor decides; see what it adds to nothing.
        let framing = tokenizer
            .encode("", true)
            .map_err(|e| hf_err(e.to_string()))?;
        let framing = framing.get_ids();
        let add_bos =
            explicit_bos.unwrap_or(ids.bos.is_some() && framing.first().copied() == ids.bos);
        let add_eos =
            explicit_eos.unwrap_or(ids.eos.is_some() && framing.last().copied() == ids.eos);
        if (add_bos && ids.bos.is_none()) || (add_eos && ids.eos.is_none()) {
            return Err(TokenizeError::Json {
                path: config_path,
                msg: "add_bos_token/add_eos_token is true but the bos_token/eos_token is not in the vocabulary".into(),
            });
        }
        Ok(HfTokenizer {
            path,
            tokenizer,
            literal: OnceLock::new(),
            style,
            strip_leading,
            added,
            explicit_flags,
            bos: ids.bos,
            eos: ids.eos,
            eot: ids.eot,
            eog,
            add_bos,
            add_eos,
        })
    }

    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let tokenizer = if parse_special {
            &self.tokenizer
        } else {
            self.literal.get_or_init(|| {
                let mut t = self.tokenizer.clone();
                t.set_encode_special_tokens(true);
                t
            })
        };
        let use_post_processor = add_special && !self.explicit_flags;
        // The tokenizers crate panics on some inconsistent files it accepted; such a panic is
        // this file's error, not the process's end.
        let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokenizer.encode(text, use_post_processor)
        }))
        .unwrap_or_else(|_| Err("the tokenizers crate failed on this file".into()));
        let encoding = encoded.map_err(|e| TokenizeError::HfTokenizer {
            path: self.path.clone(),
            msg: e.to_string(),
        })?;
        let mut ids = Vec::with_capacity(encoding.len() + 2);
        if add_special && self.explicit_flags && self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(encoding.get_ids());
        if add_special && self.explicit_flags && self.add_eos {
            ids.extend(self.eos);
        }
        Ok(ids)
    }

    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        if let Some((content, _)) = self.added.get(&id) {
            return content.as_bytes().to_vec();
        }
        let Some(text) = self.tokenizer.id_to_token(id) else {
            return Vec::new();
        };
        match self.style {
            PieceStyle::Plain => text.into_bytes(),
            PieceStyle::ByteLevel => {
                let chars: Option<Vec<u8>> = text.chars().map(unicode::char_to_byte).collect();
                chars.unwrap_or_else(|| text.into_bytes())
            }
            PieceStyle::Metaspace => {
                let b = text.as_bytes();
                if b.len() == 6 && b.starts_with(b"<0x") && b[5] == b'>' {
                    if let Ok(v) = u8::from_str_radix(&text[3..5], 16) {
                        return vec![v];
                    }
                }
                text.replace(SPACE_MARK_STR, " ").into_bytes()
            }
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        let mut out: Vec<u8> = ids.iter().flat_map(|&id| self.token_to_piece(id)).collect();
        let strip = out
            .iter()
            .take(self.strip_leading)
            .take_while(|&&b| b == b' ')
            .count();
        out.drain(..strip);
        out
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.added.get(&id).is_some_and(|(_, special)| *special)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.tokenizer.token_to_id(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the fuzzer: a template post-processor whose `type` is misspelt is still read
    /// (by its fields) and then panicked on an undefined special token at encode time.
    #[test]
    fn a_template_under_any_type_name_is_checked() {
        for kind in ["TemplateProcessing", "TemplateP=rocessing"] {
            let p = serde_json::json!({"type": kind,
                "single": [{"SpecialToken": {"id": "<x>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}});
            let e = check_post_processor(Some(&p)).unwrap_err();
            assert!(e.contains("'<x>'"), "{kind}: {e}");
        }
        let fine = serde_json::json!({"type": "ByteLevel", "trim_offsets": true});
        assert!(check_post_processor(Some(&fine)).is_ok());
    }
}
