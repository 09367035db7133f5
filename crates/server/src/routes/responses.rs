//! OpenAI's Responses API: `POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel`. Another front end
//! over the chat request path ([`chat_prompt`]: template, tokenize, tool plan, output
//! reading), answered as response objects and their event stream
//! (`responses_output.rs`), with the store and background runs of `responses_runs.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderValue;
use axum::response::Response;
use tokenmill_protocol::{
    items_conversation, parse_anthropic, response_id, ErrorResponse, ProtocolError, ResponseEvent,
    ResponseItem, ResponseObject, ResponseStatus, ResponsesRequest, ResponsesTools, SequencedEvent,
    ValidatedSampling,
};
use tokenmill_response_store::{Order, StoredResponse};

use crate::error::ApiError;
use crate::generation::{engine_request, engine_sampling};
use crate::responses_output::{drive, EventSink, NullSink, RunEnd, RunSetup};
use crate::responses_runs::{BackgroundRun, LogSink};
use crate::routes::chat::{chat_prompt, ChatInput, ChatPrompt};
use crate::routes::lora::{resolve_model, served};
use crate::routes::{check_accepting, check_request_shape, json_response, read_body};
use crate::sse::{self, EventSender};
use crate::state::{unix_now, AppState, InFlightGuard};

/// The header naming declared hosted tools that were not offered to the model.
pub(crate) const SKIPPED_TOOLS_HEADER: &str = "x-tokenmill-skipped-tools";

/// How long a cancel waits for the run to wind down before answering.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// A streamed response's events go to its SSE body.
struct SseSink {
    tx: EventSender,
    next: u64,
}

impl EventSink for SseSink {
    async fn emit(&mut self, event: ResponseEvent) -> bool {
        let name = event.name();
        let sequenced = SequencedEvent {
            event,
            sequence_number: self.next,
        };
        self.next += 1;
        sse::send_named(&self.tx, name, &sequenced).await
    }
}

fn not_found(id: &str, param: &str) -> ApiError {
    ApiError::from(
        ErrorResponse::not_found(format!("Response with id '{id}' not found.")).with_param(param),
    )
}

/// What was stored of a response as values.
fn stored(
    response: &ResponseObject,
    input: &[ResponseItem],
    context: &[ResponseItem],
) -> StoredResponse {
    let values = |items: &[ResponseItem]| {
        items
            .iter()
            .filter_map(|item| serde_json::to_value(item).ok())
            .collect()
    };
    StoredResponse::new(
        serde_json::to_value(response).unwrap_or_default(),
        values(input),
        values(context),
    )
}

/// The items a continuation starts from: the previous response's context and output.
async fn previous_items(state: &AppState, id: &str) -> Result<Vec<ResponseItem>, ApiError> {
    let wanted = id.to_string();
    let found = state
        .inner
        .responses
        .with_store(move |store| store.get(&wanted))
        .await?
        .flatten();
    let Some(previous) = found else {
        return Err(ApiError::from(
            ErrorResponse::not_found(format!("Previous response with id '{id}' not found."))
                .with_param("previous_response_id"),
        ));
    };
    let response: ResponseObject = serde_json::from_value(previous.response)
        .map_err(|e| ApiError::Internal(format!("stored response {id}: {e}")))?;
    if !response.status.is_final() {
        return Err(ApiError::invalid_param(
            "previous_response_id",
            format!("Previous response '{id}' has not finished yet."),
        ));
    }
    let mut items: Vec<ResponseItem> = previous
        .context
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()
        .map_err(|e| ApiError::Internal(format!("stored context of {id}: {e}")))?;
    items.extend(response.output);
    Ok(items)
}

