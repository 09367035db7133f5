//! `tokenmill embed --dtype`: `bfloat16` reaches the encoder (all-MiniLM-L6-v2's vectors
//! change, staying within the parity bar of the f32 ones), `auto` is the int8-pair GEMM where
//! AMX is usable (vectors within the bar, not the f32 ones) and `float32` elsewhere, a value
//! tokenmill does not know is refused by name. Skipped without the model
//! (`scripts/fetch-minilm.sh`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::path::Path;

use serde_json::Value;
use tokenmill_models::{EncoderPrecision, ModelDtype};

/// The vectors `tokenmill embed --dtype dtype` writes for `texts`.
fn embed(model: &Path, dtype: &str, texts: &[&str]) -> Vec<Vec<f64>> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!(t).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let (ok, _, stderr) = common::run_cli(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "2",
        "--dtype",
        dtype,
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert!(ok, "embed --dtype {dtype} failed: {stderr}");
    std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).unwrap();
            value["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn assert_close(a: &[Vec<f64>], b: &[Vec<f64>], what: &str) {
    for (a, b) in a.iter().zip(b) {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norms = a.iter().map(|x| x * x).sum::<f64>().sqrt()
            * b.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(dot / norms >= 0.9999, "{what}: cosine {}", dot / norms);
    }
}

#[test]
fn each_dtype_reaches_the_encoder_and_unknown_values_are_refused() {
    let test = "each_dtype_reaches_the_encoder_and_unknown_values_are_refused";
    let Some(model) = tokenmill_test_assets::MINILM.or_skip(test) else {
        return;
    };
    let texts = [
        "A short query.",
        "Retrieval pipelines run an embedding model on CPUs.",
    ];
    let f32_vectors = embed(&model, "float32", &texts);
    let bf16_vectors = embed(&model, "bfloat16", &texts);
    let auto_vectors = embed(&model, "auto", &texts);
    assert_ne!(
        f32_vectors, bf16_vectors,
        "--dtype bfloat16 changed nothing"
    );
    assert_close(&f32_vectors, &bf16_vectors, "bfloat16");
    if EncoderPrecision::for_dtype(ModelDtype::Auto) == EncoderPrecision::Int8Pair {
        assert_ne!(
            f32_vectors, auto_vectors,
            "--dtype auto ran f32 on an AMX host"
        );
        assert_close(&f32_vectors, &auto_vectors, "auto (int8 pairs)");
    } else {
        eprintln!("no usable AMX: --dtype auto is f32 here");
        assert_eq!(f32_vectors, auto_vectors);
    }
    let (ok, _, stderr) = common::run_cli(&[
        "embed",
        "--model",
        model.to_str().unwrap(),
        "--dtype",
        "float64",
        "--input",
        "unused.jsonl",
        "--output",
        "unused.jsonl",
    ]);
    assert!(!ok && stderr.contains("float64"), "{stderr}");
}
