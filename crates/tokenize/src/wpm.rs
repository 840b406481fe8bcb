//! WordPiece (GGUF `bert` model, used by BERT-style embedding models) as llama.cpp's
//! llm_tokenizer_wpm runs it: normalize (lowercase, strip accents), split on whitespace and
//! around punctuation and CJK characters, then take the longest vocabulary match from the left
//! of each word, which carries a leading U+2581 (the GGUF converter writes word-initial pieces
//! as `▁word` and `##piece` as `piece`). A word with an unmatched position becomes `[UNK]`.

use unicode_normalization::UnicodeNormalization;

use crate::spm::SPACE_MARK;
use crate::unicode::{self, Category};
use crate::vocab::Vocab;

/// BertNormalizer settings (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

pub(crate) struct Wpm {
    normalizer: Normalizer,
    /// The longest token text in bytes (at most [`MAX_MATCH`]), bounding the match search.
    max_token_len: usize,
}

/// The longest match tried, in bytes: far above any real WordPiece token (BERT's are under 30),
/// it keeps a hostile vocabulary with a huge token from making each position cost the length
/// of the word. Longer tokens cannot be matched.
const MAX_MATCH: usize = 256;

impl Wpm {
    pub fn new(vocab: &Vocab, normalizer: Normalizer) -> Wpm {
        let max_token_len = (0..vocab.len() as u32)
            .map(|id| vocab.text(id).len())
            .max()
            .unwrap_or(0)
            .min(MAX_MATCH);
        Wpm {
            normalizer,
            max_token_len,
        }
    }

    /// Tokenizes one fragment of raw text.
    pub fn tokenize(&self, vocab: &Vocab, raw: &[u8], out: &mut Vec<u32>) {
        let mut word = Vec::new();
        for w in self.words(raw) {
            word.clear();
            word.extend_from_slice(SPACE_MARK);
            word.extend_from_slice(&w);
            let before = out.len();
            let mut i = 0;
            while i < word.len() {
                let longest = (i + 1..=word.len().min(i + self.max_token_len))
                    .rev()
                    .find_map(|j| vocab.token_id(&word[i..j]).map(|id| (id, j)));
                match longest {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(before);
                        break;
                    }
                }
            }
            if out.len() == before {
                out.extend(vocab.special.unk);
            }
        }
    }

    /// The normalized words of `raw`: whitespace separates, and each punctuation mark, ASCII
    /// symbol and CJK ideograph is a word of its own. NUL, U+FFFD and control characters go.
    fn words(&self, raw: &[u8]) -> Vec<Vec<u8>> {
        let mut cps = unicode::codepoints(raw);
        if self.normalizer.strip_accents {
            // llama.cpp keeps the first codepoint of each canonical decomposition.
            for cp in &mut cps {
                if let Some(c) = char::from_u32(*cp) {
                    *cp = c.nfd().next().map_or(*cp, u32::from);
                }
            }
        }
        let mut words: Vec<Vec<u8>> = vec![Vec::new()];
        for cp in cps {
            let flags = unicode::flags(cp);
            if flags.whitespace {
                if !words.last().is_some_and(Vec::is_empty) {
                    words.push(Vec::new());
                }
                continue;
            }
            if cp == 0 || cp == 0xFFFD || flags.category == Category::Control {
                continue;
            }
            if self.normalizer.strip_accents && flags.is_mark() {
                continue;
            }
            let c = if self.normalizer.lowercase {
                unicode::to_lower(cp)
            } else {
                cp
            };
            let alone = flags.category == Category::Punctuation
                || (cp < 0x7F && flags.category == Category::Symbol)
                || is_cjk(cp);
            let last = words.last_mut().expect("never empty");
            if alone {
                if last.is_empty() {
                    unicode::push_utf8(last, c);
                } else {
                    let mut w = Vec::new();
                    unicode::push_utf8(&mut w, c);
                    words.push(w);
                }
                words.push(Vec::new());
            } else {
                unicode::push_utf8(last, c);
            }
        }
        words.retain(|w| !w.is_empty());
        words
    }
}

/// The CJK ideograph blocks BERT's tokenizer splits around (with its U+2B920 quirk).
fn is_cjk(cp: u32) -> bool {
    matches!(cp,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        let vocab = Vocab::new(Vec::new()).expect("empty vocab");
        let wpm = Wpm::new(
            &vocab,
            Normalizer {
                lowercase: true,
                strip_accents: true,
            },
        );
        wpm.words(text.as_bytes())
            .into_iter()
            .map(|w| String::from_utf8(w).expect("utf-8"))
            .collect()
    }

    #[test]
    fn splits_and_normalizes_like_bert() {
        assert_eq!(words("Hello, World!"), ["hello", ",", "world", "!"]);
        assert_eq!(words("  Äpfel\tcafé "), ["apfel", "cafe"]);
        assert_eq!(words("中文a"), ["中", "文", "a"]);
        assert_eq!(words("a\u{0}b\u{7}c"), ["abc"]);
        assert!(words(" \n ").is_empty());
    }
}
