//! Pre-tokenizers of byte-level BPE: the word splitting that `tokenizer.ggml.pre` selects,
//! reproducing llama.cpp. A pre-tokenizer is a list of splitters applied in turn; each one cuts
//! every current piece into matches and the text between them.
//!
//! llama.cpp runs most regexes on a "collapsed" copy of the text in which every non-ASCII
//! codepoint is replaced by one stand-in character per Unicode category, with `\p{..}` in the
//! regex rewritten to match the stand-in plus the ASCII members of that category; the few
//! common regexes it hand-codes (GPT-2, Llama 3, Qwen 2) are hand-coded here too, since their
//! results differ from a regex engine's in corner cases.

use fancy_regex::Regex;

use crate::unicode::{self, Category, CpFlags};

/// How one splitter finds the pieces of a chunk.
enum Splitter {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (hand-coded).
    Gpt2,
    /// The Llama 3 regex family (hand-coded): `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
    /// \p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`; with
    /// `marks_in_words`, letter runs also take combining marks (Qwen 3.5).
    Llama3 {
        max_digits: usize,
        marks_in_words: bool,
    },
    /// Runs of newlines and runs of anything else (hand-coded `[^\n]+|[\n]+`).
    Newlines,
    /// A regex run on the collapsed text (`collapsed`) or on the text itself.
    Regex { regex: Regex, collapsed: bool },
}

/// What a `tokenizer.ggml.pre` value implies besides its splitters.
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
    /// Look whole words up in the vocabulary before merging.
    pub ignore_merges: bool,
    pub clean_spaces: bool,
    /// The model adds BOS unless its metadata says otherwise.
    pub add_bos: bool,
    /// The model has no BOS token unless its metadata names one.
    pub no_bos: bool,
    /// SentencePiece-style BPE (Gemma 4): spaces become U+2581 before splitting, merges run on
    /// the raw UTF-8 (no byte-to-character map), a run of newlines that is a token is taken
    /// whole, and bytes without a token fall back to `<0xXX>`.
    pub spm_style: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const NEWLINES: &str = r"[^\n]+|[\n]+";
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];
const STARCODER: &[&str] = &[r"\p{N}", GPT2];
const DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}+",
];
const DEEPSEEK_CODER: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
    r"\p{N}",
];
const DEEPSEEK3: &[&str] = &[
    r"\p{N}{1,3}",
    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
const PORO: &str = r" ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const UFAKZEKA: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const MINICPM5: &[&str] = &[
    r"\p{N}{1,3}",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const JAIS2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";

/// The regexes and flags of a `tokenizer.ggml.pre` value (llama.cpp's table), or `None` for a
/// value we do not know.
fn lookup(pre: &str) -> Option<(Vec<&'static str>, Flags)> {
    let clean = Flags {
        clean_spaces: true,
        ..Flags::default()
    };
    let unclean = Flags::default();
    let one = |r: &'static str| vec![r];
    Some(match pre {
        "default" => (DEFAULT.to_vec(), clean),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => (
            one(LLAMA3),
            Flags {
                ignore_merges: true,
                add_bos: true,
                ..clean
            },
        ),
        "dbrx" | "smaug-bpe" => (one(LLAMA3), clean),
        "chatglm-bpe" => (
            one(LLAMA3),
            Flags {
                no_bos: true,
                ..clean
            },
        ),
        "glm4" | "glm5" => (
            one(LLAMA3),
            Flags {
                no_bos: true,
                ignore_merges: true,
                ..clean
            },
        ),
        "deepseek-llm" => (DEEPSEEK_LLM.to_vec(), unclean),
        "deepseek-coder" => (DEEPSEEK_CODER.to_vec(), unclean),
        "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => (DEEPSEEK3.to_vec(), unclean),
        "falcon" => (FALCON.to_vec(), clean),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "a.x-4.0" | "mellum"
        | "exaone4" | "mpt" | "olmo" | "jais" => (one(GPT2), clean),
        "trillion" | "granite-docling" => (one(GPT2), unclean),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            (STARCODER.to_vec(), clean)
        }
        "command-r" | "smollm" => (STARCODER.to_vec(), unclean),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => (one(QWEN2), unclean),
        "stablelm2" | "megrez" => (one(QWEN2), clean),
        "qwen35" => (one(QWEN35), unclean),
        "laguna" => (vec![NEWLINES, QWEN2], unclean),
        "poro-chat" => (one(PORO), unclean),
        "bloom" | "gpt3-finnish" => (one(PORO), clean),
        "viking" => (vec![PORO, r"\p{N}"], unclean),
        "tekken" => (
            one(TEKKEN),
            Flags {
                ignore_merges: true,
                add_bos: true,
                ..unclean
            },
        ),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => (one(GPT4O), unclean),
        "seed-coder" => (one(SEED_CODER), unclean),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (one(BAILINGMOE), unclean),
        "ufakzeka" => (one(UFAKZEKA), unclean),
        "minicpm5" => (
            MINICPM5.to_vec(),
            Flags {
                ignore_merges: true,
                ..clean
            },
        ),
        "jais-2" => (one(JAIS2), clean),
        "gemma4" | "granite-embed-multi-311m" => (
            one(NEWLINES),
            Flags {
                spm_style: true,
                ..clean
            },
        ),
        _ => return None,
    })
}

