//! OpenAI's Responses API over the router on the real default model, with an in-memory store:
//! the response object, the event stream (sequence numbers, deltas that make the final
//! object), a conversation continued by `previous_response_id` reading the prefix cache,
//! GET / DELETE / input_items, a background run cancelled (KV blocks freed), custom and
//! namespaced tools (streamed input, regex-held, outputs taken back), and errors in
//! OpenAI's shape.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{assert_error_body, error_param, json_of, sse_events, TestApp, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_engine::KvCacheSizing;
use tokenmill_protocol::ToolSettings;
use tokenmill_response_store::{ResponseStore, StoreLimits};

fn app() -> TestApp {
    TestApp::with_engine_config(
        |engine| {
            engine.max_model_len = Some(1024);
            engine.kv_cache = KvCacheSizing::Bytes(128 << 20);
        },
        |server| {
            server.response_store = Some(Arc::new(
                ResponseStore::in_memory(StoreLimits::default()).unwrap(),
            ));
        },
    )
}

fn body(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL_NAME, "max_output_tokens": 12, "temperature": 0,
        "input": "Name three colors.",
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

async fn call(app: &TestApp, method: Method, path: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    json_of(app.send(request).await).await
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().iter())
        .map(|part| part["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_streamed_stored_continued_and_cancelled() {
    let app = app();
    let (status, plain) = app.post_json("/v1/responses", &body(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    assert!(plain["id"].as_str().unwrap().starts_with("resp_"));
    assert!(matches!(
        plain["status"].as_str(),
        Some("completed" | "incomplete")
    ));
    let text = output_text(&plain);
    assert!(!text.is_empty());

    // Streamed: numbered events whose deltas make the same (greedy) text.
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/responses")
        .header("content-type", "application/json")
        .body(Body::from(body(json!({"stream": true})).to_string()))
        .unwrap();
    let events: Vec<Value> = sse_events(app.send(request).await)
        .await
        .iter()
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], index as u64, "{event}");
    }
    assert_eq!(events[0]["type"], "response.created");
    assert_eq!(events[1]["type"], "response.in_progress");
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    let last = events.last().unwrap();
    assert!(last["type"]
        .as_str()
        .is_some_and(|t| t == "response.completed" || t == "response.incomplete"));
    assert_eq!(deltas, output_text(&last["response"]));
    assert_eq!(deltas, text);

    // Stored: GET gives the same object; input items; a second turn reads the cache.
    let id = plain["id"].as_str().unwrap();
    let (status, fetched) = call(&app, Method::GET, &format!("/v1/responses/{id}")).await;
    assert_eq!((status, &fetched), (StatusCode::OK, &plain));
    let (status, items) = call(
        &app,
        Method::GET,
        &format!("/v1/responses/{id}/input_items?order=asc"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{items}");
    assert_eq!(items["data"][0]["content"][0]["text"], "Name three colors.");
    assert_eq!(items["has_more"], false);
    let facts: String = (0..60).map(|i| format!("fact {i} is true. ")).collect();
    let (_, first) = app
        .post_json("/v1/responses", &body(json!({"input": facts})))
        .await;
    let (status, second) = app
        .post_json(
            "/v1/responses",
            &body(json!({"previous_response_id": first["id"], "input": "And fact 7?"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let cached = second["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 100, "{second}");

    // Deleted: gone.
    let (status, deleted) = call(&app, Method::DELETE, &format!("/v1/responses/{id}")).await;
    assert_eq!(
        (status, deleted["deleted"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    let (status, missing) = call(&app, Method::GET, &format!("/v1/responses/{id}")).await;
    assert_error_body(status, &missing, StatusCode::NOT_FOUND, "deleted");

    // Background: answered at once, cancelled, the engine idle and the cache empty after.
    let (status, started) = app
        .post_json(
            "/v1/responses",
            &body(json!({"background": true, "max_output_tokens": 900, "ignore_eos": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(started["status"], "queued");
    let bid = started["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, cancelled) =
        call(&app, Method::POST, &format!("/v1/responses/{bid}/cancel")).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let stats = app.wait_idle().await;
    assert_eq!(stats.kv_cache_usage, 0.0);
    let (_, after) = call(&app, Method::GET, &format!("/v1/responses/{bid}")).await;
    assert_eq!(after["status"], "cancelled");

    // A background run followed to its end by a replay from a sequence number.
    let (_, short) = app
        .post_json("/v1/responses", &body(json!({"background": true})))
        .await;
    let sid = short["id"].as_str().unwrap();
    let replay = app
        .send(
            Request::builder()
                .uri(format!("/v1/responses/{sid}?stream=true&starting_after=1"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let replayed: Vec<Value> = sse_events(replay)
        .await
        .iter()
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert_eq!(replayed[0]["sequence_number"], 2);
    let replayed_text: String = replayed
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(replayed_text, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_openai_errors_naming_the_field() {
    let app = app();
    let started = Instant::now();
    for (extra, status, param) in [
        (json!({"frobnicate": 1}), StatusCode::BAD_REQUEST, None),
        (
            json!({"input": [{"type": "file_search_call", "id": "x"}]}),
            StatusCode::BAD_REQUEST,
            Some("input[0].type"),
        ),
        (
            json!({"previous_response_id": "resp_nope"}),
            StatusCode::NOT_FOUND,
            Some("previous_response_id"),
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}),
            StatusCode::BAD_REQUEST,
            Some("input"),
        ),
        (
            json!({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}),
            StatusCode::BAD_REQUEST,
            Some("tool_choice"),
        ),
        (
            json!({"input": "word ".repeat(3000)}),
            StatusCode::BAD_REQUEST,
            Some("input"),
        ),
    ] {
        let (got, error) = app.post_json("/v1/responses", &body(extra.clone())).await;
        assert_error_body(got, &error, status, &extra.to_string());
        if let Some(param) = param {
            assert_eq!(error_param(&error), Some(param), "{error}");
        }
    }
    let (status, error) = call(&app, Method::POST, "/v1/responses/resp_nope/cancel").await;
    assert_error_body(status, &error, StatusCode::NOT_FOUND, "cancel unknown");
    let (status, error) = call(
        &app,
        Method::GET,
        "/v1/responses/resp_nope/input_items?limit=0",
    )
    .await;
    assert_error_body(status, &error, StatusCode::BAD_REQUEST, "limit 0");
    let stats = app.wait_idle().await;
    assert_eq!(stats.kv_cache_usage, 0.0);
    assert!(started.elapsed() < Duration::from_secs(60));
}

fn tool_app(parser: &str) -> TestApp {
    TestApp::with_engine_config(
        |engine| {
            engine.max_model_len = Some(1024);
            engine.kv_cache = KvCacheSizing::Bytes(128 << 20);
        },
        |server| {
            server.response_store = Some(Arc::new(
                ResponseStore::in_memory(StoreLimits::default()).unwrap(),
            ));
            server.tools = ToolSettings {
                enable_auto_tool_choice: true,
                tool_call_parser: Some(parser.to_string()),
                exclude_tools_when_tool_choice_none: false,
            };
        },
    )
}

async fn stream_events(app: &TestApp, body: &Value) -> Vec<Value> {
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/responses")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    sse_events(app.send(request).await)
        .await
        .iter()
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_tools_stream_their_input_and_take_their_outputs_back() {
    let app = tool_app("generic");
    let shout = json!({"type": "custom", "name": "shout", "description": "Shouts a word.",
        "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{3,8}"}});
    let forced = body(json!({
        "stream": true, "max_output_tokens": 40,
        "input": "Shout the word hello.",
        "tools": [shout.clone()],
        "tool_choice": {"type": "custom", "name": "shout"},
        "include": ["reasoning.encrypted_content"], "store": false,
        "prompt_cache_key": "session-1", "client_metadata": {"session_id": "s"},
    }));
    let events = stream_events(&app, &forced).await;
    let names: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(
        names.contains(&"response.custom_tool_call_input.done"),
        "{names:?}"
    );
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.custom_tool_call_input.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{last}");
    assert_eq!(last["response"]["prompt_cache_key"], "session-1");
    let call = &last["response"]["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{call}");
    assert_eq!(call["name"], "shout");
    assert!(call["id"].as_str().unwrap().starts_with("ctc_"));
    let input = call["input"].as_str().unwrap();
    assert_eq!(deltas, input);
    assert!(
        (3..=8).contains(&input.len()) && input.chars().all(|c| c.is_ascii_uppercase()),
        "the regex holds: {input:?}"
    );
    let done = events
        .iter()
        .find(|e| e["type"] == "response.custom_tool_call_input.done")
        .unwrap();
    assert_eq!(done["input"], input);
    assert_eq!(done["item_id"], call["id"]);

    // The call and its output go back as input items (store: false, so no previous id).
    let (status, answered) = app
        .post_json(
            "/v1/responses",
            &body(json!({
                "tools": [shout.clone()],
                "input": [
                    {"role": "user", "content": "Shout the word hello."},
                    call.clone(),
                    {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "HELLO!"},
                ],
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answered}");

    // A namespaced function comes back with its namespace and bare name.
    let (status, spawned) = app
        .post_json(
            "/v1/responses",
            &body(json!({
                "max_output_tokens": 40,
                "tools": [{"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                    {"type": "function", "name": "spawn", "parameters": {"type": "object",
                        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
                        "required": ["n"], "additionalProperties": false}}]}],
                "tool_choice": "required",
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{spawned}");
    let call = &spawned["output"][0];
    assert_eq!(
        (&call["type"], &call["name"], &call["namespace"]),
        (&json!("function_call"), &json!("spawn"), &json!("agents")),
        "{spawned}"
    );

    // Where the input could not be held to the regex, or the grammar is Lark: 400s.
    let hermes = tool_app("hermes");
    for (app, tools, param) in [
        (&hermes, json!([shout]), "tools[0].format"),
        (
            &app,
            json!([{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"a\""}}]),
            "tools[0].format.syntax",
        ),
    ] {
        let (status, error) = app
            .post_json("/v1/responses", &body(json!({"tools": tools})))
            .await;
        assert_error_body(status, &error, StatusCode::BAD_REQUEST, param);
        assert_eq!(error_param(&error), Some(param), "{error}");
    }
    let stats = app.wait_idle().await;
    assert_eq!(stats.kv_cache_usage, 0.0);
}
