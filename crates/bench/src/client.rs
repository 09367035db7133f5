//! One streamed request against an OpenAI-compatible endpoint, timed the way vLLM's
//! `endpoint_request_func.py` times it.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde_json::{json, Value};

use crate::args::EndpointKind;
use crate::sse::{SseEvent, SseParser};

/// How to reach the endpoint and what to put in every request body.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub api_url: String,
    pub kind: EndpointKind,
    pub model: String,
    pub api_key: Option<String>,
    pub ignore_eos: bool,
    /// Sampling parameters and --extra-body; merged last, so they win.
    pub extra_body: serde_json::Map<String, Value>,
}

/// One request to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInput {
    pub prompt: String,
    pub prompt_len: usize,
    pub output_len: usize,
    /// A JSON schema the output must follow (the `json` and `json-unique` datasets): sent as
    /// `response_format` on chat and `structured_outputs.json` on completions, and checked
    /// against the output afterwards.
    pub json_schema: Option<Arc<Value>>,
}

/// The measured result of one request. Times are in seconds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestOutcome {
    pub success: bool,
    /// Prompt tokens: the dataset's count, replaced by the server's usage when reported.
    pub prompt_len: usize,
    /// `usage.completion_tokens` from the final chunk, when the server sent one.
    pub output_tokens: Option<usize>,
    /// Chunks that carried generated content.
    pub content_chunks: usize,
    /// First content chunk arrival minus send.
    pub ttft: f64,
    /// Gaps between consecutive content-chunk arrivals.
    pub itl: Vec<f64>,
    /// Last content chunk arrival minus send.
    pub latency: f64,
    /// Send time, seconds since the run started.
    pub start_time: f64,
    /// Time spent waiting for the client's concurrency limit before sending.
    pub client_queue_time: f64,
    pub generated_text: String,
    pub error: String,
}

impl RequestOutcome {
    /// Output tokens: the server's usage count, else the number of content chunks.
    pub fn output_len(&self) -> usize {
        match self.output_tokens {
            Some(tokens) if tokens > 0 => tokens,
            _ => self.content_chunks,
        }
    }

    fn failure(prompt_len: usize, error: String) -> Self {
        RequestOutcome {
            success: false,
            prompt_len,
            error,
            ..Default::default()
        }
    }
}

