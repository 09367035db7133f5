//! Read-only routes: models, health, version, OpenAPI, metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokenmill_protocol::{openapi_json, ErrorResponse, ModelCard, ModelList, VersionResponse};

use crate::error::error_response;
use crate::routes::json_response;
use crate::state::AppState;

pub(crate) async fn models(State(state): State<AppState>) -> Response {
    let root = state.inner.model.source.path().display().to_string();
    let max_model_len = u32::try_from(state.engine().max_model_len()).unwrap_or(u32::MAX);
    let architecture = state.inner.model.config().architecture.name();
    let cards = state
        .config()
        .served_model_names
        .iter()
        .map(|name| {
            ModelCard::new(
                name.clone(),
                state.inner.started_at,
                root.clone(),
                max_model_len,
            )
            .with_architecture(architecture)
        })
        .collect();
    json_response(&ModelList::new(cards))
}

/// 200 while the engine runs and the server is not draining; 503 otherwise.
pub(crate) async fn health(State(state): State<AppState>) -> Response {
    if state.is_draining() {
        return error_response(ErrorResponse::overloaded("The server is draining."));
    }
    if !state.engine().is_alive() {
        return error_response(ErrorResponse::overloaded("The engine is not running."));
    }
    StatusCode::OK.into_response()
}

pub(crate) async fn version() -> Response {
    json_response(&VersionResponse {
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

pub(crate) async fn openapi() -> Response {
    json_response(&openapi_json())
}

pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    match state.inner.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(err) => error_response(ErrorResponse::internal(format!(
            "cannot encode metrics: {err}"
        ))),
    }
}
