//! The pooling routes' handlers: inputs checked and tokenized here, pooled by the engine,
//! post-processed (Matryoshka truncation, normalization, activations) and shaped as vLLM
//! answers.

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokenmill_engine::{EngineError, PoolingInput};
use tokenmill_models::{l2_normalize, PoolingTask};
use tokenmill_protocol::{
    input_too_long, truncation_limit, ClassifyData, ClassifyRequest, ClassifyResponse,
    EmbeddingRequest, EmbeddingResponse, PromptInput, RerankRequest, RerankResponse, ScoreRequest,
    ScoreResponse, WireVector, DEFAULT_MAX_PROMPTS,
};

use super::PoolingState;
use crate::error::ApiError;
use crate::routes::{check_model, json_response, read_json};
use crate::state::unix_now;

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: EmbeddingRequest = read_json(&state, body).await?;
    require_task(&state, PoolingTask::Embed, "the Embeddings API")?;
    embed_response(&state, request, false).await
}

/// `POST /pooling`: the model's pooled output (an embedding, or class probabilities).
pub(super) async fn pooling(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: EmbeddingRequest = read_json(&state, body).await?;
    if state.inner.model.info.task == PoolingTask::Classify {
        if request.dimensions.is_some() || request.normalize.is_some() {
            let param = if request.dimensions.is_some() {
                "dimensions"
            } else {
                "normalize"
            };
            return Err(ApiError::invalid_param(
                param,
                format!("`{param}` applies to embedding models; this model classifies."),
            ));
        }
        let model = check_model(&state, request.model.as_deref())?;
        let format = request.encoding_format.unwrap_or_default();
        let (rows, tokens) = pool_input(
            &state,
            &request.input,
            request.truncate_prompt_tokens,
            request.add_special_tokens,
        )
        .await?;
        let vectors = rows
            .into_iter()
            .map(|row| WireVector::encode(activation(row), format))
            .collect();
        let created = unix_now();
        return Ok(json_response(&EmbeddingResponse::new(
            true, model, created, vectors, tokens,
        )));
    }
    embed_response(&state, request, true).await
}

async fn embed_response(
    state: &PoolingState,
    request: EmbeddingRequest,
    pooling_route: bool,
) -> Result<Response, ApiError> {
    let model = check_model(state, request.model.as_deref())?;
    let info = &state.inner.model.info;
    let dimensions = match request.dimensions {
        None => None,
        Some(requested) => Some(check_dimensions(state, &model, requested)?),
    };
    let format = request.encoding_format.unwrap_or_default();
    let normalize = request.normalize.unwrap_or(info.normalize);
    let (rows, tokens) = pool_input(
        state,
        &request.input,
        request.truncate_prompt_tokens,
        request.add_special_tokens,
    )
    .await?;
    let vectors = rows
        .into_iter()
        .map(|row| WireVector::encode(finish_embedding(row, dimensions, normalize), format))
        .collect();
    Ok(json_response(&EmbeddingResponse::new(
        pooling_route,
        model,
        unix_now(),
        vectors,
        tokens,
    )))
}

/// vLLM's rule for `dimensions`: only Matryoshka models may be truncated, to a width they
/// allow, never wider than the model's.
fn check_dimensions(state: &PoolingState, model: &str, requested: u32) -> Result<usize, ApiError> {
    let info = &state.inner.model.info;
    let Some(allowed) = &info.matryoshka_dimensions else {
        return Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "Model \"{model}\" does not support matryoshka representation, changing \
                 output dimensions will lead to poor results."
            ),
        ));
    };
    let requested = requested as usize;
    if requested < 1 || requested > info.output_dim {
        return Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "Dimensions give {requested}, but the model's embeddings have {} (1 to {} \
                 are accepted).",
                info.output_dim, info.output_dim
            ),
        ));
    }
    if !allowed.is_empty() && !allowed.contains(&requested) {
        return Err(ApiError::invalid_param(
            "dimensions",
            format!(
                "Model \"{model}\" only supports {allowed:?} matryoshka dimensions, using \
                 other output dimensions will lead to poor results."
            ),
        ));
    }
    Ok(requested)
}

/// Truncates to `dimensions` (Matryoshka), then L2-normalizes: vLLM's order.
fn finish_embedding(mut row: Vec<f32>, dimensions: Option<usize>, normalize: bool) -> Vec<f32> {
    if let Some(dimensions) = dimensions {
        row.truncate(dimensions);
    }
    if normalize {
        l2_normalize(&mut row);
    }
    row
}

