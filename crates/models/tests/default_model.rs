//! The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF): metadata, a sensible greedy
//! continuation, and batch invariance (alone, batched, chunked prefill give the same tokens).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{default_model_path, greedy_generate, load_default_model};
use tokenmill_models::{LlamaModel, ModelConfig, RopeScaling, RopeStyle};

fn load_default() -> LlamaModel {
    load_default_model(false)
}

/// "The capital of France is", tokenized without BOS as llama.cpp does for a raw prompt.
const FRANCE: [u32; 5] = [504, 3575, 282, 4649, 314];

#[test]
fn default_model_config() {
    let file = tokenmill_gguf::GgufFile::open(&default_model_path()).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(config.architecture, "llama");
    assert_eq!(config.vocab_size, 49152);
    assert_eq!(config.hidden_size, 576);
    assert_eq!(config.intermediate_size, 1536);
    assert_eq!(config.num_layers, 30);
    assert_eq!(config.num_heads, 9);
    assert_eq!(config.num_kv_heads, 3);
    assert_eq!(config.head_dim, 64);
    assert_eq!(config.max_position_embeddings, 8192);
    assert_eq!(config.rope_theta, 100_000.0);
    assert!((config.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert_eq!(config.rope_scaling, RopeScaling::None);
    assert_eq!(config.rope_style, RopeStyle::Normal);
    assert!(config.tie_word_embeddings);
    assert!(!config.attention_bias);
}

#[test]
fn greedy_continuation_names_paris() {
    let model = load_default();
    let generated = greedy_generate(&model, &[FRANCE.to_vec()], 8, 512, 16).remove(0);
    // " Paris" is token 7042 in SmolLM2's vocabulary.
    assert_eq!(generated[0], 7042, "greedy continuation {generated:?}");
}

#[test]
fn greedy_tokens_do_not_depend_on_batching_or_chunking() {
    let model = load_default();
    let prompts: Vec<Vec<u32>> = vec![
        FRANCE.to_vec(),
        vec![
            1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
            407, 19712, 8182, 2, 198, 1, 4093, 198,
        ],
        vec![
            3220, 2066, 253, 655, 28, 281, 253, 1165, 3600, 411, 260, 3656, 28,
        ],
        (100..160).collect(),
    ];
    let new_tokens = 12;
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|prompt| {
            greedy_generate(&model, std::slice::from_ref(prompt), new_tokens, 512, 16).remove(0)
        })
        .collect();
    let together = greedy_generate(&model, &prompts, new_tokens, 512, 16);
    assert_eq!(together, alone, "one flattened batch vs one at a time");
    // Chunked prefill interleaves with the other sequences' decode steps (mixed batches).
    let chunked = greedy_generate(&model, &prompts, new_tokens, 7, 16);
    assert_eq!(chunked, alone, "prefill in chunks of 7 vs one at a time");
}
