//! OpenAI's `response_format: {"type": "json_object"}`: the reply is one JSON object. After each
//! forward pass, every token whose text cannot continue a valid JSON object is masked out, so
//! the sampler only ever picks tokens that keep the text a prefix of one; the end-of-turn
//! token is allowed only once the object is closed, and then nothing else is.
//!
//! The masking sits between the engine and the executor ([`Constrained`]), so the engine's
//! sampling, stop strings and accounting stay as they are.

use anelm_model::{ExecError, Executor, KvState, Logits};

/// Where a JSON text stands, byte by byte. Copyable: checking a token clones it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonPrefix {
    state: State,
    /// Open containers, innermost in the lowest bit: 1 for an array, 0 for an object.
    stack: u64,
    depth: u8,
}

/// Nesting deeper than this is refused (the stack is one word).
const MAX_DEPTH: u8 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the top-level object: whitespace or `{`.
    Start,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// A value is due (after `:` or `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After a value: `,` or the closing bracket.
    AfterValue,
    /// In a string (a key when `key`).
    Str {
        key: bool,
        escape: Escape,
    },
    Number(Num),
    /// In `true`, `false` or `null`: the bytes still due.
    Literal(&'static [u8]),
    /// The top-level object is closed: whitespace only.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escape {
    None,
    /// After a backslash.
    Backslash,
    /// In `\uXXXX`, this many hex digits still due.
    Hex(u8),
}

/// The parts of a number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    /// Whether the number may end here.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix {
            state: State::Start,
            stack: 0,
            depth: 0,
        }
    }
}

impl JsonPrefix {
    /// Whether the top-level object is complete.
    pub fn complete(&self) -> bool {
        self.state == State::Done
    }

    /// Takes `bytes`; false (and the state undefined) when they cannot continue the text.
    pub fn push_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.push(b))
    }

    pub fn push(&mut self, b: u8) -> bool {
        match self.state {
            State::Start => match b {
                b'{' => self.open(false),
                _ => is_ws(b),
            },
            State::KeyOrClose | State::Key => match b {
                b'"' => self.to(State::Str {
                    key: true,
                    escape: Escape::None,
                }),
                b'}' if self.state == State::KeyOrClose => self.close(false),
                _ => is_ws(b),
            },
            State::Colon => match b {
                b':' => self.to(State::Value),
                _ => is_ws(b),
            },
            State::Value => self.value(b),
            State::ValueOrClose => match b {
                b']' => self.close(true),
                _ => self.value(b),
            },
            State::AfterValue => self.after_value(b),
            State::Str { key, escape } => self.string(b, key, escape),
            State::Number(n) => self.number(b, n),
            State::Literal(rest) => match rest.split_first() {
                Some((&want, rest)) if b == want => {
                    self.state = if rest.is_empty() {
                        State::AfterValue
                    } else {
                        State::Literal(rest)
                    };
                    true
                }
                _ => false,
            },
            State::Done => is_ws(b),
        }
    }

    fn to(&mut self, state: State) -> bool {
        self.state = state;
        true
    }

    fn value(&mut self, b: u8) -> bool {
        match b {
            b'{' => self.open(false),
            b'[' => self.open(true),
            b'"' => self.to(State::Str {
                key: false,
                escape: Escape::None,
            }),
            b'-' => self.to(State::Number(Num::Minus)),
            b'0' => self.to(State::Number(Num::Zero)),
            b'1'..=b'9' => self.to(State::Number(Num::Int)),
            b't' => self.to(State::Literal(b"rue")),
            b'f' => self.to(State::Literal(b"alse")),
            b'n' => self.to(State::Literal(b"ull")),
            _ => is_ws(b),
        }
    }

    fn after_value(&mut self, b: u8) -> bool {
        let in_array = self.stack & 1 == 1;
        match b {
            b',' => self.to(if in_array { State::Value } else { State::Key }),
            b'}' if !in_array => self.close(false),
            b']' if in_array => self.close(true),
            _ => is_ws(b),
        }
    }

    fn open(&mut self, array: bool) -> bool {
        if self.depth == MAX_DEPTH {
            return false;
        }
        self.stack = (self.stack << 1) | u64::from(array);
        self.depth += 1;
        self.to(if array {
            State::ValueOrClose
        } else {
            State::KeyOrClose
        })
    }

    fn close(&mut self, array: bool) -> bool {
        if self.depth == 0 || (self.stack & 1 == 1) != array {
            return false;
        }
        self.stack >>= 1;
        self.depth -= 1;
        self.to(if self.depth == 0 {
            State::Done
        } else {
            State::AfterValue
        })
    }

    fn string(&mut self, b: u8, key: bool, escape: Escape) -> bool {
        let next = match escape {
            Escape::None => match b {
                b'"' => return self.to(if key { State::Colon } else { State::AfterValue }),
                b'\\' => Escape::Backslash,
                0..=0x1f => return false,
                _ => Escape::None,
            },
            Escape::Backslash => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Escape::None,
                b'u' => Escape::Hex(4),
                _ => return false,
            },
            Escape::Hex(n) if b.is_ascii_hexdigit() => {
                if n == 1 {
                    Escape::None
                } else {
                    Escape::Hex(n - 1)
                }
            }
            Escape::Hex(_) => return false,
        };
        self.to(State::Str { key, escape: next })
    }

    fn number(&mut self, b: u8, n: Num) -> bool {
        let next = match (n, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
            (Num::E, b'+' | b'-') => Num::ESign,
            (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Num::Exp,
            // Anything else ends the number, if it may end here.
            _ if n.complete() => {
                self.state = State::AfterValue;
                return self.after_value(b);
            }
            _ => return false,
        };
        self.to(State::Number(next))
    }
}