/// A classifier's logits as probabilities: sigmoid for one label, softmax otherwise.
fn activation(mut logits: Vec<f32>) -> Vec<f32> {
    if let [single] = logits.as_mut_slice() {
        *single = 1.0 / (1.0 + (-*single).exp());
        return logits;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in logits.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    logits.iter_mut().for_each(|v| *v /= sum);
    logits
}

/// `POST /score`: cosine similarity of embeddings, or a cross-encoder's relevance.
pub(super) async fn score(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: ScoreRequest = read_json(&state, body).await?;
    let model = check_model(&state, request.model.as_deref())?;
    let pairs = request.pairs()?;
    let truncate = truncation_limit(request.truncate_prompt_tokens, max_len(&state))?;
    let (scores, tokens) = score_pairs(&state, &pairs, truncate).await?;
    Ok(json_response(&ScoreResponse::new(
        model,
        unix_now(),
        &scores,
        tokens,
    )))
}

/// `POST /rerank` (and `/v1/rerank`, `/v2/rerank`).
pub(super) async fn rerank(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: RerankRequest = read_json(&state, body).await?;
    let model = check_model(&state, request.model.as_deref())?;
    if request.documents.is_empty() {
        return Err(ApiError::invalid_param(
            "documents",
            "at least one document is required",
        ));
    }
    let truncate = truncation_limit(request.truncate_prompt_tokens, max_len(&state))?;
    let pairs: Vec<(String, String)> = request
        .documents
        .iter()
        .map(|document| (request.query.clone(), document.clone()))
        .collect();
    let (scores, tokens) = score_pairs(&state, &pairs, truncate).await?;
    Ok(json_response(&RerankResponse::new(
        model, &request, &scores, tokens,
    )))
}

/// Scores each pair: a cross-encoder reads the pair joined (`[CLS] a [SEP] b [SEP]`) and its
/// one logit goes through a sigmoid; an embedding model embeds both sides and takes the
/// cosine similarity (vLLM's score API for embedding models).
async fn score_pairs(
    state: &PoolingState,
    pairs: &[(String, String)],
    truncate: Option<usize>,
) -> Result<(Vec<f64>, usize), ApiError> {
    let info = &state.inner.model.info;
    let tokenizer = &state.inner.model.tokenizer;
    match info.task {
        PoolingTask::Classify => {
            if info.output_dim != 1 {
                return Err(ApiError::invalid(format!(
                    "Scoring needs a cross-encoder with one label; this model has {}. Use \
                     /classify.",
                    info.output_dim
                )));
            }
            let mut inputs = Vec::with_capacity(pairs.len());
            for (first, second) in pairs {
                check_text(first, "text_1")?;
                check_text(second, "text_2")?;
                let (ids, types) = tokenizer
                    .encode_for_pooling(first, Some(second), true, truncate)
                    .map_err(|e| ApiError::Internal(e.to_string()))?;
                check_length(state, ids.len(), "text_2")?;
                inputs.push(PoolingInput {
                    token_ids: ids,
                    token_type_ids: Some(types),
                });
            }
            let tokens = count_tokens(&inputs);
            let rows = run(state, inputs).await?;
            let scores = rows
                .into_iter()
                .map(|row| f64::from(activation(row)[0]))
                .collect();
            Ok((scores, tokens))
        }
        PoolingTask::Embed => {
            let mut inputs = Vec::with_capacity(pairs.len() * 2);
            for (first, second) in pairs {
                for (text, param) in [(first, "text_1"), (second, "text_2")] {
                    check_text(text, param)?;
                    inputs.push(text_input(state, text, param, truncate, true)?);
                }
            }
            let tokens = count_tokens(&inputs);
            let rows = run(state, inputs).await?;
            let scores = rows
                .chunks_exact(2)
                .map(|pair| cosine(&pair[0], &pair[1]))
                .collect();
            Ok((scores, tokens))
        }
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-12)
}

/// `POST /classify`.
pub(super) async fn classify(
    State(state): State<PoolingState>,
    body: Body,
) -> Result<Response, ApiError> {
    let request: ClassifyRequest = read_json(&state, body).await?;
    require_task(&state, PoolingTask::Classify, "the Classification API")?;
    let model = check_model(&state, request.model.as_deref())?;
    let (rows, tokens) = pool_input(
        &state,
        &request.input,
        request.truncate_prompt_tokens,
        request.add_special_tokens,
    )
    .await?;
    let labels = &state.inner.model.info.labels;
    let data = rows
        .into_iter()
        .enumerate()
        .map(|(index, row)| {
            let probs = activation(row);
            let best = probs
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i);
            ClassifyData {
                index,
                label: labels
                    .get(best)
                    .cloned()
                    .unwrap_or_else(|| format!("LABEL_{best}")),
                num_classes: probs.len(),
                probs,
            }
        })
        .collect();
    Ok(json_response(&ClassifyResponse::new(
        model,
        unix_now(),
        data,
        tokens,
    )))
}

fn require_task(state: &PoolingState, task: PoolingTask, api: &str) -> Result<(), ApiError> {
    let info = &state.inner.model.info;
    if info.task == task {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "The model does not support {api}: {} is a{} model (task {}).",
        info.architecture,
        if info.task == PoolingTask::Embed {
            "n embedding"
        } else {
            " classification"
        },
        info.task.name()
    )))
}

