//! Which models the server holds. Every model it may serve has an entry; one is loaded on the
//! first request that names it and unloaded, least recently used first, when loading another
//! would pass the budget (`--max-loaded`, `--memory`) — only while nobody is using it.
//!
//! A loaded model is an [`App`] (a chat model: its tokenizer and template, its scheduler and
//! engine thread) or an [`Embedder`] (an embedding model, which answers only embeddings and
//! tokenizing).
//! Requests for a model that is loading wait for it; when the budget is held by models in use
//! the answer is 503 with `Retry-After`, and a model that could never fit is a 400.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use anelm_engine::LoadedModel;
use anelm_model::plan::Mixer;
use anelm_model::{Executor, Model};
use axum::http::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::app::{App, Shared};
use crate::drafts::DraftConfig;
use crate::embedder::{Embedder, EncoderParts};
use crate::error::ApiError;
use crate::ServerConfig;

/// A loaded model and what runs it.
pub struct LoadedParts {
    pub loaded: LoadedModel,
    pub exec: Box<dyn Executor>,
    /// Speculative decoding with a draft model for this model's generations.
    pub draft: Option<DraftConfig>,
}

/// Loads a model: resolves its reference, reads it, builds its executor (which may compile).
/// Runs on a blocking thread; the error is one line for the client.
pub type LoadFn = Arc<dyn Fn() -> Result<Loaded, String> + Send + Sync>;

/// A loaded model of either kind.
pub enum Loaded {
    Chat(LoadedParts),
    Embed(EncoderParts),
}

impl From<LoadedParts> for Loaded {
    fn from(p: LoadedParts) -> Loaded {
        Loaded::Chat(p)
    }
}

impl From<EncoderParts> for Loaded {
    fn from(p: EncoderParts) -> Loaded {
        Loaded::Embed(p)
    }
}

/// A model being served.
#[derive(Clone)]
pub enum Served {
    Chat(Arc<App>),
    Embed(Arc<Embedder>),
}

impl Served {
    pub fn tokenizer(&self) -> &Arc<anelm_tokenize::Tokenizer> {
        match self {
            Served::Chat(a) => &a.model.tokenizer,
            Served::Embed(e) => &e.tokenizer,
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Served::Chat(a) => &a.model.id,
            Served::Embed(e) => &e.id,
        }
    }

    /// Nobody holds it but the registry, and nothing waits in its scheduler.
    fn idle(&self) -> bool {
        match self {
            Served::Chat(app) => {
                let s = app.scheduler.stats();
                Arc::strong_count(app) == 1 && s.busy == 0 && s.waiting == 0
            }
            Served::Embed(e) => Arc::strong_count(e) == 1,
        }
    }

    /// Ends it, off the async threads: a chat model's engine is stopped and waited for.
    fn shutdown(self) {
        match self {
            Served::Chat(app) => {
                if let Ok(app) = Arc::try_unwrap(app) {
                    app.shutdown();
                }
            }
            Served::Embed(e) => drop(e),
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Served::Chat(app) => {
                estimate_bytes(&app.model.loaded.model, app.model.ctx, app.slots())
            }
            Served::Embed(e) => e.bytes,
        }
    }
}

/// A model the server may serve.
#[derive(Clone)]
pub struct ModelSpec {
    /// The name requests use.
    pub id: String,
    pub load: LoadFn,
    /// Its size on disk when known before loading, the first guess at its memory.
    pub bytes_hint: u64,
}

/// How much may be loaded at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Most models loaded at once.
    pub max_loaded: Option<usize>,
    /// Most bytes of loaded models (each estimated as [`estimate_bytes`] says).
    pub memory: Option<u64>,
}

enum State {
    Unloaded,
    /// The receiver turns true when the load has ended, well or not.
    Loading(watch::Receiver<bool>),
    Loaded(Served),
    Failed(String),
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Unloaded => "unloaded",
            State::Loading(_) => "loading",
            State::Loaded(_) => "loaded",
            State::Failed(_) => "failed",
        }
    }
}

struct Entry {
    id: String,
    /// None for a model given loaded, which is never unloaded.
    load: Option<LoadFn>,
    state: State,
    /// The estimate of its memory: the hint until it has been loaded once.
    bytes: u64,
    last_used: Instant,
    /// Times it was loaded.
    loads: u64,
}

