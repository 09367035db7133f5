//! A decoder served as an embedding model (`--runner pooling`, vLLM's `--convert embed`):
//! the default model (SmolLM2-135M Q4_1 GGUF) through the pooling engine and the pooling
//! server in process — `/v1/embeddings` vectors are last-token pooled and L2-normalized, the
//! same alone and batched, `--pooler-config`'s MEAN and `normalize: false` change them, and
//! options that do not fit the model are OpenAI 400s naming them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tokenmill_engine::{PoolingEngine, PoolingEngineConfig};
use tokenmill_models::{
    load_pooling_model_with, ConvertOption, EncoderBatch, EncoderWorkspace, ModelSource,
    PoolerConfig, PoolingMethod, PoolingOptions, ThreadPool,
};
use tokenmill_server::{pooling_router, PoolingState, ServerConfig};
use tower::ServiceExt;

const NAME: &str = "smol-embed";

fn start(pooler: &str) -> (PoolingEngine, Router) {
    let mut config = PoolingEngineConfig::new(ModelSource::Gguf(common::model_path()));
    config.num_threads = Some(2);
    config.served_model_name = NAME.into();
    config.max_model_len = Some(256);
    config.options = PoolingOptions {
        convert: ConvertOption::Embed,
        pooler: PoolerConfig::from_json(pooler).unwrap(),
        ..PoolingOptions::default()
    };
    let engine = PoolingEngine::start(&config).unwrap();
    let state = PoolingState::new(
        engine.client(),
        Arc::clone(engine.model()),
        ServerConfig::new(vec![NAME.to_string()]),
        Arc::clone(engine.metrics()),
    );
    let app = pooling_router(state);
    (engine, app)
}

async fn post(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

fn vectors(body: &Value) -> Vec<Vec<f32>> {
    body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            item["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
}

fn assert_bad_request((status, body): (StatusCode, Value), needle: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

const TEXTS: [&str; 4] = [
    "The capital of France is Paris.",
    "hi",
    "Rust is a systems programming language with a strong type system and no garbage collector.",
    "東京は日本の首都です。",
];

#[tokio::test]
async fn a_gguf_decoder_serves_normalized_batch_invariant_embeddings() {
    let (engine, app) = start("{}");
    let info = &engine.model().info;
    assert_eq!((info.method, info.normalize), (PoolingMethod::Last, true));
    assert_eq!(info.output_dim, 576, "SmolLM2-135M's hidden size");
    let (status, body) = post(
        &app,
        "/v1/embeddings",
        json!({"model": NAME, "input": TEXTS}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let batched = vectors(&body);
    assert_eq!(batched.len(), TEXTS.len());
    for vector in &batched {
        assert_eq!(vector.len(), 576);
        assert!((norm(vector) - 1.0).abs() < 1e-5, "{}", norm(vector));
    }
    assert_ne!(batched[0], batched[1]);
    let tokens: usize = TEXTS
        .iter()
        .map(|text| {
            engine
                .model()
                .tokenizer
                .encode_for_pooling(text, None, true, None)
                .unwrap()
                .0
                .len()
        })
        .sum();
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    // Alone, each text gets the bits it got in the batch.
    for (text, want) in TEXTS.iter().zip(&batched) {
        let (status, body) = post(&app, "/v1/embeddings", json!({"input": text})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(&vectors(&body)[0], want, "{text:?}");
    }
    // Concurrent requests are batched into shared steps by the engine: same bits.
    let requests = TEXTS.iter().map(|text| {
        post(
            &app,
            "/v1/embeddings",
            json!({"input": [text, "filler text"]}),
        )
    });
    for ((status, body), want) in futures::future::join_all(requests)
        .await
        .into_iter()
        .zip(&batched)
    {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(&vectors(&body)[0], want);
    }
    // The vector is the model's last hidden state after the final norm: the pooling model
    // run directly gives the same row before normalization.
    let model = load_pooling_model_with(
        &ModelSource::Gguf(common::model_path()),
        &PoolingOptions::default(),
    )
    .unwrap();
    let ids = engine
        .model()
        .tokenizer
        .encode_for_pooling(TEXTS[2], None, true, None)
        .unwrap()
        .0;
    let mut batch = EncoderBatch::default();
    batch.add_sequence(&ids, None).unwrap();
    let mut raw = Vec::new();
    model
        .pool(
            &ThreadPool::new(1),
            &batch,
            &mut EncoderWorkspace::new(),
            &mut raw,
        )
        .unwrap();
    tokenmill_models::l2_normalize(&mut raw);
    assert_eq!(raw, batched[2]);
    // Scores are cosines of these vectors.
    let (status, body) = post(
        &app,
        "/score",
        json!({"text_1": TEXTS[0], "text_2": [TEXTS[0], TEXTS[1]]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let same = body["data"][0]["score"].as_f64().unwrap();
    assert!((same - 1.0).abs() < 1e-5, "{same}");
}

#[tokio::test]
async fn pooling_options_that_do_not_fit_are_400s() {
    let (_engine, app) = start("{}");
    assert_bad_request(
        post(
            &app,
            "/v1/embeddings",
            json!({"input": "hi", "dimensions": 100000}),
        )
        .await,
        "dimensions",
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
        post(&app, "/classify", json!({"model": NAME, "input": "hi"})).await,
        "Classification API",
    );
}

#[tokio::test]
async fn pooler_config_mean_and_unnormalized() {
    let (last_engine, last_app) = start("{}");
    let (_, body) = post(&last_app, "/v1/embeddings", json!({"input": TEXTS[0]})).await;
    let last = vectors(&body).remove(0);
    drop(last_engine);
    let (engine, app) = start(r#"{"pooling_type": "MEAN", "normalize": false}"#);
    assert_eq!(engine.model().info.method, PoolingMethod::Mean);
    let (status, body) = post(&app, "/v1/embeddings", json!({"input": TEXTS[0]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mean = vectors(&body).remove(0);
    assert!(
        (norm(&mean) - 1.0).abs() > 1e-3,
        "not normalized: {}",
        norm(&mean)
    );
    let mut normalized = mean.clone();
    tokenmill_models::l2_normalize(&mut normalized);
    assert_ne!(normalized, last, "mean differs from last-token pooling");
    // The request's own `normalize` still wins (vLLM's per-request override).
    let (status, body) = post(
        &app,
        "/v1/embeddings",
        json!({"input": TEXTS[0], "normalize": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let vector = vectors(&body).remove(0);
    assert!((norm(&vector) - 1.0).abs() < 1e-5);
    assert_eq!(vector, normalized);
}
