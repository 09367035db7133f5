//! `tokenmill embed --dtype`: `bfloat16` reaches the encoder (all-MiniLM-L6-v2's vectors
//! change, staying within the parity bar of the f32 ones), a value tokenmill does not know is
//! refused by name. Skipped without the model (`scripts/fetch-minilm.sh`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn minilm_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("TOKENMILL_MINILM_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".cache/tokenmill/models/all-MiniLM-L6-v2"))
        })?;
    if dir.join("model.safetensors").is_file() {
        Some(dir)
    } else {
        eprintln!("skipping: all-MiniLM-L6-v2 not found at {}", dir.display());
        None
    }
}

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

#[test]
fn bfloat16_reaches_the_encoder_and_unknown_values_are_refused() {
    let Some(model) = minilm_dir() else { return };
    let texts = [
        "A short query.",
        "Retrieval pipelines run an embedding model on CPUs.",
    ];
    let f32_vectors = embed(&model, "auto", &texts);
    let bf16_vectors = embed(&model, "bfloat16", &texts);
    assert_eq!(f32_vectors, embed(&model, "float32", &texts));
    assert_ne!(
        f32_vectors, bf16_vectors,
        "--dtype bfloat16 changed nothing"
    );
    for (a, b) in f32_vectors.iter().zip(&bf16_vectors) {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norms = a.iter().map(|x| x * x).sum::<f64>().sqrt()
            * b.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(dot / norms >= 0.9999, "cosine {}", dot / norms);
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
