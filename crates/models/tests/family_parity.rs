//! Parity with llama.cpp for the Qwen3, Gemma 3, mixture-of-experts (Qwen3-MoE, Mixtral) and
//! Phi-3 families on small random-weight GGUFs.
//!
//! `fixtures/family_{qwen3,gemma3}.json` were written by
//! `scripts/reference/make_family_fixtures.py`, `family_{qwen3moe,mixtral}.json` by
//! `scripts/reference/make_moe_fixtures.py` (llama-cpp-python 0.3.16, f32 KV cache). Each
//! holds the model's spec (metadata; per tensor its name, shape, scale and offset) and, for
//! three id prompts (5, 23 and 40 tokens; Gemma 3's window is 16), 16 greedy ids and the top-8
//! logits at every step. The weights come from a formula both sides compute bit for bit, so
//! this test rebuilds the same F32 GGUF with tokenmill's own writer: no Python, llama.cpp or
//! stored model file is needed to run it. The MoE fixtures also hold llama.cpp's run of the
//! file `llama-quantize` made Q8_0, with the type it gave each tensor; the test quantizes the
//! same tensors with tokenmill's port of GGML's reference Q8_0 quantizer. The Phi-3 fixtures
//! (`family_phi3{,_longrope}.json`, `scripts/reference/make_phi3_fixtures.py`) do the same
//! for fused QKV and gate/up, partial rotary and LongRoPE, short and long factors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;

use common::family::{
    fnv1a, formula_weights, write_gguf, write_gguf_typed, write_hf_directory, Case, Fixture,
};
use tokenmill_models::{
    load_model, BatchInput, CausalLm, KvCacheDType, KvCacheStorage, LoadOptions, ModelSource,
    MoeConfig, RopeScaling,
    RopeStyle::{Neox, Normal},
    Workspace,
};

/// Largest |our logit − llama.cpp's| over every top-8 entry of every step, per family.
///
/// Both engines run exact f32 arithmetic on F32 weights, so Qwen3's logits differ by summation
/// order only (measured max 5e-6 at logits of a few units). Gemma 3 differs more: llama.cpp
/// evaluates GELU through an f16 lookup table (input and output rounded to f16, ~5e-4
/// relative) where tokenmill computes it in f32, and the difference passes through seven
/// layers (measured max 9e-4).
const QWEN3_MAX_DIFFERENCE: f32 = 1e-4;
const GEMMA3_MAX_DIFFERENCE: f32 = 1e-2;
/// The MoE families, F32 and Q8_0 alike: exact f32 arithmetic on F32 weights; on Q8_0 both
/// engines quantize activations to the same Q8_0 blocks (scales rounded to f16) and take exact
/// integer block dots. The same experts are chosen (router margins far above rounding), so the
/// logits differ by summation order only (measured max 6e-6 on F32, 1e-6 on Q8_0).
const MOE_MAX_DIFFERENCE: f32 = 1e-4;
/// Phi-3, F32 and Q8_0: exact arithmetic as for the others (RoPE angles differ in the last
/// bits: llama.cpp multiplies f32 powers step by step, tokenmill evaluates them in f64);
/// measured max 6e-6 on F32, 1e-6 on Q8_0, short and long factors alike.
const PHI3_MAX_DIFFERENCE: f32 = 1e-4;

