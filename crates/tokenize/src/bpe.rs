//! Byte-level BPE (GGUF `gpt2` model) as llama.cpp runs it: pre-tokenize into words, map each
//! byte to its printable stand-in, then repeatedly merge the adjacent pair with the lowest merge
//! rank (leftmost first among equals).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::pretokenize::PreTokenizer;
use crate::unicode;
use crate::vocab::Vocab;

pub(crate) struct Bpe {
    pre: PreTokenizer,
    /// Interned texts of the merge halves.
    parts: HashMap<Box<[u8]>, u32>,
    /// (left part, right part) -> rank.
    ranks: HashMap<(u32, u32), u32>,
}

/// A symbol of the word being merged: a byte range plus its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    /// Interned id of the symbol's text, if it is a merge half.
    part: Option<u32>,
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

    pub fn tokenize(&self, vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) {
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
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        let mut start = 0;
        while start < word.len() {
            let len = unicode::utf8_len(word[start]).min(word.len() - start);
            let i = symbols.len();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < word.len()).then_some(i + 1),
                part: self.parts.get(&word[start..start + len]).copied(),
            });
            start += len;
        }
        // (rank, left index, right index, byte size of the pair when queued)
        let mut queue: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>,
                    symbols: &[Symbol],
                    left: Option<usize>,
                    right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else {
                return;
            };
            let (Some(pl), Some(pr)) = (symbols[l].part, symbols[r].part) else {
                return;
            };
            if let Some(&rank) = self.ranks.get(&(pl, pr)) {
                queue.push(Reverse((rank, l, r, symbols[l].len + symbols[r].len)));
            }
        };
        for i in 1..symbols.len() {
            push(&mut queue, &symbols, Some(i - 1), Some(i));
        }
        while let Some(Reverse((_, l, r, size))) = queue.pop() {
            let (left, right) = (symbols[l], symbols[r]);
            // Skip pairs that an earlier merge changed.
            if left.len == 0 || right.len == 0 || left.len + right.len != size {
                continue;
            }
            let merged = &word[left.start..left.start + size];
            symbols[l].len = size;
            symbols[l].next = right.next;
            symbols[l].part = self.parts.get(merged).copied();
            symbols[r].len = 0;
            if let Some(n) = right.next {
                symbols[n].prev = Some(l);
            }
            push(&mut queue, &symbols, symbols[l].prev, Some(l));
            push(&mut queue, &symbols, Some(l), symbols[l].next);
        }
        for s in symbols.iter().filter(|s| s.len > 0) {
            let text = &word[s.start..s.start + s.len];
            match vocab.token_id(text) {
                Some(id) => out.push(id),
                // Not a token: each byte of the text on its own, where that is a token.
                None => out.extend(text.iter().filter_map(|&b| vocab.token_id(&[b]))),
            }
        }
    }
}
