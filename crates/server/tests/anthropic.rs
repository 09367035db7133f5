//! Anthropic's Messages API over the router on the real default model: the message object,
//! the event stream rebuilt into the same message, forced tool calls with their
//! `input_json_delta`s, count_tokens, prefix-cache reads in the usage, `x-api-key`, and every
//! error in Anthropic's shape (with the engine idle and the KV cache empty afterwards).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::{text_of, TestApp, MODEL_ALIAS, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_engine::KvCacheSizing;

fn app() -> TestApp {
    TestApp::with_engine_config(
        |engine| {
            engine.max_model_len = Some(1024);
            engine.kv_cache = KvCacheSizing::Bytes(128 << 20);
        },
        |_| {},
    )
}

fn body(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL_NAME, "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Name three colors."}],
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

fn request(path: &str, body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header("anthropic-version", "2023-06-01");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

/// Status, `request-id` and JSON body of one request.
async fn post(
    app: &TestApp,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let response = app.send(request(path, body, headers)).await;
    let id = response
        .headers()
        .get("request-id")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(id.starts_with("req_"), "request-id header: {id:?}");
    let (status, text) = text_of(response).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// Asserts Anthropic's error shape, exactly.
fn assert_anthropic_error(
    status: StatusCode,
    body: &Value,
    expected: StatusCode,
    kind: &str,
) -> String {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body.as_object().unwrap().len(), 2, "{body}");
    let error = body["error"].as_object().unwrap();
    assert_eq!(error.len(), 2, "{body}");
    assert_eq!(error["type"], kind, "{body}");
    error["message"].as_str().unwrap().to_string()
}

/// The SSE events of a streamed request, as `(event name, data)`; the name must equal the
/// data's `type`.
async fn events(app: &TestApp, body: &Value) -> Vec<Value> {
    let response = app.send(request("/v1/messages?beta=true", body, &[])).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (_, text) = text_of(response).await;
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            let name = event
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap();
            let data = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            let data: Value = serde_json::from_str(data).unwrap();
            assert_eq!(data["type"], name, "{event}");
            data
        })
        .collect()
}

/// A stream rebuilt into a message as the SDK does it, with the order of events checked.
fn rebuild(events: &[Value]) -> Value {
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["message_start", "ping"], "{kinds:?}");
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["message_delta", "message_stop"],
        "{kinds:?}"
    );
    let mut message = events[0]["message"].clone();
    assert_eq!(message["content"], json!([]));
    assert_eq!(message["stop_reason"], Value::Null);
    let mut json_parts: Vec<String> = Vec::new();
    let mut open = None;
    for event in &events[2..events.len() - 2] {
        let index = event["index"].as_u64().unwrap() as usize;
        match event["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!(open, None);
                assert_eq!(index, message["content"].as_array().unwrap().len());
                message["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(event["content_block"].clone());
                json_parts.push(String::new());
                open = Some(index);
            }
            "content_block_delta" => {
                assert_eq!(open, Some(index));
                let block = &mut message["content"][index];
                let delta = &event["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => {
                        let text = block["text"].as_str().unwrap().to_string()
                            + delta["text"].as_str().unwrap();
                        block["text"] = json!(text);
                    }
                    "input_json_delta" => {
                        json_parts[index].push_str(delta["partial_json"].as_str().unwrap())
                    }
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(open, Some(index));
                if message["content"][index]["type"] == "tool_use" {
                    message["content"][index]["input"] =
                        serde_json::from_str(&json_parts[index]).unwrap();
                }
                open = None;
            }
            other => panic!("unexpected event {other}"),
        }
    }
    let delta = &events[events.len() - 2];
    message["stop_reason"] = delta["delta"]["stop_reason"].clone();
    message["stop_sequence"] = delta["delta"]["stop_sequence"].clone();
    message["usage"] = delta["usage"].clone();
    message
}

