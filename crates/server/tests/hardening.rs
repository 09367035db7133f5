//! Hostile clients over real sockets and in-process: read timeouts (silent connections,
//! half-sent request lines, headers dripped byte by byte, short bodies), the fan-out and
//! prompt-size caps, `priority` without the priority policy, the waiting-queue bound, the
//! early bind, the OpenAPI document's security matching the server, long prompts in the
//! bounded admission pool, and JSON error bodies on the responses hyper writes by itself
//! (malformed request heads, 431, 414).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::{json_of, json_request, model_path, TestApp, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_engine::{Engine, EngineConfig, KvCacheSizing, SchedulingPolicy};
use tokenmill_models::ModelSource;
use tokenmill_server::{bind, serve_on, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A real server on an OS-chosen port with 1-second read timeouts.
async fn start_server() -> SocketAddr {
    let mut engine_config = EngineConfig::new(ModelSource::from_path(model_path()));
    engine_config.kv_cache = KvCacheSizing::Bytes(32 << 20);
    engine_config.max_model_len = Some(256);
    engine_config.num_threads = Some(1);
    engine_config.log_stats_interval = None;
    let engine = Engine::start(&engine_config).unwrap();
    let mut config = ServerConfig::new(vec![MODEL_NAME.to_string()]);
    config.header_read_timeout = Duration::from_secs(1);
    config.body_read_timeout = Duration::from_secs(1);
    let listener = bind("127.0.0.1", 0).unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(serve_on(listener, engine, config));
    address
}

/// Reads until the server closes the connection (or 10 s pass), returning what it sent and
/// how long that took.
async fn read_until_closed(stream: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(10) {
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
            Err(_) => {}
        }
    }
    (
        String::from_utf8_lossy(&received).into_owned(),
        started.elapsed(),
    )
}

