//! Shared by the integration tests: the default model and the reference fixtures.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use tokenmill_text::Tokenizer;

/// The default model: `$TOKENMILL_TEST_MODEL`, else the cache path the fetch script uses.
/// Missing model is a failure, not a skip: CI fetches it first.
pub fn model_path() -> PathBuf {
    if let Ok(path) = std::env::var("TOKENMILL_TEST_MODEL") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "TOKENMILL_TEST_MODEL={} does not exist",
            path.display()
        );
        return path;
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let path = PathBuf::from(home).join(".cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "default model not found at {}; set TOKENMILL_TEST_MODEL or run the model fetch script",
        path.display()
    );
    path
}

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
