//! Constrained decoding: the sampled tokens held to a JSON schema, a JSON object, a Lark grammar
//! or a regular expression, on the token level. llguidance (the grammar engine llama.cpp and
//! mistral.rs use) computes each step's mask over a trie of the vocabulary in well under a
//! millisecond, and handles JSON Schema's breadth (`$ref`, `anyOf`, formats, lengths) — not worth
//! writing again. We give it our tokenizer's bytes and stop tokens, and the engine a
//! [`anelm_engine::Constraint`].

mod tool_calls;
mod vocab;

use std::sync::Arc;

use anelm_engine::Constraint;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

pub use tool_calls::{CallFormat, ToolSpec};
pub use vocab::{vocabulary, Piece};

#[derive(Debug, thiserror::Error)]
pub enum ConstrainError {
    /// The schema or grammar cannot be compiled (the message says where).
    #[error("{0}")]
    Invalid(String),
    /// The tokenizer cannot be used (no stop token, say).
    #[error("constrained decoding is not available for this model: {0}")]
    Unavailable(String),
}

/// What the text must be.
#[derive(Clone, Debug)]
pub enum Spec {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A value valid against this JSON Schema.
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (`%json { … }` embeds a schema).
    Lark(String),
    /// A regular expression (the whole text).
    Regex(String),
}

/// How the JSON is laid out: one space after `:` and `,`, no other whitespace, so a small model
/// cannot wander into endless newlines.
fn with_layout(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

impl Spec {
    pub(crate) fn grammar(&self) -> Result<TopLevelGrammar, ConstrainError> {
        Ok(match self {
            Spec::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )),
            Spec::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(ConstrainError::Invalid(
                        "a JSON schema must be an object (or true/false)".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
        })
    }
}

/// The grammar engine for one model's vocabulary; compiles a [`Spec`] into a fresh
/// [`Constrained`] per generation. Build once per model (the trie takes tens of milliseconds).
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// From each token's bytes (`None` for a special token, which only a grammar naming it can
    /// produce: its name is given beside) and the tokens that end a turn.
    pub fn new(
        pieces: Vec<vocab::Piece>,
        stop_ids: &[u32],
        tokenizer: Option<Arc<anelm_tokenize::Tokenizer>>,
    ) -> Result<Grammars, ConstrainError> {
        let env = vocab::env(pieces, stop_ids, tokenizer)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstrainError::Unavailable(e.to_string()))?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// The model's vocabulary, as [`vocabulary`] reads it from its tokenizer.
    pub fn for_tokenizer(
        tokenizer: Arc<anelm_tokenize::Tokenizer>,
        vocab_size: usize,
        stop_ids: &[u32],
    ) -> Result<Grammars, ConstrainError> {
        let pieces = vocabulary(&tokenizer, vocab_size);
        Grammars::new(pieces, stop_ids, Some(tokenizer))
    }

    /// Compiles `spec`; an invalid schema or grammar is an error naming the problem.
    pub fn compile(&self, spec: &Spec) -> Result<Constrained, ConstrainError> {
        let parser = self
            .factory
            .create_parser(spec.grammar()?)
            .map_err(|e| ConstrainError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Invalid(e));
        }
        Ok(Constrained {
            matcher,
            stops: self.factory.tok_env().tok_trie().eos_tokens().to_vec(),
            failed: None,
        })
    }
}

/// One generation's constraint: the grammar's state after the tokens so far.
#[derive(Clone)]
pub struct Constrained {
    matcher: Matcher,
    stops: Vec<u32>,
    /// Why the matcher gave up, if it did (the generation then may only stop).
    failed: Option<String>,
}

impl Constrained {
    /// An independent copy at the same point (for the next choice of `n`).
    pub fn fork(&self) -> Constrained {
        Constrained {
            matcher: self.matcher.deep_clone(),
            stops: self.stops.clone(),
            failed: self.failed.clone(),
        }
    }

    /// The tokens allowed next (ids in ascending order), or None after a failure.
    pub fn allowed(&mut self) -> Option<Vec<u32>> {
        let mask = self.matcher.compute_mask_or_eos().ok()?;
        Some(mask.iter().collect())
    }

    /// Why the constraint failed (a token it could not take), if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn allow_only_stops(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.stops.contains(&(id as u32)) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

impl Constraint for Constrained {
    fn mask(&mut self, logits: &mut [f32]) {
        if self.failed.is_some() {
            return self.allow_only_stops(logits);
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) => {
                // A word of the mask at a time: most words of a constrained step are all zero.
                let words = mask.as_slice();
                let mut any = false;
                for (w, chunk) in logits.chunks_mut(32).enumerate() {
                    let bits = words.get(w).copied().unwrap_or(0);
                    if bits == 0 {
                        chunk.fill(f32::NEG_INFINITY);
                        continue;
                    }
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if bits >> b & 1 == 0 {
                            *l = f32::NEG_INFINITY;
                        } else {
                            any |= *l > f32::NEG_INFINITY;
                        }
                    }
                }
                if !any {
                    self.failed = Some("no token can continue the text".into());
                    self.allow_only_stops(logits);
                }
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                self.allow_only_stops(logits);
            }
        }
    }

    fn accept(&mut self, token: u32) {
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.failed = Some(e.to_string());
        }
    }

    fn complete(&self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        use llguidance::api::StopReason;
        match self.matcher.stop_reason() {
            StopReason::EndOfSentence | StopReason::NoExtension => true,
            StopReason::NotStopped => {
                // `is_accepting` needs `&mut`; a clone is cheap (the grammar is shared).
                self.matcher.clone().is_accepting().unwrap_or(false)
            }
            _ => false,
        }
    }
}