/// The JSON body for one streamed request.
pub fn request_body(config: &EndpointConfig, input: &RequestInput) -> Value {
    let mut body = match config.kind {
        EndpointKind::Completions => json!({
            "model": config.model,
            "prompt": input.prompt,
            "max_tokens": input.output_len,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
        // vLLM sends max_completion_tokens; max_tokens too, for servers that only know it.
        EndpointKind::ChatCompletions => json!({
            "model": config.model,
            "messages": [{"role": "user", "content": input.prompt}],
            "max_completion_tokens": input.output_len,
            "max_tokens": input.output_len,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
        EndpointKind::Embeddings => json!({
            "model": config.model,
            "input": input.prompt,
            "encoding_format": "float",
        }),
        EndpointKind::Messages => json!({
            "model": config.model,
            "messages": [{"role": "user", "content": input.prompt}],
            "max_tokens": input.output_len,
            "stream": true,
        }),
        // Nothing stored: a benchmark's responses are not conversations to continue.
        EndpointKind::Responses => json!({
            "model": config.model,
            "input": input.prompt,
            "max_output_tokens": input.output_len,
            "stream": true,
            "store": false,
        }),
    };
    if let Value::Object(map) = &mut body {
        if config.kind == EndpointKind::Embeddings {
            for (key, value) in &config.extra_body {
                map.insert(key.clone(), value.clone());
            }
            return body;
        }
        // The Messages API refuses fields it does not know (`plan` refuses the flag there).
        if config.ignore_eos && config.kind != EndpointKind::Messages {
            map.insert("ignore_eos".into(), Value::Bool(true));
        }
        if let Some(schema) = &input.json_schema {
            let (key, value) = structured_field(config.kind, schema);
            map.insert(key.into(), value);
        }
        for (key, value) in &config.extra_body {
            map.insert(key.clone(), value.clone());
        }
    }
    body
}

/// The request field that constrains the output to `schema`: OpenAI's `response_format` on
/// chat, vLLM's `structured_outputs` on completions (which has no `response_format`).
fn structured_field(kind: EndpointKind, schema: &Value) -> (&'static str, Value) {
    match kind {
        EndpointKind::ChatCompletions => (
            "response_format",
            json!({
                "type": "json_schema",
                "json_schema": {"name": "bench", "schema": schema, "strict": true},
            }),
        ),
        EndpointKind::Messages => (
            "output_config",
            json!({"format": {"type": "json_schema", "schema": schema}}),
        ),
        EndpointKind::Responses => (
            "text",
            json!({"format": {"type": "json_schema", "name": "bench", "schema": schema, "strict": true}}),
        ),
        EndpointKind::Completions | EndpointKind::Embeddings => {
            ("structured_outputs", json!({"json": schema}))
        }
    }
}

/// What one parsed stream event means to the measurement.
#[derive(Debug, Clone, PartialEq)]
pub enum ChunkMeaning {
    /// Generated content (possibly empty text, as for special tokens).
    Content { text: String, finished: bool },
    /// A chunk without content; `finished` when it carries a finish_reason.
    NoContent { finished: bool },
    /// The final usage report (`finished`: it also ends the stream, as the Responses API's
    /// terminal event does).
    Usage {
        prompt_tokens: Option<usize>,
        completion_tokens: Option<usize>,
        finished: bool,
    },
    /// An error object in the stream.
    Error(String),
}

/// Interprets one `data:` payload of a completions or chat-completions stream.
pub fn interpret_chunk(kind: EndpointKind, event: Option<&str>, data: &str) -> ChunkMeaning {
    let value: Value = match serde_json::from_str(data) {
        Ok(value) => value,
        Err(err) => {
            return ChunkMeaning::Error(format!(
                "unparseable stream chunk ({err}): {}",
                truncate(data, 200)
            ))
        }
    };
    if event == Some("error")
        || value.get("error").is_some()
        || value.get("object").and_then(Value::as_str) == Some("error")
    {
        let message = value
            .pointer("/error/message")
            .or_else(|| value.get("message"))
            .or_else(|| value.get("error"))
            .map(|m| {
                m.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| m.to_string())
            })
            .unwrap_or_else(|| truncate(data, 200));
        return ChunkMeaning::Error(format!("error in stream: {message}"));
    }
    if kind == EndpointKind::Messages {
        return interpret_message_event(&value);
    }
    if kind == EndpointKind::Responses {
        return interpret_response_event(&value);
    }
    if let Some(choice) = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    {
        let finished = choice.get("finish_reason").is_some_and(|r| !r.is_null());
        let content = match kind {
            EndpointKind::Completions
            | EndpointKind::Embeddings
            | EndpointKind::Messages
            | EndpointKind::Responses => choice.get("text"),
            EndpointKind::ChatCompletions => choice.get("delta").and_then(|delta| {
                delta
                    .get("content")
                    .filter(|c| !c.is_null())
                    .or_else(|| delta.get("reasoning_content").filter(|c| !c.is_null()))
            }),
        };
        return match content.and_then(Value::as_str) {
            // llama.cpp ends with an empty-text chunk that only carries the finish_reason: a
            // marker, not a token (counting it would add one token and one ITL gap).
            Some("") if finished => ChunkMeaning::NoContent { finished },
            Some(text) => ChunkMeaning::Content {
                text: text.to_string(),
                finished,
            },
            None => ChunkMeaning::NoContent { finished },
        };
    }
    if let Some(usage) = value.get("usage").filter(|u| !u.is_null()) {
        let count = |key: &str| usage.get(key).and_then(Value::as_u64).map(|n| n as usize);
        return ChunkMeaning::Usage {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
            finished: false,
        };
    }
    ChunkMeaning::NoContent { finished: false }
}

/// One event of Anthropic's Messages stream: text, thinking and tool-input deltas are
/// content, `message_delta` carries the usage (the prompt is its uncached input plus the
/// cache reads), `message_stop` ends the message.
fn interpret_message_event(value: &Value) -> ChunkMeaning {
    match value.get("type").and_then(Value::as_str) {
        Some("content_block_delta") => {
            let delta = value.get("delta");
            let text = ["text", "thinking", "partial_json"]
                .iter()
                .find_map(|key| delta.and_then(|d| d.get(*key)).and_then(Value::as_str));
            match text {
                Some(text) => ChunkMeaning::Content {
                    text: text.to_string(),
                    finished: false,
                },
                None => ChunkMeaning::NoContent { finished: false },
            }
        }
        Some("message_delta") => {
            let count = |key: &str| {
                value
                    .pointer(&format!("/usage/{key}"))
                    .and_then(Value::as_u64)
                    .map(|n| n as usize)
            };
            let prompt_tokens = match (count("input_tokens"), count("cache_read_input_tokens")) {
                (Some(input), cached) => Some(input + cached.unwrap_or(0)),
                (None, _) => None,
            };
            ChunkMeaning::Usage {
                prompt_tokens,
                completion_tokens: count("output_tokens"),
                finished: false,
            }
        }
        Some("message_stop") => ChunkMeaning::NoContent { finished: true },
        _ => ChunkMeaning::NoContent { finished: false },
    }
}

/// One event of OpenAI's Responses stream: text, reasoning and argument deltas are content;
/// the terminal event (`response.completed` / `.incomplete`) carries the usage and ends it;
/// `response.failed` is an error.
fn interpret_response_event(value: &Value) -> ChunkMeaning {
    match value.get("type").and_then(Value::as_str) {
        Some(
            "response.output_text.delta"
            | "response.reasoning_text.delta"
            | "response.function_call_arguments.delta",
        ) => match value.get("delta").and_then(Value::as_str) {
            Some(text) => ChunkMeaning::Content {
                text: text.to_string(),
                finished: false,
            },
            None => ChunkMeaning::NoContent { finished: false },
        },
        Some("response.completed" | "response.incomplete") => {
            let count = |key: &str| {
                value
                    .pointer(&format!("/response/usage/{key}"))
                    .and_then(Value::as_u64)
                    .map(|n| n as usize)
            };
            ChunkMeaning::Usage {
                prompt_tokens: count("input_tokens"),
                completion_tokens: count("output_tokens"),
                finished: true,
            }
        }
        Some("response.failed") => ChunkMeaning::Error(format!(
            "response failed: {}",
            value
                .pointer("/response/error/message")
                .and_then(Value::as_str)
                .unwrap_or("no message")
        )),
        _ => ChunkMeaning::NoContent { finished: false },
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    let mut out: String = text.chars().take(max_chars).collect();
    if text.chars().count() > max_chars {
        out.push('…');
    }
    out
}

/// Sends one request and measures it. `run_start` anchors `start_time`; never errors: a
/// failure is an outcome with `success == false` and a message.
pub async fn send_request(
    http: &reqwest::Client,
    config: &EndpointConfig,
    input: &RequestInput,
    run_start: Instant,
) -> RequestOutcome {
    let body = request_body(config, input);
    let mut request = http.post(&config.api_url).json(&body);
    if let Some(key) = &config.api_key {
        request = request.bearer_auth(key);
    }
    let sent = Instant::now();
    let start_time = sent.duration_since(run_start).as_secs_f64();
    let mut outcome = match request.send().await {
        Err(err) => RequestOutcome::failure(
            input.prompt_len,
            format!("connection error: {}", error_chain(&err)),
        ),
        Ok(response) if !response.status().is_success() => {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            RequestOutcome::failure(
                input.prompt_len,
                format!("HTTP {status}: {}", truncate(text.trim(), 300)),
            )
        }
        Ok(response) if config.kind == EndpointKind::Embeddings => {
            read_embeddings(response, sent, input.prompt_len).await
        }
        Ok(response) => read_stream(config.kind, response, sent, input.prompt_len).await,
    };
    outcome.start_time = start_time;
    outcome
}

/// An embeddings response: one JSON body; its arrival is both the first and the last byte
/// that matter, and `usage.prompt_tokens` the input length.
async fn read_embeddings(
    response: reqwest::Response,
    sent: Instant,
    prompt_len: usize,
) -> RequestOutcome {
    let body = response.bytes().await;
    let latency = sent.elapsed().as_secs_f64();
    let value: Value = match body.map(|bytes| serde_json::from_slice(&bytes)) {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => {
            return RequestOutcome::failure(prompt_len, format!("unparseable response: {err}"))
        }
        Err(err) => {
            return RequestOutcome::failure(
                prompt_len,
                format!("body broken: {}", error_chain(&err)),
            )
        }
    };
    let vectors = value
        .get("data")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if vectors == 0 {
        return RequestOutcome::failure(prompt_len, "the response holds no embedding".into());
    }
    let prompt_tokens = value
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .map_or(prompt_len, |tokens| tokens as usize);
    RequestOutcome {
        success: true,
        prompt_len: prompt_tokens,
        ttft: latency,
        latency,
        output_tokens: Some(0),
        ..Default::default()
    }
}

async fn read_stream(
    kind: EndpointKind,
    response: reqwest::Response,
    sent: Instant,
    prompt_len: usize,
) -> RequestOutcome {
    let mut outcome = RequestOutcome {
        prompt_len,
        ..Default::default()
    };
    let mut parser = SseParser::new();
    let mut stream = response.bytes_stream();
    let mut most_recent = sent;
    let mut ended_cleanly = false;
    let mut failure: Option<String> = None;
    'read: loop {
        let (events, now, body_exhausted) = match stream.next().await {
            Some(Ok(bytes)) => (parser.push(&bytes), Instant::now(), false),
            Some(Err(err)) => {
                failure = Some(format!("stream broken: {}", error_chain(&err)));
                break;
            }
            None => (
                parser.finish().into_iter().collect::<Vec<_>>(),
                Instant::now(),
                true,
            ),
        };
        for event in events {
            let (name, data) = match event {
                SseEvent::Done => {
                    ended_cleanly = true;
                    break 'read;
                }
                SseEvent::Data { event, data } => (event, data),
            };
            match interpret_chunk(kind, name.as_deref(), &data) {
                ChunkMeaning::Content { text, finished } => {
                    if outcome.content_chunks == 0 {
                        outcome.ttft = now.duration_since(sent).as_secs_f64();
                    } else {
                        outcome
                            .itl
                            .push(now.duration_since(most_recent).as_secs_f64());
                    }
                    outcome.content_chunks += 1;
                    most_recent = now;
                    outcome.generated_text.push_str(&text);
                    ended_cleanly |= finished;
                }
                ChunkMeaning::NoContent { finished } => ended_cleanly |= finished,
                ChunkMeaning::Usage {
                    prompt_tokens,
                    completion_tokens,
                    finished,
                } => {
                    ended_cleanly |= finished;
                    outcome.output_tokens = completion_tokens;
                    if let Some(tokens) = prompt_tokens {
                        outcome.prompt_len = tokens;
                    }
                }
                ChunkMeaning::Error(message) => {
                    failure = Some(message);
                    break 'read;
                }
            }
        }
        if body_exhausted {
            break;
        }
    }
    outcome.latency = most_recent.duration_since(sent).as_secs_f64();
    outcome.success = match failure {
        Some(message) => {
            outcome.error = message;
            false
        }
        None if outcome.content_chunks == 0 => {
            outcome.error = "Never received a valid chunk to calculate TTFT. This response will be marked as failed!".into();
            false
        }
        None if !ended_cleanly => {
            outcome.error = "stream ended without [DONE] or a finish_reason (server died?)".into();
            false
        }
        None => true,
    };
    outcome
}

/// The error and its sources on one line: reqwest's top-level message alone hides the cause.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kind: EndpointKind) -> EndpointConfig {
        EndpointConfig {
            api_url: "http://127.0.0.1:1/v1/completions".into(),
            kind,
            model: "m".into(),
            api_key: None,
            ignore_eos: true,
            extra_body: serde_json::Map::from_iter([("temperature".to_string(), json!(0.0))]),
        }
    }

    #[test]
    fn embeddings_body_is_one_unstreamed_input() {
        let input = RequestInput {
            prompt: "hi".into(),
            prompt_len: 1,
            output_len: 7,
            json_schema: None,
        };
        let body = request_body(&config(EndpointKind::Embeddings), &input);
        assert_eq!(body["input"], "hi");
        assert_eq!(body["model"], "m");
        assert!(body.get("stream").is_none() && body.get("max_tokens").is_none());
        assert!(body.get("ignore_eos").is_none());
    }

    #[test]
    fn completion_body_has_vllm_fields() {
        let input = RequestInput {
            prompt: "hi".into(),
            prompt_len: 1,
            output_len: 7,
            json_schema: None,
        };
        let body = request_body(&config(EndpointKind::Completions), &input);
        assert_eq!(body["prompt"], "hi");
        assert_eq!(body["max_tokens"], 7);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["temperature"], 0.0);
        let chat = request_body(&config(EndpointKind::ChatCompletions), &input);
        assert_eq!(chat["messages"][0]["content"], "hi");
        assert_eq!(chat["max_completion_tokens"], 7);
        assert!(body.get("structured_outputs").is_none() && chat.get("response_format").is_none());
    }

    #[test]
    fn anthropic_events_are_timed_and_counted() {
        let config = config(EndpointKind::Messages);
        let input = RequestInput {
            prompt: "hi".into(),
            prompt_len: 1,
            output_len: 7,
            json_schema: None,
        };
        let body = request_body(&config, &input);
        assert_eq!(
            body,
            // No `ignore_eos` (the config asks for it): the Messages API refuses it.
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 7, "stream": true, "temperature": 0.0})
        );
        let kind = EndpointKind::Messages;
        assert_eq!(
            interpret_chunk(
                kind,
                Some("content_block_delta"),
                r#"{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}"#
            ),
            ChunkMeaning::Content {
                text: "Hi".into(),
                finished: false
            }
        );
        assert_eq!(
            interpret_chunk(
                kind,
                Some("message_delta"),
                r#"{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 3, "cache_read_input_tokens": 16, "output_tokens": 5}}"#
            ),
            ChunkMeaning::Usage {
                prompt_tokens: Some(19),
                completion_tokens: Some(5),
                finished: false
            }
        );
        assert_eq!(
            interpret_chunk(kind, Some("message_stop"), r#"{"type": "message_stop"}"#),
            ChunkMeaning::NoContent { finished: true }
        );
        assert_eq!(
            interpret_chunk(kind, Some("ping"), r#"{"type": "ping"}"#),
            ChunkMeaning::NoContent { finished: false }
        );
        assert!(matches!(
            interpret_chunk(kind, Some("error"),
                r#"{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}"#),
            ChunkMeaning::Error(message) if message.contains("busy")
        ));
    }

    #[test]
    fn a_schema_constrains_each_endpoint_its_own_way() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let input = RequestInput {
            prompt: "hi".into(),
            prompt_len: 1,
            output_len: 7,
            json_schema: Some(Arc::new(schema.clone())),
        };
        let body = request_body(&config(EndpointKind::Completions), &input);
        assert_eq!(body["structured_outputs"]["json"], schema);
        let chat = request_body(&config(EndpointKind::ChatCompletions), &input);
        assert_eq!(chat["response_format"]["type"], "json_schema");
        assert_eq!(chat["response_format"]["json_schema"]["schema"], schema);
        assert_eq!(chat["response_format"]["json_schema"]["strict"], true);
        let responses = request_body(&config(EndpointKind::Responses), &input);
        assert_eq!(responses["text"]["format"]["schema"], schema);
        assert_eq!(responses["input"], "hi");
        assert_eq!(responses["max_output_tokens"], 7);
    }

    #[test]
    fn responses_events_are_classified() {
        let kind = EndpointKind::Responses;
        assert_eq!(
            interpret_chunk(
                kind,
                Some("response.output_text.delta"),
                r#"{"type": "response.output_text.delta", "delta": "Hi", "sequence_number": 4}"#
            ),
            ChunkMeaning::Content {
                text: "Hi".into(),
                finished: false
            }
        );
        assert_eq!(
            interpret_chunk(
                kind,
                Some("response.completed"),
                r#"{"type": "response.completed", "response": {"usage": {"input_tokens": 3, "output_tokens": 5}}}"#
            ),
            ChunkMeaning::Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(5),
                finished: true
            }
        );
        assert!(matches!(
            interpret_chunk(kind, Some("response.failed"),
                r#"{"type": "response.failed", "response": {"error": {"message": "boom"}}}"#),
            ChunkMeaning::Error(message) if message.contains("boom")
        ));
    }

    #[test]
    fn chunks_are_classified() {
        use ChunkMeaning::*;
        let completions = EndpointKind::Completions;
        let chat = EndpointKind::ChatCompletions;
        assert_eq!(
            interpret_chunk(
                completions,
                None,
                r#"{"choices":[{"index":0,"text":"Hi","finish_reason":null}]}"#
            ),
            Content {
                text: "Hi".into(),
                finished: false
            }
        );
        assert_eq!(
            interpret_chunk(
                completions,
                None,
                r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#
            ),
            Usage {
                prompt_tokens: Some(5),
                completion_tokens: Some(9),
                finished: false
            }
        );
        // llama.cpp-style role-only and empty final deltas are not content.
        assert_eq!(
            interpret_chunk(
                chat,
                None,
                r#"{"choices":[{"delta":{"role":"assistant"}}]}"#
            ),
            NoContent { finished: false }
        );
        assert_eq!(
            interpret_chunk(
                chat,
                None,
                r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#
            ),
            NoContent { finished: true }
        );
        assert_eq!(
            interpret_chunk(
                completions,
                None,
                r#"{"choices":[{"text":"","finish_reason":"length"}]}"#
            ),
            NoContent { finished: true }
        );
        assert_eq!(
            interpret_chunk(completions, None, r#"{"choices":[{"text":""}]}"#),
            Content {
                text: String::new(),
                finished: false
            }
        );
        assert_eq!(
            interpret_chunk(
                chat,
                None,
                r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"length"}]}"#
            ),
            Content {
                text: "x".into(),
                finished: true
            }
        );
        assert!(
            matches!(interpret_chunk(chat, None, r#"{"error":{"message":"engine dead","type":"InternalServerError"}}"#), Error(m) if m.contains("engine dead"))
        );
        assert!(
            matches!(interpret_chunk(chat, None, r#"{"object":"error","message":"bad"}"#), Error(m) if m.contains("bad"))
        );
        assert!(matches!(
            interpret_chunk(chat, Some("error"), r#"{"detail":"x"}"#),
            Error(_)
        ));
        assert!(matches!(interpret_chunk(chat, None, "{not json"), Error(_)));
    }
}