async fn health_is_ok(address: SocketAddr) -> bool {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (text, _) = read_until_closed(&mut stream).await;
    text.starts_with("HTTP/1.1 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_clients_are_cut_off_while_others_are_served() {
    let address = start_server().await;
    // Silent, half a request line, and headers dripped a byte every 200 ms.
    let mut silent = TcpStream::connect(address).await.unwrap();
    let mut partial = TcpStream::connect(address).await.unwrap();
    partial.write_all(b"GET /v1/mo").await.unwrap();
    let mut drip = TcpStream::connect(address).await.unwrap();
    let dripper = tokio::spawn(async move {
        let started = Instant::now();
        for byte in b"GET /health HTTP/1.1\r\nHost: a-very-long-host-name\r\nX-Slow: yes\r\n" {
            if drip.write_all(&[*byte]).await.is_err() {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("the dripping connection was never closed");
    });
    assert!(health_is_ok(address).await, "others are served meanwhile");
    let (_, silent_after) = read_until_closed(&mut silent).await;
    let (_, partial_after) = read_until_closed(&mut partial).await;
    assert!(silent_after < Duration::from_secs(3), "{silent_after:?}");
    assert!(partial_after < Duration::from_secs(3), "{partial_after:?}");
    let drip_after = dripper.await.unwrap();
    assert!(drip_after < Duration::from_secs(4), "{drip_after:?}");
    assert!(health_is_ok(address).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_timeout() {
    let address = start_server().await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (text, after) = read_until_closed(&mut stream).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(after < Duration::from_secs(4), "idle for {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_body_gets_a_408_within_the_timeout() {
    let address = start_server().await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"prompt\": ",
        )
        .await
        .unwrap();
    let (text, after) = read_until_closed(&mut stream).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"error\""), "an OpenAI error body: {text}");
    assert!(after < Duration::from_secs(4), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_gets_a_413_without_waiting_for_it() {
    let address = start_server().await;
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 99999999999\r\n\r\n",
        )
        .await
        .unwrap();
    let (text, _) = read_until_closed(&mut stream).await;
    // Not the 408 the body timeout would give: refused on the header alone.
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("\"error\""), "an OpenAI error body: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_gets_no_session() {
    let address = start_server().await;
    // Idle after the preface, and a SETTINGS frame then HEADERS without END_HEADERS: an
    // HTTP/2 server would answer with its own SETTINGS frame and keep the connection open.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut with_frames = preface.clone();
    with_frames.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
    with_frames.extend_from_slice(&[0, 0, 1, 1, 0, 0, 0, 0, 1, 0x82]); // HEADERS, no END_HEADERS
    for bytes in [preface, with_frames] {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        let (text, after) = read_until_closed(&mut stream).await;
        assert!(text.is_empty(), "the server answered HTTP/2: {text:?}");
        assert!(after < Duration::from_secs(2), "open for {after:?}");
    }
    // HTTP/1.1 is served as before.
    assert!(health_is_ok(address).await);
}

#[test]
fn a_busy_port_is_refused_naming_the_address() {
    let first = bind("127.0.0.1", 0).unwrap();
    let port = first.local_addr().unwrap().port();
    let error = bind("127.0.0.1", port).unwrap_err().to_string();
    assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
}

#[tokio::test]
async fn fan_out_and_prompt_size_caps_answer_400_at_once() {
    let app = TestApp::start();
    let started = Instant::now();
    let prompts: Vec<&str> = vec!["a"; 1024];
    let (status, body) = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": prompts, "n": 128, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "n", "{body}");
    let huge = "word ".repeat(2 << 20); // 10 MiB
    let (status, body) = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": huge, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("bytes"),
        "{body}"
    );
    let (status, _) = app
        .post_json("/tokenize", &json!({"model": MODEL_NAME, "prompt": huge}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Within the caps: 8 prompts × n = 4 is fine.
    let (status, body) = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": vec!["a"; 8], "n": 4, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"].as_array().unwrap().len(), 32);
}

#[tokio::test]
async fn priority_needs_the_priority_policy() {
    let ask = json!({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "priority": 5});
    let fcfs = TestApp::start();
    let (status, body) = fcfs.post_json("/v1/completions", &ask).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["param"], "priority");
    let zero = json!({"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "priority": 0});
    assert_eq!(
        fcfs.post_json("/v1/completions", &zero).await.0,
        StatusCode::OK
    );
    let priority = TestApp::with_engine_config(
        |engine| engine.scheduling_policy = SchedulingPolicy::Priority,
        |_| {},
    );
    assert_eq!(
        priority.post_json("/v1/completions", &ask).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_waiting_bound_get_503_with_retry_after() {
    let app = TestApp::with_engine_config(
        |engine| engine.max_num_seqs = 1,
        |server| server.max_waiting_requests = Some(1),
    );
    // One runs (max_num_seqs = 1), then one waits: the bound of 1 is reached.
    let mut background = Vec::new();
    for (running, waiting) in [(1, 0), (1, 1)] {
        background.push(spawn_long_completion(&app));
        wait_for_counts(&app, running, waiting).await;
    }
    let response = app
        .send(json_request(
            Method::POST,
            "/v1/completions",
            &long_completion(),
            None,
        ))
        .await;
    assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    let (status, body) = json_of(response).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-waiting-requests"));
    let (_, metrics) = app.get("/metrics").await;
    assert!(
        metrics.contains("tokenmill:requests_rejected_total{reason=\"waiting_queue_full\"} 1"),
        "{metrics}"
    );
    for task in background {
        assert_eq!(task.await.unwrap(), StatusCode::OK);
    }
}

/// A completion that runs for 200 tokens (well over a second).
fn long_completion() -> Value {
    json!({"model": MODEL_NAME, "prompt": "Count: 1, 2, 3,", "max_tokens": 200, "ignore_eos": true})
}

/// Sends [`long_completion`] in the background; the task ends with its status.
fn spawn_long_completion(app: &TestApp) -> tokio::task::JoinHandle<StatusCode> {
    use tower::ServiceExt;
    let (router, body) = (app.app.clone(), long_completion());
    tokio::spawn(async move {
        let request = json_request(Method::POST, "/v1/completions", &body, None);
        router.oneshot(request).await.unwrap().status()
    })
}

/// Waits (up to 20 s) until the engine has `running` requests running and `waiting` waiting.
async fn wait_for_counts(app: &TestApp, running: usize, waiting: usize) {
    let client = app.engine.as_ref().unwrap().client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = client.stats();
        if stats.num_running == running && stats.num_waiting == waiting {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never saw {running} running + {waiting} waiting: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// vLLM sends a chat stream's role chunk when the engine's first output arrives, so a client's
/// time to first token (vLLM's `bench serve`, GuideLLM) covers the queueing and the prefill.
/// A stream whose request waits for a slot must therefore send nothing until it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_stream_sends_its_role_chunk_with_the_first_output() {
    use futures::StreamExt;
    let app = TestApp::with_engine_config(|engine| engine.max_num_seqs = 1, |_| {});
    // A long request takes the only slot.
    let busy = spawn_long_completion(&app);
    wait_for_counts(&app, 1, 0).await;
    let chat = json!({"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 3, "stream": true});
    let response = app
        .send(json_request(
            Method::POST,
            "/v1/chat/completions",
            &chat,
            None,
        ))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    wait_for_counts(&app, 1, 1).await;
    let mut body = response.into_body().into_data_stream();
    let early = tokio::time::timeout(Duration::from_millis(300), body.next()).await;
    assert!(early.is_err(), "sent while the request waited: {early:?}");
    let stats = app.engine.as_ref().unwrap().client().stats();
    assert_eq!(
        stats.num_waiting, 1,
        "the long request ended during the check"
    );
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let first: Value = serde_json::from_str(
        text.lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(busy.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn openapi_declares_bearer_security_only_with_a_key() {
    let open = TestApp::start();
    let (_, text) = open.get("/openapi.json").await;
    let document: Value = serde_json::from_str(&text).unwrap();
    assert!(document.get("security").is_none());
    assert!(!text.contains("\"401\""), "no 401 without a key");
    let keyed = TestApp::with_config(|config| config.api_key = Some("k".into()));
    let request = Request::builder()
        .uri("/openapi.json")
        .header(header::AUTHORIZATION, "Bearer k")
        .body(Body::empty())
        .unwrap();
    let (status, document) = json_of(keyed.send(request).await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(document["security"], json!([{"bearer": []}]));
}

/// The status line and the JSON body of a raw response.
fn status_and_json(text: &str) -> (String, Value) {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json"), "{head}");
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_request_heads_get_json_errors() {
    let address = start_server().await;
    let huge_header = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let many_headers = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..120)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad request line", b"GARBAGE\r\n\r\n".to_vec(), "400"),
        (
            "bad method",
            b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "bad version",
            b"GET / HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "bad content-length",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n".to_vec(),
            "400",
        ),
        ("header over 64 KiB", huge_header.into_bytes(), "431"),
        ("over 100 headers", many_headers.into_bytes(), "431"),
    ];
    for (name, request, code) in cases {
        let mut stream = TcpStream::connect(address).await.unwrap();
        // The server may answer (and close) before it has read all of an oversized head.
        let _ = stream.write_all(&request).await;
        let (text, after) = read_until_closed(&mut stream).await;
        assert!(after < Duration::from_secs(3), "{name}: {after:?}");
        let (status, body) = status_and_json(&text);
        assert!(
            status.starts_with(&format!("HTTP/1.1 {code} ")),
            "{name}: {text}"
        );
        assert_eq!(
            body["error"]["code"],
            code.parse::<u64>().unwrap(),
            "{name}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{name}: {body}"
        );
    }
    // The server is fine, and ordinary responses are untouched.
    assert!(health_is_ok(address).await);
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        .await
        .unwrap();
    let (text, _) = read_until_closed(&mut stream).await;
    let (status, body) = status_and_json(&text);
    assert!(status.starts_with("HTTP/1.1 400 "), "{text}");
    assert_eq!(body["error"]["param"], "prompt", "{body}");
}

/// Long prompts tokenize in the admission pool: with one job allowed, six concurrent ~290 KB
/// `/tokenize` requests (far over the 16 KiB inline limit) take turns, `/health` answers
/// while they are still running (no async worker is held), and each gets the tokens the
/// tokenizer gives (the pool path is the inline path's result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_tokenize_in_the_bounded_pool_while_health_answers() {
    let app = std::sync::Arc::new(TestApp::with_engine_config(
        |engine| {
            engine.max_model_len = Some(8192);
            engine.kv_cache = KvCacheSizing::Bytes(256 << 20);
        },
        |server| server.max_admission_jobs = 1,
    ));
    let text: String = (0..60_000).map(|i| format!("w{} ", i % 997)).collect();
    assert!(
        text.len() > 200 << 10,
        "long enough to keep the one job busy: {}",
        text.len()
    );
    let expected = app.state_model_tokenizer().encode(&text, true).unwrap();
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let requests: Vec<_> = (0..6)
        .map(|_| {
            let (app, text, finished) = (app.clone(), text.clone(), finished.clone());
            tokio::spawn(async move {
                let answer = app
                    .post_json("/tokenize", &json!({"model": MODEL_NAME, "prompt": text}))
                    .await;
                finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                answer
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, _) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    let done = finished.load(std::sync::atomic::Ordering::SeqCst);
    assert!(done < 6, "health answered only after all {done} jobs");
    for request in requests {
        let (status, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["count"], expected.len(), "{body}");
        let tokens: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
        assert_eq!(tokens, expected);
    }
}
