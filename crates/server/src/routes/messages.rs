//! Anthropic's Messages API: `POST /v1/messages` (also with `?beta=true`, as Claude Code
//! posts it) and `POST /v1/messages/count_tokens`. A third front end over the chat request
//! path ([`chat_prompt`]: template, tokenize, the same tool plan and output reading), answered
//! as Anthropic's message, event stream and errors.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive};
use axum::response::{IntoResponse, Response};
use tokenmill_engine::{RequestEvent, RequestStream};
use tokenmill_protocol::{
    anthropic_request_id, applied_edits, check_context, message_id, parse_anthropic,
    AnthropicError, AnthropicStopReason, ClearRule, CountTokensRequest, FinishReason, MessageDelta,
    MessageResponse, MessagesPrompt, MessagesRequest, MessagesUsage, StopReason, StreamEvent,
    ValidatedSampling,
};

use crate::anthropic_output::BlockWriter;
use crate::chat_output::OutputReading;
use crate::error::{AnthropicApiError, ApiError, REQUEST_ID};
use crate::generation::{
    collect, engine_request, engine_sampling, wire_finish_reason, wire_stop_reason,
};
use crate::routes::chat::{chat_prompt, ChatInput, ChatPrompt};
use crate::routes::lora::{resolve_model, served};
use crate::routes::{check_accepting, json_response, read_body};
use crate::sse::{self, EventSender};
use crate::state::{AppState, InFlightGuard};

/// How often an idle stream sends a `ping` event.
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// Whether `path` is one of these routes (under any `--root-path`): their errors, auth
/// failures included, take Anthropic's shape.
pub(crate) fn is_anthropic_path(path: &str) -> bool {
    path.ends_with("/v1/messages") || path.ends_with("/v1/messages/count_tokens")
}

/// Adds a `request-id` to a response that has none.
fn with_request_id(mut response: Response) -> Response {
    if !response.headers().contains_key(REQUEST_ID) {
        if let Ok(id) = HeaderValue::from_str(&anthropic_request_id()) {
            response.headers_mut().insert(REQUEST_ID, id);
        }
    }
    response
}

pub(crate) async fn create(State(state): State<AppState>, body: Body) -> Response {
    with_request_id(match create_message(state, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    })
}

pub(crate) async fn count_tokens(State(state): State<AppState>, body: Body) -> Response {
    let counted = async {
        let bytes = read_body(&state, body).await?;
        let request: CountTokensRequest = parse_anthropic(&bytes)?;
        resolve_model(&state, Some(&request.model))?;
        let prepared = prepare(
            &state,
            |over| request.prompt(over),
            request.clear_trigger()?,
            None,
        )
        .await?;
        Ok::<_, AnthropicApiError>(json_response(&serde_json::json!({
            "input_tokens": prepared.chat.prompt_token_ids.len()
        })))
    };
    with_request_id(match counted.await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    })
}

/// A prompt ready for the engine, and what `clear_tool_uses` did to it.
struct Prepared {
    prompt: MessagesPrompt,
    chat: ChatPrompt,
    /// Input tokens the clearing freed (0 when nothing was cleared).
    cleared_input_tokens: usize,
}

/// The prompt of either route through the chat path; with `context_management`'s
/// `clear_tool_uses`, rendered again with old tool results cleared when the first rendering
/// is over its trigger, and kept cleared only if that frees at least `clear_at_least` tokens.
/// Each rendering constrains its own copy of `validated`; the chosen one's is kept, so no
/// prompt is rendered twice.
async fn prepare(
    state: &AppState,
    prompt: impl Fn(bool) -> Result<MessagesPrompt, tokenmill_protocol::ProtocolError>,
    clear: Option<ClearRule>,
    validated: Option<&mut ValidatedSampling>,
) -> Result<Prepared, AnthropicApiError> {
    let first = prompt(false)?;
    let (chat, constrained) = render_copy(state, &first, validated.as_deref()).await?;
    if let Some(rule) = clear {
        let full = chat.prompt_token_ids.len();
        let cleared = if full as u64 > rule.trigger {
            Some(prompt(true)?).filter(|cleared| cleared.cleared_tool_uses > 0)
        } else {
            None
        };
        if let Some(cleared) = cleared {
            let (shorter, shorter_constrained) =
                render_copy(state, &cleared, validated.as_deref()).await?;
            let freed = full.saturating_sub(shorter.prompt_token_ids.len());
            if freed as u64 >= rule.at_least {
                keep(validated, shorter_constrained);
                return Ok(Prepared {
                    prompt: cleared,
                    chat: shorter,
                    cleared_input_tokens: freed,
                });
            }
        }
    }
    keep(validated, constrained);
    Ok(Prepared {
        prompt: first,
        chat,
        cleared_input_tokens: 0,
    })
}

