//! `anelm pull`: a model from the Hugging Face Hub into the Hugging Face cache (anelm-hub).

use anelm_hub::{Hub, ModelRef, Settings};
use anyhow::{bail, Result};

use crate::models::Bars;

#[derive(clap::Args)]
pub struct Args {
    /// org/name[@revision], or a GGUF repository's file: org/name[@revision]:QUANT or
    /// org/name[@revision]:file.gguf.
    #[arg(value_name = "MODEL")]
    pub reference: String,
}

pub fn run(a: Args) -> Result<()> {
    let r = ModelRef::parse(&a.reference)?;
    let ModelRef::Hub {
        repo,
        revision,
        pick,
    } = &r
    else {
        match r {
            ModelRef::Ollama { .. } => bail!(
                "{r}: anelm uses Ollama's models where Ollama keeps them; `ollama pull` fetches them"
            ),
            _ => bail!(
                "{r}: `anelm pull` fetches from the Hugging Face Hub: org/name[@revision][:QUANT|:file.gguf]"
            ),
        }
    };
    let hub = Hub::new(Settings::from_env());
    let snap = hub.pull(repo, revision.as_deref(), pick.as_ref(), &Bars::new())?;
    eprintln!(
        "{r}: commit {} in {}",
        snap.commit,
        hub.cache().root().display()
    );
    println!("{}", snap.model_path().display());
    Ok(())
}