/// Steps where llama.cpp's best token leads its runner-up by more than this must pick the
/// same token (far above both tolerances' effect on a margin).
const DECISIVE_MARGIN: f32 = 0.1;

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
fn check_logits(model: &dyn CausalLm, cases: &[Case], tolerance: f32) -> f32 {
    let vocab = model.config().vocab_size;
    let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
    let mut worst = 0.0f32;
    for (index, case) in cases.iter().enumerate() {
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

/// The largest difference from llama.cpp's top logits over `case` (teacher-forced): what a
/// negative control expects to be large.
fn widest_difference(model: &dyn CausalLm, case: &Case) -> f32 {
    let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
    common::teacher_forced_logits(
        model,
        &case.prompt_ids,
        &case.greedy_ids,
        KvCacheDType::F32,
        &mut workspace,
        &mut logits,
    );
    let vocab = model.config().vocab_size;
    case.top_logits
        .iter()
        .enumerate()
        .flat_map(|(step, top)| {
            let row = &logits[step * vocab..(step + 1) * vocab];
            top.iter()
                .map(move |&(token, expected)| (row[token as usize] - expected).abs())
        })
        .fold(0.0f32, f32::max)
}

/// Greedy generation through the chunked, batched path must follow llama.cpp's greedy ids up
/// to the first step whose margin is not decisive.
fn check_greedy(model: &dyn CausalLm, cases: &[Case]) {
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let new = cases[0].greedy_ids.len();
    let generated = common::greedy_generate(model, &prompts, new, 7, 16);
    for (index, (case, ours)) in cases.iter().zip(&generated).enumerate() {
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
    assert_eq!(config.architecture, "qwen3");
    assert!(config.qk_norm && !config.tie_word_embeddings);
    assert_eq!(
        (config.head_dim, config.hidden_size / config.num_heads),
        (32, 16)
    );
    let worst = check_logits(model.as_ref(), &fixture.cases, QWEN3_MAX_DIFFERENCE);
    eprintln!("qwen3: largest top-8 logit difference {worst}");
    check_greedy(model.as_ref(), &fixture.cases);
}

#[test]
fn gemma3_matches_llama_cpp() {
    let (fixture, model) = load_family("family_gemma3.json", "gemma3_matches_llama_cpp");
    let config = model.config();
    assert_eq!(config.architecture, "gemma3");
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
    let worst = check_logits(model.as_ref(), &fixture.cases, GEMMA3_MAX_DIFFERENCE);
    eprintln!("gemma3: largest top-8 logit difference {worst}");
    check_greedy(model.as_ref(), &fixture.cases);
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
    let widest = widest_difference(model.as_ref(), long);
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

/// The same weights as an HF checkpoint load to the same model: identical config and KV
/// layout, bitwise-identical logits (Gemma's `1 + (w - 1)` is exact). Mixtral's GGUF rotates
/// adjacent pairs of permuted Q/K rows where HF rotates halves: the same arithmetic per pair,
/// but a head's dimensions are summed in another order, so its logits agree to rounding.
#[test]
fn hf_checkpoints_match_their_gguf() {
    for (name, test) in [
        ("family_qwen3.json", "hf_qwen3"),
        ("family_gemma3.json", "hf_gemma3"),
        ("family_qwen3moe.json", "hf_qwen3moe"),
        ("family_mixtral.json", "hf_mixtral"),
    ] {
        let (fixture, gguf) = load_family(name, test);
        let dir = tempfile::tempdir().unwrap();
        write_hf_directory(&fixture, dir.path());
        let source = ModelSource::HfDirectory(dir.path().to_path_buf());
        let hf = load_model(&source, &LoadOptions::default()).unwrap();
        let (mut ours, mut theirs) = (gguf.config().clone(), hf.config().clone());
        // What differs by container: HF checkpoints name the scale, GGUF files imply it.
        ours.query_pre_attn_scalar = None;
        theirs.query_pre_attn_scalar = None;
        if fixture.arch == "llama" {
            assert_eq!((ours.rope_style, theirs.rope_style), (Normal, Neox));
            ours.rope_style = Neox;
        }
        assert_eq!(ours, theirs, "{name}");
        assert_eq!(
            gguf.config().attention_scale(),
            hf.config().attention_scale(),
            "{name}"
        );
        assert_eq!(gguf.kv_layout(), hf.kv_layout(), "{name}");
        let case = fixture.cases.last().unwrap();
        let (mut workspace, mut a, mut b) = (Workspace::new(), Vec::new(), Vec::new());
        for (model, logits) in [(&gguf, &mut a), (&hf, &mut b)] {
            common::teacher_forced_logits(
                model.as_ref(),
                &case.prompt_ids,
                &case.greedy_ids,
                KvCacheDType::F32,
                &mut workspace,
                logits,
            );
        }
        if fixture.arch == "llama" {
            let widest = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(widest <= MOE_MAX_DIFFERENCE, "{name}: {widest}");
        } else {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&a) == bits(&b), "{name}: HF and GGUF logits differ");
        }
    }
}

/// `gemma3.final_logit_softcapping` (read by llama.cpp too) turns every logit into
/// `c * tanh(logit / c)`, on top of the same forward pass.
#[test]
fn gemma3_final_logit_softcapping_caps_the_logits() {
    let mut fixture: Fixture = common::load_fixture("family_gemma3.json");
    let plain_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softcap-plain.gguf");
    write_gguf(&fixture, &plain_path);
    let cap = 3.0f32;
    fixture.meta.push((
        "final_logit_softcapping".into(),
        "f32".into(),
        serde_json::json!(cap),
    ));
    let capped_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softcap-capped.gguf");
    write_gguf(&fixture, &capped_path);
    let load = |path: &PathBuf| {
        load_model(&ModelSource::Gguf(path.clone()), &LoadOptions::default()).unwrap()
    };
    let (plain, capped) = (load(&plain_path), load(&capped_path));
    assert_eq!(capped.config().final_logit_softcapping, Some(cap));
    let case = &fixture.cases[1];
    let (mut workspace, mut a, mut b) = (Workspace::new(), Vec::new(), Vec::new());
    for (model, logits) in [(&plain, &mut a), (&capped, &mut b)] {
        common::teacher_forced_logits(
            model.as_ref(),
            &case.prompt_ids,
            &case.greedy_ids,
            KvCacheDType::F32,
            &mut workspace,
            logits,
        );
    }
    assert!(a.iter().any(|v| v.abs() > cap), "the cap must matter");
    for (plain, capped) in a.iter().zip(&b) {
        assert_eq!(capped.to_bits(), (cap * (plain / cap).tanh()).to_bits());
        assert!(capped.abs() <= cap);
    }
}

/// The fixture's MoE model in F32 and as llama-quantize's Q8_0 mix, both checked against
/// llama.cpp; returns the F32 model.
fn check_moe_family(name: &str, test: &str) -> (Fixture, Box<dyn CausalLm>) {
    let (fixture, model) = load_family(name, test);
    let worst = check_logits(model.as_ref(), &fixture.cases, MOE_MAX_DIFFERENCE);
    eprintln!("{name}: largest top-8 logit difference {worst}");
    check_greedy(model.as_ref(), &fixture.cases);
    // Every step of these fixtures is decisive: the F32 ids are llama.cpp's, all of them.
    let prompts: Vec<Vec<u32>> = fixture.cases.iter().map(|c| c.prompt_ids.clone()).collect();
    let generated = common::greedy_generate(model.as_ref(), &prompts, 16, 7, 16);
    for (case, ours) in fixture.cases.iter().zip(&generated) {
        assert_eq!(ours, &case.greedy_ids, "{name}");
    }
    let q8 = fixture.q8_0.as_ref().unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}-q8_0.gguf"));
    write_gguf_typed(&fixture, &path, &q8.tensor_types);
    let quantized = load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap();
    let worst = check_logits(quantized.as_ref(), &q8.cases, MOE_MAX_DIFFERENCE);
    eprintln!("{name} Q8_0: largest top-8 logit difference {worst}");
    check_greedy(quantized.as_ref(), &q8.cases);
    (fixture, model)
}

#[test]
fn qwen3moe_matches_llama_cpp() {
    let (_, model) = check_moe_family("family_qwen3moe.json", "qwen3moe_matches_llama_cpp");
    let config = model.config();
    assert_eq!(config.architecture, "qwen3moe");
    assert_eq!(config.family(), "Qwen3-MoE");
    assert!(config.qk_norm && !config.tie_word_embeddings);
    let moe = MoeConfig {
        num_experts: 8,
        experts_used: 2,
        expert_intermediate_size: 64,
    };
    assert_eq!(config.moe, Some(moe));
    // A decode token reads the router and two of the eight experts of each layer.
    assert!(model.decode_weight_bytes() < model.weight_bytes());
}

#[test]
fn mixtral_matches_llama_cpp() {
    let (_, model) = check_moe_family("family_mixtral.json", "mixtral_matches_llama_cpp");
    let config = model.config();
    assert_eq!(config.architecture, "llama");
    assert_eq!(config.family(), "Mixtral");
    assert_eq!(config.describe_experts(), ", 8 experts (2 per token)");
    assert!(!config.qk_norm && config.tie_word_embeddings);
    let moe = MoeConfig {
        num_experts: 8,
        experts_used: 2,
        expert_intermediate_size: 96,
    };
    assert_eq!(config.moe, Some(moe));
}

/// The MoE block's output for a row must not depend on the rows routed to the same experts:
/// a sequence's logits are bitwise the same alone in one prefill, in one step with the other
/// prompts (whose tokens pick other experts, so each expert's group changes size), and
/// prefilled in two chunks; greedy ids likewise alone, batched, and chunked. On F32 weights
/// and on Q8_0 (int8 activations).
#[test]
fn moe_is_batch_and_chunk_invariant() {
    for (name, test) in [
        ("family_qwen3moe.json", "moe_invariance_qwen3moe"),
        ("family_mixtral.json", "moe_invariance_mixtral"),
    ] {
        let (fixture, f32_model) = load_family(name, test);
        let q8_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}-q8_0.gguf"));
        let q8 = fixture.q8_0.as_ref().unwrap();
        write_gguf_typed(&fixture, &q8_path, &q8.tensor_types);
        let q8_model = load_model(&ModelSource::Gguf(q8_path), &LoadOptions::default()).unwrap();
        let prompts: Vec<Vec<u32>> = fixture.cases.iter().map(|c| c.prompt_ids.clone()).collect();
        assert_moe_invariance(name, f32_model.as_ref(), &prompts);
        assert_moe_invariance(&format!("{name} Q8_0"), q8_model.as_ref(), &prompts);
    }
}