#[derive(Clone, Copy, Default)]
struct Flags {
    ignore_merges: bool,
    clean_spaces: bool,
    add_bos: bool,
    no_bos: bool,
    spm_style: bool,
}

/// Stand-ins for non-ASCII codepoints in the collapsed text (private-use characters, so no
/// regex class matches them by accident).
const COLLAPSED_OTHER: char = '\u{F8D0}';
fn collapsed_standin(category: Category) -> char {
    match category {
        Category::Number => '\u{F8D1}',
        Category::Letter => '\u{F8D2}',
        Category::Punctuation => '\u{F8D3}',
        Category::Mark => '\u{F8D4}',
        Category::Symbol => '\u{F8D5}',
        _ => COLLAPSED_OTHER,
    }
}

/// `\p{..}` classes llama.cpp rewrites, with the ASCII members of each.
fn category_class(name: &str) -> Option<(Category, &'static str)> {
    Some(match name {
        "N" => (Category::Number, "0-9"),
        "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => (Category::Letter, "A-Za-z"),
        "P" => (Category::Punctuation, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
        "M" => (Category::Mark, ""),
        "S" => (Category::Symbol, r"\$\+<->\^`\|\~"),
        _ => return None,
    })
}

/// Rewrites `\p{..}` in `pattern` for the collapsed text; `None` if it has none.
fn collapse_pattern(pattern: &str) -> Option<String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 32);
    let mut inside = false;
    let mut changed = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let escaped = i > 0 && chars[i - 1] == '\\';
        if c == '[' && !escaped {
            inside = true;
        } else if c == ']' && inside && !escaped {
            inside = false;
        } else if c == '\\' && chars.get(i + 1) == Some(&'p') && chars.get(i + 2) == Some(&'{') {
            let close = chars[i + 3..]
                .iter()
                .position(|&c| c == '}')
                .map(|p| p + i + 3);
            let name: Option<String> = close.map(|close| chars[i + 3..close].iter().collect());
            if let (Some(close), Some((cat, ascii))) =
                (close, name.as_deref().and_then(category_class))
            {
                if !inside {
                    out.push('[');
                }
                out.push(collapsed_standin(cat));
                out.push_str(ascii);
                if !inside {
                    out.push(']');
                }
                changed = true;
                i = close + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    changed.then_some(out)
}

impl PreTokenizer {
    /// The pre-tokenizer named by `tokenizer.ggml.pre`; `Ok(None)` for an unknown name.
    pub fn new(pre: &str) -> Result<Option<PreTokenizer>, String> {
        let Some((patterns, flags)) = lookup(pre) else {
            return Ok(None);
        };
        let splitters = patterns
            .into_iter()
            .map(splitter)
            .collect::<Result<_, _>>()?;
        Ok(Some(PreTokenizer {
            splitters,
            ignore_merges: flags.ignore_merges,
            clean_spaces: flags.clean_spaces,
            add_bos: flags.add_bos,
            no_bos: flags.no_bos,
            spm_style: flags.spm_style,
        }))
    }

    /// Splits `text` into words, each as the UTF-8 bytes of its codepoints (invalid UTF-8
    /// becomes U+FFFD, as in llama.cpp).
    pub fn split(&self, text: &[u8]) -> Vec<Vec<u8>> {
        let cps = unicode::codepoints(text);
        let flags: Vec<CpFlags> = cps.iter().map(|&c| unicode::flags(c)).collect();
        let mut haystacks = Haystacks::default();
        let mut lengths = vec![cps.len()];
        for s in &self.splitters {
            let mut next = Vec::with_capacity(lengths.len() * 2);
            let mut start = 0;
            for &len in &lengths {
                let chunk = Chunk {
                    cps: &cps,
                    flags: &flags,
                    ini: start,
                    end: start + len,
                };
                match s {
                    Splitter::Gpt2 => chunk.split_gpt2(&mut next),
                    Splitter::Llama3 {
                        max_digits,
                        marks_in_words,
                    } => chunk.split_llama3(*max_digits, *marks_in_words, &mut next),
                    Splitter::Newlines => chunk.split_newlines(&mut next),
                    Splitter::Regex { regex, collapsed } => {
                        let hay = haystacks.get(*collapsed, &cps, &flags);
                        split_regex(regex, hay, start, start + len, &mut next)
                    }
                }
                start += len;
            }
            lengths = next;
        }
        let mut words = Vec::with_capacity(lengths.len());
        let mut start = 0;
        for len in lengths {
            let mut w = Vec::with_capacity(len);
            for &cp in &cps[start..start + len] {
                unicode::push_utf8(&mut w, cp);
            }
            words.push(w);
            start += len;
        }
        words
    }
}

fn splitter(pattern: &'static str) -> Result<Splitter, String> {
    Ok(match pattern {
        GPT2 => Splitter::Gpt2,
        LLAMA3 => Splitter::Llama3 {
            max_digits: 3,
            marks_in_words: false,
        },
        QWEN2 => Splitter::Llama3 {
            max_digits: 1,
            marks_in_words: false,
        },
        QWEN35 => Splitter::Llama3 {
            max_digits: 1,
            marks_in_words: true,
        },
        NEWLINES => Splitter::Newlines,
        _ => {
            let (source, collapsed) = match collapse_pattern(pattern) {
                Some(p) => (p, true),
                None => (pattern.to_string(), false),
            };
            let regex = fancy_regex::RegexBuilder::new(&source)
                .backtrack_limit(100_000_000)
                .build()
                .map_err(|e| format!("pre-tokenizer regex {pattern:?}: {e}"))?;
            Splitter::Regex { regex, collapsed }
        }
    })
}

/// The text as regexes see it, built on first use: one char per codepoint, plus the byte
/// offset of each codepoint (and of the end).
#[derive(Default)]
struct Haystacks {
    collapsed: Option<(String, Vec<usize>)>,
    plain: Option<(String, Vec<usize>)>,
}

impl Haystacks {
    fn get(&mut self, collapsed: bool, cps: &[u32], flags: &[CpFlags]) -> &(String, Vec<usize>) {
        let slot = if collapsed {
            &mut self.collapsed
        } else {
            &mut self.plain
        };
        slot.get_or_insert_with(|| {
            let mut s = String::with_capacity(cps.len());
            let mut offsets = Vec::with_capacity(cps.len() + 1);
            for (&cp, &f) in cps.iter().zip(flags) {
                offsets.push(s.len());
                let c = if cp < 0x80 {
                    char::from(cp as u8)
                } else if f.whitespace {
                    // Regexes see non-ASCII whitespace as a vertical tab (llama.cpp's choice).
                    '\x0B'
                } else if collapsed {
                    collapsed_standin(f.category)
                } else {
                    char::from_u32(cp).unwrap_or(char::REPLACEMENT_CHARACTER)
                };
                s.push(c);
            }
            offsets.push(s.len());
            (s, offsets)
        })
    }
}

/// Cuts codepoints `ini..end` into regex matches and the gaps between them.
fn split_regex(
    regex: &Regex,
    hay: &(String, Vec<usize>),
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
) {
    let (text, offsets) = hay;
    let base = offsets[ini];
    let sub = &text[base..offsets[end]];
    let to_cp = |byte: usize| offsets[ini..=end].partition_point(|&o| o < base + byte) + ini;
    let mut last = ini;
    for m in regex.find_iter(sub) {
        // A match that exceeds the backtracking limit ends the search; the rest stays one piece.
        let Ok(m) = m else { break };
        let (s, e) = (to_cp(m.start()), to_cp(m.end()));
        if e == s {
            continue;
        }
        if s > last {
            out.push(s - last);
        }
        out.push(e - s);
        last = e;
    }
    if end > last {
        out.push(end - last);
    }
}

/// One piece of the text during a hand-coded split: positions outside `ini..end` read as
/// "no codepoint".
struct Chunk<'a> {
    cps: &'a [u32],
    flags: &'a [CpFlags],
    ini: usize,
    end: usize,
}

