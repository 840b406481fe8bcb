//! `anelm serve`: the OpenAI and Anthropic APIs and a web chat over HTTP (anelm-server).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anelm_server::{
    Budget, EncoderParts, Limits, LoadFn, Loaded, LoadedParts, LookupConfig, ModelSpec,
    SchedulerConfig, Server, ServerConfig,
};
use anyhow::{Context, Result};

use super::common::{Fallback, FallbackArgs, ModelArgs, TemplateKwargsArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub fallback: FallbackArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 opens the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require this key on every API request (Authorization: Bearer KEY, or x-api-key: KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Generations in progress at once; they share the model token by token.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a free slot; beyond that the answer is 503 with Retry-After.
    #[arg(long, default_value_t = 32)]
    pub queue: usize,
    /// Context size of each conversation in tokens (default: the model's, at most 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Finished conversations kept in memory so that their continuation skips the prefix.
    #[arg(long, default_value_t = 4)]
    pub cache_sessions: usize,
    /// The model's name in the API (default: the reference given to --model, or for a path the
    /// file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,
    /// More models to serve beside --model (the default one), each loaded when a request first
    /// names it: paths, references as --model takes them, or a directory (every GGUF file and
    /// Hugging Face model directory in it). Comma-separated or repeated; a model's name in the
    /// API is its reference, or for a path its file name without .gguf.
    #[arg(long, value_name = "MODEL", value_delimiter = ',')]
    pub models: Vec<String>,
    /// Most models loaded at once; loading another unloads the least recently used idle one.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_loaded: Option<u64>,
    /// Most memory the loaded models may take, as bytes or with a unit (512M, 4G, 2GiB);
    /// a model counts as its files plus the KV cache of every slot at full context
    /// [default: three quarters of this machine's memory].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    #[command(flatten)]
    pub template_kwargs: TemplateKwargsArgs,
    /// Speculative decoding of every plain generation: `--lookup`, or `--draft M` (a draft
    /// model per generation in progress, reused by the next).
    #[command(flatten)]
    pub speculate: super::speculate::SpeculateArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// How /v1/embeddings pools a chat model's hidden states: mean, last (decoder embedding
    /// models) or cls (the first token) [default: as the model's configuration says —
    /// sentence-transformers' modules.json, GGUF pooling_type —, else mean]. Embedding models
    /// (BERT) always pool as their configuration says.
    #[arg(long, value_name = "POOLING")]
    pub pooling: Option<anelm_server::Pooling>,
}

/// What one client may ask; past a limit the request is refused with a 4xx naming it.
#[derive(clap::Args)]
pub struct LimitArgs {
    /// Seconds a client has to send a request's headers (an idle connection closes after it);
    /// past it: 408.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body; past it: 408.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Open connections at once; one more is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_connections: usize,
    /// Largest request body in bytes; past it: 413.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Most choices (`n`) per request; past it: 400.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_n: usize,
    /// Largest `max_tokens` a request may name (answers still end where the context does);
    /// past it: 400.
    #[arg(long, value_name = "N", default_value_t = 65536)]
    pub max_tokens_limit: usize,
    /// Most stop strings per request; past it: 400.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_stop: usize,
    /// Most `logit_bias` entries per request; past it: 400.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_logit_bias: usize,
    /// Most tools per request; past it: 400.
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_tools: usize,
}

impl LimitArgs {
    pub fn limits(&self) -> Result<Limits> {
        let secs = |name: &str, s: f64| {
            if s.is_finite() && s > 0.0 && s <= 86_400.0 {
                Ok(Duration::from_secs_f64(s))
            } else {
                anyhow::bail!("--{name} must be in (0, 86400] seconds, got {s}")
            }
        };
        if self.max_connections == 0 {
            anyhow::bail!("--max-connections must be at least 1");
        }
        Ok(Limits {
            header_timeout: secs("header-timeout", self.header_timeout)?,
            body_timeout: secs("body-timeout", self.body_timeout)?,
            max_connections: self.max_connections,
            max_body_bytes: self.max_body_bytes,
            max_choices: self.max_n,
            max_tokens: self.max_tokens_limit,
            max_stop: self.max_stop,
            max_logit_bias: self.max_logit_bias,
            max_tools: self.max_tools,
        })
    }
}

/// A store reference (`org/name`, `ollama:m:tag`, a listed name) names the model in the API;
/// a path leaves the name to the file.
fn reference_name(model: Option<&str>) -> Option<String> {
    let m = model?;
    match anelm_hub::ModelRef::parse(m) {
        Ok(r) if !r.is_path() => Some(m.to_string()),
        _ => None,
    }
}

/// `--memory`: bytes, or a number with K, M, G or T (powers of 1024; `GiB`, `GB` alike).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let not_a_size = || format!("'{s}' is not a size (e.g. 512M, 4G, 2GiB)");
    let v: f64 = num.trim().parse().map_err(|_| not_a_size())?;
    let shift = match unit
        .to_ascii_lowercase()
        .trim_end_matches("ib")
        .trim_end_matches('b')
    {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("{}: the unit must be K, M, G or T", not_a_size())),
    };
    if !v.is_finite() || v <= 0.0 || v * (1u64 << shift) as f64 >= u64::MAX as f64 {
        return Err(format!("'{s}' is not a positive size"));
    }
    Ok((v * (1u64 << shift) as f64) as u64)
}

