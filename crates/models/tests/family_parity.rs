//! Parity with llama.cpp for the Qwen3 and Gemma 3 families on small random-weight GGUFs.
//!
//! `fixtures/family_{qwen3,gemma3}.json` were written by
//! `scripts/reference/make_family_fixtures.py` (llama-cpp-python 0.3.16, f32 KV cache). Each
//! holds the model's spec (metadata; per tensor its name, shape, scale and offset) and, for
//! three id prompts (5, 23 and 40 tokens; Gemma 3's window is 16), 16 greedy ids and the top-8
//! logits at every step. The weights come from a formula both sides compute bit for bit, so
//! this test rebuilds the same F32 GGUF with tokenmill's own writer: no Python, llama.cpp or
//! stored model file is needed to run it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokenmill_gguf::{GgufWriter, MetadataValue};
use tokenmill_models::{
    load_model, Architecture, CausalLm, KvCacheDType, LoadOptions, ModelSource, Workspace,
};

#[derive(Deserialize)]
pub struct Fixture {
    pub arch: String,
    /// `(key without the architecture prefix, type, value)`.
    pub meta: Vec<(String, String, serde_json::Value)>,
    pub tensors: Vec<TensorSpec>,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct TensorSpec {
    pub name: String,
    /// Outermost first.
    pub shape: Vec<u64>,
    pub scale: f32,
    pub offset: f32,
}

#[derive(Deserialize)]
pub struct Case {
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub top_logits: Vec<Vec<(u32, f32)>>,
}

/// Largest |our logit − llama.cpp's| over every top-8 entry of every step, per family.
///
/// Both engines run exact f32 arithmetic on F32 weights, so Qwen3's logits differ by summation
/// order only (measured max 5e-6 at logits of a few units). Gemma 3 differs more: llama.cpp
/// evaluates GELU through an f16 lookup table (input and output rounded to f16, ~5e-4
/// relative) where tokenmill computes it in f32, and the difference passes through seven
/// layers (measured max 9e-4).
const QWEN3_MAX_DIFFERENCE: f32 = 1e-4;
const GEMMA3_MAX_DIFFERENCE: f32 = 1e-2;

/// Steps where llama.cpp's best token leads its runner-up by more than this must pick the
/// same token (far above both tolerances' effect on a margin).
const DECISIVE_MARGIN: f32 = 0.1;

/// `offset + scale * u`, `u` in [-1, 1] from an integer hash of (seed, index): the twin of
/// `formula_weights` in make_family_fixtures.py (same wrapping u64 arithmetic, same f32
/// operations in the same order, so the same bits).
fn formula_weights(seed: u64, count: usize, scale: f32, offset: f32) -> Vec<f32> {
    const MASK: u64 = 0xFFFF_FFFF;
    let add = (seed.wrapping_mul(0x85EB_CA77).wrapping_add(0x1656_67B1)) & MASK;
    (0..count as u64)
        .map(|i| {
            let mut x = (i.wrapping_mul(0x9E37_79B1).wrapping_add(add)) & MASK;
            x ^= x >> 15;
            x = x.wrapping_mul(0x2C1B_3C6D) & MASK;
            x ^= x >> 12;
            x = x.wrapping_mul(0x297A_2D39) & MASK;
            x ^= x >> 15;
            let u = ((x % 20001) as f32 - 10000.0) / 10000.0;
            u * scale + offset
        })
        .collect()
}

/// 32-bit FNV-1a of a tensor name: its seed.
fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0x811C_9DC5u64, |h, byte| {
        ((h ^ u64::from(byte)) * 0x0100_0193) & 0xFFFF_FFFF
    })
}

/// Writes the fixture's model as an F32 GGUF (no tokenizer: the vocabulary size comes from
/// `token_embd.weight`).
pub fn write_gguf(fixture: &Fixture, path: &Path) {
    let mut writer = GgufWriter::new();
    writer.add_metadata(
        "general.architecture",
        MetadataValue::String(fixture.arch.clone()),
    );
    for (key, kind, value) in &fixture.meta {
        let value = match kind.as_str() {
            "u32" => MetadataValue::U32(value.as_u64().unwrap() as u32),
            "f32" => MetadataValue::F32(value.as_f64().unwrap() as f32),
            "str" => MetadataValue::String(value.as_str().unwrap().into()),
            other => panic!("metadata type {other}"),
        };
        writer.add_metadata(&format!("{}.{key}", fixture.arch), value);
    }
    for tensor in &fixture.tensors {
        let count = tensor.shape.iter().product::<u64>() as usize;
        let values = formula_weights(fnv1a(&tensor.name), count, tensor.scale, tensor.offset);
        let dims: Vec<u64> = tensor.shape.iter().rev().copied().collect();
        writer.add_f32_tensor(&tensor.name, &dims, &values);
    }
    writer.write_to(path).unwrap();
}

/// The fixture's model, written to a file of the test's own (`test`): a file another test
/// rewrites while this one has it mapped would fault.
fn load_family(name: &str, test: &str) -> (Fixture, Box<dyn CausalLm>) {
    let fixture: Fixture = common::load_fixture(name);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}.gguf"));
    write_gguf(&fixture, &path);
    let model = load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap();
    (fixture, model)
}

