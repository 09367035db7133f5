//! Tool calling and reasoning over HTTP on the real default model: forced calls (generic
//! envelope), a native parser and a reasoning parser fed by a constrained output (a `choice`
//! that makes the model write a known hermes / `<think>` text), streamed deltas checked
//! against the non-streamed response, and the 400s.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::http::{Method, StatusCode};
use common::{error_param, json_request, sse_events, TestApp, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_engine::KvCacheSizing;
use tokenmill_protocol::ToolSettings;

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 20}},
        "required": ["tz"], "additionalProperties": false}}}])
}

fn app(parser: Option<&str>, reasoning: Option<&str>) -> TestApp {
    TestApp::with_engine_config(
        |engine| {
            engine.max_model_len = Some(1024);
            engine.kv_cache = KvCacheSizing::Bytes(128 << 20);
        },
        |config| {
            config.tools = ToolSettings {
                enable_auto_tool_choice: parser.is_some(),
                tool_call_parser: parser.map(str::to_string),
                exclude_tools_when_tool_choice_none: false,
            };
            config.reasoning_parser = reasoning.map(str::to_string);
        },
    )
}

fn body(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": tools(), "max_tokens": 200, "temperature": 0,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

/// The message of a non-streamed request.
async fn message(app: &TestApp, extra: Value) -> (Value, String) {
    let (status, response) = app.post_json("/v1/chat/completions", &body(extra)).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let choice = &response["choices"][0];
    (
        choice["message"].clone(),
        choice["finish_reason"].as_str().unwrap().to_string(),
    )
}

/// The same request streamed, rebuilt into a message; every delta is checked: a call's first
/// delta has index, id, type and name, later ones only argument fragments; reasoning comes
/// under both names.
async fn streamed_message(app: &TestApp, extra: Value) -> (Value, String) {
    let mut request = body(extra);
    request["stream"] = json!(true);
    let response = app
        .send(json_request(
            Method::POST,
            "/v1/chat/completions",
            &request,
            None,
        ))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut content: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = String::new();
    for event in sse_events(response).await {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str() {
            if !text.is_empty() {
                content.get_or_insert_with(String::new).push_str(text);
            }
        }
        if let Some(text) = delta["reasoning"].as_str() {
            assert_eq!(delta["reasoning_content"].as_str(), Some(text));
            reasoning.get_or_insert_with(String::new).push_str(text);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
                assert_eq!(call["type"], "function");
                assert!(call["function"]["name"].is_string());
                calls.push(json!({"id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"].as_str().unwrap_or("")}}));
            } else {
                assert!(
                    index + 1 == calls.len(),
                    "fragments belong to the open call: {call}"
                );
                assert!(
                    call.get("id").is_none()
                        && call.get("type").is_none()
                        && call["function"].get("name").is_none(),
                    "{call}"
                );
                let arguments = format!(
                    "{}{}",
                    calls[index]["function"]["arguments"].as_str().unwrap(),
                    call["function"]["arguments"].as_str().unwrap()
                );
                calls[index]["function"]["arguments"] = json!(arguments);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_string();
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(reasoning) = reasoning {
        message["reasoning"] = json!(reasoning);
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    (message, finish)
}

/// Streamed and not, the same message (call ids aside).
async fn both_ways(app: &TestApp, extra: Value) -> (Value, String) {
    let (mut whole, finish) = message(app, extra.clone()).await;
    let (mut streamed, streamed_finish) = streamed_message(app, extra).await;
    assert_eq!(finish, streamed_finish);
    for message in [&mut whole, &mut streamed] {
        for call in message["tool_calls"].as_array_mut().into_iter().flatten() {
            call["id"] = json!("call_x");
        }
    }
    assert_eq!(whole, streamed);
    (whole, finish)
}

fn arguments(call: &Value) -> Value {
    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn forced_calls_follow_the_schema_streamed_and_not() {
    let app = app(None, None);
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let (message, finish) = both_ways(&app, named).await;
    assert_eq!(finish, "tool_calls");
    assert!(message["content"].is_null());
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args = arguments(&calls[0]);
    assert!(
        args["city"].is_string()
            && ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap())
    );

    let (message, finish) = both_ways(
        &app,
        json!({"tool_choice": "required", "parallel_tool_calls": false}),
    )
    .await;
    assert_eq!(finish, "tool_calls");
    assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn generic_auto_answers_text_or_calls() {
    let app = app(Some("generic"), None);
    let (message, finish) = both_ways(
        &app,
        json!({"messages": [{"role": "user", "content": "Say hello."}]}),
    )
    .await;
    // Whichever the model chose, the envelope never leaks into the content.
    match message["tool_calls"].as_array() {
        Some(calls) => {
            assert!(!calls.is_empty() && ["tool_calls", "length"].contains(&finish.as_str()))
        }
        None => assert!(!message["content"].as_str().unwrap().starts_with("{\"")),
    }
}

#[tokio::test]
async fn hermes_output_streams_content_then_parallel_calls() {
    let app = app(Some("hermes"), None);
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\\\" 東京\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
    let forced = json!({"structured_outputs": {"choice": [text]}});
    let (message, finish) = both_ways(&app, forced.clone()).await;
    assert_eq!(finish, "tool_calls");
    assert_eq!(message["content"], "Let me check.\n");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(
        arguments(&calls[0]),
        json!({"city": "Paris \"}\" 東京", "unit": "celsius"})
    );
    assert_eq!(calls[1]["function"]["name"], "get_time");

    let mut single = forced;
    single["parallel_tool_calls"] = json!(false);
    let (message, _) = both_ways(&app, single).await;
    assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn reasoning_then_content_and_calls() {
    let app = app(Some("hermes"), Some("deepseek_r1"));
    let text = "<think>They want the weather. Call <tool_call> later.</think>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";
    let (message, finish) =
        both_ways(&app, json!({"structured_outputs": {"choice": [text]}})).await;
    assert_eq!(
        message["reasoning"],
        "They want the weather. Call <tool_call> later."
    );
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_time");
    // The newline after </think> is content, streamed and not.
    assert_eq!(message["content"], "\n");
    assert_eq!(finish, "tool_calls");

    // A forced call is constrained from the first token: no reasoning to split off.
    let named = json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}});
    let (message, finish) = both_ways(&app, named).await;
    assert_eq!(
        (
            message["tool_calls"][0]["function"]["name"].as_str(),
            finish.as_str()
        ),
        (Some("get_time"), "tool_calls")
    );
    assert!(message.get("reasoning").is_none());

    let (message, _) = both_ways(
        &app,
        json!({"tools": [], "include_reasoning": false, "structured_outputs": {"choice": ["<think>hidden</think>shown"]}}),
    )
    .await;
    assert!(message.get("reasoning").is_none());
    assert_eq!(message["content"], "shown");
}

#[tokio::test]
async fn tool_requests_that_are_400s() {
    let plain = app(None, None);
    let (status, response) = plain
        .post_json("/v1/chat/completions", &body(json!({})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_param(&response), Some("tool_choice"));
    assert!(response["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--enable-auto-tool-choice and --tool-call-parser"));
    let cases = [
        json!({"tool_choice": "required", "response_format": {"type": "json_object"}}),
        json!({"tool_choice": {"type": "function", "function": {"name": "missing"}}}),
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "no-such-type"}}}}}], "tool_choice": "required"}),
    ];
    for (case, param) in cases
        .into_iter()
        .zip(["tool_choice", "tool_choice", "tools"])
    {
        let (status, response) = plain
            .post_json("/v1/chat/completions", &body(case.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{case}: {response}");
        assert_eq!(error_param(&response), Some(param), "{case}: {response}");
    }
}