/// Every model the server may serve, and which are loaded.
pub struct Models {
    entries: Mutex<Vec<Entry>>,
    budget: Budget,
    config: ServerConfig,
    pub shared: Shared,
    /// When the server started (the `created` of a model not loaded).
    pub started: u64,
}

/// The guard of the entries; every critical section leaves them whole, so a poisoned lock
/// is still good.
fn lock(m: &Mutex<Vec<Entry>>) -> MutexGuard<'_, Vec<Entry>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Models {
    pub fn new(config: ServerConfig) -> Models {
        Models {
            entries: Mutex::new(Vec::new()),
            budget: config.budget,
            shared: Shared::new(&config),
            started: crate::ids::unix_seconds(),
            config,
        }
    }

    /// Adds a model that is already loaded, named `id` (default: its file's name); without
    /// `load` it stays loaded.
    pub fn add_loaded(
        &self,
        parts: Loaded,
        id: Option<String>,
        load: Option<LoadFn>,
    ) -> Result<(), String> {
        let served = self.serve(parts, id)?;
        let id = served.id().to_string();
        if lock(&self.entries).iter().any(|e| e.id == id) {
            return Err(format!("two models are named '{id}'"));
        }
        lock(&self.entries).push(Entry {
            id,
            load,
            bytes: served.bytes(),
            state: State::Loaded(served),
            last_used: Instant::now(),
            loads: 1,
        });
        Ok(())
    }

    /// A loaded model made ready to serve, named `id` (default: its file's name).
    fn serve(&self, parts: Loaded, id: Option<String>) -> Result<Served, String> {
        Ok(match parts {
            Loaded::Chat(p) => Served::Chat(Arc::new(App::new(&self.config, &self.shared, p, id)?)),
            Loaded::Embed(p) => {
                let id = id.unwrap_or_else(|| p.runner.encoder().name.clone());
                Served::Embed(Arc::new(Embedder::new(id, p)))
            }
        })
    }

    /// Adds a model to load when first asked for. Ids must be unique.
    pub fn add(&self, spec: ModelSpec) -> Result<(), String> {
        let mut entries = lock(&self.entries);
        if entries.iter().any(|e| e.id == spec.id) {
            return Err(format!("two models are named '{}'", spec.id));
        }
        entries.push(Entry {
            id: spec.id,
            load: Some(spec.load),
            state: State::Unloaded,
            bytes: spec.bytes_hint,
            last_used: Instant::now(),
            loads: 0,
        });
        Ok(())
    }

    /// The model requests name when they name none (the first one).
    pub fn default_id(&self) -> Option<String> {
        lock(&self.entries).first().map(|e| e.id.clone())
    }

    /// The chat model `asked` names, loading it first when it is not (the wait may be long:
    /// a device's programs compile). Errors: unknown name (404), an embedding model (400),
    /// budget held by models in use (503, retry), a model larger than the budget or one that
    /// failed to load.
    pub async fn get(self: &Arc<Self>, asked: &str) -> Result<Arc<App>, ApiError> {
        match self.get_served(asked).await? {
            Served::Chat(app) => Ok(app),
            Served::Embed(e) => Err(ApiError::bad_param(
                "model",
                format!(
                    "The model '{}' is an embedding model: it serves /v1/embeddings, /tokenize \
                     and /detokenize, not generation",
                    e.id
                ),
            )),
        }
    }

    /// The model `asked` names, of either kind, loaded as [`Models::get`] loads it.
    pub async fn get_served(self: &Arc<Self>, asked: &str) -> Result<Served, ApiError> {
        let mut waited = false;
        loop {
            let mut done = match self.step(asked, waited)? {
                Step::Ready(app) => return Ok(app),
                Step::Wait(rx) => rx,
            };
            waited = true;
            // The sender lives until the load ends; an error means it ended (the thread died).
            let _ = done.wait_for(|ended| *ended).await;
        }
    }

    /// The model `asked` (or the default, for requests without a `model` field).
    pub async fn get_or_default(self: &Arc<Self>, asked: Option<&str>) -> Result<Served, ApiError> {
        match asked {
            Some(name) => self.get_served(name).await,
            None => {
                let id = self
                    .default_id()
                    .ok_or_else(|| ApiError::internal("no model is served"))?;
                self.get_served(&id).await
            }
        }
    }

    fn step(self: &Arc<Self>, asked: &str, waited: bool) -> Result<Step, ApiError> {
        let mut entries = lock(&self.entries);
        let Some(i) = entries.iter().position(|e| e.id == asked) else {
            let names: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            return Err(ApiError::unknown_model(asked, &names.join("', '")));
        };
        let e = &mut entries[i];
        match &e.state {
            State::Loaded(served) => {
                e.last_used = Instant::now();
                return Ok(Step::Ready(served.clone()));
            }
            State::Loading(rx) => return Ok(Step::Wait(rx.clone())),
            State::Failed(why) if waited => return Err(load_failed(asked, why)),
            State::Unloaded | State::Failed(_) => {}
        }
        let Some(load) = e.load.clone() else {
            return Err(ApiError::internal(format!(
                "the model '{asked}' was unloaded and cannot be loaded again"
            )));
        };
        let need = e.bytes;
        let evicted = self.make_room(&mut entries, i, need)?;
        let (tx, rx) = watch::channel(false);
        entries[i].state = State::Loading(rx.clone());
        drop(entries);
        let models = self.clone();
        let id = asked.to_string();
        tokio::task::spawn_blocking(move || {
            // The evicted engines end (and free their memory) before the new model is read.
            for served in evicted {
                served.shutdown();
            }
            models.finish_load(&id, load());
            let _ = tx.send(true);
        });
        Ok(Step::Wait(rx))
    }

    /// Unloads idle models, least recently used first, until one of `need` bytes more fits
    /// beside the others; the unloaded ones are returned to be shut down off the lock.
    fn make_room(
        &self,
        entries: &mut [Entry],
        i: usize,
        need: u64,
    ) -> Result<Vec<Served>, ApiError> {
        let id = entries[i].id.clone();
        if let Some(memory) = self.budget.memory {
            if need > memory {
                return Err(too_large(&id, need, memory));
            }
        }
        let mut evicted = Vec::new();
        loop {
            let held: Vec<usize> = (0..entries.len())
                .filter(|&j| {
                    j != i && matches!(entries[j].state, State::Loaded(_) | State::Loading(_))
                })
                .collect();
            let used: u64 = held.iter().map(|&j| entries[j].bytes).sum();
            let over_count = self.budget.max_loaded.is_some_and(|m| held.len() + 1 > m);
            let over_memory = self.budget.memory.is_some_and(|m| used + need > m);
            if !over_count && !over_memory {
                return Ok(evicted);
            }
            let idle = held
                .iter()
                .copied()
                .filter(|&j| entries[j].load.is_some() && is_idle(&entries[j].state))
                .min_by_key(|&j| entries[j].last_used);
            let Some(j) = idle else {
                let busy: Vec<String> = held.iter().map(|&j| entries[j].id.clone()).collect();
                // Put back what was taken: nothing is lost when the load cannot start.
                for served in evicted {
                    restore(entries, served);
                }
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "The model '{id}' cannot be loaded now: {} in use ('{}'); retry later",
                        self.budget_text(),
                        busy.join("', '")
                    ),
                ));
            };
            let State::Loaded(served) = std::mem::replace(&mut entries[j].state, State::Unloaded)
            else {
                unreachable!("only loaded models are idle");
            };
            tracing::info!("unloading {} to make room for {id}", entries[j].id);
            evicted.push(served);
        }
    }

    fn budget_text(&self) -> String {
        match (self.budget.max_loaded, self.budget.memory) {
            (Some(n), Some(m)) => format!("the budget of {n} models and {} MiB is", m >> 20),
            (Some(n), None) => format!("the budget of {n} loaded models is"),
            (None, Some(m)) => format!("the memory budget of {} MiB is", m >> 20),
            (None, None) => "the budget is".into(),
        }
    }

    fn finish_load(&self, id: &str, parts: Result<Loaded, String>) {
        let app = parts.and_then(|p| self.serve(p, Some(id.to_string())));
        let mut entries = lock(&self.entries);
        let Some(i) = entries.iter().position(|e| e.id == id) else {
            return;
        };
        match app {
            Ok(app) => {
                let bytes = app.bytes();
                entries[i].bytes = bytes;
                entries[i].loads += 1;
                entries[i].last_used = Instant::now();
                if let Some(memory) = self.budget.memory.filter(|&m| bytes > m) {
                    let why = too_large(id, bytes, memory).message;
                    tracing::warn!("{why}");
                    entries[i].state = State::Failed(why);
                    drop(entries);
                    app.shutdown();
                    return;
                }
                tracing::info!("loaded {id} (about {} MiB)", bytes >> 20);
                entries[i].state = State::Loaded(app);
            }
            Err(why) => {
                tracing::warn!("loading {id} failed: {why}");
                entries[i].state = State::Failed(why);
            }
        }
    }

    /// Every model with its state, for `/v1/models` and `/health`.
    pub fn listing(&self) -> Vec<Value> {
        let entries = lock(&self.entries);
        entries
            .iter()
            .map(|e| {
                let mut v = json!({
                    "id": e.id,
                    "state": e.state.name(),
                    "estimated_bytes": e.bytes,
                    "loads": e.loads,
                });
                match &e.state {
                    State::Loaded(Served::Chat(app)) => {
                        v["kind"] = json!("chat");
                        v["context_length"] = json!(app.model.ctx);
                        v["created"] = json!(app.model.created);
                        v["scheduler"] = json!(app.scheduler.stats());
                    }
                    State::Loaded(Served::Embed(m)) => {
                        let (pooling, normalize) = m.pooling();
                        v["kind"] = json!("embedding");
                        v["context_length"] = json!(m.max_positions);
                        v["created"] = json!(m.created);
                        v["pooling"] = json!(pooling);
                        v["normalize"] = json!(normalize);
                    }
                    State::Failed(why) => v["error"] = json!(why),
                    _ => {}
                }
                v
            })
            .collect()
    }

    /// The loaded chat models.
    pub fn loaded(&self) -> Vec<Arc<App>> {
        lock(&self.entries)
            .iter()
            .filter_map(|e| match &e.state {
                State::Loaded(Served::Chat(app)) => Some(app.clone()),
                _ => None,
            })
            .collect()
    }

    /// How many models are loaded, of either kind.
    pub fn loaded_count(&self) -> usize {
        (lock(&self.entries).iter())
            .filter(|e| matches!(e.state, State::Loaded(_)))
            .count()
    }

    /// Whether some model is loading.
    pub fn any_loading(&self) -> bool {
        lock(&self.entries)
            .iter()
            .any(|e| matches!(e.state, State::Loading(_)))
    }

    /// Stops every engine: new jobs are refused, running ones end after their step.
    pub fn close(&self) {
        for app in self.loaded() {
            app.scheduler.close();
        }
    }
}

