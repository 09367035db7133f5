//! Every route of the router, in-process over a real engine: the happy path of each, the 404
//! fallback, wrong methods, and `/metrics` after traffic.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{
    assert_error_body, json_of, sse_events, TestApp, MAX_MODEL_LEN, MODEL_ALIAS, MODEL_NAME,
};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers() {
    let app = TestApp::start();

    let (status, body) = app.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["object"], "list");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|card| card["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [MODEL_NAME, MODEL_ALIAS]);
    assert_eq!(models["data"][0]["max_model_len"], MAX_MODEL_LEN);
    // The default model is a Llama-family GGUF.
    assert_eq!(models["data"][0]["architecture"], "llama");

    let (status, body) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = app.get("/ping").await;
    assert_eq!(status, StatusCode::OK);

    let (status, body) = app.get("/version").await;
    assert_eq!(status, StatusCode::OK);
    let version: Value = serde_json::from_str(&body).unwrap();
    assert!(version["version"].is_string(), "{version}");

    let (status, body) = app.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let spec: Value = serde_json::from_str(&body).unwrap();
    for path in [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/version",
    ] {
        assert!(spec["paths"][path].is_object(), "the spec lists {path}");
    }

    let (status, completion) = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["object"], "text_completion");
    assert_eq!(completion["model"], MODEL_NAME);
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
    assert_eq!(completion["usage"]["completion_tokens"], 4);
    assert!(completion["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());

    // The alias is served too, and is what the response reports.
    let (status, chat) = app
        .post_json(
            "/v1/chat/completions",
            &json!({"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["model"], MODEL_ALIAS);
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    assert!(chat["choices"][0]["message"]["content"].is_string());

    let (status, tokens) = app
        .post_json(
            "/tokenize",
            &json!({"prompt": "Hello world", "add_special_tokens": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(tokens["max_model_len"], MAX_MODEL_LEN);
    assert_eq!(tokens["count"], tokens["tokens"].as_array().unwrap().len());
    let (status, text) = app
        .post_json("/detokenize", &json!({"tokens": tokens["tokens"]}))
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text["prompt"], "Hello world");

    let (status, chat_tokens) = app
        .post_json(
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "Hello"}], "return_token_strs": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{chat_tokens}");
    assert_eq!(
        chat_tokens["token_strs"].as_array().unwrap().len(),
        chat_tokens["count"].as_u64().unwrap() as usize
    );

    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_get_openai_errors() {
    let app = TestApp::start();
    for path in [
        "/",
        "/v1",
        "/v1/engines",
        "/v2/completions",
        "/v1/completions/extra",
        "/metrics/x",
    ] {
        let request = Request::builder().uri(path).body(Body::empty()).unwrap();
        let (status, body) = json_of(app.send(request).await).await;
        assert_error_body(status, &body, StatusCode::NOT_FOUND, path);
    }
    let wrong_methods = [
        (Method::GET, "/v1/completions"),
        (Method::GET, "/v1/chat/completions"),
        (Method::POST, "/v1/models"),
        (Method::DELETE, "/health"),
        (Method::PUT, "/tokenize"),
    ];
    for (method, path) in wrong_methods {
        let case = format!("{method} {path}");
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let (status, body) = json_of(app.send(request).await).await;
        assert_error_body(status, &body, StatusCode::METHOD_NOT_ALLOWED, &case);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_routes_send_sse_with_usage_and_done() {
    let app = TestApp::start();
    let request = common::json_request(
        Method::POST,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 6, "temperature": 0, "stream": true,
            "stream_options": {"include_usage": true},
        }),
        None,
    );
    let response = app.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let events = sse_events(response).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(
        usage["choices"].as_array().unwrap().len(),
        0,
        "usage chunk has no choices"
    );
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert!(finish == "length" || finish == "stop", "{finish}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let completion_tokens = usage["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=6).contains(&completion_tokens), "{usage}");
    assert!(!text.is_empty());

    let request = common::json_request(
        Method::POST,
        "/v1/completions",
        &json!({"prompt": "One, two,", "max_tokens": 5, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
        None,
    );
    let events = sse_events(app.send(request).await).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let streamed: String = events[..events.len() - 2]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();

    // Streaming and non-streaming greedy output agree.
    let (_, whole) = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "One, two,", "max_tokens": 5, "temperature": 0}),
        )
        .await;
    assert_eq!(whole["choices"][0]["text"].as_str().unwrap(), streamed);
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_stream_frees_the_engine() {
    use futures::StreamExt;
    let app = TestApp::start();
    let mut bodies = Vec::new();
    for _ in 0..4 {
        let request = common::json_request(
            Method::POST,
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": true, "stream": true}),
            None,
        );
        let response = app.send(request).await;
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body().into_data_stream();
        // Wait until generation has really started, then keep the body open.
        let first = body.next().await.expect("a first chunk").unwrap();
        assert!(!first.is_empty());
        bodies.push(body);
    }
    assert!(app.state.in_flight() > 0);
    drop(bodies);
    let stats = app.wait_idle().await;
    assert_eq!(stats.num_running, 0);
    // The in-flight count follows once the streaming tasks notice the disconnect.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while app.state.in_flight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "in-flight requests never ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborting_in_flight_requests_ends_their_streams_cleanly() {
    use futures::StreamExt;
    let app = TestApp::start();
    let request = common::json_request(
        Method::POST,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 200, "ignore_eos": true, "stream": true}),
        None,
    );
    let response = app.send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body().into_data_stream();
    // The role chunk, then at least one generated chunk.
    let mut seen = String::new();
    while seen.matches("data: ").count() < 2 {
        let chunk = body.next().await.expect("stream continues").unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert_eq!(app.state.abort_in_flight(), 1);
    while let Some(chunk) = body.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let events: Vec<&str> = seen
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let last: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "abort", "{seen}");
    app.wait_idle().await;
    assert_eq!(
        app.state.abort_in_flight(),
        0,
        "finished requests are forgotten"
    );
}

/// `--kv-cache-dtype fp8` serves (over an fp8 E4M3 cache) and `vllm:cache_config_info` reports
/// the value as given, as vLLM does; the pool is sized at one byte per element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fp8_kv_cache_serves_and_is_reported_in_cache_config_info() {
    let app = TestApp::with_engine_config(
        |engine| engine.kv_cache_dtype = tokenmill_engine::CacheDtype::Fp8,
        |_| {},
    );
    let (status, body) = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0.0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body["choices"][0]["text"].as_str().unwrap().is_empty());
    let stats = app.wait_idle().await;
    let (status, text) = app.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let info = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap_or_else(|| panic!("no cache_config_info in:\n{text}"));
    assert!(info.contains("cache_dtype=\"fp8\""), "{info}");
    // SmolLM2-135M: 30 layers, 3 kv heads of 64; one byte per element.
    let fp8_blocks = (32u64 << 20) / (2 * 30 * 16 * 3 * 64);
    assert_eq!(stats.num_blocks as u64, fp8_blocks, "{info}");
    assert!(
        info.contains(&format!("num_gpu_blocks=\"{fp8_blocks}\"")),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_vllm_names_after_a_request() {
    let app = TestApp::start();
    let (status, _) = app
        .post_json(
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.get("/no/such/route").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.wait_idle().await;
    let (status, text) = app.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}:\n{text}");
    }
    assert!(
        text.contains(&format!("model_name=\"{MODEL_NAME}\"")),
        "metrics carry the served name"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("vllm:cache_config_info{") && l.contains("cache_dtype=\"auto\"")),
        "the default cache dtype is reported as vLLM's `auto`:\n{text}"
    );
    let success: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("vllm:request_success_total{") && l.contains("finished_reason=\"length\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(success, 1.0, "one request finished by length:\n{text}");
    assert!(
        text.contains("http_requests_total") || text.contains("http_request_duration"),
        "HTTP metrics are recorded:\n{text}"
    );
    // Routes are labelled by their path; unknown paths share one label.
    assert!(
        text.lines()
            .any(|l| l.starts_with("http_requests_total{")
                && l.contains("handler=\"/v1/completions\"")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("http_requests_total{") && l.contains("handler=\"none\"")),
        "{text}"
    );
}
