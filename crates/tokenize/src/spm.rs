//! SentencePiece BPE (GGUF `llama` model) as llama.cpp's llm_tokenizer_spm runs it: spaces
//! become U+2581, the text is cut into UTF-8 characters, and the adjacent pair whose
//! concatenation is the highest-scoring token is merged until no pair is a token. Characters
//! that end up as no token fall back to byte tokens `<0xXX>`.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::unicode;
use crate::vocab::Vocab;

/// U+2581, SentencePiece's visible space.
pub(crate) const SPACE_MARK_STR: &str = "\u{2581}";
pub(crate) const SPACE_MARK: &[u8] = SPACE_MARK_STR.as_bytes();

pub(crate) struct Spm {
    /// Token for each byte value, for byte fallback: `<0xXX>`, else the one-byte text, else
    /// the unknown token.
    byte_tokens: [Option<u32>; 256],
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A queued pair: highest score first, then leftmost.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(Reverse(self.left).cmp(&Reverse(other.left)))
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
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let mut start = 0;
        while start < text.len() {
            let len = unicode::utf8_len(text[start]).min(text.len() - start);
            let i = symbols.len();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < text.len()).then_some(i + 1),
            });
            start += len;
        }
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Bigram>,
                    symbols: &[Symbol],
                    left: Option<usize>,
                    right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else {
                return;
            };
            let size = symbols[l].len + symbols[r].len;
            let s = symbols[l].start;
            if let Some(id) = vocab.token_id(&text[s..s + size]) {
                queue.push(Bigram {
                    score: vocab.score(id),
                    left: l,
                    right: r,
                    size,
                });
            }
        };
        for i in 1..symbols.len() {
            push(&mut queue, &symbols, Some(i - 1), Some(i));
        }
        while let Some(Bigram {
            left: l,
            right: r,
            size,
            ..
        }) = queue.pop()
        {
            let (left, right) = (symbols[l], symbols[r]);
            if left.len == 0 || right.len == 0 || left.len + right.len != size {
                continue;
            }
            symbols[l].len = size;
            symbols[l].next = right.next;
            symbols[r].len = 0;
            if let Some(n) = right.next {
                symbols[n].prev = Some(l);
            }
            push(&mut queue, &symbols, symbols[l].prev, Some(l));
            push(&mut queue, &symbols, Some(l), symbols[l].next);
        }
        for s in symbols.iter().filter(|s| s.len > 0) {
            let piece = &text[s.start..s.start + s.len];
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

fn escape_spaces(raw: &[u8]) -> Vec<u8> {
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
