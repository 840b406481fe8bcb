//! The application: the served model, the scheduler, and the routes.

use std::sync::Arc;

use anelm_engine::LoadedModel;
use anelm_model::Executor;
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
use crate::openai::responses_store::{self, ResponseStore};
use crate::scheduler::{Job, Scheduler, Update};
use crate::{anthropic, auth, openai, tokens, webui, ServerConfig, ServerError};

pub struct App {
    pub model: Arc<ServedModel>,
    pub scheduler: Scheduler,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`.
    pub responses: ResponseStore,
    /// How embeddings pool ([`crate::embeddings`]).
    pub pooling: crate::embeddings::Pooling,
}

impl App {
    pub fn new(
        config: &ServerConfig,
        loaded: LoadedModel,
        exec: Box<dyn Executor>,
    ) -> Result<App, ServerError> {
        let model = Arc::new(ServedModel::new(
            loaded,
            config.model_id.clone(),
            config.ctx,
        )?);
        let metrics = Arc::new(Metrics::new());
        let scheduler = Scheduler::new(
            model.loaded.clone(),
            exec,
            model.ctx,
            config.scheduler.clone(),
            metrics.clone(),
        );
        Ok(App {
            model,
            scheduler,
            limits: config.limits.clone(),
            metrics,
            responses: ResponseStore::new(responses_store::KEPT, responses_store::KEPT_BYTES),
            pooling: config.pooling,
        })
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

pub fn router(app: Arc<App>, config: &ServerConfig) -> Router {
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
            app.clone(),
            metrics::count_requests,
        ))
        .layer(DefaultBodyLimit::max(config.limits.max_body_bytes))
        .layer(cors)
        .with_state(app)
}

/// `GET /health`: answers at once, whatever the slots are doing.
async fn health(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "model": app.model.id,
        "context": app.model.ctx,
        "scheduler": app.scheduler.stats(),
    }))
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
