//! Arguments and steps shared by the subcommands that run a model.

use std::sync::Arc;

use anelm_ane::device::{CoreMlDevice, PrivateAneDevice};
use anelm_ane::dialect::{
    machine_key, probe_path, resolve, DialectChoice, MilDialect, ProbeMemory,
};
use anelm_ane::exec::FallbackExecutor;
use anelm_ane::{
    AneExecutor, Device as AneDevice, DevicePath, LoweringOptions, SimDevice, Strategy,
};
use anelm_cpu::{check_cache_types, CpuExecutor, CpuOptions, KvDtype};
use anelm_engine::{LoadedModel, TemplateKwargs, TextSide};
use anelm_model::{Executor, Model};
use anelm_tokenize::Tokenizer;
use anyhow::{bail, Result};

use crate::models;

#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// The model: a GGUF file or a Hugging Face model directory; org/name[@revision] on the
    /// Hugging Face Hub (a GGUF repository with :QUANT or :file.gguf), fetched into the Hugging
    /// Face cache when it is not there; ollama:name[:tag] from Ollama's store; or a name from
    /// `anelm list` (default: SmolLM2-135M-Instruct Q4_1 from the model cache).
    #[arg(short, long, value_name = "MODEL")]
    pub model: Option<String>,
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
    /// How the ANE path holds weight matrices: auto (the file's own integer blocks where they
    /// map, fp16 otherwise), fp16, int8 or int4 (float weights quantised per block of 32).
    #[arg(long, default_value = "auto")]
    pub weights: anelm_ane::lower::WeightPolicy,
    /// Fused strategy: most layers per program (default 24; a first run on new hardware can
    /// start at 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub layers_per_chunk: Option<u16>,
    /// Fused strategy: most megabytes of fp16 weights per program (default 1600, the largest
    /// reported compiling); a mixture's layer over it is split by experts across programs.
    #[arg(long, value_name = "MB", value_parser = positive_mb)]
    pub mb_per_chunk: Option<f64>,
    /// Fused strategy: tokens per sub-chunk of a gated DeltaNet's chunked prefill (default 64,
    /// transformers' size; its triangular solve is this many steps).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub delta_chunk: Option<u16>,
    /// Fused strategy: sequences per batch function — a decode step of that many
    /// conversations is one evaluation per program, each over its own KV cache (default:
    /// serve's --parallel and bench's largest --batch, at most 8; else 1, no batch function).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub decode_batch: Option<u16>,
    /// The MIL dialect of the ANE programs: a (`program(1.3)`/ios18, Core ML spec 9), b
    /// (`program(1.0)`/ios16, spec 7), or auto: what this machine accepted when probed
    /// (`$ANELM_PROGRAMS/probe.json`), else b below macOS 15 and a otherwise.
    #[arg(long, value_enum, default_value_t = MilDialectArg::Auto)]
    pub mil_dialect: MilDialectArg,
    /// The ANE path (--device sim|ane) normally recomputes in f32 on the CPU every logit
    /// within 3e-3 (relative) of the top one when the top two are that close, so that greedy
    /// choices do not hang on fp16 rounding of the head; this gives the device's logits alone.
    #[arg(long)]
    pub no_settle_ties: bool,
    /// The format of the CPU engine's cached keys: f32, f16, q8_0 or q4_0 (llama.cpp's
    /// blocks of 32) [default: f16 for a quantised model, else f32].
    #[arg(long, value_name = "TYPE", value_parser = parse_cache_type)]
    pub cache_type_k: Option<KvDtype>,
    /// The format of the CPU engine's cached values, as --cache-type-k.
    #[arg(long, value_name = "TYPE", value_parser = parse_cache_type)]
    pub cache_type_v: Option<KvDtype>,
}

fn parse_cache_type(s: &str) -> Result<KvDtype, String> {
    s.parse()
}

/// `--chat-template-kwargs`, for the subcommands that render conversations.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TemplateKwargsArgs {
    /// Chat-template variables as a JSON object, as transformers' apply_chat_template takes
    /// them, e.g. '{"enable_thinking": false}' (Qwen3, SmolLM3) or '{"date_string": "26 Jul
    /// 2024"}' (Llama 3.x).
    #[arg(long, value_name = "JSON", value_parser = parse_template_kwargs)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
}

