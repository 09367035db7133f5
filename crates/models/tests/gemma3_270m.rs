//! Greedy parity with llama.cpp on Gemma 3 270M's real weights, dequantized to F32.
//!
//! `fixtures/family_gemma3_270m_f32.json` was written by
//! `scripts/reference/make_family_fixtures.py --gemma3-270m` (llama-cpp-python 0.3.16, f32 KV
//! cache) from `gemma-3-270m-q4_k_m.gguf` (`scripts/fetch-gemma3.sh`) dequantized to an
//! all-F32 GGUF with gguf-py: nine raw prompts with llama.cpp's BOS, one of them longer than
//! the 512-token sliding window, 32 greedy ids and the top-8 logits at every step.
//!
//! The test runs on that F32 copy (`$TOKENMILL_GEMMA3_F32`, else
//! `~/.cache/tokenmill/reference/gemma-3-270m-q4_k_m.dequantized-F32.gguf`, which the script
//! leaves there). Without it, it loads the Q4_K_M file (`$TOKENMILL_GEMMA3_MODEL`, else the
//! model cache) with `dequantize_to_f32`, which gives the same weights once tokenmill reads
//! every type the file uses (Q5_0, Q8_0, Q4_K, Q6_K); until then, or with neither file, it
//! skips with a message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;

use serde::Deserialize;
use tokenmill_models::{load_model, CausalLm, KvCacheDType, LoadOptions, ModelSource, Workspace};

/// Largest |our logit − llama.cpp's| over every top-8 entry of every step. Both run f32
/// arithmetic on the same weights; the differences are summation order and llama.cpp's f16
/// GELU table (see `family_parity.rs`), through 18 layers (measured max 0.013).
const MAX_LOGIT_DIFFERENCE: f32 = 0.05;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    top_logits: Vec<Vec<(u32, f32)>>,
}

/// `path` if it is a file, else the file `home_relative` under `$HOME`.
fn find(variable: &str, home_relative: &str) -> Option<PathBuf> {
    let path = match std::env::var_os(variable) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(std::env::var_os("HOME")?).join(home_relative),
    };
    path.is_file().then_some(path)
}

/// The F32 copy as it is, else the Q4_K_M file expanded to f32 at load; `None` (a skip, or
/// a failure under `TOKENMILL_REQUIRE_ASSETS=1`) without either.
fn load_f32_model(test: &str) -> Option<Box<dyn CausalLm>> {
    if let Some(path) = find(
        "TOKENMILL_GEMMA3_F32",
        ".cache/tokenmill/reference/gemma-3-270m-q4_k_m.dequantized-F32.gguf",
    ) {
        return Some(load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap());
    }
    let path = tokenmill_test_assets::GEMMA3_270M.or_skip(test)?;
    let options = LoadOptions {
        dequantize_to_f32: true,
        ..LoadOptions::default()
    };
    Some(load_model(&ModelSource::Gguf(path), &options).unwrap())
}

#[test]
fn gemma3_270m_f32_greedy_matches_llama_cpp() {
    let Some(model) = load_f32_model("gemma3_270m_f32_greedy_matches_llama_cpp") else {
        return;
    };
    let fixture: Fixture = common::load_fixture("family_gemma3_270m_f32.json");
    let config = model.config();
    assert_eq!(config.architecture, "gemma3");
    assert_eq!(
        (config.num_layers, config.head_dim, config.vocab_size),
        (18, 256, 262_144)
    );
    let window = model.kv_layout()[0].sliding_window.unwrap();
    assert!(fixture.cases.iter().any(|c| c.prompt_ids.len() > window));

    // Greedy generation through the batched, chunked path: every prompt together.
    let prompts: Vec<Vec<u32>> = fixture.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let generated = common::greedy_generate(model.as_ref(), &prompts, 32, 256, 16);
    for (case, ours) in fixture.cases.iter().zip(&generated) {
        assert_eq!(ours, &case.greedy_ids, "{:?}", case.text);
    }

    // Logits along llama.cpp's path.
    let vocab = config.vocab_size;
    let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
    let mut worst = 0.0f32;
    for case in &fixture.cases {
        common::teacher_forced_logits(
            model.as_ref(),
            &case.prompt_ids,
            &case.greedy_ids,
            KvCacheDType::F32,
            &mut workspace,
            &mut logits,
        );
        for (step, top) in case.top_logits.iter().enumerate() {
            let row = &logits[step * vocab..(step + 1) * vocab];
            for &(token, expected) in top {
                worst = worst.max((row[token as usize] - expected).abs());
            }
        }
    }
    eprintln!("gemma3 270m: largest top-8 logit difference {worst}");
    assert!(worst <= MAX_LOGIT_DIFFERENCE, "{worst}");
}
