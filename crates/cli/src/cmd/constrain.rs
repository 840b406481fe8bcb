//! The structured-output flags of `run` and `bench`: the reply held to a JSON Schema or a Lark
//! grammar by constrained decoding ([`anelm_constrain`]), as the server's `json_schema` does.

use std::path::PathBuf;

use anelm_constrain::{Constrained, Grammars, Spec};
use anelm_engine::LoadedModel;
use anyhow::{Context, Result};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConstrainArgs {
    /// Hold the reply to this JSON Schema (a file): every reply that ends validates against it.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Hold the reply to this Lark grammar (a file, llguidance's dialect; `%json {…}` embeds
    /// a schema).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

impl ConstrainArgs {
    pub fn enabled(&self) -> bool {
        self.json_schema.is_some() || self.grammar.is_some()
    }

    /// What the flags ask, read and checked (None without them).
    pub fn spec(&self) -> Result<Option<Spec>> {
        if let Some(path) = &self.json_schema {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--json-schema {}", path.display()))?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {}: not JSON", path.display()))?;
            return Ok(Some(Spec::JsonSchema(schema)));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--grammar {}", path.display()))?;
            return Ok(Some(Spec::Lark(text)));
        }
        Ok(None)
    }

    /// The compiled constraint for `loaded`'s vocabulary (None without the flags).
    pub fn build(&self, loaded: &LoadedModel) -> Result<Option<Constrained>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let tokenizer = loaded.tokenizer()?.clone();
        let grammars = Grammars::for_tokenizer(
            tokenizer,
            loaded.model.config.vocab_size,
            &loaded.stop_ids(),
        )?;
        let flag = if self.json_schema.is_some() {
            "--json-schema"
        } else {
            "--grammar"
        };
        Ok(Some(grammars.compile(&spec).with_context(|| flag)?))
    }
}