#[tokio::test]
async fn a_message_streamed_and_not_agree() {
    let app = app();
    let (status, message) = post(&app, "/v1/messages", &body(json!({})), &[]).await;
    assert_eq!(status, StatusCode::OK, "{message}");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        (message["type"].as_str(), message["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(message["model"], MODEL_NAME);
    assert_eq!(message["content"][0]["type"], "text");
    assert!(!message["content"][0]["text"].as_str().unwrap().is_empty());
    assert!(["end_turn", "max_tokens"].contains(&message["stop_reason"].as_str().unwrap()));
    let usage = &message["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 5);
    assert!(usage["output_tokens"].as_u64().unwrap() > 0);
    assert_eq!(usage["cache_creation_input_tokens"], 0);

    let mut streamed_body = body(json!({"stream": true}));
    streamed_body["model"] = json!(MODEL_ALIAS);
    let streamed = rebuild(&events(&app, &streamed_body).await);
    assert_eq!(streamed["content"], message["content"]);
    assert_eq!(streamed["stop_reason"], message["stop_reason"]);
    assert_eq!(
        streamed["usage"]["output_tokens"],
        message["usage"]["output_tokens"]
    );
    assert_eq!(streamed["model"], MODEL_ALIAS);
    // Same prompt: the whole prompt either read from the cache or not.
    let whole = |u: &Value| {
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap()
    };
    assert_eq!(whole(&streamed["usage"]), whole(usage));
    assert!(
        streamed["usage"]["cache_read_input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // count_tokens: the same prompt's length.
    let count = json!({"model": MODEL_NAME, "messages": body(json!({}))["messages"]});
    let (status, counted) = post(&app, "/v1/messages/count_tokens", &count, &[]).await;
    assert_eq!(status, StatusCode::OK, "{counted}");
    assert_eq!(counted, json!({"input_tokens": whole(usage)}));
    app.wait_idle().await;
}

#[tokio::test]
async fn stop_sequences_and_prefill() {
    let app = app();
    let (status, message) = post(
        &app,
        "/v1/messages",
        &body(json!({"messages": [{"role": "user", "content": "Count from 1 to 10, separated by commas."},
            {"role": "assistant", "content": "1, 2, 3,"}], "stop_sequences": [" 6"], "max_tokens": 30})),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{message}");
    assert_eq!(message["stop_reason"], "stop_sequence", "{message}");
    assert_eq!(message["stop_sequence"], " 6");
    assert!(!message["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains(" 6"));
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false},
        "cache_control": {"type": "ephemeral"}},
      {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 20}},
        "required": ["tz"], "additionalProperties": false}}])
}

#[tokio::test]
async fn forced_tool_calls_and_a_round_trip() {
    let app = app();
    let forced = body(json!({"tools": weather_tools(), "max_tokens": 120,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tool_choice": {"type": "tool", "name": "get_weather"}}));
    let (status, message) = post(&app, "/v1/messages", &forced, &[]).await;
    assert_eq!(status, StatusCode::OK, "{message}");
    assert_eq!(message["stop_reason"], "tool_use", "{message}");
    let call = message["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].is_string(), "{call}");

    let mut streamed = forced.clone();
    streamed["stream"] = json!(true);
    let rebuilt = rebuild(&events(&app, &streamed).await);
    assert_eq!(rebuilt["stop_reason"], "tool_use");
    let streamed_call = rebuilt["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(streamed_call["input"], call["input"]);

    // `any` with parallel use off: one call.
    let any = body(json!({"tools": weather_tools(), "max_tokens": 120,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}));
    let (status, message) = post(&app, "/v1/messages", &any, &[]).await;
    assert_eq!(status, StatusCode::OK, "{message}");
    let calls = message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .count();
    assert_eq!(calls, 1, "{message}");

    // The round trip: the call and its result in history, then an answer.
    let round_trip = body(json!({"tools": weather_tools(), "max_tokens": 30,
        "tool_choice": {"type": "none"},
        "messages": [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                "content": [{"type": "text", "text": "18 degrees and sunny"}]}]}]}));
    let (status, answer) = post(&app, "/v1/messages", &round_trip, &[]).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["content"][0]["type"], "text", "{answer}");
    assert_ne!(answer["stop_reason"], "tool_use");
    app.wait_idle().await;
}

#[tokio::test]
async fn errors_take_anthropics_shape() {
    let app = TestApp::with_config(|config| config.api_key = Some("sk-test".into()));
    let key = [("x-api-key", "sk-test")];
    let cases: Vec<(Value, StatusCode, &str, &str)> = vec![
        (
            body(json!({"frobnicate": true})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "frobnicate",
        ),
        (
            body(
                json!({"messages": [{"role": "user", "content": [{"type": "image",
            "source": {"type": "url", "url": "http://x"}}]}]}),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "image",
        ),
        (
            body(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "web_search",
        ),
        (
            body(json!({"model": "claude-sonnet-4-5"})),
            StatusCode::NOT_FOUND,
            "not_found_error",
            "claude-sonnet-4-5",
        ),
        (
            body(json!({"messages": [{"role": "user", "content": "word ".repeat(400)}]})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "prompt is too long",
        ),
        (
            body(json!({"max_tokens": 250})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "exceed context limit",
        ),
        (
            body(json!({"temperature": 2})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "temperature",
        ),
        (
            body(json!({"tool_choice": {"type": "any"}})),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "tools",
        ),
    ];
    for (case, expected, kind, needle) in cases {
        let (status, error) = post(&app, "/v1/messages", &case, &key).await;
        let message = assert_anthropic_error(status, &error, expected, kind);
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // Auth: a wrong key (either header) is Anthropic's 401 here, OpenAI's on chat.
    let (status, error) = post(
        &app,
        "/v1/messages",
        &body(json!({})),
        &[("x-api-key", "wrong")],
    )
    .await;
    assert_anthropic_error(
        status,
        &error,
        StatusCode::UNAUTHORIZED,
        "authentication_error",
    );
    let (status, error) = post(&app, "/v1/messages/count_tokens", &json!({}), &[]).await;
    assert_anthropic_error(
        status,
        &error,
        StatusCode::UNAUTHORIZED,
        "authentication_error",
    );
    let bearer = [("authorization", "Bearer sk-test")];
    let (status, message) = post(
        &app,
        "/v1/messages",
        &body(json!({"max_tokens": 2})),
        &bearer,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{message}");
    let chat = app
        .send(
            Request::builder()
                .method(Method::POST)
                .uri("/v1/chat/completions")
                .header("x-api-key", "sk-test")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                        .to_string(),
                ))
                .unwrap(),
        )
        .await;
    assert_eq!(chat.status(), StatusCode::OK);
    let (status, error) = post(
        &app,
        "/v1/messages/count_tokens",
        &json!({"model": MODEL_NAME, "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}]}),
        &key,
    )
    .await;
    let message = assert_anthropic_error(
        status,
        &error,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    );
    assert!(message.contains("max_tokens"), "{message}");
    // The router's own answers take the route's shape too: a wrong method (405) on a
    // Messages route and an unserved path under it (the Message Batches API, 404).
    for (method, path, expected, kind) in [
        (
            Method::GET,
            "/v1/messages",
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/messages/batches",
            StatusCode::NOT_FOUND,
            "not_found_error",
        ),
    ] {
        let response = app
            .send(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .header("x-api-key", "sk-test")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert!(response.headers().contains_key("request-id"), "{path}");
        let (status, text) = text_of(response).await;
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_anthropic_error(status, &error, expected, kind);
    }
    // Still serving, nothing left in the engine.
    let (status, _) = post(&app, "/v1/messages", &body(json!({"max_tokens": 2})), &key).await;
    assert_eq!(status, StatusCode::OK);
    let stats = app.wait_idle().await;
    assert_eq!(stats.kv_cache_usage, 0.0);
}

/// `clear_tool_uses` over HTTP: over the trigger the older results are cleared and the
/// response says how many uses and input tokens; `count_tokens` counts the same prompt; a
/// `clear_at_least` the clearing cannot free leaves the prompt whole and reports no edit.
#[tokio::test]
async fn clear_tool_uses_reports_what_it_freed_and_honours_clear_at_least() {
    let app = app();
    let long_result = "temperature humidity pressure wind ".repeat(12);
    let mut messages = vec![json!({"role": "user", "content": "Check the weather four times."})];
    for id in ["toolu_a", "toolu_b", "toolu_c", "toolu_d"] {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "get_weather", "input": {"city": "Paris"}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": long_result}]}));
    }
    let edit = |at_least: u64| {
        json!({"edits": [{"type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 100},
            "keep": {"type": "tool_uses", "value": 1},
            "clear_at_least": {"type": "input_tokens", "value": at_least}}]})
    };
    let whole = |u: &Value| {
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap()
    };
    let ask = |at_least: u64| {
        body(
            json!({"max_tokens": 4, "messages": messages.clone(), "tools": weather_tools(),
                    "tool_choice": {"type": "none"}, "context_management": edit(at_least)}),
        )
    };
    let count = |at_least: u64| {
        json!({"model": MODEL_NAME, "messages": messages.clone(), "tools": weather_tools(),
               "tool_choice": {"type": "none"}, "context_management": edit(at_least)})
    };

    let (status, cleared) = post(&app, "/v1/messages", &ask(0), &[]).await;
    assert_eq!(status, StatusCode::OK, "{cleared}");
    let edits = &cleared["context_management"]["applied_edits"];
    assert_eq!(edits[0]["type"], "clear_tool_uses_20250919", "{cleared}");
    assert_eq!(edits[0]["cleared_tool_uses"], 3, "{cleared}");
    let freed = edits[0]["cleared_input_tokens"].as_u64().unwrap();
    assert!(freed > 100, "three long results freed only {freed} tokens");
    let (_, counted) = post(&app, "/v1/messages/count_tokens", &count(0), &[]).await;
    assert_eq!(
        counted["input_tokens"].as_u64(),
        Some(whole(&cleared["usage"]))
    );

    let (status, kept) = post(&app, "/v1/messages", &ask(1_000_000), &[]).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(
        kept["context_management"],
        json!({"applied_edits": []}),
        "{kept}"
    );
    assert_eq!(whole(&kept["usage"]), whole(&cleared["usage"]) + freed);
    let (_, counted) = post(&app, "/v1/messages/count_tokens", &count(1_000_000), &[]).await;
    assert_eq!(
        counted["input_tokens"].as_u64(),
        Some(whole(&kept["usage"]))
    );
    app.wait_idle().await;
}
