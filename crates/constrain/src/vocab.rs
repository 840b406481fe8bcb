//! The vocabulary as llguidance sees it: a trie of every token's bytes, special tokens under
//! llguidance's marker byte (0xFF) so only a grammar that names them can produce them, and the
//! stop tokens as its end-of-sentence set.

use std::sync::Arc;

use anelm_tokenize::Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::ConstrainError;

/// One token: its text bytes, or the name of a special token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(Vec<u8>),
    Special(String),
    /// An id the tokenizer does not know (a padded embedding row): never allowed.
    Unused,
}

/// Every token of `tokenizer` up to `vocab_size` (the model's embedding rows).
pub fn vocabulary(tokenizer: &Tokenizer, vocab_size: usize) -> Vec<Piece> {
    let known = tokenizer.vocab_size();
    (0..vocab_size as u32)
        .map(|id| {
            if id as usize >= known {
                Piece::Unused
            } else if tokenizer.is_special(id) {
                Piece::Special(String::from_utf8_lossy(&tokenizer.token_to_piece(id)).into_owned())
            } else {
                Piece::Text(tokenizer.token_to_piece(id))
            }
        })
        .collect()
}

/// Tokenizes with the model's own tokenizer (valid UTF-8), else the trie's greedy split.
struct Env {
    trie: TokTrie,
    tokenizer: Option<Arc<Tokenizer>>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if let (Some(t), Ok(text)) = (&self.tokenizer, std::str::from_utf8(s)) {
            if let Ok(ids) = t.encode(text, false, false) {
                return ids;
            }
        }
        self.trie.greedy_tokenize(s)
    }

    /// Not claimed canonical: llguidance then never forces a token by tokenizing the bytes a
    /// grammar forces (a fragment tokenized alone can differ from the model's own split — an
    /// SPM space prefix, a word-level vocabulary), it masks them like any others.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

pub(crate) fn env(
    pieces: Vec<Piece>,
    stop_ids: &[u32],
    tokenizer: Option<Arc<Tokenizer>>,
) -> Result<TokEnv, ConstrainError> {
    let Some(&first_stop) = stop_ids.first() else {
        return Err(ConstrainError::Unavailable(
            "the model has no end-of-turn token to end a constrained reply".into(),
        ));
    };
    let words: Vec<Vec<u8>> = pieces
        .into_iter()
        .map(|p| match p {
            Piece::Text(bytes) => bytes,
            Piece::Special(name) => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(name.as_bytes());
                w
            }
            Piece::Unused => Vec::new(),
        })
        .collect();
    if stop_ids.iter().any(|&s| s as usize >= words.len()) {
        return Err(ConstrainError::Unavailable(
            "a stop token lies outside the vocabulary".into(),
        ));
    }
    let info = TokRxInfo::new(words.len() as u32, first_stop);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(stop_ids);
    Ok(Arc::new(Env { trie, tokenizer }))
}
