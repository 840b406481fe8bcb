//! `anelm serve`: the OpenAI and Anthropic APIs and a web chat over HTTP (anelm-server).

use std::time::Duration;

use anelm_server::{Limits, LookupConfig, SchedulerConfig, Server, ServerConfig};
use anyhow::Result;

use super::common::{FallbackArgs, ModelArgs, TemplateKwargsArgs};

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
    #[command(flatten)]
    pub template_kwargs: TemplateKwargsArgs,
    /// Speculative decoding of every plain generation: `--lookup`, or `--draft M` (a draft
    /// model per generation in progress, reused by the next).
    #[command(flatten)]
    pub speculate: super::speculate::SpeculateArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// How /v1/embeddings pools an input's hidden states: mean, last (decoder embedding
    /// models) or cls (the first token).
    #[arg(long, default_value = "mean", value_name = "POOLING")]
    pub pooling: anelm_server::Pooling,
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

pub fn run(mut a: Args) -> Result<()> {
    if a.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    let lookup = a.speculate.lookup()?.map(|s| LookupConfig {
        k: s.k,
        max_ngram: a.speculate.lookup_ngram,
    });
    let limits = a.limits.limits()?;
    let mut loaded = a.model.load()?;
    a.template_kwargs.apply(&mut loaded);
    // An impossible --ctx is refused when the server starts; the executor never needs more.
    let max = loaded.model.max_positions();
    let ctx = anelm_server::context_size(a.ctx, max).min(max);
    let fallback = a.fallback.resolve(a.model.device);
    a.model.default_decode_batch(a.parallel);
    let exec = a.model.executor_with_fallback(&loaded, ctx, fallback)?.0;
    let draft = a.speculate.draft_maker(&a.model, &loaded, ctx)?;
    let config = ServerConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        model_id: a.alias.or_else(|| reference_name(a.model.model.as_deref())),
        ctx: a.ctx,
        scheduler: SchedulerConfig {
            parallel: a.parallel,
            queue: a.queue,
            cached_sessions: a.cache_sessions,
            lookup,
            draft,
        },
        limits,
        pooling: a.pooling,
    };
    let server = Server::start(config, loaded, exec)?;
    eprintln!(
        "anelm serve: {} on http://{} (web chat at /, OpenAI and Anthropic APIs under /v1). Ctrl-C stops.",
        server.model_id(),
        server.addr()
    );
    server.wait_for_ctrl_c()?;
    Ok(())
}
