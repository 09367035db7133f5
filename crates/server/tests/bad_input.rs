//! The bad-input battery: malformed, mistyped, out-of-range and oversized requests each get
//! the right status and an OpenAI error body, none of them panics the server or leaks KV
//! blocks, and the server is healthy afterwards. Plus the auth and drain error paths.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::{assert_error_body, error_param, json_of, json_request, TestApp, MODEL_NAME};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// One battery case: where to send what, and what must come back.
struct Case {
    name: &'static str,
    path: &'static str,
    body: Vec<u8>,
    status: StatusCode,
    /// `Some(p)`: the error names `p` (`Some(None)`: names nothing); `None`: not checked.
    param: Option<Option<&'static str>>,
}

fn case(
    name: &'static str,
    path: &'static str,
    body: impl Into<Vec<u8>>,
    status: StatusCode,
    param: Option<Option<&'static str>>,
) -> Case {
    Case {
        name,
        path,
        body: body.into(),
        status,
        param,
    }
}

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";
const BAD: StatusCode = StatusCode::BAD_REQUEST;

/// The server's `--max-n` in the battery.
const MAX_N: u32 = 4;
/// The server's body limit in the battery.
const MAX_BODY_BYTES: usize = 64 << 10;

fn completion(extra: Value) -> String {
    let mut body = json!({"model": MODEL_NAME, "prompt": "Hello there", "max_tokens": 2});
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body.to_string()
}

fn chat(extra: Value) -> String {
    let mut body = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 2,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body.to_string()
}