impl TemplateKwargsArgs {
    /// Sets the kwargs on the model every conversation is rendered with.
    pub fn apply(&self, loaded: &mut LoadedModel) {
        if let Some(k) = &self.chat_template_kwargs {
            loaded.template_kwargs = k.clone();
        }
    }
}

/// A JSON object of template variables, from the command line.
pub fn parse_template_kwargs(
    s: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let v = serde_json::from_str(s).map_err(|e| format!("invalid JSON: {e}"))?;
    anelm_engine::template_kwargs(v)
}

/// `--mil-dialect`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MilDialectArg {
    Auto,
    A,
    B,
}

/// The key under which `probe --all` remembers answers for `device`: the simulator's own, or
/// this machine's chip and OS build (None off a Mac).
pub fn machine_key_for(device: Device) -> Option<String> {
    if device == Device::Sim {
        return Some("simulator".to_string());
    }
    let m = anelm_macos::machine_info().ok()?;
    Some(machine_key(m.chip.as_deref()?, m.os_build.as_deref()?))
}

/// The remembered probe answers (an unreadable file is ignored with a warning).
fn probe_memory() -> ProbeMemory {
    ProbeMemory::load(&probe_path(&models::programs_dir())).unwrap_or_else(|e| {
        tracing::warn!("ignoring the remembered probe answers: {e}");
        ProbeMemory::default()
    })
}

/// What `run`, `chat` and `serve` do when the device refuses a program.
#[derive(clap::Args, Clone, Debug)]
pub struct FallbackArgs {
    /// When the device refuses a program (compile, load or evaluate): continue on the CPU
    /// engine with one warning, or fail [default: cpu on --device ane, else none].
    #[arg(long, value_enum)]
    pub fallback: Option<Fallback>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Continue on the CPU engine.
    Cpu,
    /// Fail with the device's reason.
    None,
}

impl FallbackArgs {
    pub fn resolve(&self, device: Device) -> Fallback {
        self.fallback.unwrap_or(if device == Device::Ane {
            Fallback::Cpu
        } else {
            Fallback::None
        })
    }
}

/// The one line printed when the device path gives way to the CPU engine.
fn fallback_warning(why: &str) {
    eprintln!("warning: {why}; continuing on the CPU engine (--fallback none to fail instead)");
}

/// Whether an error of the device path is the device (or its compiler) refusing a program, as
/// opposed to bad input or no ANE at all.
fn refused(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<anelm_ane::AneError>(),
        Some(anelm_ane::AneError::Device(_) | anelm_ane::AneError::Unsupported(_))
    )
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

impl Device {
    /// The value of `--device` that selects it.
    fn flag(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Sim => "sim",
            Device::Ane => "ane",
        }
    }
}

