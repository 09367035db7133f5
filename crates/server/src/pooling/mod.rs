//! The pooling server (`tokenmill serve MODEL --runner pooling`): vLLM's pooling routes over
//! a [`PoolingClient`], with the generation server's layers (auth, access log, metrics,
//! CORS, `--root-path`) and lifecycle, and `/tokenize` / `/detokenize` as vLLM serves them for
//! any model. Generation routes answer 400 here, and the pooling routes answer 400 on the
//! generation server ([`not_a_pooling_model`]).

mod handlers;
mod tokenize;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokenmill_engine::{LoadedPoolingModel, PoolingClient};
use tokenmill_metrics::EngineMetrics;
use tokenmill_protocol::{ErrorResponse, ModelList};

use crate::config::ServerConfig;
use crate::error::{error_response, ApiError};
use crate::routes::{finish_app, info, json_response, HttpState};
use crate::state::unix_now;

/// The pooling routes, vLLM's paths.
pub(crate) const POOLING_PATHS: [&str; 7] = [
    "/v1/embeddings",
    "/pooling",
    "/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/classify",
];

/// Handler state of the pooling server. Cheap to clone.
#[derive(Clone)]
pub struct PoolingState {
    inner: Arc<Inner>,
}

struct Inner {
    client: PoolingClient,
    model: Arc<LoadedPoolingModel>,
    config: ServerConfig,
    metrics: Arc<EngineMetrics>,
    draining: AtomicBool,
    in_flight: AtomicUsize,
    started_at: u64,
}

impl std::fmt::Debug for PoolingState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolingState")
            .field("model", &self.inner.model)
            .finish_non_exhaustive()
    }
}

impl HttpState for PoolingState {
    fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    fn metrics(&self) -> &EngineMetrics {
        &self.inner.metrics
    }

    fn extend_openapi(&self, document: &mut serde_json::Value) {
        tokenmill_protocol::apply_openapi_model_names(
            document,
            &self.inner.config.served_model_names,
        );
    }
}

impl PoolingState {
    pub fn new(
        client: PoolingClient,
        model: Arc<LoadedPoolingModel>,
        config: ServerConfig,
        metrics: Arc<EngineMetrics>,
    ) -> PoolingState {
        PoolingState {
            inner: Arc::new(Inner {
                client,
                model,
                config,
                metrics,
                draining: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                started_at: unix_now(),
            }),
        }
    }

    /// Stop accepting requests; `/health` turns 503.
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Fails the inputs still queued in the engine (the shutdown drain timed out).
    pub fn abort_in_flight(&self) {
        self.inner.client.abort_queued();
    }

    fn check_accepting(&self) -> Result<InFlight, ApiError> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable(
                "The server is shutting down and accepts no new requests.",
            ));
        }
        if !self.inner.client.is_alive() {
            return Err(ApiError::unavailable("The engine is not running."));
        }
        if let Some(limit) = self.inner.config.max_waiting_requests {
            let waiting = self.inner.client.num_pending();
            if waiting >= limit {
                self.inner.metrics.record_rejected("waiting_queue_full");
                return Err(ApiError::unavailable(format!(
                    "The server is overloaded: {waiting} inputs are waiting \
                     (--max-waiting-requests {limit}). Retry later."
                )));
            }
        }
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok(InFlight(self.clone()))
    }
}

/// Counts a request as in flight until dropped (the drain waits for zero).
struct InFlight(PoolingState);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inner.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The pooling server's app, ready for `axum::serve` or in-process `oneshot` tests.
pub fn pooling_router(state: PoolingState) -> Router {
    let mut routes = Router::new()
        .route("/v1/embeddings", post(handlers::embeddings))
        .route("/pooling", post(handlers::pooling))
        .route("/score", post(handlers::score))
        .route("/v1/score", post(handlers::score))
        .route("/rerank", post(handlers::rerank))
        .route("/v1/rerank", post(handlers::rerank))
        .route("/v2/rerank", post(handlers::rerank))
        .route("/classify", post(handlers::classify))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/v1/completions", post(not_a_generative_model))
        .route("/v1/chat/completions", post(not_a_generative_model))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ping", get(health))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics::<PoolingState>));
    if state.inner.config.serve_openapi {
        routes = routes.route("/openapi.json", get(info::openapi::<PoolingState>));
    }
    finish_app(routes, state)
}

async fn models(State(state): State<PoolingState>) -> Response {
    let model = &state.inner.model;
    let cards = info::served_model_cards(
        &state.inner.config.served_model_names,
        state.inner.started_at,
        &model.source.path().display().to_string(),
        model.max_model_len,
        &model.info.architecture,
    );
    json_response(&ModelList::new(cards))
}

async fn health(State(state): State<PoolingState>) -> Response {
    if state.inner.draining.load(Ordering::SeqCst) {
        return error_response(ErrorResponse::overloaded("The server is draining."));
    }
    if !state.inner.client.is_alive() {
        return error_response(ErrorResponse::overloaded("The engine is not running."));
    }
    StatusCode::OK.into_response()
}

/// `/v1/completions` and `/v1/chat/completions` on a pooling model.
async fn not_a_generative_model(uri: axum::http::Uri) -> Response {
    ApiError::invalid(format!(
        "The model is served by the pooling runner (--runner pooling) and does not support \
         {}: it produces embeddings and scores (/v1/embeddings, /pooling, /score, /rerank, \
         /classify), not text. Serve a generative model for completions.",
        uri.path()
    ))
    .into_response()
}

/// The pooling routes on the generation server.
pub(crate) async fn not_a_pooling_model(uri: axum::http::Uri) -> Response {
    ApiError::invalid(format!(
        "The model is served by the generate runner and does not support {}: serve an \
         embedding, reranking or classification model with --runner pooling (or --task \
         embed|score|classify).",
        uri.path()
    ))
    .into_response()
}