/// Three quarters of this machine's memory, when the system says how much it has.
fn default_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system constants.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && size > 0).then(|| (pages as u64).saturating_mul(size as u64) / 4 * 3)
}

/// How one served model is loaded: the shared flags with its own reference.
#[derive(Clone)]
struct Recipe {
    model: ModelArgs,
    template_kwargs: TemplateKwargsArgs,
    ctx: Option<usize>,
    fallback: Fallback,
    /// `--draft` / `--lookup` settings: the first model's (a draft model shares its vocabulary),
    /// so a reload after an unload drafts again.
    speculate: Option<super::speculate::SpeculateArgs>,
}

impl Recipe {
    /// Reads the model and builds its executor (compiling on a device); an embedding model
    /// gets its encoder pass.
    fn load(&self) -> Result<Loaded> {
        if let Some(path) = self.model.encoder_path()? {
            if self.speculate.as_ref().is_some_and(|s| s.draft.is_some()) {
                anyhow::bail!(
                    "--draft: {} is an embedding model, which does not generate",
                    path.display()
                );
            }
            let (runner, tokenizer) = self.model.load_encoder(&path)?;
            return Ok(EncoderParts { runner, tokenizer }.into());
        }
        let mut loaded = self.model.load()?;
        self.template_kwargs.apply(&mut loaded);
        // An impossible --ctx is refused when the model is served; the executor never needs more.
        let max = loaded.model.max_positions();
        let ctx = anelm_server::context_size(self.ctx, max).min(max);
        let exec = (self.model)
            .executor_with_fallback(&loaded, ctx, self.fallback)?
            .0;
        let draft = match &self.speculate {
            Some(s) => s.draft_maker(&self.model, &loaded, ctx)?,
            None => None,
        };
        Ok(LoadedParts {
            loaded,
            exec,
            draft,
        }
        .into())
    }

    fn load_fn(self) -> LoadFn {
        Arc::new(move || self.load().map_err(|e| format!("{e:#}")))
    }
}

