//! The vocabulary shared by the GGUF tokenizers: token texts (raw bytes), scores, attributes,
//! a hashed text -> id index, the special ids and the flags that steer encoding.

use std::collections::{BTreeSet, HashMap};

/// Token attributes as llama.cpp keeps them (a bit set: a token can be e.g. user-defined and
/// control at once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attr(u16);

impl Attr {
    pub const UNDEFINED: Attr = Attr(0);
    pub const UNKNOWN: Attr = Attr(1 << 0);
    pub const UNUSED: Attr = Attr(1 << 1);
    pub const NORMAL: Attr = Attr(1 << 2);
    pub const CONTROL: Attr = Attr(1 << 3);
    pub const USER_DEFINED: Attr = Attr(1 << 4);
    pub const BYTE: Attr = Attr(1 << 5);

    /// From a `tokenizer.ggml.token_type` value: 1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte; anything else is undefined.
    pub fn from_token_type(t: i64) -> Attr {
        match t {
            1 => Attr::NORMAL,
            2 => Attr::UNKNOWN,
            3 => Attr::CONTROL,
            4 => Attr::USER_DEFINED,
            5 => Attr::UNUSED,
            6 => Attr::BYTE,
            _ => Attr::UNDEFINED,
        }
    }

    pub fn has(self, any_of: Attr) -> bool {
        self.0 & any_of.0 != 0
    }

    pub fn with(self, other: Attr) -> Attr {
        Attr(self.0 | other.0)
    }
}

impl std::ops::BitOr for Attr {
    type Output = Attr;
    fn bitor(self, rhs: Attr) -> Attr {
        self.with(rhs)
    }
}

/// Ids with a role. `None` where the model has no such token.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    /// Separator (BERT's `[SEP]`), appended by WordPiece when special tokens are added.
    pub sep: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) struct Vocab {
    texts: Vec<Box<[u8]>>,
    scores: Vec<f32>,
    attrs: Vec<Attr>,
    index: HashMap<Box<[u8]>, u32>,
    pub special: SpecialIds,
    /// End-of-generation ids.
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order in which
    /// they are cut out of raw text.
    pub partition_order: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// WordPiece: append the separator when special tokens are added.
    pub add_sep: bool,
    /// SentencePiece: prepend a space to text that starts the input or follows a special token.
    pub add_space_prefix: bool,
    /// Remove spaces before punctuation when decoding (llama.cpp's clean_spaces).
    pub clean_spaces: bool,
}

/// A vocabulary entry before indexing.
pub(crate) struct Entry {
    pub text: Vec<u8>,
    pub score: f32,
    pub attr: Attr,
}

impl Vocab {
    /// Indexes `entries`. A repeated text is an error: the message names both ids.
    pub fn new(entries: Vec<Entry>) -> Result<Vocab, String> {
        let n = entries.len();
        let mut texts = Vec::with_capacity(n);
        let mut scores = Vec::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        let mut index = HashMap::with_capacity(n);
        for (id, e) in entries.into_iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| format!("{n} tokens do not fit 32-bit ids"))?;
            let text: Box<[u8]> = e.text.into_boxed_slice();
            if let Some(prev) = index.insert(text.clone(), id) {
                return Err(format!(
                    "duplicate token '{}' has ids {prev} and {id}",
                    String::from_utf8_lossy(&text)
                ));
            }
            texts.push(text);
            scores.push(e.score);
            attrs.push(e.attr);
        }
        Ok(Vocab {
            texts,
            scores,
            attrs,
            index,
            special: SpecialIds::default(),
            eog: BTreeSet::new(),
            partition_order: Vec::new(),
            add_bos: false,
            add_eos: false,
            add_sep: false,
            add_space_prefix: false,
            clean_spaces: false,
        })
    }

    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn token_id(&self, text: &[u8]) -> Option<u32> {
        self.index.get(text).copied()
    }

    /// The text of a valid id.
    pub fn text(&self, id: u32) -> &[u8] {
        &self.texts[id as usize]
    }

    pub fn score(&self, id: u32) -> f32 {
        self.scores[id as usize]
    }

    /// Attributes of `id`; an id outside the vocabulary has none.
    pub fn attr(&self, id: u32) -> Attr {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(Attr::UNDEFINED)
    }

    pub fn add_attr(&mut self, id: u32, attr: Attr) {
        let a = &mut self.attrs[id as usize];
        *a = a.with(attr);
    }

    pub fn set_attr(&mut self, id: u32, attr: Attr) {
        self.attrs[id as usize] = attr;
    }

    /// Fills [`Vocab::partition_order`] from the current attributes.
    pub fn build_partition_order(&mut self) {
        let special = Attr::CONTROL | Attr::USER_DEFINED | Attr::UNKNOWN;
        let mut ids: Vec<u32> = (0..self.len() as u32)
            .filter(|&id| self.attr(id).has(special))
            .collect();
        // Stable: equal lengths keep id order (llama.cpp's order among them is unspecified).
        ids.sort_by_key(|&id| std::cmp::Reverse(self.texts[id as usize].len()));
        self.partition_order = ids;
    }
}
