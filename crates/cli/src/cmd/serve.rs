//! `anelm serve`: the OpenAI and Anthropic APIs and a web chat over HTTP (anelm-server).

use anelm_server::{SchedulerConfig, Server, ServerConfig};
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
    /// The model's name in the API (default: the file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,
    #[command(flatten)]
    pub template_kwargs: TemplateKwargsArgs,
}

pub fn run(a: Args) -> Result<()> {
    if a.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    let mut loaded = a.model.load()?;
    a.template_kwargs.apply(&mut loaded);
    // An impossible --ctx is refused when the server starts; the executor never needs more.
    let max = loaded.model.max_positions();
    let ctx = anelm_server::context_size(a.ctx, max).min(max);
    let fallback = a.fallback.resolve(a.model.device);
    let exec = a.model.executor_with_fallback(&loaded, ctx, fallback)?.0;
    let config = ServerConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        model_id: a.alias,
        ctx: a.ctx,
        scheduler: SchedulerConfig {
            parallel: a.parallel,
            queue: a.queue,
            cached_sessions: a.cache_sessions,
        },
        ..ServerConfig::default()
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
