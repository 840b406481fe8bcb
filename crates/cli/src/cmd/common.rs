//! Arguments and steps shared by the subcommands that run a model.

use std::path::PathBuf;
use std::sync::Arc;

use anelm_cpu::CpuExecutor;
use anelm_engine::LoadedModel;
use anelm_model::Executor;
use anelm_tokenize::Tokenizer;
use anyhow::{bail, Result};

use crate::models;

#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face model directory (default: SmolLM2-135M-Instruct Q4_1 from
    /// the model cache).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// CPU threads (default: one per core).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Which macOS driver `--device ane` uses.
    #[arg(long, value_enum, default_value_t = Driver::Private)]
    pub driver: Driver,
    /// How the ANE path (--device sim|ane) lowers the model.
    #[arg(long, value_enum, default_value_t = super::compile::Strategy::Projection)]
    pub strategy: super::compile::Strategy,
}

/// The macOS driver that runs the ANE programs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// AppleNeuralEngine.framework's in-memory MIL path (FACTS §3).
    Private,
    /// Core ML with compute units CPU_AND_NE.
    Coreml,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU engine.
    Cpu,
    /// The ANE programs, executed by the simulator on the CPU.
    Sim,
    /// The Apple Neural Engine.
    Ane,
}

impl ModelArgs {
    /// The executor for `--device`.
    pub fn executor(&self, loaded: &LoadedModel) -> Result<Box<dyn Executor>> {
        match self.device {
            Device::Cpu => Ok(Box::new(CpuExecutor::new(
                loaded.model.clone(),
                self.threads,
            ))),
            Device::Sim => super::compile::sim_executor(loaded.model.clone(), self.strategy),
            Device::Ane => {
                let (model, opts) = (loaded.model.clone(), anelm_ane::LoweringOptions::default());
                let on = |what| format!("compiling for the ANE ({what})");
                Ok(match self.driver {
                    Driver::Private => {
                        let device = anelm_ane::device::PrivateAneDevice::open(
                            anelm_macos::LoadOptions::default(),
                        )?;
                        Box::new(models::with_spinner(&on("private driver"), || {
                            anelm_ane::ProjectionExecutor::on_device(model, device, &opts)
                        })?)
                    }
                    Driver::Coreml => {
                        let device = anelm_ane::device::CoreMlDevice::open()?;
                        Box::new(models::with_spinner(&on("Core ML"), || {
                            anelm_ane::ProjectionExecutor::on_device(model, device, &opts)
                        })?)
                    }
                })
            }
        }
    }

    pub fn load(&self) -> Result<LoadedModel> {
        let path = models::resolve(self.model.as_deref())?;
        let loaded = models::with_spinner(&format!("loading {}", path.display()), || {
            LoadedModel::load(&path)
        })?;
        tracing::info!(
            family = loaded.model.config.family.name(),
            layers = loaded.model.n_layers(),
            vocab = loaded.model.config.vocab_size,
            "loaded {}",
            loaded.model.config.name
        );
        Ok(loaded)
    }
}

/// A prompt given as text or as token ids.
#[derive(clap::Args, Clone)]
pub struct PromptArgs {
    /// The prompt text (tokenized with special tokens added and parsed, as llama.cpp does).
    #[arg(short, long)]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids.
    #[arg(long)]
    pub ids: Option<String>,
}

impl PromptArgs {
    /// The prompt as ids, checked against the vocabulary.
    pub fn ids(&self, loaded: &LoadedModel) -> Result<Vec<u32>> {
        prompt_ids(loaded, self.prompt.as_deref(), self.ids.as_deref())
    }
}

/// The prompt as ids: `--ids` as given, or `--prompt` tokenized as llama.cpp tokenizes a prompt
/// (special tokens added and parsed). Every id is checked against the vocabulary.
fn prompt_ids(loaded: &LoadedModel, prompt: Option<&str>, ids: Option<&str>) -> Result<Vec<u32>> {
    let out = match (prompt, ids) {
        (Some(_), Some(_)) => bail!("give --prompt or --ids, not both"),
        (None, None) => bail!("give a --prompt or --ids"),
        (None, Some(ids)) => models::parse_ids(ids)?,
        (Some(text), None) => tokenizer(loaded)?.encode(text, true, true)?,
    };
    let vocab = loaded.model.config.vocab_size;
    if let Some(bad) = out.iter().find(|&&id| id as usize >= vocab) {
        bail!(
            "{}: token id {bad} is outside the vocabulary (size {vocab})",
            loaded.model.source.path().display()
        );
    }
    if out.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(out)
}

pub fn tokenizer(loaded: &LoadedModel) -> Result<&Arc<Tokenizer>> {
    match &loaded.tokenizer {
        Some(t) => Ok(t),
        None => bail!(
            "{} has no tokenizer (no tokenizer.json); pass token ids with --ids",
            loaded.model.source.path().display()
        ),
    }
}