/// What masking needs to know of the vocabulary: each token's bytes (None for special tokens,
/// which have no text) and the tokens that end a turn.
pub struct Vocabulary {
    pub pieces: Vec<Option<Vec<u8>>>,
    pub stop_ids: Vec<u32>,
}

impl Vocabulary {
    /// Sets every token that cannot follow `prefix` to minus infinity.
    fn mask(&self, prefix: &JsonPrefix, logits: &mut [f32]) {
        for (id, logit) in logits.iter_mut().enumerate() {
            let allowed = if prefix.complete() {
                self.stop_ids.contains(&(id as u32))
            } else {
                match self.pieces.get(id) {
                    Some(Some(piece)) if !piece.is_empty() => prefix.clone().push_all(piece),
                    _ => false,
                }
            };
            if !allowed {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// The bytes of a token, for advancing the prefix once it is chosen.
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces
            .get(id as usize)
            .and_then(|p| p.as_deref())
            .unwrap_or(&[])
    }
}

/// An executor whose last-position logits are masked to the tokens that keep the text JSON.
pub struct Constrained<'a> {
    pub inner: &'a mut dyn Executor,
    pub vocabulary: &'a Vocabulary,
    pub prefix: &'a JsonPrefix,
}

impl Executor for Constrained<'_> {
    fn new_state(&self, capacity: usize) -> Result<Box<dyn KvState>, ExecError> {
        self.inner.new_state(capacity)
    }

    fn forward(
        &mut self,
        state: &mut dyn KvState,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        self.inner.forward(state, tokens, logits, out)?;
        if logits == Logits::Last {
            self.vocabulary.mask(self.prefix, out);
        }
        Ok(())
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(text: &str) -> Option<bool> {
        let mut p = JsonPrefix::default();
        p.push_all(text.as_bytes()).then(|| p.complete())
    }

    #[test]
    fn complete_objects() {
        for text in [
            "{}",
            " {\"a\": 1}\n",
            r#"{"a": [1, -2.5e+3, 0, 0.25, true, false, null, "x\"y\\u00e9"], "b": {"c": {}}, "d": []}"#,
            "{\"é 😀\": \"ü\"}",
        ] {
            assert_eq!(accepts(text), Some(true), "{text}");
        }
    }

    #[test]
    fn prefixes_are_accepted_but_not_complete() {
        for text in [
            "",
            "  ",
            "{",
            "{\"a",
            "{\"a\":",
            "{\"a\": -",
            "{\"a\": 1.",
            "{\"a\": [tr",
            "{\"a\": \"\\u00",
        ] {
            assert_eq!(accepts(text), Some(false), "{text}");
        }
    }

    #[test]
    fn invalid_text_is_refused() {
        for text in [
            "[]",
            "x",
            "{a",
            "{\"a\" 1}",
            "{\"a\": 01}",
            "{\"a\": 1.}",
            "{\"a\": tru}",
            "{\"a\": [1,]}",
            "{\"a\": 1,}",
            "{\"a\": \"\\x\"}",
            "{\"a\": \"\n\"}",
            "{\"a\": 1]",
            "{} {}",
            "{\"a\": -}",
            "{\"a\": \"\\u12g4\"}",
        ] {
            assert_eq!(accepts(text), None, "{text}");
        }
    }

    #[test]
    fn nesting_has_a_limit() {
        let deep = format!("{{\"a\": {}", "[".repeat(63));
        assert_eq!(accepts(&deep), Some(false));
        assert_eq!(accepts(&format!("{deep}[")), None);
    }

    #[test]
    fn the_mask_keeps_only_continuations_and_ends_after_the_object() {
        let vocab = Vocabulary {
            pieces: vec![
                None,
                Some(b"{".to_vec()),
                Some(b"}".to_vec()),
                Some(b" ".to_vec()),
                Some(b"x".to_vec()),
                Some(b"{}".to_vec()),
            ],
            stop_ids: vec![0],
        };
        let mut logits = vec![0.0; 6];
        vocab.mask(&JsonPrefix::default(), &mut logits);
        let allowed: Vec<usize> = (0..6).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(allowed, [1, 3, 5]);
        let mut done = JsonPrefix::default();
        assert!(done.push_all(b"{}"));
        let mut logits = vec![0.0; 6];
        vocab.mask(&done, &mut logits);
        let allowed: Vec<usize> = (0..6).filter(|&i| logits[i].is_finite()).collect();
        assert_eq!(allowed, [0]);
    }
}
