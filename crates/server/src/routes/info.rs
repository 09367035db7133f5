//! Read-only routes: models, health, version, OpenAPI, metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokenmill_protocol::{openapi_json, ErrorResponse, ModelCard, ModelList, VersionResponse};

use crate::error::error_response;
use crate::routes::json_response;
use crate::state::AppState;

pub(crate) async fn models(State(state): State<AppState>) -> Response {
    let cards = served_model_cards(
        &state.config().served_model_names,
        state.inner.started_at,
        &state.inner.model.source.path().display().to_string(),
        state.engine().max_model_len(),
        state.inner.model.config().architecture.name(),
    );
    json_response(&ModelList::new(with_adapters(&state, cards)))
}

/// One `/v1/models` card per served name of the base model (the generation and the pooling
/// servers list their model the same way).
pub(crate) fn served_model_cards(
    names: &[String],
    started_at: u64,
    root: &str,
    max_model_len: usize,
    architecture: &str,
) -> Vec<ModelCard> {
    let max_model_len = u32::try_from(max_model_len).unwrap_or(u32::MAX);
    names
        .iter()
        .map(|name| {
            ModelCard::new(name.clone(), started_at, root.to_string(), max_model_len)
                .with_architecture(architecture)
        })
        .collect()
}

/// vLLM's adapter cards after the base model's: `root` the adapter's path, `parent` its
/// base model name (the served name unless `--lora-modules` gave one).
fn with_adapters(state: &AppState, mut cards: Vec<ModelCard>) -> Vec<ModelCard> {
    let Some(registry) = state.engine().lora() else {
        return cards;
    };
    let base = state.config().primary_model_name().to_string();
    for adapter in registry.list() {
        let mut card = ModelCard::new(
            adapter.name,
            adapter.created,
            adapter.path.display().to_string(),
            0,
        );
        card.max_model_len = None;
        card.parent = Some(adapter.base_model_name.unwrap_or_else(|| base.clone()));
        cards.push(card);
    }
    cards
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

/// The OpenAPI document; bearer security is declared only when the server has a key, so
/// generated clients and schemathesis do not send (or expect 401s for) a key nobody checks.
pub(crate) async fn openapi<S: crate::routes::HttpState>(State(state): State<S>) -> Response {
    let mut document = openapi_json();
    state.extend_openapi(&mut document);
    if state.config().api_key.is_none() {
        without_security(&mut document);
    }
    json_response(&document)
}

/// Drops the security requirement, the bearer scheme and the 401 responses.
fn without_security(document: &mut serde_json::Value) {
    if let Some(root) = document.as_object_mut() {
        root.remove("security");
    }
    if let Some(components) = document
        .get_mut("components")
        .and_then(serde_json::Value::as_object_mut)
    {
        components.remove("securitySchemes");
    }
    if let Some(paths) = document
        .get_mut("paths")
        .and_then(serde_json::Value::as_object_mut)
    {
        for operation in paths
            .values_mut()
            .filter_map(serde_json::Value::as_object_mut)
            .flat_map(|methods| methods.values_mut())
            .filter_map(serde_json::Value::as_object_mut)
        {
            operation.remove("security");
            if let Some(responses) = operation
                .get_mut("responses")
                .and_then(serde_json::Value::as_object_mut)
            {
                responses.remove("401");
            }
        }
    }
}

pub(crate) async fn metrics<S: crate::routes::HttpState>(State(state): State<S>) -> Response {
    match state.metrics().encode() {
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
