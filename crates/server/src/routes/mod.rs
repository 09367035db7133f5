//! The route table and the layers every route passes through (auth, access log, metrics).
//! The pooling server (`crate::pooling`) has its own table and shares the layers
//! ([`finish_app`]).

mod chat;
mod completions;
pub(crate) mod info;
mod lora;
mod messages;
mod responses;
pub(crate) mod tokenize;

use std::time::Instant;

use axum::body::{to_bytes, Body, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokenmill_engine::SchedulingPolicy;
use tokenmill_protocol::{
    parse_json_noting_ignored, ErrorResponse, ProtocolError, ValidatedSampling,
};

use crate::config::ServerConfig;
use crate::error::{anthropic_error_response, error_response, ApiError};
use crate::state::AppState;
use tokenmill_metrics::EngineMetrics;

/// What the layers every route passes through (auth, access log, metrics) read from a
/// server's state: the generation server's [`AppState`] and the pooling server's
/// `PoolingState` alike.
pub(crate) trait HttpState: Clone + Send + Sync + 'static {
    fn config(&self) -> &ServerConfig;
    fn metrics(&self) -> &EngineMetrics;
    /// Whether `name` is a loaded LoRA adapter a request may name as its `model`.
    fn is_lora_adapter(&self, _name: &str) -> bool {
        false
    }
    /// Adds the routes this state serves beyond the shared document to `/openapi.json`.
    fn extend_openapi(&self, _document: &mut serde_json::Value) {}
}

impl HttpState for AppState {
    fn config(&self) -> &ServerConfig {
        AppState::config(self)
    }

    fn metrics(&self) -> &EngineMetrics {
        &self.inner.metrics
    }

    fn is_lora_adapter(&self, name: &str) -> bool {
        self.engine().lora().is_some_and(|r| r.contains(name))
    }

    fn extend_openapi(&self, document: &mut serde_json::Value) {
        tokenmill_protocol::apply_openapi_limits(document, &self.inner.limits);
        if serves_runtime_lora(self) {
            // Adapter names come and go: `model` stays any string.
            lora::extend_openapi(document);
        } else {
            let mut names = self.config().served_model_names.clone();
            if let Some(registry) = self.engine().lora() {
                names.extend(registry.list().into_iter().map(|adapter| adapter.name));
            }
            tokenmill_protocol::apply_openapi_model_names(document, &names);
        }
    }
}

/// Whether `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` are served.
fn serves_runtime_lora(state: &AppState) -> bool {
    state.config().allow_runtime_lora_updating && state.engine().lora().is_some()
}

/// The whole app, ready for `axum::serve` or in-process `oneshot` tests.
pub fn router(state: AppState) -> Router {
    let mut routes = Router::new()
        .route("/v1/completions", post(completions::create))
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/models", get(info::models))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/health", get(info::health))
        .route("/ping", get(info::health))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics::<AppState>));
    if state.config().serve_openapi {
        routes = routes.route("/openapi.json", get(info::openapi::<AppState>));
    }
    if serves_runtime_lora(&state) {
        routes = routes
            .route("/v1/load_lora_adapter", post(lora::load))
            .route("/v1/unload_lora_adapter", post(lora::unload));
    }
    if state.config().enable_tokenizer_info_endpoint {
        routes = routes.route("/tokenizer_info", get(tokenize::tokenizer_info));
    }
    for path in crate::pooling::POOLING_PATHS {
        routes = routes.route(path, post(crate::pooling::not_a_pooling_model));
    }
    finish_app(routes, state)
}

