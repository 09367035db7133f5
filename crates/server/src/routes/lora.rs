//! Runtime LoRA routes (vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`), and
//! how a request's `model` field picks an adapter.

use std::path::PathBuf;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokenmill_engine::{EngineError, LoraRegistry, LoraRequest};
use tokenmill_protocol::{ErrorResponse, LoadLoraAdapterRequest, UnloadLoraAdapterRequest};

use crate::error::ApiError;
use crate::routes::{check_model, read_json};
use crate::state::AppState;

/// The adapter a response was generated with; the access log names it.
#[derive(Debug, Clone)]
pub(crate) struct ServedAdapter(pub String);

/// The served name and adapter a request's `model` names: a served model name (or none) is
/// the base model; a registered adapter name is that adapter; anything else is a 404.
pub(crate) fn resolve_model(
    state: &AppState,
    model: Option<&str>,
) -> Result<(String, Option<LoraRequest>), ApiError> {
    if let (Some(name), Some(registry)) = (model, state.engine().lora()) {
        if !state.config().served_model_names.iter().any(|n| n == name) {
            match registry.get(name) {
                Ok(Some(lora)) => return Ok((name.to_string(), Some(lora))),
                Ok(None) => {}
                // Registered but evicted, and reading it again failed (its files changed).
                Err(error) => {
                    return Err(ApiError::invalid_param(
                        "model",
                        format!("The LoRA adapter `{name}` could not be read again: {error}"),
                    ))
                }
            }
        }
    }
    check_model(state, model).map(|name| (name, None))
}

/// Marks `response` with the adapter it was generated with, for the access log.
pub(crate) fn served(mut response: Response, lora: Option<&LoraRequest>) -> Response {
    if let Some(lora) = lora {
        response
            .extensions_mut()
            .insert(ServedAdapter(lora.name.clone()));
    }
    response
}

fn registry(state: &AppState) -> Result<&LoraRegistry, ApiError> {
    state.engine().lora().map(|r| r.as_ref()).ok_or_else(|| {
        ApiError::invalid("LoRA is not enabled on this server (start it with --enable-lora).")
    })
}

/// Status and body of a registry error: a taken name and a bad adapter are 400s, an
/// unknown name a 404, vLLM's messages.
fn registry_error(error: EngineError) -> ApiError {
    match error {
        EngineError::LoraNotFound(_) => ApiError::from(ErrorResponse::not_found(error.to_string())),
        EngineError::LoraAlreadyLoaded(_)
        | EngineError::Lora(_)
        | EngineError::InvalidRequest(_) => ApiError::invalid(error.to_string()),
        other => ApiError::Internal(other.to_string()),
    }
}

pub(crate) async fn load(State(state): State<AppState>, body: Body) -> Result<Response, ApiError> {
    let request: LoadLoraAdapterRequest = read_json(&state, body).await?;
    let (name, path) = request.validate()?;
    let (name, path) = (name.to_string(), PathBuf::from(path));
    registry(&state)?;
    let message = format!("Success: LoRA adapter '{name}' added successfully.");
    // Reading and checking the weights is blocking file work.
    let engine = state.engine().clone();
    tokio::task::spawn_blocking(move || match engine.lora() {
        Some(registry) => registry.load_at_runtime(&name, &path),
        None => Err(EngineError::Config("LoRA is not enabled".into())),
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?
    .map_err(registry_error)?;
    Ok(message.into_response())
}

pub(crate) async fn unload(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: UnloadLoraAdapterRequest = read_json(&state, body).await?;
    let name = request.validate()?;
    registry(&state)?.unload(name).map_err(registry_error)?;
    Ok(format!("Success: LoRA adapter '{name}' removed successfully.").into_response())
}

/// The runtime routes' entries in `/openapi.json` (only when they are served): vLLM's request
/// bodies, a plain-text success message, OpenAI-shaped errors.
pub(crate) fn extend_openapi(document: &mut Value) {
    let error = |description: &str| {
        json!({"description": description,
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
    };
    let route = |summary: &str, properties: Value, required: &[&str], not_found: bool| {
        let mut responses = json!({
            "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "400": error("Invalid request (missing field, unreadable or mismatched adapter, name taken)."),
            "401": error("Missing or wrong API key."),
        });
        if not_found {
            responses["404"] = error("No adapter of that name is loaded.");
        }
        json!({"post": {
            "summary": summary,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "required": required, "properties": properties}}}},
            "responses": responses,
        }})
    };
    let name =
        json!({"type": "string", "description": "The adapter's served name, a request's `model`."});
    let load = route(
        "Load a LoRA adapter (PEFT directory or GGUF LoRA file) and serve it under a name",
        json!({"lora_name": name, "lora_path": {"type": "string", "description": "A path on the server."}}),
        &["lora_name", "lora_path"],
        false,
    );
    let unload = route(
        "Unload a LoRA adapter; requests already using it finish first",
        json!({"lora_name": name}),
        &["lora_name"],
        true,
    );
    if let Some(paths) = document["paths"].as_object_mut() {
        paths.insert("/v1/load_lora_adapter".into(), load);
        paths.insert("/v1/unload_lora_adapter".into(), unload);
    }
}