/// A step longer than the MoE block's gathering window (512 tokens) runs window by window;
/// its last logits are bitwise those of the same prompt prefilled in two chunks that each fit
/// one window. On F32 weights (one matmul per expert) and Q8_0 (the segmented matmul).
#[test]
fn moe_steps_longer_than_a_window_match_chunks() {
    let (fixture, f32_model) = load_family("family_qwen3moe.json", "moe_window_qwen3moe");
    let q8_path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("moe_window_qwen3moe-q8_0.gguf");
    write_gguf_typed(
        &fixture,
        &q8_path,
        &fixture.q8_0.as_ref().unwrap().tensor_types,
    );
    let q8_model = load_model(&ModelSource::Gguf(q8_path), &LoadOptions::default()).unwrap();
    let length = 700;
    let prompt: Vec<u32> = fixture
        .cases
        .iter()
        .flat_map(|c| c.prompt_ids.clone())
        .cycle()
        .take(length)
        .collect();
    let block_size = 16;
    let blocks = length.div_ceil(block_size);
    let table: Vec<u32> = (0..blocks as u32).collect();
    for (name, model) in [("F32", f32_model.as_ref()), ("Q8_0", q8_model.as_ref())] {
        let run = |chunks: &[usize]| {
            let mut kv = KvCacheStorage::with_dtype(
                model.kv_layout(),
                blocks,
                block_size,
                KvCacheDType::F32,
            );
            let (mut start, mut logits) = (0, Vec::new());
            for (i, &end) in chunks.iter().enumerate() {
                let mut batch = BatchInput::default();
                let last = i + 1 == chunks.len();
                batch
                    .add_sequence(&prompt[start..end], start, &table, block_size, last)
                    .unwrap();
                let mut workspace = Workspace::new();
                model
                    .forward(
                        &common::test_pool(),
                        &batch,
                        &mut kv,
                        &mut workspace,
                        &mut logits,
                    )
                    .unwrap();
                start = end;
            }
            logits.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let whole = run(&[length]);
        assert_eq!(whole.len(), model.config().vocab_size);
        assert!(
            whole == run(&[350, length]),
            "{name}: one 700-token step vs two chunks"
        );
    }
}

fn assert_moe_invariance(name: &str, model: &dyn CausalLm, prompts: &[Vec<u32>]) {
    let block_size = 16;
    let blocks_per_seq = 4;
    let last_logits = |sequences: &[(usize, usize)], kv: &mut KvCacheStorage| {
        // (prompt index, first position of this step's tokens)
        let mut batch = BatchInput::default();
        for &(index, start) in sequences {
            let table: Vec<u32> = (0..blocks_per_seq)
                .map(|b| (index * blocks_per_seq + b) as u32)
                .collect();
            batch
                .add_sequence(&prompts[index][start..], start, &table, block_size, true)
                .unwrap();
        }
        let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
        model
            .forward(
                &common::test_pool(),
                &batch,
                kv,
                &mut workspace,
                &mut logits,
            )
            .unwrap();
        logits.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    let vocab = model.config().vocab_size;
    let new_cache = || {
        KvCacheStorage::with_dtype(
            model.kv_layout(),
            blocks_per_seq * prompts.len(),
            block_size,
            KvCacheDType::F32,
        )
    };
    let all: Vec<(usize, usize)> = (0..prompts.len()).map(|i| (i, 0)).collect();
    let together = last_logits(&all, &mut new_cache());
    for index in 0..prompts.len() {
        let alone = last_logits(&[(index, 0)], &mut new_cache());
        let row = &together[index * vocab..(index + 1) * vocab];
        assert!(alone == row, "{name}: prompt {index} alone vs batched");
        let split = prompts[index].len() / 2;
        if split > 0 {
            // The first chunk fills the cache; the second's last row gives the logits.
            let mut kv = new_cache();
            let mut batch = BatchInput::default();
            let table: Vec<u32> = (0..blocks_per_seq)
                .map(|b| (index * blocks_per_seq + b) as u32)
                .collect();
            batch
                .add_sequence(&prompts[index][..split], 0, &table, block_size, false)
                .unwrap();
            let (mut workspace, mut logits) = (Workspace::new(), Vec::new());
            model
                .forward(
                    &common::test_pool(),
                    &batch,
                    &mut kv,
                    &mut workspace,
                    &mut logits,
                )
                .unwrap();
            let chunked = last_logits(&[(index, split)], &mut kv);
            assert!(chunked == row, "{name}: prompt {index} chunked");
        }
    }
    let batched = common::greedy_generate(model, prompts, 12, 7, 16);
    for (index, prompt) in prompts.iter().enumerate() {
        for (chunk, block) in [(usize::MAX, 16), (1, 4), (5, 32)] {
            let alone =
                common::greedy_generate(model, std::slice::from_ref(prompt), 12, chunk, block);
            assert_eq!(
                alone[0], batched[index],
                "{name}: prompt {index} chunk {chunk}"
            );
        }
    }
}

/// The routing is what the fixture measures: one expert per token instead of two gives other
/// logits.
#[test]
fn qwen3moe_with_one_expert_per_token_differs_from_llama_cpp() {
    let mut fixture: Fixture = common::load_fixture("family_qwen3moe.json");
    for (key, _, value) in &mut fixture.meta {
        if key == "expert_used_count" {
            *value = serde_json::json!(1);
        }
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("qwen3moe-top1.gguf");
    write_gguf(&fixture, &path);
    let model = load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap();
    assert_eq!(model.config().moe.map(|moe| moe.experts_used), Some(1));
    let case = &fixture.cases[1];
    let widest = widest_difference(model.as_ref(), case);
    eprintln!("qwen3moe with top-1 routing: largest difference {widest}");
    assert!(widest > 100.0 * MOE_MAX_DIFFERENCE, "{widest}");
}

/// Both Phi-3 fixtures, F32 and Q8_0, against llama.cpp: the short factors at a context equal
/// to the original one, the long factors (and the attention factor) at a larger one, with
/// prompts running past the original context.
#[test]
fn phi3_matches_llama_cpp() {
    for (name, test, original, long) in [
        ("family_phi3.json", "phi3_matches_llama_cpp", 128, false),
        (
            "family_phi3_longrope.json",
            "phi3_longrope_matches_llama_cpp",
            32,
            true,
        ),
    ] {
        let (fixture, model) = load_family(name, test);
        let config = model.config();
        assert_eq!(config.architecture, "phi3");
        assert_eq!(config.family(), "Phi-3");
        assert_eq!((config.head_dim, config.rotary_dim), (16, 12));
        let RopeScaling::LongRope {
            original_max_position_embeddings,
            attn_factor,
        } = config.rope_scaling
        else {
            panic!("{name}: {:?}", config.rope_scaling);
        };
        assert_eq!(original_max_position_embeddings, original);
        assert_eq!(
            attn_factor > 1.0,
            long,
            "{name}: attention factor {attn_factor}"
        );
        let factors = config.rope_freq_factors.clone().unwrap();
        let chosen = if long {
            "rope_factors_long.weight"
        } else {
            "rope_factors_short.weight"
        };
        let spec = fixture.tensors.iter().find(|t| t.name == chosen).unwrap();
        assert_eq!(
            factors,
            formula_weights(fnv1a(chosen), 6, spec.scale, spec.offset)
        );
        let longest = fixture
            .cases
            .iter()
            .map(|c| c.prompt_ids.len())
            .max()
            .unwrap();
        assert!(
            !long || longest > original,
            "{name}: no prompt past the original context"
        );
        let worst = check_logits(model.as_ref(), &fixture.cases, PHI3_MAX_DIFFERENCE);
        eprintln!("{name}: largest top-8 logit difference {worst}");
        check_greedy(model.as_ref(), &fixture.cases);
        let q8 = fixture.q8_0.as_ref().unwrap();
        assert!(q8.tensor_types.values().any(|t| t == "Q8_0"));
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}-q8_0.gguf"));
        write_gguf_typed(&fixture, &path, &q8.tensor_types);
        let quantized = load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap();
        let worst = check_logits(quantized.as_ref(), &q8.cases, PHI3_MAX_DIFFERENCE);
        eprintln!("{name} Q8_0: largest top-8 logit difference {worst}");
        check_greedy(quantized.as_ref(), &q8.cases);
    }
}

/// Negative controls: the long fixture's model with its short factors (the file's context
/// cut to the original one), or rotating whole heads, is far from llama.cpp's logits; so the
/// factor choice and the partial rotary are both what makes the positive test pass.
#[test]
fn phi3_without_long_factors_or_partial_rotary_differs_from_llama_cpp() {
    let mut fixture: Fixture = common::load_fixture("family_phi3_longrope.json");
    let longest = (0..fixture.cases.len())
        .max_by_key(|&i| fixture.cases[i].prompt_ids.len())
        .unwrap();
    let worst = |fixture: &Fixture, test: &str| {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}.gguf"));
        write_gguf(fixture, &path);
        let model = load_model(&ModelSource::Gguf(path), &LoadOptions::default()).unwrap();
        widest_difference(model.as_ref(), &fixture.cases[longest])
    };
    let set = |fixture: &mut Fixture, key: &str, value: u64| {
        for entry in &mut fixture.meta {
            if entry.0 == key {
                entry.2 = serde_json::Value::from(value);
            }
        }
    };
    let reference = worst(&fixture, "phi3_control_reference");
    assert!(reference <= PHI3_MAX_DIFFERENCE, "{reference}");
    set(&mut fixture, "context_length", 32);
    let short = worst(&fixture, "phi3_control_short_factors");
    set(&mut fixture, "context_length", 512);
    set(&mut fixture, "rope.dimension_count", 16);
    fixture
        .tensors
        .retain(|t| !t.name.starts_with("rope_factors"));
    let whole_heads = worst(&fixture, "phi3_control_whole_heads");
    eprintln!("phi3 controls: short factors {short}, whole heads {whole_heads}");
    assert!(short > 100.0 * PHI3_MAX_DIFFERENCE, "{short}");
    assert!(whole_heads > 100.0 * PHI3_MAX_DIFFERENCE, "{whole_heads}");
}