impl Chunk<'_> {
    fn cp(&self, pos: usize) -> Option<u32> {
        (self.ini <= pos && pos < self.end).then(|| self.cps[pos])
    }
    fn fl(&self, pos: usize) -> Option<CpFlags> {
        (self.ini <= pos && pos < self.end).then(|| self.flags[pos])
    }
    fn test(&self, pos: usize, f: impl Fn(CpFlags) -> bool) -> bool {
        self.fl(pos).is_some_and(f)
    }
    fn whitespace(&self, pos: usize) -> bool {
        self.test(pos, |f| f.whitespace)
    }

    /// Length of a contraction ('s 't 'm 'd 're 've 'll) at `pos`, if any.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        if self.cps[pos] != u32::from(b'\'') || pos + 1 >= self.end {
            return None;
        }
        let low = |c: u32| if fold_case { unicode::to_lower(c) } else { c };
        let is = |c: u32, ch: u8| c == u32::from(ch);
        let n1 = low(self.cps[pos + 1]);
        if [b's', b't', b'm', b'd'].iter().any(|&ch| is(n1, ch)) {
            return Some(2);
        }
        if pos + 2 < self.end {
            let n2 = low(self.cps[pos + 2]);
            if (is(n1, b'r') && is(n2, b'e'))
                || (is(n1, b'v') && is(n2, b'e'))
                || (is(n1, b'l') && is(n2, b'l'))
            {
                return Some(3);
            }
        }
        None
    }

    fn split_gpt2(&self, out: &mut Vec<usize>) {
        let mut pieces = Pieces {
            out,
            prev_end: self.ini,
        };
        let mut pos = self.ini;
        while pos < self.end {
            let cp = self.cps[pos];
            if let Some(n) = self.contraction(pos, false) {
                pos += n;
                pieces.cut(pos);
                continue;
            }
            let space = cp == u32::from(b' ');
            let f2 = if space {
                self.fl(pos + 1)
            } else {
                Some(self.flags[pos])
            };
            let other = |f: CpFlags| !(f.whitespace || f.is_letter() || f.is_number());
            if f2.is_some_and(CpFlags::is_letter) {
                pos += usize::from(space);
                while self.test(pos, CpFlags::is_letter) {
                    pos += 1;
                }
            } else if f2.is_some_and(CpFlags::is_number) {
                pos += usize::from(space);
                while self.test(pos, CpFlags::is_number) {
                    pos += 1;
                }
            } else if f2.is_some_and(other) {
                pos += usize::from(space);
                while self.test(pos, other) {
                    pos += 1;
                }
            } else {
                let n_ws = (0..).take_while(|&k| self.whitespace(pos + k)).count();
                if n_ws > 1 && self.cp(pos + n_ws).is_some() {
                    pos += n_ws - 1; // \s+(?!\S): leave the last space to the next word
                } else if n_ws > 0 {
                    pos += n_ws;
                } else {
                    pos += 1;
                }
            }
            pieces.cut(pos);
        }
    }

    fn split_llama3(&self, max_digits: usize, marks_in_words: bool, out: &mut Vec<usize>) {
        let mut pieces = Pieces {
            out,
            prev_end: self.ini,
        };
        let wordish = |f: CpFlags| f.is_letter() || (marks_in_words && f.is_mark());
        let other = |f: CpFlags| !(f.whitespace || wordish(f) || f.is_number());
        let newline = |c: Option<u32>| c == Some(u32::from(b'\r')) || c == Some(u32::from(b'\n'));
        let mut pos = self.ini;
        while pos < self.end {
            let cp = self.cps[pos];
            let f = self.flags[pos];
            if let Some(n) = self.contraction(pos, true) {
                pos += n;
                pieces.cut(pos);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(newline(Some(cp)) || f.is_number()) && (wordish(f) || self.test(pos + 1, wordish))
            {
                pos += 1;
                while self.test(pos, wordish) {
                    pos += 1;
                }
                pieces.cut(pos);
                continue;
            }
            // \p{N}{1,max_digits}
            if f.is_number() {
                let mut ini = pos;
                while self.test(pos, CpFlags::is_number) {
                    pos += 1;
                    if pos - ini >= max_digits {
                        pieces.cut(pos);
                        ini = pos;
                    }
                }
                pieces.cut(pos);
                continue;
            }
            // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (also taken by a final lone space)
            let space = cp == u32::from(b' ');
            let f2 = if space { self.fl(pos + 1) } else { Some(f) };
            if f2.is_none_or(other) {
                pos += usize::from(space);
                while self.test(pos, other) {
                    pos += 1;
                }
                while newline(self.cp(pos)) {
                    pos += 1;
                }
                pieces.cut(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_newline_end = None;
            while self.whitespace(pos + n_ws) {
                if newline(self.cp(pos + n_ws)) {
                    last_newline_end = Some(pos + n_ws + 1);
                }
                n_ws += 1;
            }
            pos = if let Some(e) = last_newline_end {
                e // \s*[\r\n]+
            } else if n_ws > 1 && self.cp(pos + n_ws).is_some() {
                pos + n_ws - 1 // \s+(?!\S)
            } else if n_ws > 0 {
                pos + n_ws // \s+
            } else {
                pos + 1
            };
            pieces.cut(pos);
        }
    }

    fn split_newlines(&self, out: &mut Vec<usize>) {
        let mut pos = self.ini;
        while pos < self.end {
            let is_nl = self.cps[pos] == u32::from(b'\n');
            let start = pos;
            while pos < self.end && (self.cps[pos] == u32::from(b'\n')) == is_nl {
                pos += 1;
            }
            out.push(pos - start);
        }
    }
}

/// Collects piece lengths: each cut ends a piece at `end` (empty pieces are dropped).
struct Pieces<'a> {
    out: &'a mut Vec<usize>,
    prev_end: usize,
}

impl Pieces<'_> {
    fn cut(&mut self, end: usize) {
        if end > self.prev_end {
            self.out.push(end - self.prev_end);
        }
        self.prev_end = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(pre).unwrap().unwrap();
        p.split(text.as_bytes())
            .into_iter()
            .map(|w| String::from_utf8(w).unwrap())
            .collect()
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        assert_eq!(
            words("gpt-2", "Hello world's  end!!\n"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n"]
        );
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(words("smollm", "ab 123"), ["ab", " ", "1", "2", "3"]);
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(
            words("llama-bpe", "I'M 12345\n\n x"),
            ["I", "'M", " ", "123", "45", "\n\n", " x"]
        );
    }

    #[test]
    fn qwen2_single_digits() {
        assert_eq!(words("qwen2", "a1 22"), ["a", "1", " ", "2", "2"]);
    }

    #[test]
    fn collapsed_regex_classes() {
        assert_eq!(collapse_pattern(r"\p{N}").unwrap(), "[\u{F8D1}0-9]");
        assert_eq!(
            collapse_pattern(r"[^\s\p{L}]").unwrap(),
            "[^\\s\u{F8D2}A-Za-z]"
        );
        assert!(collapse_pattern(r"[\r\n]").is_none());
        // Non-ASCII digits count as \p{N} through their stand-in.
        assert_eq!(words("deepseek-coder", "x٣٤"), ["x", "٣", "٤"]);
    }

    #[test]
    fn every_known_pre_compiles() {
        for pre in [
            "default",
            "falcon",
            "deepseek-llm",
            "deepseek-v3",
            "poro-chat",
            "viking",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
            "ufakzeka",
            "minicpm5",
            "jais-2",
            "laguna",
            "qwen35",
        ] {
            assert!(PreTokenizer::new(pre).unwrap().is_some(), "{pre}");
        }
        assert!(PreTokenizer::new("no-such-pre").unwrap().is_none());
    }
}
