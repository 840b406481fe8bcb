//! The merge loop both BPE flavours share: a word cut into UTF-8 characters, each linked to its
//! neighbours, and the best-ranked adjacent pair merged (leftmost first among equals) until no
//! pair may merge. Byte-level BPE and SentencePiece differ only in how they rank a pair.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use crate::unicode;

/// A symbol of the word being merged: a byte range and its neighbours; empty once merged away.
#[derive(Clone, Copy)]
pub(crate) struct Symbol {
    pub start: usize,
    pub len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Symbol {
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

/// How a tokenizer ranks the merge of two adjacent symbols.
pub(crate) trait PairRank {
    /// Greater ranks merge first.
    type Rank: Ord;
    /// The word is cut into `symbols`, one per character; no merge has happened yet.
    fn begin(&mut self, _symbols: &[Symbol]) {}
    /// The rank of merging symbol `l` with its right neighbour `r`, if they may merge.
    fn rank(&self, symbols: &[Symbol], l: usize, r: usize) -> Option<Self::Rank>;
    /// Symbol `l` has just taken in its right neighbour.
    fn merged(&mut self, _symbols: &[Symbol], _l: usize) {}
}

/// The byte ranges of `text`'s symbols, in order, after every merge `rule` allows.
pub(crate) fn merge<R: PairRank>(text: &[u8], rule: &mut R) -> Vec<Range<usize>> {
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
    rule.begin(&symbols);
    // (rank, leftmost first, right index, byte size of the pair when queued)
    let mut queue: BinaryHeap<(R::Rank, Reverse<usize>, usize, usize)> = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<_>, rule: &R, symbols: &[Symbol], l: Option<usize>| {
        let Some(l) = l else { return };
        let Some(r) = symbols[l].next else { return };
        if let Some(rank) = rule.rank(symbols, l, r) {
            queue.push((rank, Reverse(l), r, symbols[l].len + symbols[r].len));
        }
    };
    for i in 0..symbols.len() {
        push(&mut queue, rule, &symbols, Some(i));
    }
    while let Some((_, Reverse(l), r, size)) = queue.pop() {
        let (left, right) = (symbols[l], symbols[r]);
        // Skip pairs that an earlier merge changed.
        if left.len == 0 || right.len == 0 || left.len + right.len != size {
            continue;
        }
        symbols[l].len = size;
        symbols[l].next = right.next;
        symbols[r].len = 0;
        if let Some(n) = right.next {
            symbols[n].prev = Some(l);
        }
        rule.merged(&symbols, l);
        push(&mut queue, rule, &symbols, symbols[l].prev);
        push(&mut queue, rule, &symbols, Some(l));
    }
    symbols
        .iter()
        .filter(|s| s.len > 0)
        .map(Symbol::range)
        .collect()
}