fn battery() -> Vec<Case> {
    let long_prompt = "word ".repeat(400);
    let deep_nesting = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let oversized = completion(json!({"prompt": "x".repeat(MAX_BODY_BYTES + 1)}));
    vec![
        // Malformed bodies.
        case("not JSON", COMPLETIONS, "{not json", BAD, Some(None)),
        case("empty body", COMPLETIONS, "", BAD, Some(None)),
        case("JSON array body", COMPLETIONS, "[]", BAD, Some(None)),
        case(
            "positional array body",
            CHAT,
            json!([MODEL_NAME, [{"role": "user", "content": "hi"}]]).to_string(),
            BAD,
            Some(None),
        ),
        case(
            "JSON string body",
            "/tokenize",
            "\"hello\"",
            BAD,
            Some(None),
        ),
        case(
            "truncated JSON",
            CHAT,
            r#"{"messages": [{"role": "user""#,
            BAD,
            Some(None),
        ),
        case(
            "invalid UTF-8",
            COMPLETIONS,
            &b"{\"prompt\": \"\xff\xfe\"}"[..],
            BAD,
            None,
        ),
        case(
            "nesting past the parser's depth",
            COMPLETIONS,
            deep_nesting,
            BAD,
            Some(None),
        ),
        // Wrong types.
        case(
            "prompt is a number",
            COMPLETIONS,
            completion(json!({"prompt": 5})),
            BAD,
            None,
        ),
        case(
            "max_tokens is a word",
            COMPLETIONS,
            completion(json!({"max_tokens": "ten"})),
            BAD,
            None,
        ),
        case(
            "max_tokens is fractional",
            COMPLETIONS,
            completion(json!({"max_tokens": 2.5})),
            BAD,
            None,
        ),
        case(
            "temperature is a string",
            COMPLETIONS,
            completion(json!({"temperature": "hot"})),
            BAD,
            None,
        ),
        case(
            "stream is a string",
            CHAT,
            chat(json!({"stream": "yes"})),
            BAD,
            None,
        ),
        case(
            "negative token id",
            COMPLETIONS,
            completion(json!({"prompt": [1, -1]})),
            BAD,
            None,
        ),
        case(
            "messages is a string",
            CHAT,
            chat(json!({"messages": "hi"})),
            BAD,
            None,
        ),
        case(
            "message content is a number",
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": 5}]})),
            BAD,
            None,
        ),
        case(
            "unknown role",
            CHAT,
            chat(json!({"messages": [{"role": "wizard", "content": "hi"}]})),
            BAD,
            None,
        ),
        case(
            "stop is a number",
            COMPLETIONS,
            completion(json!({"stop": 7})),
            BAD,
            None,
        ),
        // Missing or empty input.
        case(
            "no prompt",
            COMPLETIONS,
            json!({"max_tokens": 2}).to_string(),
            BAD,
            Some(Some("prompt")),
        ),
        case(
            "empty prompt list",
            COMPLETIONS,
            completion(json!({"prompt": []})),
            BAD,
            Some(Some("prompt")),
        ),
        case(
            "empty token list",
            COMPLETIONS,
            completion(json!({"prompt": [[]]})),
            BAD,
            Some(Some("prompt")),
        ),
        case(
            "no messages",
            CHAT,
            json!({"max_tokens": 2}).to_string(),
            BAD,
            Some(None),
        ),
        case(
            "empty messages",
            CHAT,
            chat(json!({"messages": []})),
            BAD,
            Some(Some("messages")),
        ),
        case(
            "message without content",
            CHAT,
            chat(json!({"messages": [{"role": "user"}]})),
            BAD,
            Some(Some("messages")),
        ),
        case(
            "image content part",
            CHAT,
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
            ),
            BAD,
            Some(Some("messages")),
        ),
        // Context length.
        case(
            "max_tokens past the context",
            COMPLETIONS,
            completion(json!({"max_tokens": 300})),
            BAD,
            Some(Some("max_tokens")),
        ),
        case(
            "max_completion_tokens past the context",
            CHAT,
            chat(json!({"max_completion_tokens": 1000})),
            BAD,
            Some(Some("max_completion_tokens")),
        ),
        case(
            "prompt longer than the context",
            COMPLETIONS,
            completion(json!({"prompt": long_prompt.clone()})),
            BAD,
            Some(Some("prompt")),
        ),
        case(
            "chat prompt longer than the context",
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": long_prompt}]})),
            BAD,
            Some(Some("messages")),
        ),
        case(
            "token id past the vocabulary",
            COMPLETIONS,
            completion(json!({"prompt": [1, 999_999]})),
            BAD,
            Some(Some("prompt")),
        ),
        // Counts and sampling ranges.
        case(
            "n = 0",
            COMPLETIONS,
            completion(json!({"n": 0})),
            BAD,
            Some(Some("n")),
        ),
        case(
            "n over --max-n",
            COMPLETIONS,
            completion(json!({"n": MAX_N + 1})),
            BAD,
            Some(Some("n")),
        ),
        case(
            "chat n over --max-n",
            CHAT,
            chat(json!({"n": MAX_N + 1, "temperature": 1})),
            BAD,
            Some(Some("n")),
        ),
        case(
            "max_tokens = 0",
            COMPLETIONS,
            completion(json!({"max_tokens": 0})),
            BAD,
            Some(Some("max_tokens")),
        ),
        case(
            "negative max_tokens",
            COMPLETIONS,
            completion(json!({"max_tokens": -5})),
            BAD,
            Some(Some("max_tokens")),
        ),
        case(
            "negative temperature",
            COMPLETIONS,
            completion(json!({"temperature": -1})),
            BAD,
            Some(Some("temperature")),
        ),
        case(
            "top_p = 0",
            COMPLETIONS,
            completion(json!({"top_p": 0})),
            BAD,
            Some(Some("top_p")),
        ),
        case(
            "top_p above 1",
            CHAT,
            chat(json!({"top_p": 1.5})),
            BAD,
            Some(Some("top_p")),
        ),
        case(
            "top_k = -2",
            COMPLETIONS,
            completion(json!({"top_k": -2})),
            BAD,
            Some(Some("top_k")),
        ),
        case(
            "min_p above 1",
            COMPLETIONS,
            completion(json!({"min_p": 2})),
            BAD,
            Some(Some("min_p")),
        ),
        case(
            "repetition_penalty = 0",
            COMPLETIONS,
            completion(json!({"repetition_penalty": 0})),
            BAD,
            Some(Some("repetition_penalty")),
        ),
        case(
            "presence_penalty above 2",
            CHAT,
            chat(json!({"presence_penalty": 3})),
            BAD,
            Some(Some("presence_penalty")),
        ),
        case(
            "frequency_penalty below -2",
            COMPLETIONS,
            completion(json!({"frequency_penalty": -3})),
            BAD,
            Some(Some("frequency_penalty")),
        ),
        case(
            "logprobs above 20",
            COMPLETIONS,
            completion(json!({"logprobs": 21})),
            BAD,
            Some(Some("logprobs")),
        ),
        case(
            "top_logprobs without logprobs",
            CHAT,
            chat(json!({"top_logprobs": 3})),
            BAD,
            Some(Some("top_logprobs")),
        ),
        case(
            "top_logprobs above 20",
            CHAT,
            chat(json!({"logprobs": true, "top_logprobs": 30})),
            BAD,
            Some(Some("top_logprobs")),
        ),
        case(
            "seed past 64 bits",
            COMPLETIONS,
            completion(json!({})).replacen('{', "{\"seed\": 1180591620717411303424,", 1),
            BAD,
            Some(Some("seed")),
        ),
        case(
            "min_tokens above max_tokens",
            COMPLETIONS,
            completion(json!({"min_tokens": 5, "max_tokens": 2})),
            BAD,
            Some(Some("min_tokens")),
        ),
        case(
            "best_of below n",
            COMPLETIONS,
            completion(json!({"n": 2, "best_of": 1, "temperature": 1})),
            BAD,
            Some(Some("best_of")),
        ),
        case(
            "logit_bias key not a token id",
            COMPLETIONS,
            completion(json!({"logit_bias": {"abc": 1}})),
            BAD,
            Some(Some("logit_bias")),
        ),
        case(
            "logit_bias value out of range",
            CHAT,
            chat(json!({"logit_bias": {"5": 500}})),
            BAD,
            Some(Some("logit_bias")),
        ),
        case(
            "stop_token_ids past the vocabulary",
            COMPLETIONS,
            completion(json!({"stop_token_ids": [99_999_999]})),
            BAD,
            Some(Some("stop_token_ids")),
        ),
        case(
            "beam search",
            COMPLETIONS,
            completion(json!({"use_beam_search": true})),
            BAD,
            Some(Some("use_beam_search")),
        ),
        case(
            "bad error in a stream request is still JSON",
            COMPLETIONS,
            completion(json!({"stream": true, "temperature": -1})),
            BAD,
            Some(Some("temperature")),
        ),
        // Templates.
        case(
            "template syntax error",
            CHAT,
            chat(json!({"chat_template": "{% for %}"})),
            BAD,
            Some(Some("messages")),
        ),
        case(
            "template raises",
            CHAT,
            chat(json!({"chat_template": "{{ raise_exception('no system prompts') }}"})),
            BAD,
            Some(Some("messages")),
        ),
        case(
            "continue_final_message after a user turn",
            CHAT,
            chat(json!({"continue_final_message": true, "add_generation_prompt": false})),
            BAD,
            Some(Some("continue_final_message")),
        ),
        case(
            "continue_final_message with a generation prompt",
            CHAT,
            chat(
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "continue_final_message": true, "add_generation_prompt": true}),
            ),
            BAD,
            Some(Some("continue_final_message")),
        ),
        case(
            "forced tool choice",
            CHAT,
            chat(json!({"tool_choice": "required"})),
            BAD,
            Some(Some("tool_choice")),
        ),
        // Other routes.
        case(
            "tokenize without input",
            "/tokenize",
            json!({"add_special_tokens": true}).to_string(),
            BAD,
            Some(None),
        ),
        case(
            "detokenize past the vocabulary",
            "/detokenize",
            json!({"tokens": [1, 999_999]}).to_string(),
            BAD,
            Some(Some("tokens")),
        ),
        case(
            "detokenize tokens are strings",
            "/detokenize",
            json!({"tokens": ["a"]}).to_string(),
            BAD,
            Some(None),
        ),
        // Unknown model, oversized body.
        case(
            "unknown model",
            COMPLETIONS,
            completion(json!({"model": "gpt-4"})),
            StatusCode::NOT_FOUND,
            Some(Some("model")),
        ),
        case(
            "chat unknown model",
            CHAT,
            chat(json!({"model": "gpt-4"})),
            StatusCode::NOT_FOUND,
            Some(Some("model")),
        ),
        case(
            "tokenize unknown model",
            "/tokenize",
            json!({"model": "gpt-4", "prompt": "hi"}).to_string(),
            StatusCode::NOT_FOUND,
            Some(Some("model")),
        ),
        case(
            "body over the limit",
            COMPLETIONS,
            oversized.clone(),
            StatusCode::PAYLOAD_TOO_LARGE,
            Some(None),
        ),
        case(
            "chat body over the limit",
            CHAT,
            chat(json!({"messages": [{"role": "user", "content": "y".repeat(MAX_BODY_BYTES)}]})),
            StatusCode::PAYLOAD_TOO_LARGE,
            Some(None),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_battery() {
    let app = TestApp::with_config(|config| {
        config.max_n = MAX_N;
        config.max_body_bytes = MAX_BODY_BYTES;
        config.trust_request_chat_template = true;
    });
    let cases = battery();
    assert!(cases.len() >= 30, "the battery has {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let (status, body) = app.post_raw(case.path, case.body.clone()).await;
        let outcome = std::panic::catch_unwind(|| {
            assert_error_body(status, &body, case.status, case.name);
            if let Some(param) = case.param {
                assert_eq!(
                    error_param(&body),
                    param,
                    "{}: param; body {body}",
                    case.name
                );
            }
        });
        if outcome.is_err() {
            failures.push(format!("{}: got {status} {body}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );

    // Nothing above may have left work or blocks behind, and the server is still healthy.
    let (status, body) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stats = app.wait_idle().await;
    assert_eq!(stats.num_running + stats.num_waiting, 0);
    assert_eq!(stats.kv_cache_usage, 0.0);
    assert_eq!(app.state.in_flight(), 0);

    // And it still generates.
    let (status, body) = app
        .post_json(COMPLETIONS, &json!({"prompt": "Hello", "max_tokens": 2}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_and_accepted_extras_are_not_errors() {
    let app = TestApp::start();
    let accepted = [
        (
            COMPLETIONS,
            completion(json!({"frobnicate": true, "nested": {"a": [1, 2]}})),
        ),
        (
            CHAT,
            chat(json!({"unknown_field": 1, "user": "someone", "metadata": {"k": "v"}})),
        ),
        (
            CHAT,
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}], "extra": 1}]}),
            ),
        ),
        (COMPLETIONS, completion(json!({"max_tokens": 2.0}))),
        (COMPLETIONS, completion(json!({"model": null}))),
        (
            COMPLETIONS,
            completion(
                // A non-zero priority needs --scheduling-policy priority (hardening.rs).
                json!({"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": true,
                              "min_tokens": 2, "priority": 0, "request_id": "abc", "cache_salt": "s",
                              "return_token_ids": true, "skip_special_tokens": false, "seed": 7}),
            ),
        ),
    ];
    for (path, body) in accepted {
        let (status, response) = app.post_raw(path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body} -> {response}");
    }
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_everything_but_health_and_metrics() {
    let app = TestApp::with_config(|config| config.api_key = Some("sekrit".to_string()));
    let body = json!({"prompt": "Hi", "max_tokens": 1});
    for (key, expected) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("wrong"), StatusCode::UNAUTHORIZED),
        (Some("sekrit "), StatusCode::UNAUTHORIZED),
        (Some("sekrit"), StatusCode::OK),
    ] {
        let (status, response) = json_of(
            app.send(json_request(Method::POST, COMPLETIONS, &body, key))
                .await,
        )
        .await;
        if expected == StatusCode::OK {
            assert_eq!(status, expected, "{response}");
        } else {
            assert_error_body(status, &response, expected, &format!("key {key:?}"));
        }
    }
    // A non-Bearer scheme is refused even with the right secret.
    let request = Request::builder()
        .method(Method::GET)
        .uri("/v1/models")
        .header(header::AUTHORIZATION, "Basic sekrit")
        .body(Body::empty())
        .unwrap();
    let (status, response) = json_of(app.send(request).await).await;
    assert_error_body(status, &response, StatusCode::UNAUTHORIZED, "basic auth");
    for path in ["/v1/models", "/version", "/openapi.json", "/no-such-route"] {
        let (status, text) = app.get(path).await;
        assert_error_body(
            status,
            &serde_json::from_str(&text).unwrap(),
            StatusCode::UNAUTHORIZED,
            path,
        );
    }
    for path in ["/tokenize", "/detokenize", CHAT] {
        let (status, response) = app.post_json(path, &json!({})).await;
        assert_error_body(status, &response, StatusCode::UNAUTHORIZED, path);
    }
    let (status, _) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.get("/metrics").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "/metrics is open without --api-key-metrics"
    );
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_metrics_guards_metrics() {
    let app = TestApp::with_config(|config| {
        config.api_key = Some("sekrit".to_string());
        config.api_key_metrics = true;
    });
    let (status, text) = app.get("/metrics").await;
    assert_error_body(
        status,
        &serde_json::from_str(&text).unwrap(),
        StatusCode::UNAUTHORIZED,
        "/metrics",
    );
    let request = Request::builder()
        .uri("/metrics")
        .header(header::AUTHORIZATION, "Bearer sekrit")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(request).await.status(), StatusCode::OK);
    let (status, _) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_server_answers_503() {
    let app = TestApp::start();
    app.state.start_draining();
    for (path, body) in [
        (COMPLETIONS, completion(json!({}))),
        (CHAT, chat(json!({"stream": true}))),
    ] {
        let (status, response) = app.post_raw(path, body).await;
        assert_error_body(status, &response, StatusCode::SERVICE_UNAVAILABLE, path);
    }
    let (status, text) = app.get("/health").await;
    assert_error_body(
        status,
        &serde_json::from_str(&text).unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "/health",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_engine_answers_503() {
    let mut app = TestApp::start();
    app.shutdown_engine();
    assert!(!app.state.engine().is_alive());
    for (path, body) in [
        (COMPLETIONS, completion(json!({}))),
        (CHAT, chat(json!({"stream": true}))),
    ] {
        let (status, response) = app.post_raw(path, body).await;
        assert_error_body(status, &response, StatusCode::SERVICE_UNAVAILABLE, path);
    }
    let (status, text) = app.get("/health").await;
    assert_error_body(
        status,
        &serde_json::from_str(&text).unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
        "/health with a stopped engine",
    );
}

/// Issue 43: a request's own chat template is a program. It is refused unless the operator
/// trusts them (vLLM's `--trust-request-chat-template`); trusted, it runs off the async
/// runtime under the template engine's fuel and output limits, each breach a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_chat_templates_need_trust_and_stay_bounded() {
    let chat_with = |template: &str| {
        json!({"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 1, "chat_template": template})
    };
    let untrusted = TestApp::start();
    let (status, body) = untrusted
        .post_json("/v1/chat/completions", &chat_with("{{ 'x' }}"))
        .await;
    assert_error_body(status, &body, StatusCode::BAD_REQUEST, "untrusted template");
    assert_eq!(error_param(&body), Some("chat_template"));
    let (status, body) = untrusted
        .post_json(
            "/tokenize",
            &json!({"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                    "chat_template": "{{ 'x' }}"}),
        )
        .await;
    assert_error_body(status, &body, StatusCode::BAD_REQUEST, "untrusted template");

    let trusted = TestApp::with_config(|config| config.trust_request_chat_template = true);
    for (template, limit) in [
        (
            "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}\
             {% endfor %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        ("{{ messages[0].content | indent(1000000000) }}", "limit"),
        (
            "{% for a in range(1000) %}{% for b in range(100) %}{{ 'x' * 1000 }}\
             {% endfor %}{% endfor %}",
            "bytes",
        ),
    ] {
        let started = Instant::now();
        let (status, body) = trusted
            .post_json("/v1/chat/completions", &chat_with(template))
            .await;
        assert_error_body(status, &body, StatusCode::BAD_REQUEST, template);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(limit), "{template}: {message}");
        assert!(started.elapsed() < Duration::from_secs(10), "{template}");
        let (status, _) = trusted.get("/health").await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = trusted
        .post_json(
            "/v1/chat/completions",
            &chat_with("{% for m in messages %}{{ m.content }}{% endfor %}"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