/// The fallbacks and the layers every route of either server passes through, around `routes`.
pub(crate) fn finish_app<S: HttpState>(routes: Router<S>, state: S) -> Router {
    let app = routes
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            authenticate::<S>,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            access_log::<S>,
        ));
    // `--root-path`: a proxy that does not strip its path prefix reaches the same routes.
    let app = match state.config().root_path.as_deref() {
        Some(prefix) => Router::new().nest(prefix, app.clone()).merge(app),
        None => app,
    };
    let app = match &state.config().cors {
        Some(cors) => app.layer(cors.layer()),
        None => app,
    };
    app.with_state(state)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> Response {
    let error = ErrorResponse::not_found(format!(
        "{method} {} is not a route of this server",
        uri.path()
    ));
    // Anthropic's clients (the Message Batches API under `/v1/messages/batches`, ...) parse
    // Anthropic's error shape.
    if uri.path().contains("/v1/messages/") {
        anthropic_error_response(error)
    } else {
        error_response(error)
    }
}

/// A known path with the wrong method: 405 with an error body in the route's API shape
/// (Anthropic's on the Messages routes, OpenAI's elsewhere; axum's default is empty).
async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let error = ErrorResponse::new(
        405,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    );
    if messages::is_anthropic_path(uri.path()) {
        anthropic_error_response(error)
    } else {
        error_response(error)
    }
}

/// API-key check (`Authorization: Bearer` or `x-api-key`): every route except `/health` (and `/metrics` unless
/// `--api-key-metrics`) needs the key when one is configured.
async fn authenticate<S: HttpState>(
    State(state): State<S>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.config().api_key.as_deref() else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    let open = path == "/health"
        || path == "/ping"
        || (path == "/metrics" && !state.config().api_key_metrics);
    if open {
        return next.run(request).await;
    }
    // `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic), either on any route.
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let x_api_key = headers.get(X_API_KEY).and_then(|value| value.to_str().ok());
    let matches = |key: Option<&str>| {
        key.is_some_and(|key| constant_time_eq(key.as_bytes(), expected.as_bytes()))
    };
    if matches(bearer) || matches(x_api_key) {
        return next.run(request).await;
    }
    let error = ErrorResponse::authentication(
        "Incorrect or missing API key. Pass it as 'Authorization: Bearer <key>' or \
         'x-api-key: <key>'.",
    );
    if messages::is_anthropic_path(path) {
        anthropic_error_response(error)
    } else {
        error_response(error)
    }
}

/// Anthropic's API key header.
const X_API_KEY: &str = "x-api-key";

/// Compares keys without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One access-log line per request (method, path, status, latency, request id) and the HTTP
/// metrics.
async fn access_log<S: HttpState>(
    State(state): State<S>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    // The metrics label is the matched route, so unknown paths (scanners) share one label
    // instead of blowing up the label cardinality.
    let handler = request.extensions().get::<MatchedPath>().map_or_else(
        || "none".to_string(),
        |matched| matched.as_str().to_string(),
    );
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let response = next.run(request).await;
    let elapsed = started.elapsed().as_secs_f64();
    let adapter = response
        .extensions()
        .get::<lora::ServedAdapter>()
        .map(|adapter| format!(" lora={}", adapter.0))
        .unwrap_or_default();
    let status = response.status().as_u16();
    let quiet = state
        .config()
        .disable_access_log_for_endpoints
        .iter()
        .any(|p| p == &path);
    if !quiet {
        tracing::info!(
            target: "tokenmill::access",
            "{method} {path} {status} {:.1}ms request_id={}{adapter}",
            elapsed * 1e3,
            request_id.as_deref().unwrap_or("-")
        );
    }
    // Like vLLM's instrumentator, scrapes and health checks are not counted.
    if path != "/metrics" && path != "/health" && path != "/ping" {
        state
            .metrics()
            .record_http(&handler, method.as_str(), status, elapsed);
    }
    response
}

/// Reads a JSON request body: over the configured limit is a 413; anything but a JSON object
/// is a 400 (serde would otherwise accept an array as a struct's fields in order).
pub(crate) async fn read_json<T: serde::de::DeserializeOwned, S: HttpState>(
    state: &S,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = read_body(state, body).await?;
    let (request, ignored) = parse_json_noting_ignored(&bytes)?;
    if !ignored.is_empty() {
        // vLLM's warning: the request is served, but the client should know what did nothing.
        tracing::warn!(
            "The following fields were present in the request but ignored: {}",
            ignored.join(", ")
        );
    }
    Ok(request)
}