/// Teacher-forces every case along llama.cpp's greedy path and compares the top logits and
/// the decisive greedy picks; returns the largest difference seen.
fn check_logits(model: &dyn CausalLm, fixture: &Fixture, tolerance: f32) -> f32 {
    let vocab = model.config().vocab_size;
    let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
    let mut worst = 0.0f32;
    for (index, case) in fixture.cases.iter().enumerate() {
        common::teacher_forced_logits(
            model,
            &case.prompt_ids,
            &case.greedy_ids,
            KvCacheDType::F32,
            &mut workspace,
            &mut logits,
        );
        for (step, top) in case.top_logits.iter().enumerate() {
            let row = &logits[step * vocab..(step + 1) * vocab];
            for &(token, expected) in top {
                let difference = (row[token as usize] - expected).abs();
                worst = worst.max(difference);
                assert!(
                    difference <= tolerance,
                    "case {index} step {step} token {token}: {} vs llama.cpp {expected}",
                    row[token as usize]
                );
            }
            if top[0].1 - top[1].1 > DECISIVE_MARGIN {
                let ours = tokenmill_models::argmax(row).unwrap();
                assert_eq!(ours, top[0].0, "case {index} step {step}");
            }
        }
    }
    worst
}

/// Greedy generation through the chunked, batched path must follow llama.cpp's greedy ids up
/// to the first step whose margin is not decisive.
fn check_greedy(model: &dyn CausalLm, fixture: &Fixture) {
    let prompts: Vec<Vec<u32>> = fixture.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let new = fixture.cases[0].greedy_ids.len();
    let generated = common::greedy_generate(model, &prompts, new, 7, 16);
    for (index, (case, ours)) in fixture.cases.iter().zip(&generated).enumerate() {
        let decisive = case
            .top_logits
            .iter()
            .take_while(|top| top[0].1 - top[1].1 > DECISIVE_MARGIN)
            .count();
        assert_eq!(
            ours[..decisive],
            case.greedy_ids[..decisive],
            "case {index}: greedy ids differ within the first {decisive} decisive steps"
        );
    }
}

#[test]
fn qwen3_matches_llama_cpp() {
    let (fixture, model) = load_family("family_qwen3.json", "qwen3_matches_llama_cpp");
    let config = model.config();
    assert_eq!(config.architecture, Architecture::Qwen3);
    assert!(config.qk_norm && !config.tie_word_embeddings);
    assert_eq!(
        (config.head_dim, config.hidden_size / config.num_heads),
        (32, 16)
    );
    let worst = check_logits(model.as_ref(), &fixture, QWEN3_MAX_DIFFERENCE);
    eprintln!("qwen3: largest top-8 logit difference {worst}");
    check_greedy(model.as_ref(), &fixture);
}

#[test]
fn gemma3_matches_llama_cpp() {
    let (fixture, model) = load_family("family_gemma3.json", "gemma3_matches_llama_cpp");
    let config = model.config();
    assert_eq!(config.architecture, Architecture::Gemma3);
    assert!(config.tie_word_embeddings);
    let windows: Vec<Option<usize>> = model.kv_layout().iter().map(|l| l.sliding_window).collect();
    assert_eq!(
        windows,
        [
            Some(16),
            Some(16),
            Some(16),
            Some(16),
            Some(16),
            None,
            Some(16)
        ]
    );
    assert!(fixture.cases.iter().any(|c| c.prompt_ids.len() > 16));
    let worst = check_logits(model.as_ref(), &fixture, GEMMA3_MAX_DIFFERENCE);
    eprintln!("gemma3: largest top-8 logit difference {worst}");
    check_greedy(model.as_ref(), &fixture);
}

/// The window is what the fixture measures: the same weights attending to the whole context
/// on every layer give other logits on the prompts longer than the window.
#[test]
fn gemma3_without_its_window_differs_from_llama_cpp() {
    let mut fixture: Fixture = common::load_fixture("family_gemma3.json");
    fixture
        .meta
        .retain(|(key, _, _)| key != "attention.sliding_window");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("random-gemma3-no-window.gguf");
    write_gguf(&fixture, &path);
    let model = load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap();
    assert!(model.kv_layout().iter().all(|l| l.sliding_window.is_none()));
    let long = fixture
        .cases
        .iter()
        .find(|c| c.prompt_ids.len() > 16)
        .unwrap();
    let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
    common::teacher_forced_logits(
        model.as_ref(),
        &long.prompt_ids,
        &long.greedy_ids,
        KvCacheDType::F32,
        &mut workspace,
        &mut logits,
    );
    let vocab = model.config().vocab_size;
    let widest = long
        .top_logits
        .iter()
        .enumerate()
        .flat_map(|(step, top)| {
            let row = &logits[step * vocab..(step + 1) * vocab];
            top.iter()
                .map(move |&(token, expected)| (row[token as usize] - expected).abs())
        })
        .fold(0.0f32, f32::max);
    eprintln!("gemma3 without its window: largest difference {widest}");
    assert!(widest > 10.0 * GEMMA3_MAX_DIFFERENCE, "{widest}");
}

/// A sliding-window model's greedy output does not depend on batching or chunking: all
/// prompts together in chunks of 7, each alone in one prefill, and each one token at a time.
#[test]
fn gemma3_greedy_is_batch_and_chunk_invariant() {
    let (fixture, model) = load_family("family_gemma3.json", "gemma3_greedy_invariance");
    let prompts: Vec<Vec<u32>> = fixture.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let together = common::greedy_generate(model.as_ref(), &prompts, 12, 7, 16);
    for (index, prompt) in prompts.iter().enumerate() {
        for (chunk, block_size) in [(usize::MAX, 16), (1, 4), (5, 32)] {
            let alone = common::greedy_generate(
                model.as_ref(),
                std::slice::from_ref(prompt),
                12,
                chunk,
                block_size,
            );
            assert_eq!(alone[0], together[index], "prompt {index} chunk {chunk}");
        }
    }
}