enum Step {
    Ready(Served),
    Wait(watch::Receiver<bool>),
}

/// Loaded, with nobody holding it (no request in progress, no reply being written) and
/// nothing in its scheduler.
fn is_idle(state: &State) -> bool {
    matches!(state, State::Loaded(served) if served.idle())
}

fn restore(entries: &mut [Entry], served: Served) {
    if let Some(e) = entries.iter_mut().find(|e| e.id == served.id()) {
        e.state = State::Loaded(served);
    }
}

fn too_large(id: &str, need: u64, memory: u64) -> ApiError {
    ApiError {
        param: Some("model".into()),
        code: Some("model_too_large"),
        ..ApiError::bad_request(format!(
            "The model '{id}' needs about {} MiB, more than the server's memory budget of {} \
             MiB (serve --memory)",
            need.div_ceil(1 << 20),
            memory >> 20
        ))
    }
}

fn load_failed(id: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("The model '{id}' could not be loaded: {why}"),
    )
}

/// A model's memory when loaded: its files (the weights the engine keeps) and the KV cache of
/// every slot at full context in f16 — a bound, since caches grow with use.
pub fn estimate_bytes(model: &Model, ctx: usize, slots: usize) -> u64 {
    let files = source_bytes(model.source.path());
    let per_position: usize = model
        .layers
        .iter()
        .map(|l| match &l.mixer {
            Mixer::Attention(a) => 2 * a.k.out_features() * 2,
            _ => 0,
        })
        .sum();
    files + (per_position * ctx * slots) as u64
}

/// Bytes of a model file, or of a model directory's files.
pub fn source_bytes(path: &std::path::Path) -> u64 {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => m.len(),
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .filter_map(|f| std::fs::metadata(f.path()).ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0),
        _ => 0,
    }
}
