//! SentencePiece BPE (GGUF `llama` model) as llama.cpp's llm_tokenizer_spm runs it: spaces
//! become U+2581, the text is cut into UTF-8 characters, and the adjacent pair whose
//! concatenation is the highest-scoring token is merged until no pair is a token. Characters
//! that end up as no token fall back to byte tokens `<0xXX>`.

use std::cmp::Ordering;

use crate::merge::{merge, PairRank, Symbol};
use crate::vocab::Vocab;

/// U+2581, SentencePiece's visible space.
pub(crate) const SPACE_MARK_STR: &str = "\u{2581}";
pub(crate) const SPACE_MARK: &[u8] = SPACE_MARK_STR.as_bytes();

pub(crate) struct Spm {
    /// Token for each byte value, for byte fallback: `<0xXX>`, else the one-byte text, else
    /// the unknown token.
    byte_tokens: [Option<u32>; 256],
}

/// SentencePiece's ranking of a pair: the score of the token it makes, highest first.
struct TokenScores<'a> {
    vocab: &'a Vocab,
    text: &'a [u8],
}

/// A token score, ordered totally.
struct Score(f32);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl PairRank for TokenScores<'_> {
    type Rank = Score;

    fn rank(&self, symbols: &[Symbol], l: usize, r: usize) -> Option<Score> {
        let pair = symbols[l].start..symbols[r].start + symbols[r].len;
        let id = self.vocab.token_id(&self.text[pair])?;
        Some(Score(self.vocab.score(id)))
    }
}

impl Spm {
    pub fn new(vocab: &Vocab) -> Spm {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = vocab
                .token_id(hex.as_bytes())
                .or_else(|| vocab.token_id(&[b as u8]))
                .or(vocab.special.unk);
        }
        Spm { byte_tokens }
    }

    /// Tokenizes one fragment of raw text (the caller adds the space prefix).
    pub fn tokenize(&self, vocab: &Vocab, raw: &[u8], out: &mut Vec<u32>) {
        let text = escape_spaces(raw);
        let mut rule = TokenScores { vocab, text: &text };
        for range in merge(&text, &mut rule) {
            let piece = &text[range];
            match vocab.token_id(piece) {
                Some(id) => out.push(id),
                None => out.extend(
                    piece
                        .iter()
                        .filter_map(|&b| self.byte_tokens[usize::from(b)]),
                ),
            }
        }
    }
}

/// `raw` with every space written as U+2581.
pub(crate) fn escape_spaces(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + raw.len() / 2);
    for &b in raw {
        if b == b' ' {
            out.extend_from_slice(SPACE_MARK);
        } else {
            out.push(b);
        }
    }
    out
}
