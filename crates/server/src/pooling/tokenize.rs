//! vLLM's `POST /tokenize` and `POST /detokenize` on the pooling server: the token ids a
//! pooling route would compute for a prompt (the same `encode_for_pooling`, special tokens
//! as the request says), and text for token ids. The chat form needs a chat template, which
//! only the generate runner renders: it is refused by name.

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokenmill_protocol::{
    DetokenizeRequest, DetokenizeResponse, TokenizeInput, TokenizeRequest, TokenizeResponse,
};

use super::PoolingState;
use crate::error::ApiError;
use crate::generation::token_text;
use crate::routes::{check_model, json_response, read_json};

pub(super) async fn tokenize(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: TokenizeRequest = read_json(&state, body).await?;
    check_model(&state, request.model())?;
    let TokenizeInput::Prompt {
        text,
        add_special_tokens,
    } = request.input()?
    else {
        return Err(ApiError::invalid_param(
            "messages",
            "This server runs a pooling model, which has no chat template here: tokenize a \
             `prompt` instead.",
        ));
    };
    let model = &state.inner.model;
    let (tokens, _) = model
        .tokenizer
        .encode_for_pooling(&text, None, add_special_tokens, None)
        .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
    let token_strs = request.return_token_strs().then(|| {
        tokens
            .iter()
            .map(|&id| token_text(&model.tokenizer, id))
            .collect()
    });
    Ok(json_response(&TokenizeResponse {
        count: tokens.len(),
        max_model_len: u32::try_from(model.max_model_len).unwrap_or(u32::MAX),
        tokens,
        token_strs,
    }))
}

pub(super) async fn detokenize(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: DetokenizeRequest = read_json(&state, body).await?;
    check_model(&state, request.model.as_deref())?;
    let tokenizer = &state.inner.model.tokenizer;
    let vocab_size = tokenizer.vocab_size();
    if let Some(id) = request.tokens.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("Token id {id} is out of vocabulary (size {vocab_size})."),
        ));
    }
    let prompt = tokenizer
        .decode(&request.tokens, false)
        .map_err(|e| ApiError::invalid_param("tokens", e.to_string()))?;
    Ok(json_response(&DetokenizeResponse { prompt }))
}