/// Renders the conversation through the chat path; with `truncation: auto` the oldest items
/// are dropped until the prompt and its budget fit the context.
async fn render_fitting(
    state: &AppState,
    request: &ResponsesRequest,
    tools: &ResponsesTools,
    items: &[ResponseItem],
    validated: &ValidatedSampling,
) -> Result<(ValidatedSampling, ChatPrompt, u32), ApiError> {
    let auto = request.truncation.as_deref() == Some("auto");
    let mut start = 0;
    loop {
        let conversation = items_conversation(request.instructions.as_deref(), &items[start..])?;
        let mut attempt = validated.clone();
        let prepared = chat_prompt(
            state,
            ChatInput {
                messages: conversation,
                options: request.template_options(),
                tools: tools.tools.as_deref(),
                tool_choice: tools.tool_choice.as_ref(),
                parallel_tool_calls: request.parallel_tool_calls,
                include_reasoning: true,
            },
            Some(&mut attempt),
        )
        .await?;
        match attempt.resolve_max_tokens(prepared.prompt_token_ids.len(), &state.inner.limits) {
            Ok(max_tokens) => return Ok((attempt, prepared, max_tokens)),
            Err(ProtocolError::ContextLengthExceeded { .. }) if auto && start + 1 < items.len() => {
                start += 1;
                while start + 1 < items.len()
                    && matches!(
                        items[start],
                        ResponseItem::FunctionCallOutput(_) | ResponseItem::CustomToolCallOutput(_)
                    )
                {
                    start += 1;
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

pub(crate) async fn create(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    check_accepting(&state)?;
    let bytes = read_body(&state, body).await?;
    let request: ResponsesRequest = parse_anthropic(&bytes)?;
    let (model, lora) = resolve_model(&state, request.model.as_deref())?;
    let validated = request.validate(&state.inner.limits)?;
    check_request_shape(&state, &validated, 1)?;
    let tools = request.tools()?;
    let input = request.input_items()?;
    let mut context = match &request.previous_response_id {
        Some(id) => previous_items(&state, id).await?,
        None => Vec::new(),
    };
    context.extend(input.iter().cloned());
    let (validated, prepared, max_tokens) =
        render_fitting(&state, &request, &tools, &context, &validated).await?;
    let logprobs = request
        .includes_logprobs()
        .then(|| validated.sampling.logprobs.unwrap_or(0) as usize);
    if logprobs.is_some() && !prepared.reading.is_plain() {
        return Err(ApiError::invalid_param(
            "include",
            "message.output_text.logprobs is served for plain text output only (no tools, no \
             reasoning parser).",
        ));
    }
    // `tool_choice: "none"` reads no calls (no parser), so nothing needs holding to a regex.
    let free_parser = prepared
        .reading
        .tool_parser
        .as_deref()
        .filter(|_| !prepared.reading.constrains_tool_calls());
    if let (Some(param), Some(parser)) = (tools.constrained_formats.first(), free_parser) {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "{param}: a regex-constrained custom tool needs constrained tool output (a \
                 forced call: tool_choice \"required\" or this tool, or the server's \
                 --tool-call-parser generic); the {parser} parser reads free text and could not \
                 hold the input to the regex."
            ),
        ));
    }
    if !tools.skipped.is_empty() {
        tracing::info!(
            "responses: hosted tools not offered to the model (they cannot run here): {}",
            tools.skipped.join(", ")
        );
    }
    if state.config().enable_log_requests {
        if let Some(user) = &request.user {
            tracing::info!("responses request for user {user:?}");
        }
        if let Some(metadata) = &request.client_metadata {
            let shown = serde_json::Value::Object(metadata.clone());
            tracing::info!("responses request client_metadata: {shown}");
        }
    }
    let responses = &state.inner.responses;
    let store = request.store.unwrap_or(true) && responses.store.is_some();
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
    let response = ResponseObject::new(response_id(), unix_now(), model, &request, store);
    let setup = RunSetup {
        state: state.clone(),
        response: response.clone(),
        reader: prepared.reading.choice(),
        prompt_tokens: prepared.prompt_token_ids.len() as u32,
        logprobs,
        tool_names: tools.names.clone(),
        encrypted_reasoning: request.includes_encrypted_reasoning(),
    };
    let mut http = if request.is_background() {
        let run = Arc::new(BackgroundRun::new(response.clone()));
        if let Ok(mut slot) = run.engine_request.lock() {
            *slot = Some(stream.request_id());
        }
        responses.add_run(&response.id, Arc::clone(&run));
        if store {
            responses
                .save(&state.inner.metrics, stored(&response, &input, &context))
                .await?;
        }
        let task_run = Arc::clone(&run);
        let task_state = state.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let mut sink = LogSink(Arc::clone(&task_run));
            let cancel_flag = Arc::clone(&task_run);
            let end = drive(setup, stream, &mut sink, move || cancel_flag.cancelled()).await;
            if let RunEnd::Finished(done) = end {
                if let Ok(mut current) = task_run.response.lock() {
                    *current = (*done).clone();
                }
                if store {
                    let saved = task_state
                        .inner
                        .responses
                        .save(&task_state.inner.metrics, stored(&done, &input, &context))
                        .await;
                    if let Err(error) = saved {
                        tracing::error!("cannot store response {}: {error}", done.id);
                    }
                }
            }
            task_run.finish();
        });
        if request.is_stream() {
            follow_response(run, 0)
        } else {
            json_response(&response)
        }
    } else if request.is_stream() {
        let (tx, http) = sse::channel();
        let task_state = state.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let mut sink = SseSink { tx, next: 0 };
            if let RunEnd::Finished(done) = drive(setup, stream, &mut sink, || false).await {
                if store {
                    let saved = task_state
                        .inner
                        .responses
                        .save(&task_state.inner.metrics, stored(&done, &input, &context))
                        .await;
                    if let Err(error) = saved {
                        tracing::error!("cannot store response {}: {error}", done.id);
                    }
                }
            }
        });
        http
    } else {
        let end = drive(setup, stream, &mut NullSink, || false).await;
        drop(guard);
        let RunEnd::Finished(done) = end else {
            return Err(ApiError::Internal("the response run ended early".into()));
        };
        if let (ResponseStatus::Failed, Some(error)) = (done.status, &done.error) {
            return Err(match error.code.as_str() {
                "invalid_request" => ApiError::invalid(error.message.clone()),
                _ => ApiError::from(ErrorResponse::internal(error.message.clone())),
            });
        }
        if store {
            responses
                .save(&state.inner.metrics, stored(&done, &input, &context))
                .await?;
        }
        json_response(&*done)
    };
    if !tools.skipped.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&tools.skipped.join(", ")) {
            http.headers_mut().insert(SKIPPED_TOOLS_HEADER, value);
        }
    }
    Ok(served(http, lora.as_ref()))
}

