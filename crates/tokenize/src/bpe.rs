//! Byte-level BPE (GGUF `gpt2` model) as llama.cpp runs it: pre-tokenize into words, map each
//! byte to its printable stand-in, then repeatedly merge the adjacent pair with the lowest merge
//! rank (leftmost first among equals). Gemma 4's SentencePiece-style variant merges the raw
//! UTF-8 with spaces written as U+2581.

use std::cmp::Reverse;
use std::collections::HashMap;

use crate::merge::{merge, PairRank, Symbol};
use crate::pretokenize::PreTokenizer;
use crate::spm::escape_spaces;
use crate::unicode;
use crate::vocab::Vocab;

pub(crate) struct Bpe {
    pre: PreTokenizer,
    /// Interned texts of the merge halves.
    parts: HashMap<Box<[u8]>, u32>,
    /// (left part, right part) -> rank.
    ranks: HashMap<(u32, u32), u32>,
}

/// Byte-level BPE's ranking of a pair: its merge rank, lowest first.
struct MergeRanks<'a> {
    bpe: &'a Bpe,
    word: &'a [u8],
    /// Interned id of each symbol's text, if it is a merge half.
    parts: Vec<Option<u32>>,
}

impl PairRank for MergeRanks<'_> {
    type Rank = Reverse<u32>;

    fn begin(&mut self, symbols: &[Symbol]) {
        self.parts = (symbols.iter())
            .map(|s| self.bpe.parts.get(&self.word[s.range()]).copied())
            .collect();
    }

    fn rank(&self, _: &[Symbol], l: usize, r: usize) -> Option<Reverse<u32>> {
        let pair = (self.parts[l]?, self.parts[r]?);
        self.bpe.ranks.get(&pair).map(|&rank| Reverse(rank))
    }

    fn merged(&mut self, symbols: &[Symbol], l: usize) {
        self.parts[l] = self.bpe.parts.get(&self.word[symbols[l].range()]).copied();
    }
}

impl Bpe {
    /// `merges` are "left right" lines, rank = line number. A line without a space after its
    /// first byte becomes the pair ("", ""), which never matches (llama.cpp does the same).
    pub fn new(pre: PreTokenizer, merges: &[&[u8]]) -> Bpe {
        let mut parts: HashMap<Box<[u8]>, u32> = HashMap::new();
        let mut ranks = HashMap::with_capacity(merges.len());
        let intern = |s: &[u8], parts: &mut HashMap<Box<[u8]>, u32>| {
            let n = parts.len() as u32;
            *parts.entry(s.into()).or_insert(n)
        };
        for (rank, line) in merges.iter().enumerate() {
            let (left, right) = match line.iter().skip(1).position(|&b| b == b' ') {
                Some(p) => (&line[..p + 1], &line[p + 2..]),
                None => (&line[..0], &line[..0]),
            };
            let key = (intern(left, &mut parts), intern(right, &mut parts));
            // The first line for a pair keeps its rank.
            ranks.entry(key).or_insert(rank as u32);
        }
        Bpe { pre, parts, ranks }
    }

    /// Whether tokens hold raw UTF-8 with U+2581 for spaces (Gemma 4), not byte-level text.
    pub fn spm_style(&self) -> bool {
        self.pre.spm_style
    }

    pub fn tokenize(&self, vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) {
        if self.pre.spm_style {
            let escaped = escape_spaces(text);
            for word in self.pre.split(&escaped) {
                // A run of newlines that is a token is taken whole (llama.cpp's Gemma 4 rule).
                let newlines = word.iter().all(|&b| b == b'\n');
                match vocab.token_id(&word).filter(|_| newlines) {
                    Some(id) => out.push(id),
                    None => self.tokenize_word(vocab, &word, out),
                }
            }
            return;
        }
        let mut encoded = Vec::new();
        for word in self.pre.split(text) {
            encoded.clear();
            for &b in &word {
                let mut buf = [0u8; 4];
                encoded
                    .extend_from_slice(unicode::byte_to_char(b).encode_utf8(&mut buf).as_bytes());
            }
            self.tokenize_word(vocab, &encoded, out);
        }
    }

    fn tokenize_word(&self, vocab: &Vocab, word: &[u8], out: &mut Vec<u32>) {
        if self.pre.ignore_merges {
            if let Some(id) = vocab.token_id(word) {
                out.push(id);
                return;
            }
        }
        let mut rule = MergeRanks {
            bpe: self,
            word,
            parts: Vec::new(),
        };
        for range in merge(word, &mut rule) {
            let text = &word[range];
            match vocab.token_id(text) {
                Some(id) => out.push(id),
                // Not a token: each byte of the text on its own, where that is a token.
                None if self.pre.spm_style => out.extend(
                    (text.iter())
                        .filter_map(|&b| vocab.token_id(format!("<0x{b:02X}>").as_bytes())),
                ),
                None => out.extend(text.iter().filter_map(|&b| vocab.token_id(&[b]))),
            }
        }
    }
}
