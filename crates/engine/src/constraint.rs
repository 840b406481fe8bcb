//! Constrained decoding: a [`Constraint`] holds the sampled tokens to a language (a JSON schema,
//! a grammar, a forced tool call). Before each draw it masks the tokens that cannot continue the
//! text; after it, it takes the chosen token. The engine knows nothing of grammars: the
//! `anelm-constrain` crate implements this trait.

/// Holds a generation's tokens to a language. Infallible by design: an implementation that
/// meets an error (or the end of its language) allows only the stop tokens, so the generation
/// ends instead of failing.
pub trait Constraint: Send {
    /// Sets the logit of every token that cannot come next to minus infinity. Always leaves at
    /// least one token allowed.
    fn mask(&mut self, logits: &mut [f32]);

    /// Takes the token drawn after the last [`Constraint::mask`] (or forced).
    fn accept(&mut self, token: u32);

    /// Whether the text so far is a complete sentence of the language.
    fn complete(&self) -> bool;
}