/// One rendering against a copy of `validated` (what the rendering constrained comes back).
async fn render_copy(
    state: &AppState,
    prompt: &MessagesPrompt,
    validated: Option<&ValidatedSampling>,
) -> Result<(ChatPrompt, Option<ValidatedSampling>), AnthropicApiError> {
    let mut copy = validated.cloned();
    let chat = render(state, prompt, copy.as_mut()).await?;
    Ok((chat, copy))
}

/// Makes the chosen rendering's constraints the request's.
fn keep(validated: Option<&mut ValidatedSampling>, constrained: Option<ValidatedSampling>) {
    if let (Some(validated), Some(constrained)) = (validated, constrained) {
        *validated = constrained;
    }
}

/// One rendering of a messages prompt through the chat path.
async fn render(
    state: &AppState,
    prompt: &MessagesPrompt,
    validated: Option<&mut ValidatedSampling>,
) -> Result<ChatPrompt, AnthropicApiError> {
    Ok(chat_prompt(
        state,
        ChatInput {
            messages: prompt.conversation.clone(),
            options: prompt.template.clone(),
            tools: prompt.tools.as_deref(),
            tool_choice: prompt.tool_choice.as_ref(),
            parallel_tool_calls: prompt.parallel_tool_calls,
            include_reasoning: true,
        },
        validated,
    )
    .await?)
}

/// A validated message request on its way through the engine.
struct Job {
    id: String,
    model: String,
    prompt_tokens: u32,
    reading: OutputReading,
    omit_thinking: bool,
    context_management: Option<serde_json::Value>,
}

async fn create_message(state: AppState, body: Body) -> Result<Response, AnthropicApiError> {
    let arrival = Instant::now();
    check_accepting(&state)?;
    let bytes = read_body(&state, body).await?;
    let request: MessagesRequest = parse_anthropic(&bytes)?;
    let (model, lora) = resolve_model(&state, Some(&request.model))?;
    let limits = &state.inner.limits;
    let mut validated = request.validate(limits)?;
    let Prepared {
        prompt,
        chat: prepared,
        cleared_input_tokens,
    } = prepare(
        &state,
        |over| request.prompt(over),
        request.clear_trigger()?,
        Some(&mut validated),
    )
    .await?;
    let requested = validated.sampling.max_tokens.unwrap_or(1);
    let max_tokens = check_context(
        prepared.prompt_token_ids.len(),
        requested,
        limits.max_model_len,
    )?;
    if state.config().enable_log_requests {
        if let Some(user) = request.metadata.as_ref().and_then(|m| m.user_id.as_deref()) {
            tracing::info!("messages request for metadata.user_id {user:?}");
        }
    }
    let params = engine_sampling(&validated, &state).await?;
    let mut guard = InFlightGuard::new(&state);
    let mut engine_req = engine_request(
        prepared.prompt_token_ids.clone(),
        &validated,
        &params,
        max_tokens,
        0,
        arrival,
    );
    engine_req.lora = lora.clone();
    let stream = guard.submit(engine_req)?;
    let job = Job {
        id: message_id(),
        model,
        prompt_tokens: prepared.prompt_token_ids.len() as u32,
        reading: prepared.reading,
        omit_thinking: prompt.omit_thinking,
        context_management: request
            .context_management
            .is_some()
            .then(|| applied_edits(prompt.cleared_tool_uses, cleared_input_tokens)),
    };
    if validated.output.stream {
        Ok(served(stream_response(guard, job, stream), lora.as_ref()))
    } else {
        let result = collect(stream).await?;
        drop(guard);
        let mut writer = BlockWriter::new(job.omit_thinking);
        writer.push(job.reading.choice().push(&result.text, true));
        writer.finish();
        let (stop_reason, stop_sequence) =
            stop_reason(result.finish_reason, result.stop_reason, writer.called())?;
        let mut message = MessageResponse::new(
            job.id,
            job.model,
            MessagesUsage::new(
                job.prompt_tokens,
                result.num_cached_tokens as u32,
                result.token_ids.len() as u32,
            ),
        );
        message.content = writer.into_blocks();
        message.stop_reason = Some(stop_reason);
        message.stop_sequence = stop_sequence;
        message.context_management = job.context_management;
        Ok(served(json_response(&message), lora.as_ref()))
    }
}

/// Anthropic's stop reason (and the stop sequence that matched) of a finished reply; an
/// aborted request (a drain that timed out) is an overloaded error.
fn stop_reason(
    finish: Option<FinishReason>,
    stop: Option<StopReason>,
    called: bool,
) -> Result<(AnthropicStopReason, Option<String>), ApiError> {
    match (finish, stop) {
        (Some(FinishReason::Length), _) => Ok((AnthropicStopReason::MaxTokens, None)),
        (Some(FinishReason::Stop | FinishReason::ToolCalls), Some(StopReason::Text(text))) => {
            Ok((AnthropicStopReason::StopSequence, Some(text)))
        }
        (Some(FinishReason::Stop | FinishReason::ToolCalls), _) if called => {
            Ok((AnthropicStopReason::ToolUse, None))
        }
        (Some(FinishReason::Stop | FinishReason::ToolCalls), _) => {
            Ok((AnthropicStopReason::EndTurn, None))
        }
        _ => Err(ApiError::unavailable(
            "The request was aborted before it finished (the server is shutting down).",
        )),
    }
}

