//! `POST /v1/completions`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokenmill_engine::{RequestEvent, RequestStream};
use tokenmill_protocol::{
    completion_id, CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    CompletionStreamChoice, CompletionStreamChunk, Prompt, Usage, ValidatedSampling,
};

use crate::error::ApiError;
use crate::generation::{
    append_completion_logprobs, collect, engine_request, engine_sampling, wire_finish_reason,
    wire_prompt_logprobs, wire_stop_reason, TokenNames,
};
use crate::routes::lora::{resolve_model, served};
use crate::routes::tokenize::encode;
use crate::routes::{check_accepting, check_request_shape, json_response, read_json};
use crate::sse;
use crate::state::{unix_now, AppState, InFlightGuard};
use tokenmill_engine::TokenLogprob;

/// One prompt after tokenization.
struct PreparedPrompt {
    token_ids: Vec<u32>,
    /// The prompt as text, for `echo`.
    text: String,
    max_tokens: u32,
}

pub(crate) async fn create(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    check_accepting(&state)?;
    let request: CompletionRequest = read_json(&state, body).await?;
    let (model, lora) = resolve_model(&state, request.model.as_deref())?;
    let limits = &state.inner.limits;
    let validated = request.validate(limits)?;
    let requested = request.prompts(limits)?;
    check_request_shape(&state, &validated, requested.len())?;
    let mut prompts = Vec::new();
    for prompt in requested {
        let (mut token_ids, text) = match prompt {
            Prompt::Text(text) => (
                encode(&state, &text, validated.output.add_special_tokens).await?,
                text,
            ),
            Prompt::Tokens(ids) => {
                let text = state
                    .inner
                    .model
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
                (ids, text)
            }
        };
        if let Some(keep) = validated.output.truncate_prompt_tokens {
            let keep = keep as usize;
            if token_ids.len() > keep {
                token_ids.drain(..token_ids.len() - keep);
            }
        }
        if token_ids.is_empty() {
            return Err(ApiError::invalid_param("prompt", "The prompt is empty."));
        }
        let max_tokens = validated.resolve_max_tokens(token_ids.len(), limits)?;
        prompts.push(PreparedPrompt {
            token_ids,
            text,
            max_tokens,
        });
    }
    if state.config().enable_log_requests {
        log_prompts(&state, &prompts);
    }

    let params = engine_sampling(&validated, &state).await?;
    let mut guard = InFlightGuard::new(&state);
    let n = validated.sampling.n;
    let mut streams = Vec::with_capacity(prompts.len() * n as usize);
    for (prompt_index, prompt) in prompts.iter().enumerate() {
        for choice in 0..n {
            let index = prompt_index as u32 * n + choice;
            let mut engine_req = engine_request(
                prompt.token_ids.clone(),
                &validated,
                &params,
                prompt.max_tokens,
                choice,
                arrival,
            );
            engine_req.lora = lora.clone();
            // Echoed prompts carry their own logprobs (lm-eval's loglikelihood scoring).
            if validated.output.echo {
                if let Some(k) = validated.sampling.logprobs {
                    let k = k as usize;
                    engine_req.prompt_logprobs =
                        Some(engine_req.prompt_logprobs.map_or(k, |p| p.max(k)));
                }
            }
            streams.push((index, guard.submit(engine_req)?));
        }
    }
    let job = Job {
        id: completion_id(validated.output.request_id.as_deref()),
        created: unix_now(),
        model,
        validated,
        prompts,
    };
    if job.validated.output.stream {
        Ok(served(
            stream_response(state, guard, job, streams),
            lora.as_ref(),
        ))
    } else {
        let response = complete(&state, job, streams).await?;
        drop(guard);
        Ok(served(json_response(&response), lora.as_ref()))
    }
}

/// A validated, tokenized completions request on its way through the engine.
struct Job {
    id: String,
    created: u64,
    model: String,
    validated: ValidatedSampling,
    prompts: Vec<PreparedPrompt>,
}

fn log_prompts(state: &AppState, prompts: &[PreparedPrompt]) {
    for prompt in prompts {
        let text: String = match state.config().max_log_len {
            Some(max) => prompt.text.chars().take(max).collect(),
            None => prompt.text.clone(),
        };
        tracing::info!(
            "completion prompt ({} tokens): {text:?}",
            prompt.token_ids.len()
        );
    }
}

