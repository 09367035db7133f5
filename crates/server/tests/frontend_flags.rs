//! vLLM's frontend flags on a real engine: CORS, `--root-path`, `--disable-fastapi-docs`,
//! `--return-tokens-as-token-ids`, `--response-role`, `--max-logprobs`, and `--seed` on the
//! engine.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::{json_request, sse_events, TestApp, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_server::CorsConfig;

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

#[tokio::test]
async fn cors_defaults_allow_any_origin_and_answer_preflights() {
    let app = TestApp::start();
    let preflight = Request::builder()
        .method(Method::OPTIONS)
        .uri("/v1/chat/completions")
        .header(header::ORIGIN, "https://app.example")
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "content-type,authorization",
        )
        .body(Body::empty())
        .unwrap();
    let response = app.send(preflight).await;
    assert!(response.status().is_success(), "{}", response.status());
    let headers = response.headers();
    assert_eq!(headers[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
    assert!(headers.contains_key(header::ACCESS_CONTROL_ALLOW_METHODS));
    let get = Request::builder()
        .uri("/v1/models")
        .header(header::ORIGIN, "https://app.example")
        .body(Body::empty())
        .unwrap();
    let response = app.send(get).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
}

#[tokio::test]
async fn cors_lists_and_credentials_follow_the_flags() {
    let app = TestApp::with_config(|config| {
        config.cors = Some(
            CorsConfig::new(
                &strings(&["https://good.example"]),
                &strings(&["GET", "post"]),
                &strings(&["*"]),
                true,
            )
            .unwrap(),
        );
    });
    let with_origin = |origin: &str| {
        Request::builder()
            .uri("/v1/models")
            .header(header::ORIGIN, origin)
            .body(Body::empty())
            .unwrap()
    };
    let good = app.send(with_origin("https://good.example")).await;
    assert_eq!(
        good.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://good.example"
    );
    assert_eq!(
        good.headers()[header::ACCESS_CONTROL_ALLOW_CREDENTIALS],
        "true"
    );
    let bad = app.send(with_origin("https://evil.example")).await;
    assert!(!bad
        .headers()
        .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
    assert!(CorsConfig::new(&strings(&["bad\nvalue"]), &[], &[], false)
        .unwrap_err()
        .contains("--allowed-origins"));
}

#[tokio::test]
async fn root_path_serves_routes_under_the_prefix_too() {
    let app = TestApp::with_config(|config| config.root_path = Some("/llm".into()));
    for path in ["/v1/models", "/llm/v1/models", "/llm/health"] {
        let (status, _) = app.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    let (status, body) = app
        .post_json(
            "/llm/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = app.get("/other/v1/models").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn disable_fastapi_docs_removes_openapi_json() {
    let served = TestApp::start();
    assert_eq!(served.get("/openapi.json").await.0, StatusCode::OK);
    let hidden = TestApp::with_config(|config| config.serve_openapi = false);
    assert_eq!(hidden.get("/openapi.json").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn tokens_as_token_ids_name_logprob_tokens_by_id() {
    let app = TestApp::with_config(|config| config.return_tokens_as_token_ids = true);
    let (status, body) = app
        .post_json(
            "/v1/chat/completions",
            &json!({
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3,
                "logprobs": true,
                "top_logprobs": 2,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!content.is_empty());
    for entry in content {
        let token = entry["token"].as_str().unwrap();
        let id = token.strip_prefix("token_id:").expect("token_id:N");
        assert!(id.parse::<u32>().is_ok(), "{token}");
        assert!(entry["bytes"].is_array(), "bytes stay the token's own");
        for top in entry["top_logprobs"].as_array().unwrap() {
            assert!(top["token"].as_str().unwrap().starts_with("token_id:"));
        }
    }
    let (status, body) = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2, "logprobs": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for token in body["choices"][0]["logprobs"]["tokens"].as_array().unwrap() {
        assert!(token.as_str().unwrap().starts_with("token_id:"), "{token}");
    }
}

#[tokio::test]
async fn response_role_names_the_reply_unless_it_continues_the_last_message() {
    let app = TestApp::with_config(|config| config.response_role = "bot".into());
    let chat = |extra: Value| {
        let mut body = json!({
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well"}],
            "max_tokens": 2,
        });
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let (status, body) = app
        .post_json("/v1/chat/completions", &chat(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["role"], "bot");
    // Continuing the final message (no generation prompt): the reply is that message's role,
    // and echo prepends its content, as vLLM does.
    let (status, body) = app
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"continue_final_message": true, "echo": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("Well"), "{content}");
    let response = app
        .send(json_request(
            Method::POST,
            "/v1/chat/completions",
            &chat(json!({"stream": true})),
            None,
        ))
        .await;
    let events = sse_events(response).await;
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "bot");
}

#[tokio::test]
async fn max_logprobs_caps_requests() {
    let app = TestApp::with_config(|config| config.max_logprobs = 3);
    let ask = |k: u32| json!({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "logprobs": k});
    assert_eq!(
        app.post_json("/v1/completions", &ask(3)).await.0,
        StatusCode::OK
    );
    let (status, body) = app.post_json("/v1/completions", &ask(4)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains('3'),
        "{body}"
    );
}

/// `--seed`: unseeded sampled requests repeat across engine restarts in the same order, and
/// differ from each other.
#[tokio::test]
async fn engine_seed_makes_unseeded_sampling_reproducible() {
    async fn two_samples(seed: u64) -> Vec<String> {
        let app = TestApp::with_engine_config(|engine| engine.seed = Some(seed), |_| {});
        let mut texts = Vec::new();
        for _ in 0..2 {
            let (status, body) = app
                .post_json(
                    "/v1/completions",
                    &json!({
                        "model": MODEL_NAME,
                        "prompt": "Once upon a time",
                        "max_tokens": 12,
                        "temperature": 1.0,
                    }),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            texts.push(text(&body));
        }
        texts
    }
    let first = two_samples(1234).await;
    let again = two_samples(1234).await;
    assert_eq!(first, again, "same --seed, same order: same samples");
    assert_ne!(first[0], first[1], "requests draw different streams");
}

fn text(body: &Value) -> String {
    body["choices"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn tokenizer_info_is_served_only_when_enabled() {
    let off = TestApp::start();
    assert_eq!(off.get("/tokenizer_info").await.0, StatusCode::NOT_FOUND);
    let app = TestApp::with_config(|config| config.enable_tokenizer_info_endpoint = true);
    let (status, body) = app.get("/tokenizer_info").await;
    assert_eq!(status, StatusCode::OK);
    let info: Value = serde_json::from_str(&body).unwrap();
    let tokenizer = &app.state_model_tokenizer();
    assert_eq!(info["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(info["eos_token"], tokenizer.eos_token());
    assert_eq!(info["model_max_length"], common::MAX_MODEL_LEN);
    assert!(info["chat_template"].as_str().unwrap().contains("im_start"));
    // What lm-eval's remote tokenizer does with it: encode the EOS text without specials.
    let (status, tokens) = app
        .post_json(
            "/tokenize",
            &json!({"prompt": info["eos_token"], "add_special_tokens": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(tokens["tokens"][0], tokenizer.eos_token_id().unwrap());
}

/// `--tokenizer DIR` with the model's own tokenizer exported as an HF directory serves the
/// same ids as the GGUF's tokenizer.
#[tokio::test]
async fn tokenizer_override_from_an_exported_directory_serves_the_same_ids() {
    let plain = TestApp::start();
    let dir = tempfile::tempdir().unwrap();
    plain
        .state_model_tokenizer()
        .write_hf_dir(dir.path(), None)
        .unwrap();
    let exported = dir.path().to_path_buf();
    let overridden =
        TestApp::with_engine_config(|engine| engine.tokenizer = Some(exported), |_| {});
    let ask = json!({"model": MODEL_NAME, "prompt": "The capital of France is"});
    let (_, a) = plain.post_json("/tokenize", &ask).await;
    let (_, b) = overridden.post_json("/tokenize", &ask).await;
    assert_eq!(a["tokens"], b["tokens"]);
    let greedy = json!({"model": MODEL_NAME, "prompt": "The capital of France is",
                        "max_tokens": 6, "temperature": 0});
    let (_, a) = plain.post_json("/v1/completions", &greedy).await;
    let (status, b) = overridden.post_json("/v1/completions", &greedy).await;
    assert_eq!(status, StatusCode::OK, "{b}");
    assert_eq!(text(&a), text(&b));
}
