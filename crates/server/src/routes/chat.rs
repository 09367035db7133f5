//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokenmill_engine::{RequestEvent, RequestStream};
use tokenmill_protocol::{
    chat_completion_id, plan_tools, prepare_tool_history, ChatChoice, ChatChunkChoice,
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta,
    ChatResponseMessage, ChatTemplateOptions, ConversationMessage, FinishReason,
    StructuredConstraint, StructuredOutputRequest, ToolOutput, Usage, ValidatedSampling,
};

use crate::chat_output::{deltas, ChoiceReader, OutputReading};
use crate::error::ApiError;
use crate::generation::{
    chat_logprobs, collect, engine_request, engine_sampling, wire_finish_reason, wire_stop_reason,
};
use crate::routes::lora::{resolve_model, served};
use crate::routes::tokenize::{encode, render_chat, renders_tools};
use crate::routes::{check_accepting, check_request_shape, json_response, read_json};
use crate::sse;
use crate::state::{unix_now, AppState, InFlightGuard};

/// A validated, templated chat request on its way through the engine.
struct Job {
    id: String,
    created: u64,
    model: String,
    validated: ValidatedSampling,
    prompt_token_ids: Vec<u32>,
    /// With `echo`: the final message's content, prepended to each reply.
    echo_prefix: String,
    /// The replies' role (`--response-role`, or the last message's without a generation
    /// prompt).
    role: String,
    /// How each choice's text is read (reasoning, tool calls).
    reading: OutputReading,
}

pub(crate) async fn create(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    check_accepting(&state)?;
    let request: ChatCompletionRequest = read_json(&state, body).await?;
    let (model, lora) = resolve_model(&state, request.model.as_deref())?;
    let limits = &state.inner.limits;
    let mut validated = request.validate(limits)?;
    check_request_shape(&state, &validated, 1)?;
    let prepared = chat_prompt(
        &state,
        ChatInput {
            messages: request.conversation()?,
            options: request.template_options()?,
            tools: request.tools.as_deref(),
            tool_choice: request.tool_choice.as_ref(),
            parallel_tool_calls: request.parallel_tool_calls,
            include_reasoning: request.include_reasoning.unwrap_or(true),
        },
        Some(&mut validated),
    )
    .await?;
    let ChatPrompt {
        messages,
        options,
        prompt_token_ids,
        reading,
    } = prepared;
    let max_tokens = validated.resolve_max_tokens(prompt_token_ids.len(), limits)?;
    let role = match messages.last() {
        Some(last) if !options.add_generation_prompt => last.role.as_str().to_string(),
        _ => state.config().response_role.clone(),
    };
    let echo_prefix = match messages.last() {
        Some(last) if validated.output.echo && last.role.as_str() == role => {
            last.content.clone().unwrap_or_default()
        }
        _ => String::new(),
    };

    let params = engine_sampling(&validated, &state).await?;
    let mut guard = InFlightGuard::new(&state);
    let mut streams = Vec::with_capacity(validated.sampling.n as usize);
    for choice in 0..validated.sampling.n {
        let mut engine_req = engine_request(
            prompt_token_ids.clone(),
            &validated,
            &params,
            max_tokens,
            choice,
            arrival,
        );
        engine_req.lora = lora.clone();
        streams.push((choice, guard.submit(engine_req)?));
    }
    let job = Job {
        id: chat_completion_id(validated.output.request_id.as_deref()),
        created: unix_now(),
        model,
        validated,
        prompt_token_ids,
        echo_prefix,
        role,
        reading,
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

/// A chat-shaped request before the engine: the conversation and template options of chat
/// completions or Anthropic's messages, with the tool fields in OpenAI's shape.
pub(crate) struct ChatInput<'a> {
    pub messages: Vec<ConversationMessage>,
    pub options: ChatTemplateOptions,
    pub tools: Option<&'a [serde_json::Value]>,
    pub tool_choice: Option<&'a serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    pub include_reasoning: bool,
}

/// A [`ChatInput`] rendered and tokenized, with how its output is read.
pub(crate) struct ChatPrompt {
    pub messages: Vec<ConversationMessage>,
    pub options: ChatTemplateOptions,
    pub prompt_token_ids: Vec<u32>,
    pub reading: OutputReading,
}

/// The one request path of every chat-shaped route: tools planned (a forced call constrains
/// `validated`'s output to the envelope), history prepared, the template rendered, the prompt
/// tokenized. `validated` is `None` where nothing is generated (token counting).
pub(crate) async fn chat_prompt(
    state: &AppState,
    input: ChatInput<'_>,
    validated: Option<&mut ValidatedSampling>,
) -> Result<ChatPrompt, ApiError> {
    let ChatInput {
        mut messages,
        mut options,
        ..
    } = input;
    let renders_tools = renders_tools(state, &options).await?;
    let plan = plan_tools(
        input.tools,
        input.tool_choice,
        input.parallel_tool_calls,
        &state.config().tools,
        renders_tools,
    )?;
    prepare_tool_history(&mut messages, plan.system_prompt.as_deref(), !renders_tools);
    options.tools = plan.template_tools.clone();
    let reading = OutputReading::new(
        &plan,
        state.config().reasoning_parser.as_deref(),
        input.include_reasoning,
    );
    let mut add_special_tokens = false;
    if let Some(validated) = validated {
        if let ToolOutput::Envelope { schema, .. } = &plan.output {
            if let Some(other) = &validated.sampling.structured_output {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!(
                        "{} cannot be combined with tool_choice {:?}: both constrain the output.",
                        other.param,
                        input
                            .tool_choice
                            .map_or("auto".to_string(), |c| c.to_string())
                    ),
                ));
            }
            validated.sampling.structured_output = Some(StructuredOutputRequest {
                constraint: StructuredConstraint::JsonSchema(schema.clone()),
                param: "tools",
            });
        }
        if reading.needs_special_tokens() {
            validated.sampling.skip_special_tokens = false;
        }
        add_special_tokens = validated.output.add_special_tokens;
    }
    let prompt = render_chat(state, &messages, &options).await?;
    if state.config().enable_log_requests {
        let shown: String = match state.config().max_log_len {
            Some(max) => prompt.chars().take(max).collect(),
            None => prompt.clone(),
        };
        tracing::info!("chat prompt: {shown:?}");
    }
    let prompt_token_ids = encode(state, &prompt, add_special_tokens).await?;
    if prompt_token_ids.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "The rendered prompt is empty.",
        ));
    }
    Ok(ChatPrompt {
        messages,
        options,
        prompt_token_ids,
        reading,
    })
}

