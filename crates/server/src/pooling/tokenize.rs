//! vLLM's `POST /tokenize` and `POST /detokenize` on the pooling server: the token ids a
//! pooling route would compute for a prompt (the same `encode_for_pooling`, special tokens
//! as the request says), and text for token ids. The chat form needs a chat template, which
//! only the generate runner renders: it is refused by name.

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokenmill_protocol::{DetokenizeRequest, TokenizeInput, TokenizeRequest};

use super::PoolingState;
use crate::error::ApiError;
use crate::routes::tokenize::{detokenize_response, tokenize_response};
use crate::routes::{check_model, read_json};

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
    Ok(tokenize_response(
        &request,
        &model.tokenizer,
        tokens,
        u32::try_from(model.max_model_len).unwrap_or(u32::MAX),
    ))
}

pub(super) async fn detokenize(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: DetokenizeRequest = read_json(&state, body).await?;
    check_model(&state, request.model.as_deref())?;
    let tokenizer = &state.inner.model.tokenizer;
    let vocab_size = u32::try_from(tokenizer.vocab_size()).unwrap_or(u32::MAX);
    detokenize_response(&request, tokenizer, vocab_size)
}
