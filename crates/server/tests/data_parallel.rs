//! `--data-parallel-size 2` behind one in-process HTTP front end: requests spread over both
//! engines (each engine's `vllm:request_success_total{engine=...}` grows), greedy completions
//! are those of a one-engine server, a repeated prompt finds its prefix cached, `/health`
//! answers for both engines and `/metrics` declares each family once.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::http::StatusCode;
use common::{TestApp, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_triage::exposition::Scrape;

fn dp_app(ranks: usize) -> TestApp {
    TestApp::with_engine_config(|engine| engine.data_parallel_size = ranks, |_| {})
}

/// `vllm:request_success_total` of one engine, summed over finish reasons.
async fn successes(app: &TestApp, engine: &str) -> f64 {
    let (status, text) = app.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let scrape = Scrape::parse(&text).unwrap();
    scrape
        .samples_named("vllm:request_success_total")
        .filter(|sample| sample.labels.get("engine") == Some(engine))
        .map(|sample| sample.value)
        .sum()
}

fn completion(prompt: &str) -> Value {
    json!({"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0})
}

/// Posts all prompts at once; returns each response body in order.
async fn complete_all(app: &TestApp, prompts: &[String]) -> Vec<Value> {
    let bodies: Vec<Value> = prompts.iter().map(|p| completion(p)).collect();
    let responses = futures::future::join_all(
        bodies
            .iter()
            .map(|body| app.post_json("/v1/completions", body)),
    )
    .await;
    responses
        .into_iter()
        .map(|(status, body)| {
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        })
        .collect()
}

fn text(body: &Value) -> &str {
    body["choices"][0]["text"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_serve_as_one_with_per_engine_metrics() {
    let prompts: Vec<String> = [
        "The capital of France is",
        "Write a haiku about the sea. The waves",
        "def fibonacci(n):",
        "Once upon a time, in a land far away, there lived",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    let single = dp_app(1);
    let expected = complete_all(&single, &prompts).await;
    drop(single);

    let app = dp_app(2);
    let (status, _) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    let outputs = complete_all(&app, &prompts).await;
    for (output, expected) in outputs.iter().zip(&expected) {
        assert_eq!(text(output), text(expected));
    }
    app.wait_idle().await;
    let (engine0, engine1) = (successes(&app, "0").await, successes(&app, "1").await);
    assert!(engine0 > 0.0 && engine1 > 0.0, "{engine0} / {engine1}");
    assert_eq!(engine0 + engine1, 4.0);

    // One family declaration, one series per engine.
    let (_, metrics) = app.get("/metrics").await;
    assert_eq!(
        metrics
            .matches("# TYPE vllm:num_requests_running gauge")
            .count(),
        1
    );
    for engine in ["0", "1"] {
        assert!(metrics.contains(&format!(
            "vllm:num_requests_running{{model_name=\"{MODEL_NAME}\",engine=\"{engine}\"}}"
        )));
    }

    // A long prompt sent again finds its prefix on the engine that served it.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(6);
    let other = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. ".repeat(5);
    complete_all(&app, &[long.clone(), other.clone()]).await;
    for prompt in [other, long] {
        let repeat = complete_all(&app, &[prompt]).await.remove(0);
        let cached = repeat["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached >= 32, "{repeat}");
    }
}