async fn complete(
    state: &AppState,
    job: Job,
    streams: Vec<(u32, RequestStream)>,
) -> Result<ChatCompletionResponse, ApiError> {
    let results = futures::future::join_all(
        streams
            .into_iter()
            .map(|(index, stream)| async move { (index, collect(stream).await) }),
    )
    .await;
    let mut choices = Vec::with_capacity(results.len());
    let mut completion_tokens = 0u32;
    let mut cached_tokens = 0u32;
    for (index, result) in results {
        let result = result?;
        completion_tokens += result.token_ids.len() as u32;
        cached_tokens = cached_tokens.max(result.num_cached_tokens as u32);
        let logprobs = job
            .validated
            .sampling
            .logprobs
            .map(|k| chat_logprobs(state.token_names(), &result.logprobs, k as usize));
        let mut reader = job.reading.choice();
        let parsed = reader.complete(&result.text);
        let content = format!("{}{}", job.echo_prefix, parsed.content);
        choices.push(ChatChoice {
            index,
            message: ChatResponseMessage {
                role: job.role.clone(),
                // Only calls: null, as OpenAI sends (any text, even whitespace, was streamed).
                content: (parsed.tool_calls.is_empty() || !content.is_empty()).then_some(content),
                reasoning: parsed.reasoning.clone(),
                reasoning_content: parsed.reasoning,
                tool_calls: parsed.tool_calls,
            },
            logprobs,
            finish_reason: finish_reason(result.finish_reason, &reader),
            stop_reason: result.stop_reason,
            token_ids: job
                .validated
                .output
                .return_token_ids
                .then_some(result.token_ids),
        });
    }
    choices.sort_by_key(|c| c.index);
    let usage = Usage::new(
        job.prompt_token_ids.len() as u32,
        completion_tokens,
        Some(cached_tokens),
    );
    let mut response = ChatCompletionResponse::new(job.id, job.created, job.model, choices, usage);
    if job.validated.output.return_token_ids {
        response.prompt_token_ids = Some(job.prompt_token_ids);
    }
    Ok(response)
}