/// An SSE body that follows a background run's log from sequence number `from`.
fn follow_response(run: Arc<BackgroundRun>, from: usize) -> Response {
    let (tx, http) = sse::channel();
    tokio::spawn(async move {
        run.follow(from, |name, json| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(axum::response::sse::Event::default()
                    .event(name)
                    .data(json)))
                    .await
                    .is_ok()
            }
        })
        .await;
    });
    http
}

/// Query parameters, each checked: an unknown one is a 400 naming it.
fn query_params(query: Option<&str>, known: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let mut params = HashMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = key.replace("%5B%5D", "[]");
        if !known.contains(&key.as_str()) {
            return Err(ApiError::invalid_param(
                &key,
                format!(
                    "Unknown query parameter {key:?}; this route takes {}.",
                    known.join(", ")
                ),
            ));
        }
        params.insert(key, value.to_string());
    }
    Ok(params)
}

fn parse_param<T: std::str::FromStr>(
    params: &HashMap<String, String>,
    key: &str,
) -> Result<Option<T>, ApiError> {
    params
        .get(key)
        .map(|value| {
            value
                .parse()
                .map_err(|_| ApiError::invalid_param(key, format!("{key}: cannot read {value:?}.")))
        })
        .transpose()
}

/// The latest object of a response: its run's, else the store's.
async fn current(state: &AppState, id: &str) -> Result<Option<serde_json::Value>, ApiError> {
    if let Some(snapshot) = state.inner.responses.run(id).and_then(|run| run.snapshot()) {
        return Ok(serde_json::to_value(snapshot).ok());
    }
    let wanted = id.to_string();
    Ok(state
        .inner
        .responses
        .with_store(move |store| store.get(&wanted))
        .await?
        .flatten()
        .map(|stored| stored.response))
}

