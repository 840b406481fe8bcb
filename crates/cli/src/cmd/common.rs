//! Arguments and steps shared by the subcommands that run a model.

use std::path::PathBuf;
use std::sync::Arc;

use anelm_ane::device::{CoreMlDevice, PrivateAneDevice};
use anelm_ane::dialect::{
    machine_key, probe_path, resolve, DialectChoice, MilDialect, ProbeMemory,
};
use anelm_ane::{
    AneExecutor, Device as AneDevice, DevicePath, LoweringOptions, SimDevice, Strategy,
};
use anelm_cpu::CpuExecutor;
use anelm_engine::LoadedModel;
use anelm_model::{Executor, Model};
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
    /// The MIL dialect of the ANE programs: a (`program(1.3)`/ios18, Core ML spec 9), b
    /// (`program(1.0)`/ios16, spec 7), or auto: what this machine accepted when probed
    /// (`$ANELM_PROGRAMS/probe.json`), else b below macOS 15 and a otherwise.
    #[arg(long, value_enum, default_value_t = MilDialectArg::Auto)]
    pub mil_dialect: MilDialectArg,
}

/// `--mil-dialect`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MilDialectArg {
    Auto,
    A,
    B,
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
    /// The dialect `--mil-dialect` resolves to on this machine.
    pub fn dialect(&self) -> MilDialect {
        let choice = match self.mil_dialect {
            MilDialectArg::Auto => DialectChoice::Auto,
            MilDialectArg::A => DialectChoice::Fixed(MilDialect::A),
            MilDialectArg::B => DialectChoice::Fixed(MilDialect::B),
        };
        if choice != DialectChoice::Auto {
            return resolve(choice, None, &ProbeMemory::default(), None);
        }
        let machine = anelm_macos::machine_info().ok();
        let os = machine.as_ref().and_then(|m| m.os_version.clone());
        let key = machine
            .as_ref()
            .and_then(|m| Some(machine_key(m.chip.as_deref()?, m.os_build.as_deref()?)));
        let path = probe_path(&models::programs_dir());
        let memory = ProbeMemory::load(&path).unwrap_or_else(|e| {
            tracing::warn!("ignoring the remembered probe answers: {e}");
            ProbeMemory::default()
        });
        let d = resolve(choice, os.as_deref(), &memory, key.as_deref());
        tracing::debug!(os = os.as_deref(), "--mil-dialect auto: dialect {d}");
        d
    }

    /// The executor for `--device`, for sequences of up to `context` positions.
    pub fn executor(&self, loaded: &LoadedModel, context: usize) -> Result<Box<dyn Executor>> {
        Ok(self.executor_and_dispatches(loaded, context)?.0)
    }

    /// The executor for `--device`, for sequences of up to `context` positions, and the device
    /// evaluations one decoded token costs (none on the CPU).
    pub fn executor_and_dispatches(
        &self,
        loaded: &LoadedModel,
        context: usize,
    ) -> Result<(Box<dyn Executor>, Option<usize>)> {
        if self.device == Device::Cpu {
            let cpu = CpuExecutor::new(loaded.model.clone(), self.threads);
            return Ok((Box::new(cpu), None));
        }
        // Fused programs hold the whole cache: as many positions as asked, in whole tiles.
        let opts = LoweringOptions {
            context: context.next_multiple_of(64).max(64),
            ..LoweringOptions::default()
        };
        let path = self.device_path(loaded.model.clone(), &opts)?;
        let per_token = path.dispatches_per_token();
        Ok((path, Some(per_token)))
    }

    /// The model lowered by `--strategy` and compiled for `--device` (sim, or ane through
    /// `--driver`).
    pub fn device_path(
        &self,
        model: Arc<Model>,
        opts: &LoweringOptions,
    ) -> Result<Box<dyn DevicePath>> {
        let strategy = self.strategy.into();
        // Hardware compiles are slow and budgeted per process: keep what they produce.
        let mut cached = opts.clone();
        cached.dialect = self.dialect();
        if self.device == Device::Ane && cached.cache_dir.is_none() {
            cached.cache_dir = Some(models::programs_dir());
        }
        let opts = &cached;
        match (self.device, self.driver) {
            (Device::Cpu, _) => bail!("--device cpu runs the CPU engine, not ANE programs"),
            (Device::Sim, _) => {
                compile_on("the simulator", model, SimDevice::new(), strategy, opts)
            }
            (Device::Ane, Driver::Private) => {
                let device = PrivateAneDevice::open(anelm_macos::LoadOptions::default())?;
                compile_on("the ANE (private driver)", model, device, strategy, opts)
            }
            (Device::Ane, Driver::Coreml) => {
                let device = CoreMlDevice::open()?;
                compile_on("the ANE (Core ML)", model, device, strategy, opts)
            }
        }
    }

    /// What `--device` (and `--driver`) name, for reports.
    pub fn device_name(&self) -> &'static str {
        match (self.device, self.driver) {
            (Device::Cpu, _) => "cpu",
            (Device::Sim, _) => "sim",
            (Device::Ane, Driver::Private) => "ane-private",
            (Device::Ane, Driver::Coreml) => "ane-coreml",
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

fn compile_on<D: AneDevice + Send + 'static>(
    what: &str,
    model: Arc<Model>,
    device: D,
    strategy: Strategy,
    opts: &LoweringOptions,
) -> Result<Box<dyn DevicePath>> {
    let exec = models::with_spinner(&format!("compiling for {what}"), || {
        AneExecutor::new(model, device, strategy, opts)
    })?;
    Ok(Box::new(exec))
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
