//! Shared harness for the in-process server tests: a real engine over the default model, the
//! axum router on top of it, and helpers that send one request through `oneshot` and check
//! OpenAI-shaped error bodies.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use futures::StreamExt;
use serde_json::Value;
use tokenmill_engine::{Engine, EngineConfig, EngineStats, KvCacheSizing};
use tokenmill_models::ModelSource;
use tokenmill_server::{router, AppState, ServerConfig};
use tower::ServiceExt;

/// The name the test servers serve the model under.
pub const MODEL_NAME: &str = "tm-test";
/// A second alias, to check that every served name is accepted.
pub const MODEL_ALIAS: &str = "tm-alias";
/// Small context so over-long requests are cheap to build.
pub const MAX_MODEL_LEN: usize = 256;

pub use tokenmill_test_assets::default_model as model_path;

/// A real engine plus the router over it. The engine shuts down when this is dropped.
pub struct TestApp {
    /// `None` after [`TestApp::shutdown_engine`].
    pub engine: Option<Engine>,
    pub state: AppState,
    pub app: Router,
}

impl TestApp {
    /// Defaults: served as `tm-test` and `tm-alias`, no key, 256-token context.
    pub fn start() -> TestApp {
        TestApp::with_config(|_| {})
    }

    /// Like [`TestApp::start`] with the server settings adjusted by `configure`.
    pub fn with_config(configure: impl FnOnce(&mut ServerConfig)) -> TestApp {
        TestApp::with_engine_config(|_| {}, configure)
    }

    /// Like [`TestApp::with_config`] with the engine settings adjusted by `configure_engine`
    /// as well.
    pub fn with_engine_config(
        configure_engine: impl FnOnce(&mut EngineConfig),
        configure: impl FnOnce(&mut ServerConfig),
    ) -> TestApp {
        let mut engine_config = EngineConfig::new(ModelSource::from_path(model_path()));
        engine_config.kv_cache = KvCacheSizing::Bytes(32 << 20);
        engine_config.max_model_len = Some(MAX_MODEL_LEN);
        engine_config.num_threads = Some(1);
        engine_config.served_model_name = MODEL_NAME.to_string();
        engine_config.log_stats_interval = None;
        configure_engine(&mut engine_config);
        let engine = Engine::start(&engine_config).expect("engine starts on the test model");
        let mut config = ServerConfig::new(vec![MODEL_NAME.to_string(), MODEL_ALIAS.to_string()]);
        configure(&mut config);
        let state = AppState::new(
            engine.client(),
            Arc::clone(engine.model()),
            config,
            Arc::clone(engine.metrics()),
        );
        let app = router(state.clone());
        TestApp {
            engine: Some(engine),
            state,
            app,
        }
    }

    /// The served model's tokenizer.
    pub fn state_model_tokenizer(&self) -> std::sync::Arc<tokenmill_text::Tokenizer> {
        std::sync::Arc::clone(
            &self
                .engine
                .as_ref()
                .expect("engine running")
                .model()
                .tokenizer,
        )
    }

    /// Stops the engine thread (as if it died); the router stays up.
    pub fn shutdown_engine(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown();
        }
    }

    /// Sends one request through a fresh clone of the router.
    pub async fn send(&self, request: Request<Body>) -> Response {
        self.app
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible")
    }

    /// POSTs a JSON value (no key).
    pub async fn post_json(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// POSTs raw bytes as JSON (no key).
    pub async fn post_raw(&self, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.into())
            .expect("valid request");
        json_of(self.send(request).await).await
    }

    /// GETs a path (no key), returning status and body text.
    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let request = Request::builder()
            .method(Method::GET)
            .uri(path)
            .body(Body::empty())
            .expect("valid request");
        text_of(self.send(request).await).await
    }

    /// Waits until the engine runs nothing and holds no KV blocks, returning the final stats.
    /// Aborts reach the engine thread asynchronously, so this polls; a stuck request fails.
    pub async fn wait_idle(&self) -> EngineStats {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let stats = self.state.engine().stats();
            if stats.num_running + stats.num_waiting == 0 && stats.kv_cache_usage == 0.0 {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "engine did not go idle: {stats:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub async fn text_of(response: Response) -> (StatusCode, String) {
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body reads");
    (
        status,
        String::from_utf8(bytes.to_vec()).expect("UTF-8 body"),
    )
}

pub async fn json_of(response: Response) -> (StatusCode, Value) {
    let (status, text) = text_of(response).await;
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("status {status}: body is not JSON ({err}): {text:?}"));
    (status, value)
}

/// Asserts the OpenAI error envelope: exactly `message` (non-empty string), `type` (string),
/// `param` (string or null) and `code` (the HTTP status), nothing else.
pub fn assert_error_body(status: StatusCode, body: &Value, expected: StatusCode, case: &str) {
    assert_eq!(status, expected, "{case}: status; body {body}");
    let top = body
        .as_object()
        .unwrap_or_else(|| panic!("{case}: body is not an object: {body}"));
    assert_eq!(
        top.len(),
        1,
        "{case}: only `error` at the top level: {body}"
    );
    let error = top
        .get("error")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("{case}: no error object: {body}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["code", "message", "param", "type"],
        "{case}: error keys: {body}"
    );
    let message = error["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{case}: empty message: {body}");
    assert!(
        error["type"].is_string(),
        "{case}: type is a string: {body}"
    );
    assert!(
        error["param"].is_string() || error["param"].is_null(),
        "{case}: param is a string or null: {body}"
    );
    assert_eq!(
        error["code"].as_u64(),
        Some(u64::from(expected.as_u16())),
        "{case}: code carries the status: {body}"
    );
}

/// The `param` of an error body.
pub fn error_param(body: &Value) -> Option<&str> {
    body["error"]["param"].as_str()
}

/// Reads an SSE body until it ends, returning the `data:` payloads in order.
pub async fn sse_events(response: Response) -> Vec<String> {
    let mut stream = response.into_body().into_data_stream();
    let mut buffer = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("SSE body reads");
        buffer.push_str(std::str::from_utf8(&chunk).expect("UTF-8 SSE"));
    }
    buffer
        .split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|line| line.strip_prefix("data: ").or(line.strip_prefix("data:")))
                .map(|data| data.trim().to_string())
        })
        .collect()
}

/// A request with a JSON body and optional bearer key.
pub fn json_request(method: Method, path: &str, body: &Value, key: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    builder
        .body(Body::from(body.to_string()))
        .expect("valid request")
}
