//! anelm's HTTP server: the OpenAI API (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/v1/responses`), the Anthropic API (`/v1/messages`, `/v1/messages/count_tokens`), llama-server's
//! `/tokenize` and `/detokenize`, `/health`, Prometheus `/metrics` and a web chat at `/`, over
//! one model or several, each loaded on first use and unloaded least recently used under a
//! budget ([`models`]).
//!
//! HTTP runs on tokio; generation runs on the [`scheduler`]'s engine thread, which advances
//! every request in progress together, one batched step per token. Requests wait in a bounded
//! queue; past it they are refused with 503 and `Retry-After`.
//!
//! ```no_run
//! # fn demo(loaded: anelm_engine::LoadedModel, exec: Box<dyn anelm_model::Executor>) -> Result<(), anelm_server::ServerError> {
//! let server = anelm_server::Server::start(anelm_server::ServerConfig::default(), loaded, exec)?;
//! println!("listening on http://{}", server.addr());
//! server.wait_for_ctrl_c()
//! # }
//! ```

mod anthropic;
mod anthropic_tools;
mod app;
mod auth;
mod drafts;
mod embedder;
mod embeddings;
mod error;
mod extract;
#[doc(hidden)]
pub mod fuzz;
mod ids;
mod limits;
mod listen;
mod metrics;
mod model;
pub mod models;
mod openai;
mod params;
mod reasoning;
mod scheduler;
mod sessions;
mod stream;
mod structured;
mod template_kwargs;
mod tokens;
mod tools;
mod webui;

use std::net::SocketAddr;
use std::sync::Arc;

use anelm_engine::LoadedModel;
use anelm_model::Executor;
use tokio::sync::oneshot;

pub use drafts::{DraftConfig, MakeDrafter};
pub use embedder::EncoderParts;
pub use embeddings::Pooling;
pub use limits::Limits;
pub use model::context_size;
pub use models::{Budget, LoadFn, Loaded, LoadedParts, ModelSpec};
pub use scheduler::{LookupConfig, SchedulerConfig, Stats};

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on; loopback unless asked otherwise.
    pub host: String,
    /// 0 picks a free port ([`Server::addr`] tells which).
    pub port: u16,
    /// When set, every `/v1`, `/tokenize` and `/detokenize` request must carry it
    /// (`Authorization: Bearer` or `x-api-key`); `/health` and `/metrics` stay open.
    pub api_key: Option<String>,
    /// The name clients use for the model (default: the file name without `.gguf`).
    pub model_id: Option<String>,
    /// Context size of each conversation (default: the model's, at most 4096).
    pub ctx: Option<usize>,
    /// Timeouts, the connection limit and the size limits of a request.
    pub limits: Limits,
    pub scheduler: SchedulerConfig,
    /// How `/v1/embeddings` pools a chat model's hidden states (default: as the model's own
    /// configuration says — sentence-transformers' modules, GGUF `pooling_type` — else mean).
    pub pooling: Option<Pooling>,
    /// How many models, and how much of them, may be loaded at once.
    pub budget: Budget,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            model_id: None,
            ctx: None,
            limits: Limits::default(),
            scheduler: SchedulerConfig::default(),
            pooling: None,
            budget: Budget::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Model(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A running server; dropping it stops it.
pub struct Server {
    addr: SocketAddr,
    models: Arc<models::Models>,
    shutdown: Option<oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Server {
    /// Binds, starts the generation slots and serves one model in the background.
    pub fn start(
        config: ServerConfig,
        loaded: LoadedModel,
        exec: Box<dyn Executor>,
    ) -> Result<Server, ServerError> {
        let models = models::Models::new(config.clone());
        let parts = LoadedParts {
            loaded,
            exec,
            draft: config.scheduler.draft.clone(),
        };
        models
            .add_loaded(parts.into(), config.model_id.clone(), None)
            .map_err(ServerError::Model)?;
        Server::serve(config, models)
    }

    /// Serves several models: the first, given loaded, is the default; the others load when
    /// a request first names them.
    pub fn start_many(
        config: ServerConfig,
        first: (ModelSpec, Loaded),
        others: Vec<ModelSpec>,
    ) -> Result<Server, ServerError> {
        let models = models::Models::new(config.clone());
        let (spec, parts) = first;
        models
            .add_loaded(parts, Some(spec.id), Some(spec.load))
            .map_err(ServerError::Model)?;
        for spec in others {
            models.add(spec).map_err(ServerError::Model)?;
        }
        Server::serve(config, models)
    }

    fn serve(config: ServerConfig, models: models::Models) -> Result<Server, ServerError> {
        let models = Arc::new(models);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("anelm-http")
            .enable_all()
            .build()?;
        let addr_text = format!("{}:{}", config.host, config.port);
        // Bound here, not in the runtime, so that starting works from any thread (a caller
        // inside another runtime included) and errors come back at once.
        let listener =
            std::net::TcpListener::bind((config.host.as_str(), config.port)).map_err(|source| {
                ServerError::Bind {
                    addr: addr_text.clone(),
                    source,
                }
            })?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let router = app::router(models.clone(), &config);
        let (shutdown, stopped) = oneshot::channel::<()>();
        let limits = config.limits.clone();
        runtime.spawn(async move {
            let serve = async {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                listen::serve(listener, router, limits, stopped).await
            };
            if let Err(e) = serve.await {
                tracing::error!("server stopped: {e}");
            }
        });
        tracing::info!(
            "serving {} on http://{addr}",
            models.default_id().unwrap_or_default()
        );
        Ok(Server {
            addr,
            models,
            shutdown: Some(shutdown),
            runtime: Some(runtime),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The id clients name the default model by.
    pub fn model_id(&self) -> String {
        self.models.default_id().unwrap_or_default()
    }

    /// The scheduler of the default model (zeros while it is not loaded).
    pub fn stats(&self) -> Stats {
        let id = self.model_id();
        (self.models.loaded().into_iter())
            .find(|a| a.model.id == id)
            .map_or_else(Stats::default, |a| a.scheduler.stats())
    }

    /// Serves until Ctrl-C (or SIGINT).
    pub fn wait_for_ctrl_c(self) -> Result<(), ServerError> {
        if let Some(rt) = &self.runtime {
            rt.block_on(tokio::signal::ctrl_c())?;
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        self.models.close();
        // Open streams would hold a graceful shutdown forever; the engine ends after its step.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
