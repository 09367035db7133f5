//! Shared by the integration tests: the default model and the reference fixtures.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use tokenmill_text::Tokenizer;

pub use tokenmill_test_assets::default_model as model_path;

pub fn default_tokenizer() -> Tokenizer {
    let file = tokenmill_gguf::GgufFile::open(&model_path()).expect("open default model");
    Tokenizer::from_gguf(&file).expect("tokenizer from GGUF metadata")
}

pub fn fixture(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

/// (prompt, llama.cpp ids) for every case of the tokenizer fixture.
pub fn tokenizer_cases() -> Vec<(String, Vec<u32>)> {
    let fixture = fixture("tokenizer_smollm2.json");
    fixture["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|case| {
            let prompt = case["prompt"].as_str().expect("prompt").to_string();
            let ids = case["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|id| id.as_u64().expect("id") as u32)
                .collect();
            (prompt, ids)
        })
        .collect()
}