/// A request body's bytes, which must start a JSON object: over the configured limit is a
/// 413, not received in time a 408.
pub(crate) async fn read_body<S: HttpState>(
    state: &S,
    body: Body,
) -> Result<axum::body::Bytes, ApiError> {
    let limit = state.config().max_body_bytes;
    let timeout = state.config().body_read_timeout;
    // A declared Content-Length over the limit is refused before waiting for the body.
    if body.size_hint().lower() > limit as u64 {
        return Err(ApiError::from(ErrorResponse::request_too_large(limit)));
    }
    // A client that announces a body and never sends it (or drips it) must not hold a
    // connection and a task forever.
    let bytes = tokio::time::timeout(timeout, to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::from(ErrorResponse::new(
                408,
                "request_timeout",
                format!(
                    "The request body was not received within {} s.",
                    timeout.as_secs_f64()
                ),
            ))
        })?
        .map_err(|_| ApiError::from(ErrorResponse::request_too_large(limit)))?;
    let first = bytes.iter().find(|byte| !byte.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::from(ProtocolError::MalformedJson {
            message: "Invalid request body: expected a JSON object.".to_string(),
        }));
    }
    Ok(bytes)
}

/// 503 for new generation work while draining or after the engine died.
pub(crate) fn check_accepting(state: &AppState) -> Result<(), ApiError> {
    if state.is_draining() {
        return Err(ApiError::unavailable(
            "The server is shutting down and accepts no new requests.",
        ));
    }
    if !state.engine().is_alive() {
        return Err(ApiError::unavailable("The engine is not running."));
    }
    if let Some(limit) = state.config().max_waiting_requests {
        let waiting = state.num_waiting();
        if waiting >= limit {
            state.inner.metrics.record_rejected("waiting_queue_full");
            return Err(ApiError::unavailable(format!(
                "The server is overloaded: {waiting} requests are waiting \
                 (--max-waiting-requests {limit}). Retry later."
            )));
        }
    }
    Ok(())
}

/// What a validated request may ask of this server besides its sampling values: `priority`
/// only under the priority policy (vLLM's 400), and at most `max_prompts` sequences
/// (`num_prompts × n`) in one request, so one request cannot occupy the engine for minutes.
pub(crate) fn check_request_shape(
    state: &AppState,
    validated: &ValidatedSampling,
    num_prompts: usize,
) -> Result<(), ApiError> {
    let priority = validated.output.priority;
    if priority != 0 && state.engine().scheduling_policy() != SchedulingPolicy::Priority {
        return Err(ApiError::invalid_param(
            "priority",
            format!(
                "Got priority {priority} but Priority scheduling is not enabled \
                 (--scheduling-policy priority)."
            ),
        ));
    }
    let n = validated.sampling.n.max(1) as usize;
    let sequences = num_prompts.saturating_mul(n);
    let limit = state.inner.limits.max_prompts;
    if sequences > limit {
        return Err(ApiError::invalid_param(
            "n",
            format!(
                "{num_prompts} prompt(s) × n = {n} asks for {sequences} sequences; at most \
                 {limit} are allowed per request."
            ),
        ));
    }
    Ok(())
}

/// The served model a request names: absent → the primary name; a served name or a
/// registered LoRA adapter → itself; unknown → 404.
pub(crate) fn check_model<S: HttpState>(
    state: &S,
    model: Option<&str>,
) -> Result<String, ApiError> {
    let names = &state.config().served_model_names;
    let is_adapter = |name: &str| state.is_lora_adapter(name);
    match model {
        None | Some("") => Ok(state.config().primary_model_name().to_string()),
        Some(name) if names.iter().any(|n| n == name) || is_adapter(name) => Ok(name.to_string()),
        Some(name) => Err(ApiError::from(ErrorResponse::model_not_found(name))),
    }
}

pub(crate) fn json_response<T: serde::Serialize>(value: &T) -> Response {
    axum::Json(value).into_response()
}