fn stream_response(
    state: AppState,
    guard: InFlightGuard,
    job: Job,
    streams: Vec<(u32, RequestStream)>,
) -> Response {
    let (tx, response) = sse::channel();
    tokio::spawn(async move {
        let _guard = guard;
        let validated = &job.validated;
        let n = streams.len();
        let chunk = |choices| {
            ChatCompletionChunk::new(job.id.clone(), job.created, job.model.clone(), choices)
        };

        // Role first, one chunk per choice, as OpenAI and vLLM do, once the engine's first
        // output is in: vLLM sends them when its first result arrives, so a client's time to
        // first token (vLLM's `bench serve`, GuideLLM) measures the prefill, not the queueing.
        let role_chunks = || {
            (0..n as u32).map(|index| {
                let mut first = chunk(vec![ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: Some(job.role.clone()),
                        content: Some(job.echo_prefix.clone()),
                        ..ChatDelta::default()
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                    token_ids: None,
                }]);
                if index == 0 && validated.output.return_token_ids {
                    first.prompt_token_ids = Some(job.prompt_token_ids.clone());
                }
                first
            })
        };

        let mut readers: Vec<ChoiceReader> = (0..n).map(|_| job.reading.choice()).collect();
        let mut merged = sse::merge(streams);
        let mut completion_tokens = vec![0u32; n];
        let mut cached_tokens = 0u32;
        let mut roles_sent = false;
        while let Some((index, event)) = sse::next_event(&tx, &mut merged).await {
            let output = match event {
                RequestEvent::Output(output) => output,
                failure => {
                    sse::send_engine_failure(&tx, failure).await;
                    return;
                }
            };
            if !roles_sent {
                roles_sent = true;
                for first in role_chunks() {
                    if !sse::send_json(&tx, &first).await {
                        return;
                    }
                }
            }
            completion_tokens[index as usize] += output.new_token_ids.len() as u32;
            cached_tokens = cached_tokens.max(output.num_cached_tokens as u32);
            if output.new_text.is_empty()
                && output.finish_reason.is_none()
                && output.logprobs.is_empty()
            {
                continue;
            }
            let finished = output.finish_reason.is_some();
            let reader = &mut readers[index as usize];
            let mut step = if job.reading.is_plain() {
                vec![ChatDelta {
                    content: Some(output.new_text),
                    ..ChatDelta::default()
                }]
            } else {
                deltas(reader.push(&output.new_text, finished))
            };
            let ends_step =
                finished || !output.logprobs.is_empty() || validated.output.return_token_ids;
            if step.is_empty() {
                if !ends_step {
                    continue;
                }
                step.push(ChatDelta::default());
            }
            let last = step.len() - 1;
            for (position, delta) in step.into_iter().enumerate() {
                let mut choice = ChatChunkChoice {
                    index,
                    delta,
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                    token_ids: None,
                };
                let mut message_usage = None;
                if position == last {
                    choice.logprobs = validated
                        .sampling
                        .logprobs
                        .map(|k| chat_logprobs(state.token_names(), &output.logprobs, k as usize));
                    choice.finish_reason =
                        finish_reason(output.finish_reason.map(wire_finish_reason), reader);
                    choice.stop_reason = output.stop_reason.clone().map(wire_stop_reason);
                    choice.token_ids = validated
                        .output
                        .return_token_ids
                        .then(|| output.new_token_ids.clone());
                    if validated.output.continuous_usage_stats {
                        message_usage = Some(Usage::new(
                            job.prompt_token_ids.len() as u32,
                            completion_tokens[index as usize],
                            None,
                        ));
                    }
                }
                let mut message = chunk(vec![choice]);
                message.usage = message_usage;
                if !sse::send_json(&tx, &message).await {
                    return;
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        if validated.output.include_usage {
            let mut message = chunk(Vec::new());
            message.usage = Some(Usage::new(
                job.prompt_token_ids.len() as u32,
                completion_tokens.iter().sum(),
                Some(cached_tokens),
            ));
            if !sse::send_json(&tx, &message).await {
                return;
            }
        }
        sse::send_done(&tx).await;
    });
    response
}

/// A choice that made tool calls and stopped by itself finished with `tool_calls`.
fn finish_reason(reason: Option<FinishReason>, reader: &ChoiceReader) -> Option<FinishReason> {
    match reason {
        Some(FinishReason::Stop) if reader.called() => Some(FinishReason::ToolCalls),
        other => other,
    }
}