/// Sends one event under its own name; `false` when the client is gone.
async fn send(tx: &EventSender, event: &StreamEvent) -> bool {
    sse::send_named(tx, event.name(), event).await
}

/// Ends a stream with an `error` event.
async fn send_error(tx: &EventSender, error: ApiError) {
    let (_, body) = AnthropicError::from_openai(&error.to_error_response());
    send(tx, &StreamEvent::Error { error: body.error }).await;
}

fn stream_response(guard: InFlightGuard, job: Job, stream: RequestStream) -> Response {
    let ping = Event::default().event("ping").data(r#"{"type": "ping"}"#);
    let (tx, response) = sse::channel_with(KeepAlive::new().interval(PING_INTERVAL).event(ping));
    tokio::spawn(async move {
        let _guard = guard;
        let mut merged = sse::merge(vec![(0, stream)]);
        let mut reader = job.reading.choice();
        let mut writer = BlockWriter::new(job.omit_thinking);
        let mut output_tokens = 0u32;
        let mut cached_tokens = 0u32;
        let mut started = false;
        let mut finish = None;
        while let Some((_, event)) = sse::next_event(&tx, &mut merged).await {
            let output = match event {
                RequestEvent::Output(output) => output,
                RequestEvent::Rejected(message) => {
                    send_error(&tx, ApiError::invalid(message)).await;
                    return;
                }
                RequestEvent::Error(message) => {
                    tracing::error!("request failed mid-stream: {message}");
                    send_error(&tx, ApiError::Internal(message)).await;
                    return;
                }
                RequestEvent::Failed(failure) => {
                    send_error(&tx, crate::generation::request_failure(failure)).await;
                    return;
                }
            };
            output_tokens += output.new_token_ids.len() as u32;
            cached_tokens = cached_tokens.max(output.num_cached_tokens as u32);
            // The message starts with the engine's first output, as chat's role chunk does,
            // so a client's time to first token measures the prefill, and the cache hits
            // are known.
            if !started {
                started = true;
                let message = MessageResponse::new(
                    job.id.clone(),
                    job.model.clone(),
                    MessagesUsage::new(job.prompt_tokens, cached_tokens, 0),
                );
                if !send(&tx, &StreamEvent::MessageStart { message }).await
                    || !send(&tx, &StreamEvent::Ping).await
                {
                    return;
                }
            }
            let finished = output.finish_reason.is_some();
            for event in writer.push(reader.push(&output.new_text, finished)) {
                if !send(&tx, &event).await {
                    return;
                }
            }
            if let Some(reason) = output.finish_reason {
                finish = Some((
                    wire_finish_reason(reason),
                    output.stop_reason.map(wire_stop_reason),
                ));
            }
        }
        if tx.is_closed() {
            return;
        }
        let Some((reason, stop)) = finish else {
            send_error(
                &tx,
                ApiError::unavailable("the engine stopped before the request finished"),
            )
            .await;
            return;
        };
        for event in writer.finish() {
            if !send(&tx, &event).await {
                return;
            }
        }
        let (stop_reason, stop_sequence) = match stop_reason(Some(reason), stop, writer.called()) {
            Ok(stop) => stop,
            Err(error) => {
                send_error(&tx, error).await;
                return;
            }
        };
        let delta = StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: Some(stop_reason),
                stop_sequence,
            },
            usage: MessagesUsage::new(job.prompt_tokens, cached_tokens, output_tokens),
            context_management: job.context_management.clone(),
        };
        if send(&tx, &delta).await {
            send(&tx, &StreamEvent::MessageStop).await;
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_are_anthropics() {
        let text = |s: &str| Some(StopReason::Text(s.into()));
        assert_eq!(
            stop_reason(Some(FinishReason::Stop), None, false).unwrap(),
            (AnthropicStopReason::EndTurn, None)
        );
        assert_eq!(
            stop_reason(Some(FinishReason::Stop), None, true).unwrap(),
            (AnthropicStopReason::ToolUse, None)
        );
        assert_eq!(
            stop_reason(Some(FinishReason::Stop), text("END"), false).unwrap(),
            (AnthropicStopReason::StopSequence, Some("END".into()))
        );
        assert_eq!(
            stop_reason(Some(FinishReason::Length), None, true).unwrap(),
            (AnthropicStopReason::MaxTokens, None)
        );
        let aborted = stop_reason(Some(FinishReason::Abort), None, false).unwrap_err();
        assert_eq!(aborted.to_error_response().status(), 503);
        assert!(is_anthropic_path("/prefix/v1/messages"));
        assert!(is_anthropic_path("/v1/messages/count_tokens"));
        assert!(!is_anthropic_path("/v1/chat/completions"));
    }
}
