//! The pooling server in process over all-MiniLM-L6-v2 (`scripts/fetch-minilm.sh`; skipped
//! when absent): `/v1/embeddings` (floats, base64, token ids, truncation, vLLM's 400s),
//! `/pooling`, `/score`, `/rerank`, and the routes a pooling model refuses.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value};
use tokenmill_engine::{PoolingEngine, PoolingEngineConfig};
use tokenmill_models::ModelSource;
use tokenmill_server::{pooling_router, PoolingState, ServerConfig};
use tower::ServiceExt;

const NAME: &str = "minilm";

#[allow(clippy::unwrap_used)]
fn start() -> Option<(PoolingEngine, Router)> {
    let dir = tokenmill_test_assets::MINILM.or_skip("embeddings (all-MiniLM-L6-v2)")?;
    let mut config = PoolingEngineConfig::new(ModelSource::HfDirectory(dir));
    config.num_threads = Some(2);
    config.served_model_name = NAME.into();
    let engine = PoolingEngine::start(&config).unwrap();
    let state = PoolingState::new(
        engine.client(),
        Arc::clone(engine.model()),
        ServerConfig::new(vec![NAME.to_string()]),
        Arc::clone(engine.metrics()),
    );
    let app = pooling_router(state);
    Some((engine, app))
}

#[allow(clippy::unwrap_used)]
async fn send(
    app: &Router,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    send(app, Method::POST, path, Some(body)).await
}

#[allow(clippy::unwrap_used)]
fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
}