impl ModelArgs {
    /// The CPU engine's options from `--threads` and `--cache-type-k/-v`, checked against the
    /// model.
    pub fn cpu_options(&self, model: &Model) -> Result<CpuOptions> {
        let opts = CpuOptions {
            threads: self.threads,
            cache_k: self.cache_type_k,
            cache_v: self.cache_type_v,
            ..CpuOptions::default()
        };
        let (k, v) = opts.cache_types(model);
        check_cache_types(model, k, v).map_err(anyhow::Error::msg)?;
        Ok(opts)
    }

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
        let os = match self.device {
            Device::Sim => None,
            _ => anelm_macos::machine_info().ok().and_then(|m| m.os_version),
        };
        let key = machine_key_for(self.device);
        let d = resolve(choice, os.as_deref(), &probe_memory(), key.as_deref());
        tracing::debug!(os = os.as_deref(), "--mil-dialect auto: dialect {d}");
        d
    }

    /// The ops the lowering writes another way because `probe --all` saw them fail on this
    /// machine in `dialect`.
    fn alternatives(&self, dialect: MilDialect) -> anelm_ane::lower::Alternatives {
        let Some(key) = machine_key_for(self.device) else {
            return Default::default();
        };
        let failed = probe_memory().failed_ops(&key, dialect);
        let alts = anelm_ane::lower::Alternatives::avoiding(&failed);
        for op in alts.ops() {
            tracing::info!("{op}: written another way (probe --all saw it fail on {key})");
        }
        alts
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
        self.executor_with_fallback(loaded, context, Fallback::None)
    }

    /// [`ModelArgs::executor_and_dispatches`], and with [`Fallback::Cpu`] the CPU engine when
    /// the device refuses a program — while compiling (then `None` dispatches) or later.
    pub fn executor_with_fallback(
        &self,
        loaded: &LoadedModel,
        context: usize,
        fallback: Fallback,
    ) -> Result<(Box<dyn Executor>, Option<usize>)> {
        let opts = self.cpu_options(&loaded.model)?;
        let model = loaded.model.clone();
        let cpu = move || -> Box<dyn Executor> { Box::new(CpuExecutor::with_options(model, opts)) };
        if self.device == Device::Cpu {
            return Ok((cpu(), None));
        }
        for (flag, t) in [("k", self.cache_type_k), ("v", self.cache_type_v)] {
            if let Some(t) = t.filter(|&t| t != KvDtype::F16) {
                bail!(
                    "--cache-type-{flag} {t}: the ANE path (--device {}) keeps its own f16 KV \
                     cache; use --device cpu for a {t} cache",
                    self.device.flag()
                );
            }
        }
        // Fused programs hold the whole cache: as many positions as asked, in whole tiles.
        let opts = LoweringOptions {
            context: context.next_multiple_of(64).max(64),
            ..LoweringOptions::default()
        };
        match (self.device_path(loaded.model.clone(), &opts), fallback) {
            (Ok(path), Fallback::None) => {
                let per_token = path.dispatches_per_token();
                Ok((path, Some(per_token)))
            }
            (Ok(path), Fallback::Cpu) => {
                let per_token = path.dispatches_per_token();
                let exec = FallbackExecutor::new(path, cpu, fallback_warning);
                Ok((Box::new(exec), Some(per_token)))
            }
            (Err(e), Fallback::Cpu) if refused(&e) => {
                fallback_warning(&format!("{e:#}"));
                Ok((cpu(), None))
            }
            (Err(e), _) => Err(e),
        }
    }

    /// The model lowered by `--strategy` and compiled for `--device` (sim, or ane through
    /// `--driver`).
    pub fn device_path(
        &self,
        model: Arc<Model>,
        opts: &LoweringOptions,
    ) -> Result<Box<dyn DevicePath>> {
        let strategy = self.strategy.into();
        let mut cached = self.lowering(opts.clone())?;
        // Hardware compiles are slow and budgeted per process: keep what they produce. The
        // simulator keeps its programs only where ANELM_PROGRAMS says.
        if cached.cache_dir.is_none()
            && (self.device == Device::Ane || std::env::var_os(models::PROGRAMS_ENV).is_some())
        {
            cached.cache_dir = Some(models::programs_dir());
        }
        let opts = &cached;
        let mut path = match (self.device, self.driver) {
            (Device::Cpu, _) => bail!("--device cpu runs the CPU engine, not ANE programs"),
            (Device::Sim, _) => {
                let sim = SimDevice::from_env().map_err(anyhow::Error::msg)?;
                compile_on("the simulator", model, sim, strategy, opts)
            }
            (Device::Ane, Driver::Private) => {
                let device = PrivateAneDevice::open(anelm_macos::LoadOptions::default())?;
                compile_on("the ANE (private driver)", model, device, strategy, opts)
            }
            (Device::Ane, Driver::Coreml) => {
                let device = CoreMlDevice::open()?;
                compile_on("the ANE (Core ML)", model, device, strategy, opts)
            }
        }?;
        path.set_settle_ties(!self.no_settle_ties);
        Ok(path)
    }

    /// `--weights` in the dialect `--mil-dialect` resolves to, with the forms this machine
    /// takes.
    pub fn weight_target(&self) -> Result<anelm_ane::lower::WeightTarget> {
        Ok(self.lowering(LoweringOptions::default())?.weight_target())
    }

    /// The integer weight forms the programs for `--device` may use in `dialect`: what
    /// `probe --all` saw on this machine, else the per-chip table (every form off a Mac).
    fn weight_forms(&self, dialect: MilDialect) -> anelm_ane::lower::Forms {
        let chip = match self.device {
            Device::Sim => None,
            _ => anelm_macos::machine_info().ok().and_then(|m| m.chip),
        };
        let verdicts = machine_key_for(self.device)
            .map(|k| probe_memory().forms(&k, dialect))
            .unwrap_or_default();
        let v: Vec<(&str, bool)> = verdicts.iter().map(|(k, ok)| (k.as_str(), *ok)).collect();
        let forms = anelm_ane::lower::Forms::for_machine(chip.as_deref(), &v);
        if let Some(why) = forms.int4 {
            tracing::info!("4-bit weight blocks held as int8: {why}");
        }
        forms
    }

    /// `opts` with the lowering flags applied (`--weights`, `--mil-dialect`, `--layers-per-chunk`,
    /// `--delta-chunk`).
    pub fn lowering(&self, opts: LoweringOptions) -> Result<LoweringOptions> {
        let dialect = self.dialect();
        let opts = LoweringOptions {
            weights: self.weights,
            dialect,
            alternatives: self.alternatives(dialect),
            weight_forms: self.weight_forms(dialect),
            ..opts
        };
        let fused = self.strategy == super::compile::Strategy::Fused;
        if self.layers_per_chunk.is_some() && !fused {
            bail!("--layers-per-chunk applies to --strategy fused")
        }
        if self.mb_per_chunk.is_some() && !fused {
            bail!("--mb-per-chunk applies to --strategy fused")
        }
        if self.delta_chunk.is_some() && !fused {
            bail!("--delta-chunk applies to --strategy fused")
        }
        if self.decode_batch.is_some() && !fused {
            bail!("--decode-batch applies to --strategy fused (the projection strategy's kernels take a batch as they are)")
        }
        Ok(LoweringOptions {
            chunk_layers: self.layers_per_chunk.map_or(opts.chunk_layers, usize::from),
            delta_chunk: self.delta_chunk.map_or(opts.delta_chunk, usize::from),
            decode_batch: self.decode_batch.map_or(opts.decode_batch, usize::from),
            chunk_bytes: self
                .mb_per_chunk
                .map_or(opts.chunk_bytes, |mb| (mb * 1e6) as u64),
            ..opts
        })
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

    /// For the fused strategy on a device without `--decode-batch`: batch functions for
    /// `sequences` decoded together (at most 8; none for one).
    pub fn default_decode_batch(&mut self, sequences: usize) {
        let fused = self.strategy == super::compile::Strategy::Fused;
        if fused && self.device != Device::Cpu && self.decode_batch.is_none() && sequences > 1 {
            self.decode_batch = Some(sequences.min(8) as u16);
        }
    }

    /// Only the tokenizer and chat template: no weights are read, so a vocabulary-only GGUF
    /// will do.
    pub fn load_text_side(&self) -> Result<TextSide> {
        let path = models::resolve(self.model.as_deref())?;
        Ok(TextSide::load(&path)?)
    }

    /// The path of `--model` when it is an embedding (encoder) model, which does not
    /// generate and loads with [`ModelArgs::load_encoder`].
    pub fn encoder_path(&self) -> Result<Option<std::path::PathBuf>> {
        let path = models::resolve(self.model.as_deref())?;
        let source = anelm_model::open_source(&path)?;
        let arch = anelm_model::architecture_of(&source);
        Ok(arch
            .filter(|a| anelm_model::encoder::is_encoder_arch(a))
            .map(|_| path))
    }

    /// An embedding model and its tokenizer, on the CPU engine (whatever `--device` says: the
    /// ANE path lowers decoders only).
    pub fn load_encoder(
        &self,
        path: &std::path::Path,
    ) -> Result<(anelm_cpu::encoder::EncoderRunner, Arc<Tokenizer>)> {
        let enc = models::with_spinner(&format!("loading {}", path.display()), || {
            anelm_model::encoder::load(path)
        })?;
        if self.device != Device::Cpu {
            tracing::info!(
                "{}: an embedding model runs on the CPU engine",
                path.display()
            );
        }
        let text = TextSide::load(path)?;
        let tokenizer = text.tokenizer()?.clone();
        let runner = anelm_cpu::encoder::EncoderRunner::new(Arc::new(enc), self.threads);
        Ok((runner, tokenizer))
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

/// A positive, finite number of megabytes.
fn positive_mb(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v * 1e6 >= 1.0 => Ok(v),
        Ok(_) => Err(format!("{s}: not a positive number of megabytes")),
        Err(e) => Err(format!("{s}: {e}")),
    }
}
