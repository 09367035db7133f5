//! The pooling server over a cross-encoder (the formula-weight `BertForSequenceClassification`
//! of `scripts/reference/make_embedding_fixtures.py`, written with a tokenizer whose words
//! `w{i}` are ids `i`): `/score` and `/rerank` return transformers' sigmoid scores for the
//! fixture's pairs, `/classify` the probabilities, and `/v1/embeddings` is refused.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tokenmill_engine::{PoolingEngine, PoolingEngineConfig};
use tokenmill_models::ModelSource;
use tokenmill_server::{pooling_router, PoolingState, ServerConfig};
use tower::ServiceExt;

#[path = "../../models/tests/support/cross_encoder.rs"]
mod cross_encoder;

#[allow(clippy::unwrap_used)]
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
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn cross_encoder_scores_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    cross_encoder::write_checkpoint(dir.path());
    let mut config = PoolingEngineConfig::new(ModelSource::HfDirectory(dir.path().to_path_buf()));
    config.num_threads = Some(2);
    let engine = PoolingEngine::start(&config).unwrap();
    let app = pooling_router(PoolingState::new(
        engine.client(),
        Arc::clone(engine.model()),
        ServerConfig::new(vec!["reranker".into()]),
        Arc::clone(engine.metrics()),
    ));
    let pairs = cross_encoder::text_pairs();
    let (status, body) = post(
        &app,
        "/score",
        json!({
            "text_1": pairs.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
            "text_2": pairs.iter().map(|p| p.1.clone()).collect::<Vec<_>>(),
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for ((_, _, logit), data) in pairs.iter().zip(body["data"].as_array().unwrap()) {
        let score = data["score"].as_f64().unwrap();
        assert!(
            (score - sigmoid(*logit)).abs() < 1e-5,
            "{score} vs sigmoid({logit})"
        );
    }

    // One query against every fixture document: rerank orders them by the same scores.
    let query = pairs[0].0.clone();
    let documents: Vec<String> = pairs.iter().map(|p| p.1.clone()).collect();
    let (_, scored) = post(
        &app,
        "/score",
        json!({"text_1": query, "text_2": documents}),
    )
    .await;
    let scores: Vec<f64> = scored["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["score"].as_f64().unwrap())
        .collect();
    assert!((scores[0] - sigmoid(pairs[0].2)).abs() < 1e-5);
    let (status, reranked) = post(
        &app,
        "/v1/rerank",
        json!({"query": query, "documents": documents, "top_n": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reranked}");
    let results = reranked["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    let mut best: Vec<usize> = (0..scores.len()).collect();
    best.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    for (result, &index) in results.iter().zip(&best) {
        assert_eq!(result["index"], index);
        assert!((result["relevance_score"].as_f64().unwrap() - scores[index]).abs() < 1e-9);
    }

    let (status, classified) =
        post(&app, "/classify", json!({"input": [pairs[1].0.clone()]})).await;
    assert_eq!(status, StatusCode::OK, "{classified}");
    assert_eq!(classified["data"][0]["label"], "LABEL_0");
    assert_eq!(classified["data"][0]["num_classes"], 1);
    let (status, refused) = post(&app, "/v1/embeddings", json!({"input": "w5 w6"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Embeddings API"));
    engine.shutdown();
}
