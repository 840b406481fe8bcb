//! The application: one loaded model with its scheduler ([`App`]), what all models share, and
//! the routes, which find the model a request names in [`Models`].

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tower_http::cors::{Any, CorsLayer};

use crate::error::{ApiError, Flavour};
use crate::limits::Limits;
use crate::metrics::{self, Metrics};
use crate::model::ServedModel;
use crate::models::{LoadedParts, Models};
use crate::openai::responses_store::{self, ResponseStore};
use crate::scheduler::{Job, Scheduler, SchedulerConfig, Update};
use crate::{anthropic, auth, openai, tokens, webui, ServerConfig};

/// What every model shares: the limits on a request, the metrics, the stored responses and
/// how embeddings pool.
#[derive(Clone)]
pub struct Shared {
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`.
    pub responses: Arc<ResponseStore>,
    /// How embeddings pool when asked ([`crate::embeddings`]); None: as each model says.
    pub pooling: Option<crate::embeddings::Pooling>,
}

impl Shared {
    pub fn new(config: &ServerConfig) -> Shared {
        Shared {
            limits: config.limits.clone(),
            metrics: Arc::new(Metrics::new()),
            responses: Arc::new(ResponseStore::new(
                responses_store::KEPT,
                responses_store::KEPT_BYTES,
            )),
            pooling: config.pooling,
        }
    }
}

/// One loaded model as the handlers see it: the model, its scheduler, and the shared parts.
pub struct App {
    pub model: Arc<ServedModel>,
    pub scheduler: Scheduler,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub responses: Arc<ResponseStore>,
    pub pooling: crate::embeddings::Pooling,
}

impl App {
    /// The model named `id` (default: its file's name), served as `config` says.
    pub fn new(
        config: &ServerConfig,
        shared: &Shared,
        parts: LoadedParts,
        id: Option<String>,
    ) -> Result<App, String> {
        let model =
            Arc::new(ServedModel::new(parts.loaded, id, config.ctx).map_err(|e| e.to_string())?);
        let scheduler = Scheduler::new(
            model.loaded.clone(),
            parts.exec,
            model.ctx,
            SchedulerConfig {
                draft: parts.draft,
                ..config.scheduler.clone()
            },
            shared.metrics.clone(),
        );
        // The model's own pooling (decoder embedding models such as Qwen3-Embedding name
        // last-token pooling), unless the server was told one.
        let configured = anelm_model::encoder::configured_pooling(&model.loaded.model.source)
            .map_err(|e| e.to_string())?;
        let pooling = shared
            .pooling
            .or(configured.map(|(p, _)| p))
            .unwrap_or_default();
        Ok(App {
            model,
            scheduler,
            limits: shared.limits.clone(),
            metrics: shared.metrics.clone(),
            responses: shared.responses.clone(),
            pooling,
        })
    }

    /// Generation slots of this model.
    pub fn slots(&self) -> usize {
        self.scheduler.stats().slots
    }

    /// Stops the engine and waits for its thread, which frees the model's memory.
    pub fn shutdown(self) {
        self.scheduler.close();
        self.scheduler.join();
    }

    /// Builds a prompt off the async threads (tokenizing a long text takes a while).
    pub async fn tokenize(
        &self,
        f: impl FnOnce(&ServedModel) -> Result<Vec<u32>, ApiError> + Send + 'static,
    ) -> Result<Vec<u32>, ApiError> {
        let model = self.model.clone();
        tokio::task::spawn_blocking(move || f(&model))
            .await
            .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
    }

    pub async fn tokenize_text(&self, text: String) -> Result<Vec<u32>, ApiError> {
        self.tokenize(move |m| m.text_prompt(&text)).await
    }

    /// Queues a job, or refuses it with 503 when the queue is full.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Update>, ApiError> {
        self.scheduler.submit(job).map_err(|_| ApiError::busy())
    }
}

impl Drop for App {
    /// An unloaded model's engine ends after its current step.
    fn drop(&mut self) {
        self.scheduler.close();
    }
}

pub fn router(models: Arc<Models>, config: &ServerConfig) -> Router {
    let api = Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat::handle))
        .route("/v1/completions", post(openai::completions::handle))
        .route("/v1/embeddings", post(crate::embeddings::handle))
        .route("/v1/responses", post(openai::responses::create))
        .route(
            "/v1/responses/{id}",
            get(openai::responses::retrieve).delete(openai::responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route_layer(middleware::from_fn_with_state(
            Arc::new(config.api_key.clone()),
            auth::check,
        ));
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers(Any)
        .expose_headers(Any);
    Router::new()
        .route("/", get(webui::page))
        .route("/health", get(health))
        .route("/metrics", get(metrics::handle))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            models.clone(),
            metrics::count_requests,
        ))
        .layer(DefaultBodyLimit::max(config.limits.max_body_bytes))
        .layer(cors)
        .with_state(models)
}

/// `GET /health`: answers at once, whatever the slots are doing: the default model (its
/// context and scheduler when loaded) and every model's state.
async fn health(State(models): State<Arc<Models>>) -> Json<Value> {
    let listing = models.listing();
    let mut body = json!({
        "status": if models.any_loading() { "loading" } else { "ok" },
        "models": listing,
    });
    if let Some(first) = listing.first() {
        body["model"] = first["id"].clone();
        if let Some(ctx) = first.get("context_length") {
            body["context"] = ctx.clone();
        }
        if let Some(stats) = first.get("scheduler") {
            body["scheduler"] = stats.clone();
        }
    }
    Json(body)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Unknown request URL: {} {}", req.method(), req.uri().path()),
    )
    .with_flavour(Flavour::of_path(req.uri().path()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .with_flavour(Flavour::of_path(req.uri().path()))
}