pub(crate) async fn retrieve(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = query_params(query.as_deref(), &["stream", "starting_after", "include[]"])?;
    if params.contains_key("include[]") {
        return Err(ApiError::invalid_param(
            "include",
            "include is not served on retrieval: the stored object holds what its request \
             included.",
        ));
    }
    let starting_after = parse_param::<u64>(&params, "starting_after")?;
    let stream = parse_param::<bool>(&params, "stream")?.unwrap_or(false);
    if starting_after.is_some() && !stream {
        return Err(ApiError::invalid_param(
            "starting_after",
            "starting_after picks where a replayed event stream starts: it needs stream=true.",
        ));
    }
    if stream {
        let Some(run) = state.inner.responses.run(&id) else {
            return match current(&state, &id).await? {
                Some(_) => Err(ApiError::invalid_param(
                    "stream",
                    format!(
                        "Response '{id}' has no event stream to replay (only background \
                         responses of this server process keep one)."
                    ),
                )),
                None => Err(not_found(&id, "response_id")),
            };
        };
        let from = starting_after.map_or(0, |n| {
            usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1)
        });
        return Ok(follow_response(run, from));
    }
    match current(&state, &id).await? {
        Some(response) => Ok(json_response(&response)),
        None => Err(not_found(&id, "response_id")),
    }
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let responses = &state.inner.responses;
    let had_run = responses.run(&id).is_some();
    responses.remove_run(&id);
    let wanted = id.clone();
    let deleted = responses
        .with_store(move |store| store.delete(&wanted))
        .await?
        .unwrap_or(false);
    if !deleted && !had_run {
        return Err(not_found(&id, "response_id"));
    }
    Ok(json_response(&serde_json::json!({
        "id": id, "object": "response", "deleted": true
    })))
}

pub(crate) async fn input_items(
    State(state): State<AppState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params = query_params(query.as_deref(), &["after", "limit", "order"])?;
    let limit = parse_param::<usize>(&params, "limit")?.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid_param(
            "limit",
            format!("limit must be in [1, 100], got {limit}."),
        ));
    }
    let order = match params.get("order").map(String::as_str) {
        None | Some("desc") => Order::Desc,
        Some("asc") => Order::Asc,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "order",
                format!("order must be \"asc\" or \"desc\", got {other:?}."),
            ))
        }
    };
    let after = params.get("after").cloned();
    let wanted = id.clone();
    let page = state
        .inner
        .responses
        .with_store(move |store| store.input_items(&wanted, after.as_deref(), limit, order))
        .await?
        .flatten()
        .ok_or_else(|| not_found(&id, "response_id"))?;
    let item_id = |item: Option<&serde_json::Value>| {
        item.and_then(|item| item.get("id"))
            .cloned()
            .unwrap_or_default()
    };
    Ok(json_response(&serde_json::json!({
        "object": "list",
        "first_id": item_id(page.data.first()),
        "last_id": item_id(page.data.last()),
        "has_more": page.has_more,
        "data": page.data,
    })))
}

pub(crate) async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let Some(run) = state.inner.responses.run(&id) else {
        return match current(&state, &id).await? {
            Some(response) if response["background"] != true => Err(ApiError::invalid_param(
                "response_id",
                "Cannot cancel a synchronous response.",
            )),
            Some(response) => Ok(json_response(&response)),
            None => Err(not_found(&id, "response_id")),
        };
    };
    if !run.is_done() {
        run.request_cancel();
        let engine_request = run.engine_request.lock().ok().and_then(|slot| *slot);
        if let Some(request_id) = engine_request {
            state.engine().abort(request_id);
        }
        let waited =
            tokio::time::timeout(CANCEL_WAIT, run.follow(usize::MAX, |_, _| async { true })).await;
        if waited.is_err() {
            tracing::warn!("response {id}: the run did not wind down within {CANCEL_WAIT:?}");
        }
    }
    match run.snapshot() {
        Some(response) => Ok(json_response(&response)),
        None => Err(not_found(&id, "response_id")),
    }
}