/// A model's name in the API: an alias, its reference, or its file's name without .gguf.
fn api_name(reference: &str, path: Option<&Path>) -> String {
    if let Some(name) = reference_name(Some(reference)) {
        return name;
    }
    let p = path.unwrap_or(Path::new(reference));
    let name = p.file_name().map_or_else(
        || reference.to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

/// `--models` entries: a directory that is not itself a Hugging Face model stands for every
/// GGUF file and model directory in it.
fn expand(references: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for r in references
        .iter()
        .map(|r| r.trim())
        .filter(|r| !r.is_empty())
    {
        let p = PathBuf::from(r);
        let is_path = anelm_hub::ModelRef::parse(r).map_or(true, |m| m.is_path());
        if is_path && !p.exists() {
            anyhow::bail!("--models {r}: no such file or directory");
        }
        if !p.is_dir() || p.join("config.json").is_file() {
            out.push(r.to_string());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(&p)
            .with_context(|| format!("--models {r}"))?
            .flatten()
            .map(|e| e.path())
            .filter(|q| {
                (q.is_file() && q.extension().is_some_and(|x| x == "gguf"))
                    || q.join("config.json").is_file()
            })
            .collect();
        if found.is_empty() {
            anyhow::bail!("--models {r}: no GGUF file or Hugging Face model directory in it");
        }
        found.sort();
        out.extend(found.into_iter().map(|q| q.to_string_lossy().into_owned()));
    }
    Ok(out)
}

pub fn run(mut a: Args) -> Result<()> {
    if a.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    let lookup = a.speculate.lookup()?.map(|s| LookupConfig {
        k: s.k,
        max_ngram: a.speculate.lookup_ngram,
    });
    let limits = a.limits.limits()?;
    let others = expand(&a.models)?;
    a.model.default_decode_batch(a.parallel);
    let recipe = Recipe {
        model: a.model.clone(),
        template_kwargs: a.template_kwargs.clone(),
        ctx: a.ctx,
        fallback: a.fallback.resolve(a.model.device),
        speculate: None,
    };
    let first_recipe = Recipe {
        speculate: Some(a.speculate.clone()),
        ..recipe.clone()
    };
    let (first, path) = match first_recipe.load()? {
        Loaded::Chat(p) => {
            let path = p.loaded.model.source.path().to_path_buf();
            (Loaded::Chat(p), path)
        }
        Loaded::Embed(p) => {
            let path = p.runner.encoder().source.path().to_path_buf();
            (Loaded::Embed(p), path)
        }
    };
    let reference = a
        .model
        .model
        .clone()
        .unwrap_or_else(|| path.to_string_lossy().into_owned());
    let first_id = a
        .alias
        .clone()
        .unwrap_or_else(|| api_name(&reference, Some(&path)));
    let config = ServerConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        model_id: Some(first_id.clone()),
        ctx: a.ctx,
        scheduler: SchedulerConfig {
            parallel: a.parallel,
            queue: a.queue,
            cached_sessions: a.cache_sessions,
            lookup,
            draft: None,
        },
        limits,
        pooling: a.pooling,
        budget: Budget {
            max_loaded: a.max_loaded.map(|n| n as usize),
            memory: a.memory.or_else(default_memory),
        },
    };
    let spec = |reference: &str| {
        let path = Path::new(reference);
        ModelSpec {
            id: api_name(reference, None),
            bytes_hint: anelm_server::models::source_bytes(path),
            load: Recipe {
                model: ModelArgs {
                    model: Some(reference.to_string()),
                    ..recipe.model.clone()
                },
                ..recipe.clone()
            }
            .load_fn(),
        }
    };
    let first_spec = ModelSpec {
        id: first_id,
        load: first_recipe.load_fn(),
        ..spec(&reference)
    };
    let others = others.iter().map(|r| spec(r)).collect::<Vec<_>>();
    let n_others = others.len();
    let server = Server::start_many(config, (first_spec, first), others)?;
    let more = match n_others {
        0 => String::new(),
        n => format!(" and {n} more loaded on first use"),
    };
    eprintln!(
        "anelm serve: {}{more} on http://{} (web chat at /, OpenAI and Anthropic APIs under /v1). Ctrl-C stops.",
        server.model_id(),
        server.addr()
    );
    server.wait_for_ctrl_c()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5gb"), Ok(3 << 29));
        assert_eq!(parse_size("1000"), Ok(1000));
        for bad in ["", "G", "-1G", "0", "4Q", "1e30T", "NaN"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_directory_stands_for_the_models_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("b.gguf"), "").unwrap();
        std::fs::write(d.join("a.gguf"), "").unwrap();
        std::fs::write(d.join("readme.md"), "").unwrap();
        std::fs::create_dir(d.join("hf")).unwrap();
        std::fs::write(d.join("hf/config.json"), "{}").unwrap();
        std::fs::create_dir(d.join("empty")).unwrap();
        let got = expand(&[d.to_string_lossy().into_owned()]).unwrap();
        let names: Vec<_> = got
            .iter()
            .map(|p| {
                Path::new(p)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["a.gguf", "b.gguf", "hf"]);
        // A model directory is one model; an empty one is an error.
        let hf = d.join("hf").to_string_lossy().into_owned();
        assert_eq!(expand(std::slice::from_ref(&hf)).unwrap(), [hf]);
        assert!(expand(&[d.join("empty").to_string_lossy().into_owned()]).is_err());
        assert_eq!(api_name("/x/y/m.Q4_0.gguf", None), "m.Q4_0");
        assert_eq!(api_name("org/name", None), "org/name");
    }
}
