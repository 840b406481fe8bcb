//! Special tokens: the roles llama.cpp recognises by token text (end of turn, FIM, end of
//! generation), and cutting special-token text out of raw input before the subword model runs.

use aho_corasick::AhoCorasick;
use memchr::memmem;

use std::collections::BTreeSet;

use crate::vocab::{Attr, SpecialIds, Vocab};

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts that end generation whatever their role.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// Chat-format markers that are always rendered and never end generation (gpt-oss).
const ALWAYS_RENDERED_TEXTS: &[&str] =
    &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// A vocabulary as seen by [`assign_roles`]: lookup by text and attribute changes.
pub(crate) trait RoleVocab {
    fn find(&self, text: &str) -> Option<u32>;
    /// Adds `attr` to the token's attributes.
    fn mark(&mut self, id: u32, attr: Attr);
    /// Replaces the token's attributes.
    fn set(&mut self, id: u32, attr: Attr);
}

impl RoleVocab for Vocab {
    fn find(&self, text: &str) -> Option<u32> {
        self.token_id(text.as_bytes())
    }
    fn mark(&mut self, id: u32, attr: Attr) {
        self.add_attr(id, attr);
    }
    fn set(&mut self, id: u32, attr: Attr) {
        self.set_attr(id, attr);
    }
}

/// The lowest id whose text is one of `texts`.
fn find_by_text(vocab: &impl RoleVocab, texts: &[&str]) -> Option<u32> {
    texts.iter().filter_map(|t| vocab.find(t)).min()
}

/// Completes the roles the metadata left unset by looking at token texts, marks every token
/// with such a role as control, and returns the end-of-generation set, as llama.cpp does when
/// it loads a vocabulary. Where several tokens match a role, the lowest id takes it.
pub(crate) fn assign_roles(vocab: &mut impl RoleVocab, ids: &mut SpecialIds) -> BTreeSet<u32> {
    for (slot, texts) in [
        (&mut ids.eot, EOT_TEXTS),
        (&mut ids.eom, EOM_TEXTS),
        (&mut ids.fim_pre, FIM_PRE_TEXTS),
        (&mut ids.fim_suf, FIM_SUF_TEXTS),
        (&mut ids.fim_mid, FIM_MID_TEXTS),
        (&mut ids.fim_pad, FIM_PAD_TEXTS),
        (&mut ids.fim_rep, FIM_REP_TEXTS),
        (&mut ids.fim_sep, FIM_SEP_TEXTS),
    ] {
        if slot.is_none() {
            *slot = find_by_text(vocab, texts);
            if let Some(id) = *slot {
                vocab.mark(id, Attr::CONTROL);
            }
        }
    }

    let mut eog: BTreeSet<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for text in EOG_TEXTS {
        if let Some(id) = vocab.find(text) {
            eog.insert(id);
            vocab.mark(id, Attr::CONTROL);
        }
    }
    for text in ALWAYS_RENDERED_TEXTS {
        if let Some(id) = vocab.find(text) {
            vocab.set(id, Attr::USER_DEFINED);
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());

    let with_text =
        |eog: &BTreeSet<u32>, text: &str| vocab.find(text).filter(|id| eog.contains(id));
    // Harmony-style vocabularies end a turn with <|return|> or <|call|>; there <|end|> only
    // closes a message.
    let has_return = with_text(&eog, "<|return|>").is_some();
    let has_call = with_text(&eog, "<|call|>")
        .or(with_text(&eog, "<|calls|>"))
        .is_some();
    let has_flush = with_text(&eog, "<|flush|>").is_some();
    let end_id = with_text(&eog, "<|end|>");
    // Vocabularies with <|tool_response> use </s> as ordinary text.
    let tool_response = with_text(&eog, "<|tool_response>").is_some();
    let s_id = with_text(&eog, "</s>");
    if let Some(end) = end_id.filter(|_| has_call && (has_return || has_flush)) {
        eog.remove(&end);
        vocab.set(end, Attr::USER_DEFINED);
    }
    if let Some(s) = s_id.filter(|_| tool_response) {
        eog.remove(&s);
        vocab.set(s, Attr::NORMAL);
    }
    eog
}

/// A piece of input: raw text still to be tokenized, or a special token cut out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a [u8]),
    Token(u32),
}

/// Finds special-token text in raw input. Tokens are taken longest first; each one is cut out
/// of every remaining text fragment, leftmost occurrence first. Control and unknown tokens are
/// cut only when `parse_special` is set; user-defined tokens always are.
pub(crate) struct SpecialMatcher {
    /// Over the texts of `vocab.partition_order`, in that order.
    automaton: Option<AhoCorasick>,
}

impl SpecialMatcher {
    pub fn new(vocab: &Vocab) -> SpecialMatcher {
        let patterns: Vec<&[u8]> = vocab
            .partition_order
            .iter()
            .map(|&id| vocab.text(id))
            .collect();
        // Building only fails for pattern sets far beyond any vocabulary; then every token is
        // searched for directly.
        let automaton = if patterns.is_empty() {
            None
        } else {
            AhoCorasick::new(&patterns).ok()
        };
        SpecialMatcher { automaton }
    }

    pub fn partition<'a>(
        &self,
        vocab: &Vocab,
        text: &'a [u8],
        parse_special: bool,
    ) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(text)];
        let skip = Attr::CONTROL | Attr::UNKNOWN;
        // Positions in partition_order of the tokens present anywhere in the text.
        let present: Vec<usize> = match &self.automaton {
            Some(ac) => {
                let mut found: Vec<usize> = ac
                    .find_overlapping_iter(text)
                    .map(|m| m.pattern().as_usize())
                    .collect();
                found.sort_unstable();
                found.dedup();
                found
            }
            None => (0..vocab.partition_order.len()).collect(),
        };
        for i in present {
            let id = vocab.partition_order[i];
            if !parse_special && vocab.attr(id).has(skip) {
                continue;
            }
            fragments = cut(&fragments, vocab.text(id), id);
        }
        fragments
    }
}

/// Replaces every occurrence of `needle` in the text fragments by `Token(id)`.
fn cut<'a>(fragments: &[Fragment<'a>], needle: &[u8], id: u32) -> Vec<Fragment<'a>> {
    let mut out = Vec::with_capacity(fragments.len() + 2);
    let finder = memmem::Finder::new(needle);
    for &f in fragments {
        let Fragment::Text(mut rest) = f else {
            out.push(f);
            continue;
        };
        while let Some(pos) = finder.find(rest) {
            if pos > 0 {
                out.push(Fragment::Text(&rest[..pos]));
            }
            out.push(Fragment::Token(id));
            rest = &rest[pos + needle.len()..];
        }
        if !rest.is_empty() {
            out.push(Fragment::Text(rest));
        }
    }
    out
}