async fn complete(
    state: &AppState,
    job: Job,
    streams: Vec<(u32, RequestStream)>,
) -> Result<CompletionResponse, ApiError> {
    let Job {
        id,
        created,
        model,
        validated,
        prompts,
    } = job;
    let n = validated.sampling.n as usize;
    let tokenizer = &state.inner.model.tokenizer;
    let mut choices = Vec::with_capacity(streams.len());
    let mut prompt_tokens = 0u32;
    let mut completion_tokens = 0u32;
    let mut cached_tokens = 0u32;
    let results = futures::future::join_all(
        streams
            .into_iter()
            .map(|(index, stream)| async move { (index, collect(stream).await) }),
    )
    .await;
    for (index, result) in results {
        let result = result?;
        let prompt = &prompts[index as usize / n.max(1)];
        if (index as usize).is_multiple_of(n.max(1)) {
            prompt_tokens += prompt.token_ids.len() as u32;
            cached_tokens += result.num_cached_tokens as u32;
        }
        let echo_text = if validated.output.echo {
            prompt.text.clone()
        } else {
            String::new()
        };
        let (token_ids, text, logprobs_entries) = if validated.output.echo_without_generation {
            (Vec::new(), String::new(), Vec::new())
        } else {
            (result.token_ids, result.text, result.logprobs)
        };
        completion_tokens += token_ids.len() as u32;
        let logprobs = validated.sampling.logprobs.map(|_| {
            let mut out = CompletionLogprobs::default();
            let mut offset = 0u32;
            if validated.output.echo {
                append_prompt_logprobs(
                    &mut out,
                    state.token_names(),
                    prompt,
                    result.prompt_logprobs.as_deref(),
                    &mut offset,
                );
            }
            let generated: Vec<_> = logprobs_entries
                .iter()
                .map(|e| (e.token_id, Some(e)))
                .collect();
            append_completion_logprobs(&mut out, state.token_names(), &generated, &mut offset);
            out
        });
        let prompt_logprobs = match (&validated.sampling.prompt_logprobs, &result.prompt_logprobs) {
            (Some(_), Some(entries)) => {
                Some(wire_prompt_logprobs(tokenizer, &prompt.token_ids, entries))
            }
            _ => None,
        };
        choices.push(CompletionChoice {
            index,
            text: format!("{echo_text}{text}"),
            logprobs,
            finish_reason: result.finish_reason,
            stop_reason: result.stop_reason,
            token_ids: validated.output.return_token_ids.then_some(token_ids),
            prompt_token_ids: validated
                .output
                .return_token_ids
                .then(|| prompt.token_ids.clone()),
            prompt_logprobs,
        });
    }
    choices.sort_by_key(|c| c.index);
    let usage = Usage::new(prompt_tokens, completion_tokens, Some(cached_tokens));
    Ok(CompletionResponse::new(id, created, model, choices, usage))
}

fn stream_response(
    state: AppState,
    guard: InFlightGuard,
    job: Job,
    streams: Vec<(u32, RequestStream)>,
) -> Response {
    let (tx, response) = sse::channel();
    tokio::spawn(async move {
        let Job {
            id,
            created,
            model,
            validated,
            prompts,
        } = job;
        let _guard = guard;
        let n = validated.sampling.n.max(1) as usize;
        let mut merged = sse::merge(streams);
        let mut completion_tokens = vec![0u32; prompts.len() * n];
        let mut cached_tokens = vec![0u32; prompts.len()];
        let mut offsets = vec![0u32; prompts.len() * n];
        let mut first = vec![true; prompts.len() * n];
        let chunk =
            |choices| CompletionStreamChunk::new(id.clone(), created, model.clone(), choices);
        while let Some((index, event)) = sse::next_event(&tx, &mut merged).await {
            let i = index as usize;
            let prompt = &prompts[i / n];
            let output = match event {
                RequestEvent::Output(output) => output,
                failure => {
                    sse::send_engine_failure(&tx, failure).await;
                    return;
                }
            };
            cached_tokens[i / n] = output.num_cached_tokens as u32;
            let mut text = String::new();
            if first[i] && validated.output.echo {
                text.push_str(&prompt.text);
            }
            let generated = !validated.output.echo_without_generation;
            if generated {
                text.push_str(&output.new_text);
                completion_tokens[i] += output.new_token_ids.len() as u32;
            }
            let logprobs = validated.sampling.logprobs.map(|_| {
                let mut out = CompletionLogprobs::default();
                if first[i] && validated.output.echo {
                    offsets[i] = 0;
                    append_prompt_logprobs(
                        &mut out,
                        state.token_names(),
                        prompt,
                        output.prompt_logprobs.as_deref(),
                        &mut offsets[i],
                    );
                }
                if generated {
                    let entries: Vec<_> = output
                        .logprobs
                        .iter()
                        .map(|e| (e.token_id, Some(e)))
                        .collect();
                    append_completion_logprobs(
                        &mut out,
                        state.token_names(),
                        &entries,
                        &mut offsets[i],
                    );
                }
                out
            });
            if text.is_empty()
                && output.finish_reason.is_none()
                && logprobs.as_ref().is_none_or(|l| l.tokens.is_empty())
            {
                continue;
            }
            let choice = CompletionStreamChoice {
                index,
                text,
                logprobs,
                finish_reason: output.finish_reason.map(wire_finish_reason),
                stop_reason: output.stop_reason.map(wire_stop_reason),
                token_ids: validated.output.return_token_ids.then(|| {
                    if generated {
                        output.new_token_ids.clone()
                    } else {
                        Vec::new()
                    }
                }),
                prompt_token_ids: (validated.output.return_token_ids && first[i])
                    .then(|| prompt.token_ids.clone()),
            };
            first[i] = false;
            let mut message = chunk(vec![choice]);
            if validated.output.continuous_usage_stats {
                message.usage = Some(Usage::new(
                    prompt.token_ids.len() as u32,
                    completion_tokens[i],
                    None,
                ));
            }
            if !sse::send_json(&tx, &message).await {
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
        if validated.output.include_usage {
            let prompt_tokens = prompts.iter().map(|p| p.token_ids.len() as u32).sum();
            let mut message = chunk(Vec::new());
            message.usage = Some(Usage::new(
                prompt_tokens,
                completion_tokens.iter().sum(),
                Some(cached_tokens.iter().sum()),
            ));
            if !sse::send_json(&tx, &message).await {
                return;
            }
        }
        sse::send_done(&tx).await;
    });
    response
}

/// The echoed prompt's part of legacy logprobs: the first token has none.
fn append_prompt_logprobs(
    out: &mut CompletionLogprobs,
    names: TokenNames<'_>,
    prompt: &PreparedPrompt,
    entries: Option<&[Option<TokenLogprob>]>,
    offset: &mut u32,
) {
    let entries: Vec<(u32, Option<&TokenLogprob>)> = prompt
        .token_ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, entries.and_then(|e| e.get(i)).and_then(Option::as_ref)))
        .collect();
    append_completion_logprobs(out, names, &entries, offset);
}