fn max_len(state: &PoolingState) -> usize {
    state.inner.model.max_model_len
}

fn count_tokens(inputs: &[PoolingInput]) -> usize {
    inputs.iter().map(|input| input.token_ids.len()).sum()
}

/// `input` truncated and checked (`prepare`), then pooled: the rows and the prompt tokens they
/// took (the usage count).
async fn pool_input(
    state: &PoolingState,
    input: &PromptInput,
    truncate_prompt_tokens: Option<i64>,
    add_special_tokens: Option<bool>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let truncate = truncation_limit(truncate_prompt_tokens, max_len(state))?;
    let inputs = prepare(state, input, truncate, add_special_tokens.unwrap_or(true))?;
    let tokens = count_tokens(&inputs);
    Ok((run(state, inputs).await?, tokens))
}

/// The engine's answer, with its errors as HTTP errors (a closed engine is a 503).
async fn run(state: &PoolingState, inputs: Vec<PoolingInput>) -> Result<Vec<Vec<f32>>, ApiError> {
    let _in_flight = state.check_accepting()?;
    state
        .inner
        .client
        .pool(inputs)
        .await
        .map_err(|error| match error {
            EngineError::InvalidRequest(message) => ApiError::invalid_param("input", message),
            EngineError::EngineDead => ApiError::unavailable("The engine is not running."),
            other => ApiError::Internal(other.to_string()),
        })
}

fn check_text(text: &str, param: &str) -> Result<(), ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` must not be an empty string"),
        ));
    }
    Ok(())
}

fn check_length(state: &PoolingState, len: usize, param: &str) -> Result<(), ApiError> {
    let max = max_len(state);
    if len > max {
        return Err(input_too_long(param, len, max).into());
    }
    Ok(())
}

fn text_input(
    state: &PoolingState,
    text: &str,
    param: &str,
    truncate: Option<usize>,
    add_special_tokens: bool,
) -> Result<PoolingInput, ApiError> {
    let (ids, _) = state
        .inner
        .model
        .tokenizer
        .encode_for_pooling(text, None, add_special_tokens, truncate)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    if ids.is_empty() {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` tokenizes to no tokens"),
        ));
    }
    check_length(state, ids.len(), param)?;
    Ok(PoolingInput::tokens(ids))
}

/// `input` as sequences: texts tokenized (with special tokens unless the request turned
/// them off), token ids checked against the vocabulary; `truncate` keeps the first tokens
/// of a text (transformers' truncation, special tokens kept) and the last of a token list
/// (vLLM's); anything longer than the model is vLLM's 400.
fn prepare(
    state: &PoolingState,
    input: &PromptInput,
    truncate: Option<usize>,
    add_special_tokens: bool,
) -> Result<Vec<PoolingInput>, ApiError> {
    let empty = || ApiError::invalid_param("input", "`input` must not be empty");
    let vocab = state.inner.model.info.vocab_size;
    let tokens = |ids: &[u32]| -> Result<PoolingInput, ApiError> {
        if ids.is_empty() {
            return Err(empty());
        }
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::invalid_param(
                "input",
                format!(
                    "token id {bad} is out of the vocabulary (0 to {})",
                    vocab - 1
                ),
            ));
        }
        let ids = match truncate {
            Some(k) if ids.len() > k => &ids[ids.len() - k..],
            _ => ids,
        };
        check_length(state, ids.len(), "input")?;
        Ok(PoolingInput::tokens(ids.to_vec()))
    };
    let text = |text: &str| -> Result<PoolingInput, ApiError> {
        check_text(text, "input")?;
        text_input(state, text, "input", truncate, add_special_tokens)
    };
    let inputs = match input {
        PromptInput::Text(t) => vec![text(t)?],
        PromptInput::Texts(texts) => texts.iter().map(|t| text(t)).collect::<Result<_, _>>()?,
        PromptInput::Tokens(ids) => vec![tokens(ids)?],
        PromptInput::TokenBatches(batches) => batches
            .iter()
            .map(|ids| tokens(ids))
            .collect::<Result<_, _>>()?,
    };
    if inputs.is_empty() {
        return Err(empty());
    }
    let limit = DEFAULT_MAX_PROMPTS;
    if inputs.len() > limit {
        return Err(ApiError::invalid_param(
            "input",
            format!(
                "{} inputs in one request; at most {limit} are accepted",
                inputs.len()
            ),
        ));
    }
    Ok(inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_truncated_then_normalized() {
        let row = finish_embedding(vec![3.0, 4.0, 12.0], Some(2), true);
        assert_eq!(row, [0.6, 0.8]);
        assert_eq!(finish_embedding(vec![3.0, 4.0], None, false), [3.0, 4.0]);
    }

    #[test]
    fn activations() {
        assert_eq!(activation(vec![0.0]), [0.5]);
        let probs = activation(vec![1.0, 1.0]);
        assert_eq!(probs, [0.5, 0.5]);
    }
}