/// A 400 whose message mentions `needle`.
#[allow(clippy::unwrap_used)]
fn assert_bad_request((status, body): (StatusCode, Value), needle: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn embeddings_in_floats_base64_and_from_token_ids() {
    let Some((_engine, app)) = start() else {
        return;
    };
    let (status, body) = post(
        &app,
        "/v1/embeddings",
        json!({"model": NAME, "input": ["Hello world.", "a"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], NAME);
    assert!(body["id"].as_str().unwrap().starts_with("embd-"));
    assert_eq!(body["usage"]["prompt_tokens"], 8);
    assert_eq!(body["usage"]["total_tokens"], 8);
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    assert_eq!(data[0]["object"], "embedding");
    let first = floats(&data[0]["embedding"]);
    assert_eq!(first.len(), 384);
    assert!((norm(&first) - 1.0).abs() < 1e-5);

    let (_, encoded) = post(
        &app,
        "/v1/embeddings",
        json!({"input": "Hello world.", "encoding_format": "base64"}),
    )
    .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, first);

    // [CLS] hello world . [SEP] as ids: the same vector.
    let (_, from_ids) = post(
        &app,
        "/v1/embeddings",
        json!({"input": [[101, 7592, 2088, 1012, 102]]}),
    )
    .await;
    assert_eq!(floats(&from_ids["data"][0]["embedding"]), first);

    let (status, pooled) = post(&app, "/pooling", json!({"input": "Hello world."})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(pooled["data"][0]["object"], "pooling");
    assert_eq!(floats(&pooled["data"][0]["data"]), first);

    let (_, raw) = post(
        &app,
        "/v1/embeddings",
        json!({"input": "Hello world.", "normalize": false}),
    )
    .await;
    let raw = floats(&raw["data"][0]["embedding"]);
    assert!(
        (norm(&raw) - 1.0).abs() > 1e-3,
        "the mean-pooled vector is not unit length"
    );
}

#[tokio::test]
async fn bad_embedding_inputs_are_openai_400s() {
    let Some((_engine, app)) = start() else {
        return;
    };
    assert_bad_request(
        post(&app, "/v1/embeddings", json!({"input": ""})).await,
        "empty",
    );
    assert_bad_request(
        post(&app, "/v1/embeddings", json!({"input": []})).await,
        "empty",
    );
    assert_bad_request(
        post(&app, "/v1/embeddings", json!({"input": [[]]})).await,
        "empty",
    );
    assert_bad_request(
        post(&app, "/v1/embeddings", json!({"input": ["a", 1]})).await,
        "input",
    );
    assert_bad_request(
        post(&app, "/v1/embeddings", json!({"input": [40000]})).await,
        "vocabulary",
    );
    let long: Vec<u32> = (0..300).map(|i| 1000 + i).collect();
    assert_bad_request(
        post(&app, "/v1/embeddings", json!({"input": long})).await,
        "256",
    );
    assert_bad_request(
        post(
            &app,
            "/v1/embeddings",
            json!({"input": "word ".repeat(400)}),
        )
        .await,
        "maximum context length is 256",
    );
    assert_bad_request(
        post(
            &app,
            "/v1/embeddings",
            json!({"input": "hi", "dimensions": 64}),
        )
        .await,
        "matryoshka",
    );
    assert_bad_request(
        post(
            &app,
            "/v1/embeddings",
            json!({"input": "hi", "truncate_prompt_tokens": 1000}),
        )
        .await,
        "max_model_len",
    );
    assert_bad_request(
        post(
            &app,
            "/v1/embeddings",
            json!({"input": "hi", "encoding_format": "int8"}),
        )
        .await,
        "encoding_format",
    );
    let (status, _) = post(
        &app,
        "/v1/embeddings",
        json!({"model": "other", "input": "hi"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Truncated instead: the first 255 tokens and [SEP] of the text, the last 256 ids.
    let (status, body) = post(
        &app,
        "/v1/embeddings",
        json!({"input": "word ".repeat(400), "truncate_prompt_tokens": -1}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 256);
    let (status, body) = post(
        &app,
        "/v1/embeddings",
        json!({"input": long, "truncate_prompt_tokens": 10}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 10);
}

#[tokio::test]
async fn score_and_rerank_rank_the_relevant_text_first() {
    let Some((_engine, app)) = start() else {
        return;
    };
    let query = "What is the capital of France?";
    let documents = [
        "I like apples.",
        "Paris is the capital of France.",
        "Dogs are loyal.",
    ];
    let (status, body) = post(
        &app,
        "/score",
        json!({"text_1": query, "text_2": documents}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let scores: Vec<f64> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["score"].as_f64().unwrap())
        .collect();
    assert_eq!(scores.len(), 3);
    assert!(scores[1] > scores[0] && scores[1] > scores[2], "{scores:?}");
    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let (status, body) = post(
            &app,
            path,
            json!({"query": query, "documents": documents, "top_n": 2}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 1);
        assert_eq!(results[0]["document"]["text"], documents[1]);
        assert!((results[0]["relevance_score"].as_f64().unwrap() - scores[1]).abs() < 1e-6);
    }
    let (_, body) = post(
        &app,
        "/rerank",
        json!({"query": query, "documents": documents, "return_documents": false}),
    )
    .await;
    assert_eq!(body["results"].as_array().unwrap().len(), 3);
    assert!(body["results"][0].get("document").is_none());
    assert_bad_request(
        post(
            &app,
            "/score",
            json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
        )
        .await,
        "same length",
    );
    assert_bad_request(
        post(&app, "/rerank", json!({"query": query, "documents": []})).await,
        "document",
    );
}

#[tokio::test]
async fn a_pooling_model_refuses_generation_and_reports_itself() {
    let Some((_engine, app)) = start() else {
        return;
    };
    assert_bad_request(
        post(
            &app,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await,
        "--runner pooling",
    );
    assert_bad_request(
        post(&app, "/v1/completions", json!({"prompt": "hi"})).await,
        "/v1/completions",
    );
    assert_bad_request(
        post(&app, "/classify", json!({"input": "hi"})).await,
        "Classification API",
    );
    let (status, models) = send(&app, Method::GET, "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][0]["id"], NAME);
    assert_eq!(models["data"][0]["max_model_len"], 256);
    let (status, _) = send(&app, Method::GET, "/health", None).await;
    assert_eq!(status, StatusCode::OK);
    post(&app, "/v1/embeddings", json!({"input": ["one", "two"]})).await;
    let (_, metrics) = send(&app, Method::GET, "/metrics", None).await;
    let text = metrics.as_str().unwrap_or_default();
    assert!(text.contains("vllm:prompt_tokens_total"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("vllm:request_success_total")
                && l.contains("finished_reason=\"stop\"")
                && !l.ends_with(" 0")),
        "{text}"
    );
}

#[tokio::test]
async fn tokenize_and_detokenize_as_the_pooling_routes_encode() {
    let Some((_engine, app)) = start() else {
        return;
    };
    let (status, body) = post(&app, "/tokenize", json!({"prompt": "Hello world."})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The ids the embeddings test feeds as a token list: the same vector as the text.
    assert_eq!(body["tokens"], json!([101, 7592, 2088, 1012, 102]));
    assert_eq!(body["count"], 5);
    assert_eq!(body["max_model_len"], 256);
    let (_, bare) = post(
        &app,
        "/tokenize",
        json!({"model": NAME, "prompt": "Hello world.", "add_special_tokens": false, "return_token_strs": true}),
    )
    .await;
    assert_eq!(bare["tokens"], json!([7592, 2088, 1012]));
    assert_eq!(bare["token_strs"], json!(["hello", "world", "."]));
    let (status, text) = post(&app, "/detokenize", json!({"tokens": [7592, 2088, 1012]})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text["prompt"], "hello world.");
    assert_bad_request(
        post(&app, "/detokenize", json!({"tokens": [7592, 999_999]})).await,
        "999999",
    );
    assert_bad_request(
        post(
            &app,
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await,
        "chat template",
    );
    let (status, _) = post(&app, "/tokenize", json!({"model": "other", "prompt": "hi"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
