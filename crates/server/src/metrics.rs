//! `GET /metrics`: the server's counters in the Prometheus/OpenMetrics text format, encoded by
//! `prometheus-client`. HTTP requests are counted by a middleware (by route, not raw path, so
//! the label set stays small); generation figures come from the scheduler's hooks.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use anelm_engine::Finish;

use crate::error::ApiError;
use crate::models::Models;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: u16,
}

type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    prompt_tokens: Counter,
    prompt_tokens_cached: Counter,
    prompt_tokens_processed: Counter,
    prompt_seconds: FloatCounter,
    generated_tokens: Counter,
    generation_seconds: FloatCounter,
    prompt_tps: FloatGauge,
    generation_tps: FloatGauge,
    ttft: Histogram,
    per_token: Histogram,
    prefix_cache_hits: Counter,
    prefix_cache_misses: Counter,
    queue_length: Gauge,
    slots: Gauge,
    slots_busy: Gauge,
    models_loaded: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("anelm");
        let m = Metrics {
            requests: Family::default(),
            prompt_tokens: Counter::default(),
            prompt_tokens_cached: Counter::default(),
            prompt_tokens_processed: Counter::default(),
            prompt_seconds: FloatCounter::default(),
            generated_tokens: Counter::default(),
            generation_seconds: FloatCounter::default(),
            prompt_tps: FloatGauge::default(),
            generation_tps: FloatGauge::default(),
            // 1 ms .. ~65 s.
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            // 0.5 ms .. ~16 s.
            per_token: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            prefix_cache_hits: Counter::default(),
            prefix_cache_misses: Counter::default(),
            queue_length: Gauge::default(),
            slots: Gauge::default(),
            slots_busy: Gauge::default(),
            models_loaded: Gauge::default(),
            registry: Registry::default(),
        };
        r.register(
            "requests",
            "HTTP requests answered, by route and status",
            m.requests.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of finished generations (tokens in)",
            m.prompt_tokens.clone(),
        );
        r.register(
            "prompt_tokens_cached",
            "Prompt tokens whose keys and values a cached session already held",
            m.prompt_tokens_cached.clone(),
        );
        r.register(
            "prompt_tokens_processed",
            "Prompt tokens run through the model (not cached)",
            m.prompt_tokens_processed.clone(),
        );
        r.register(
            "prompt_seconds",
            "Time spent processing prompt tokens",
            m.prompt_seconds.clone(),
        );
        r.register(
            "generated_tokens",
            "Tokens generated (tokens out)",
            m.generated_tokens.clone(),
        );
        r.register(
            "generation_seconds",
            "Time spent generating tokens",
            m.generation_seconds.clone(),
        );
        r.register(
            "prompt_tokens_per_second",
            "Prompt throughput: processed prompt tokens over prompt time, since start",
            m.prompt_tps.clone(),
        );
        r.register(
            "generation_tokens_per_second",
            "Generation throughput: generated tokens over generation time, since start",
            m.generation_tps.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "From a job's arrival at the scheduler to its first generated token",
            m.ttft.clone(),
        );
        r.register(
            "time_per_output_token_seconds",
            "Between consecutive generated tokens of one choice",
            m.per_token.clone(),
        );
        r.register(
            "prefix_cache_hits",
            "Generations that reused a cached prompt prefix",
            m.prefix_cache_hits.clone(),
        );
        r.register(
            "prefix_cache_misses",
            "Generations that reused no cached prompt prefix",
            m.prefix_cache_misses.clone(),
        );
        r.register(
            "queue_length",
            "Jobs waiting for a slot",
            m.queue_length.clone(),
        );
        r.register("slots", "Generation slots", m.slots.clone());
        r.register(
            "slots_busy",
            "Generation slots running a job",
            m.slots_busy.clone(),
        );
        r.register(
            "models_loaded",
            "Models loaded and served",
            m.models_loaded.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// The first token of a choice, `since` the job reached the scheduler.
    pub fn first_token(&self, since: Duration) {
        self.ttft.observe(since.as_secs_f64());
    }

    /// A later token of a choice, `gap` after the one before.
    pub fn next_token(&self, gap: Duration) {
        self.per_token.observe(gap.as_secs_f64());
    }

    /// A choice that ran to its end.
    pub fn finished(&self, f: &Finish) {
        self.prompt_tokens.inc_by(f.usage.prompt_tokens as u64);
        self.prompt_tokens_cached
            .inc_by(f.usage.cached_tokens as u64);
        self.prompt_tokens_processed
            .inc_by(f.timings.prefilled_tokens as u64);
        self.prompt_seconds.inc_by(f.timings.prefill.as_secs_f64());
        self.generated_tokens
            .inc_by(f.usage.completion_tokens as u64);
        self.generation_seconds
            .inc_by(f.timings.decode.as_secs_f64());
        if f.usage.cached_tokens > 0 {
            self.prefix_cache_hits.inc();
        } else {
            self.prefix_cache_misses.inc();
        }
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        self.prompt_tps.set(rate(
            self.prompt_tokens_processed.get(),
            self.prompt_seconds.get(),
        ));
        self.generation_tps.set(rate(
            self.generated_tokens.get(),
            self.generation_seconds.get(),
        ));
    }

    fn request(&self, endpoint: String, status: u16) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, status })
            .inc();
    }
}

/// Counts every answered request by its route (`other` for paths no route matched).
pub async fn count_requests(
    State(models): State<Arc<Models>>,
    req: Request,
    next: Next,
) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_string(), |p| p.as_str().to_string());
    let response = next.run(req).await;
    (models.shared.metrics).request(endpoint, response.status().as_u16());
    response
}

/// `GET /metrics`.
pub async fn handle(State(models): State<Arc<Models>>) -> Result<Response, ApiError> {
    let m = &models.shared.metrics;
    let loaded = models.loaded();
    let stats: Vec<_> = loaded.iter().map(|a| a.scheduler.stats()).collect();
    m.queue_length
        .set(stats.iter().map(|s| s.waiting as i64).sum());
    m.slots.set(stats.iter().map(|s| s.slots as i64).sum());
    m.slots_busy.set(stats.iter().map(|s| s.busy as i64).sum());
    m.models_loaded.set(models.loaded_count() as i64);
    drop(loaded);
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &m.registry)
        .map_err(|e| ApiError::internal(format!("encoding the metrics failed: {e}")))?;
    Ok((
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response())
}
