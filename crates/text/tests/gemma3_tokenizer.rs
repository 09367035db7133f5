//! Gemma 3's SentencePiece vocabulary (262k pieces, BOS added) against llama.cpp's prompt ids
//! in the models crate's Gemma 3 270M parity fixture, when the model file is present
//! (`scripts/fetch-gemma3.sh`; the test skips with a message otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde::Deserialize;
use tokenmill_gguf::GgufFile;
use tokenmill_text::Tokenizer;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    completion: String,
}

#[test]
fn gemma3_prompt_ids_and_bos_match_llama_cpp() {
    let test = "gemma3_prompt_ids_and_bos_match_llama_cpp";
    let Some(path) = tokenmill_test_assets::GEMMA3_270M.or_skip(test) else {
        return;
    };
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let fixture = format!(
        "{}/../models/tests/fixtures/family_gemma3_270m_f32.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    for case in &fixture.cases {
        // llama.cpp adds BOS for Gemma (tokenizer.ggml.add_bos_token = true).
        assert_eq!(
            tokenizer.encode(&case.text, true).unwrap(),
            case.prompt_ids,
            "{:?}",
            case.text
        );
        assert_eq!(
            tokenizer.decode(&case.greedy_ids, true).unwrap(),
            case.completion,
            "{:?}",
            case.text
        );
    }
    assert_eq!(fixture.cases[0].prompt_ids[0], 2, "BOS is <bos>, id 2");
}
