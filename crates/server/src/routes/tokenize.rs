//! `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info` (vLLM extras), plus the
//! prompt-preparation helpers the generation routes share: chat templating and tokenization.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokenmill_protocol::{
    prepare_tool_history, ChatTemplateOptions, ConversationMessage, DetokenizeRequest,
    DetokenizeResponse, TokenizeInput, TokenizeRequest, TokenizeResponse,
};
use tokenmill_text::{ChatTemplate, RenderOptions, TextError, Tokenizer};

use crate::admission::INLINE_TOKENIZE_BYTES;
use crate::error::ApiError;
use crate::generation::token_text;
use crate::routes::{check_model, json_response, read_json};
use crate::state::AppState;

/// vLLM's `GET /tokenizer_info` (with `--enable-tokenizer-info-endpoint`): the tokenizer's
/// `tokenizer_config.json` content, with the chat template this server renders with, so
/// remote-tokenizer clients (lm-eval's `tokenizer_backend=remote`) need no hub download.
pub(crate) async fn tokenizer_info(State(state): State<AppState>) -> Response {
    let model = &state.inner.model;
    let mut info = model
        .tokenizer
        .tokenizer_config(Some(state.inner.limits.max_model_len as usize));
    if let Some(config) = info.as_object_mut() {
        if model.has_chat_template() {
            config.insert(
                "chat_template".into(),
                model.chat_template.source().to_string().into(),
            );
        } else {
            config.remove("chat_template");
        }
    }
    json_response(&info)
}

pub(crate) async fn tokenize(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: TokenizeRequest = read_json(&state, body).await?;
    check_model(&state, request.model())?;
    let tokens = match request.input()? {
        TokenizeInput::Prompt {
            text,
            add_special_tokens,
        } => encode(&state, &text, add_special_tokens).await?,
        TokenizeInput::Chat {
            mut messages,
            template,
            add_special_tokens,
        } => {
            // Earlier tool calls render as they do for chat completions.
            let renders_tools = renders_tools(&state, &template).await?;
            prepare_tool_history(&mut messages, None, !renders_tools);
            let prompt = render_chat(&state, &messages, &template).await?;
            encode(&state, &prompt, add_special_tokens).await?
        }
    };
    Ok(tokenize_response(
        &request,
        &state.inner.model.tokenizer,
        tokens,
        state.inner.limits.max_model_len,
    ))
}

/// `/tokenize`'s answer for `tokens` (with each token's text when the request asks), shared
/// by the generation and pooling servers.
pub(crate) fn tokenize_response(
    request: &TokenizeRequest,
    tokenizer: &Tokenizer,
    tokens: Vec<u32>,
    max_model_len: u32,
) -> Response {
    let token_strs = request
        .return_token_strs()
        .then(|| tokens.iter().map(|&id| token_text(tokenizer, id)).collect());
    json_response(&TokenizeResponse {
        count: tokens.len(),
        max_model_len,
        tokens,
        token_strs,
    })
}

pub(crate) async fn detokenize(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: DetokenizeRequest = read_json(&state, body).await?;
    check_model(&state, request.model.as_deref())?;
    detokenize_response(
        &request,
        &state.inner.model.tokenizer,
        state.inner.limits.vocab_size,
    )
}

/// `/detokenize`'s answer: the request's token ids, each below `vocab_size`, as text; shared
/// by the generation and pooling servers.
pub(crate) fn detokenize_response(
    request: &DetokenizeRequest,
    tokenizer: &Tokenizer,
    vocab_size: u32,
) -> Result<Response, ApiError> {
    request.validate_vocabulary(vocab_size)?;
    let prompt = tokenizer
        .decode(&request.tokens, false)
        .map_err(|e| ApiError::invalid_param("tokens", e.to_string()))?;
    Ok(json_response(&DetokenizeResponse { prompt }))
}

/// Whether the template a request renders with (its own, else the server's) shows `tools`.
/// A request's own template is refused unless the server trusts them, and probed off the
/// async runtime (it is a program: see [`render_chat`]).
pub(crate) async fn renders_tools(
    state: &AppState,
    options: &ChatTemplateOptions,
) -> Result<bool, ApiError> {
    check_request_template(state, options)?;
    match &options.chat_template {
        Some(source) => {
            let source = source.clone();
            state
                .admission()
                .run("chat template", move || {
                    ChatTemplate::new(source).is_ok_and(|t| t.renders_tools())
                })
                .await
        }
        None => Ok(state.inner.template_renders_tools),
    }
}

/// vLLM's refusal of a request-level `chat_template` without `--trust-request-chat-template`.
fn check_request_template(state: &AppState, options: &ChatTemplateOptions) -> Result<(), ApiError> {
    if options.chat_template.is_some() && !state.config().trust_request_chat_template {
        return Err(ApiError::invalid_param(
            "chat_template",
            "Chat template is passed with request, but --trust-request-chat-template is not \
             set. Refused request with untrusted chat template.",
        ));
    }
    Ok(())
}

/// Tokenizes prompt text (`add_special_tokens` adds BOS where the model wants one). A long
/// text tokenizes in the admission pool (`crate::admission`), a short one inline.
pub(crate) async fn encode(
    state: &AppState,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    // No token is longer than the longest vocabulary piece, so a text longer than that many
    // bytes per context position cannot fit: refuse it before spending a core on tokenizing.
    let max_bytes = state.max_prompt_bytes();
    if text.len() > max_bytes {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "The prompt is {} bytes; no prompt over {max_bytes} bytes fits this model's \
                 context of {} tokens.",
                text.len(),
                state.inner.limits.max_model_len
            ),
        ));
    }
    let encoded = if text.len() <= INLINE_TOKENIZE_BYTES {
        state.inner.model.tokenizer.encode(text, add_special_tokens)
    } else {
        let model = Arc::clone(&state.inner.model);
        let text = text.to_owned();
        state
            .admission()
            .run("tokenizing", move || {
                model.tokenizer.encode(&text, add_special_tokens)
            })
            .await?
    };
    encoded.map_err(|e| ApiError::invalid_param("prompt", e.to_string()))
}

/// Renders a conversation with the request's template (only under
/// `--trust-request-chat-template`), else the server's, off the async runtime. Every render is
/// bounded by the template engine's fuel and an output cap (`tokenmill_text`'s
/// `TEMPLATE_FUEL`, `MAX_RENDERED_BYTES`); going over either is a 400.
pub(crate) async fn render_chat(
    state: &AppState,
    messages: &[ConversationMessage],
    options: &ChatTemplateOptions,
) -> Result<String, ApiError> {
    check_request_template(state, options)?;
    let values = messages
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut render = RenderOptions::for_tokenizer(&state.inner.model.tokenizer);
    render.add_generation_prompt = options.add_generation_prompt;
    render.continue_final_message = options.continue_final_message;
    render.chat_template_kwargs = options.chat_template_kwargs.clone();
    render.tools = options.tools.clone();
    render.documents = options.documents.as_ref().map(|docs| {
        docs.iter()
            .map(|doc| serde_json::Value::Object(doc.clone()))
            .collect()
    });
    let source = options.chat_template.clone();
    let model = Arc::clone(&state.inner.model);
    let rendered = state
        .admission()
        .run("chat template", move || match source {
            Some(source) => {
                ChatTemplate::new(source).and_then(|template| template.render(&values, &render))
            }
            None => model.chat_template.render(&values, &render),
        })
        .await?;
    rendered.map_err(template_error)
}

fn template_error(error: TextError) -> ApiError {
    ApiError::invalid_param("messages", format!("chat template error: {error}"))
}
