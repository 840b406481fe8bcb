//! `anelm rm`: a model out of the Hugging Face cache or anelm's directory (anelm-hub).

use anelm_hub::{remove::remove, ModelRef, Settings};
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    /// A model as `anelm list` names it (org/name[@revision][:file.gguf], or a file name).
    #[arg(value_name = "MODEL")]
    pub reference: String,
}

pub fn run(a: Args) -> Result<()> {
    let r = ModelRef::parse(&a.reference)?;
    let done = remove(&Settings::from_env(), &r)?;
    println!(
        "removed {}: {} file(s), {} bytes freed",
        done.name, done.files, done.bytes
    );
    Ok(())
}
