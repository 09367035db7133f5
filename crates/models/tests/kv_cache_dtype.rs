//! Reduced-precision KV caches on the default model: teacher-forced logits over an f16, bf16
//! or fp8 cache stay close to those over the f32 cache, and greedy generation stays batch
//! invariant with each cache type.
//!
//! The prompts and forced continuations are those of the llama.cpp parity fixture
//! (`fixtures/parity_smollm2.json`: 17 raw and chat prompts, 32 greedy tokens each).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{greedy_generate_with_kv, load_default_model, load_fixture};
use serde::Deserialize;
use tokenmill_models::{argmax, CausalLm, KvCacheDType, LlamaModel, Workspace};

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

fn fixture() -> Fixture {
    load_fixture("parity_smollm2.json")
}

/// Logits at every forced step (prompt, then the fixture's greedy tokens, in one prefill) over
/// a fresh `dtype` cache.
fn teacher_forced_logits(model: &LlamaModel, case: &Case, dtype: KvCacheDType) -> Vec<f32> {
    let mut logits = Vec::new();
    common::teacher_forced_logits(
        model,
        &case.prompt_ids,
        &case.greedy_ids,
        dtype,
        &mut Workspace::new(),
        &mut logits,
    );
    logits
}

/// How far a cache type moves the logits from the f32 cache's, over every forced step.
#[derive(Debug, Default)]
struct Drift {
    steps: usize,
    top1_agree: usize,
    max_delta: f32,
    sum_delta: f64,
    entries: usize,
}

impl Drift {
    fn agreement(&self) -> f64 {
        self.top1_agree as f64 / self.steps as f64
    }

    fn mean_delta(&self) -> f64 {
        self.sum_delta / self.entries as f64
    }
}

/// (cache type, min top-1 agreement, max |Δlogit|, max mean |Δlogit|).
type Limits = (KvCacheDType, f64, f32, f64);

/// Teacher-forces every fixture case over an f32 cache and over each cache type of `limits`,
/// prints the drift and checks it against the limits.
fn check_drift(model: &LlamaModel, label: &str, limits: &[Limits]) {
    let vocab = model.config().vocab_size;
    let mut drifts: Vec<Drift> = limits.iter().map(|_| Drift::default()).collect();
    for case in &fixture().cases {
        let reference = teacher_forced_logits(model, case, KvCacheDType::F32);
        for (&(dtype, ..), drift) in limits.iter().zip(&mut drifts) {
            let reduced = teacher_forced_logits(model, case, dtype);
            for (want, got) in reference.chunks(vocab).zip(reduced.chunks(vocab)) {
                drift.steps += 1;
                drift.top1_agree += usize::from(argmax(want) == argmax(got));
                for (a, b) in want.iter().zip(got) {
                    let delta = (a - b).abs();
                    assert!(delta.is_finite(), "{dtype}: non-finite logit");
                    drift.max_delta = drift.max_delta.max(delta);
                    drift.sum_delta += f64::from(delta);
                    drift.entries += 1;
                }
            }
        }
    }
    for (&(dtype, ..), drift) in limits.iter().zip(&drifts) {
        eprintln!(
            "{label}, {dtype} KV vs f32 KV: top-1 agreement {}/{} ({:.1} %), max |Δlogit| {:.4}, \
             mean |Δlogit| {:.5}",
            drift.top1_agree,
            drift.steps,
            100.0 * drift.agreement(),
            drift.max_delta,
            drift.mean_delta()
        );
    }
    for (&(dtype, agreement, max_delta, mean_delta), drift) in limits.iter().zip(&drifts) {
        assert!(drift.agreement() >= agreement, "{label} {dtype}: {drift:?}");
        assert!(drift.max_delta <= max_delta, "{label} {dtype}: {drift:?}");
        assert!(
            drift.mean_delta() <= mean_delta,
            "{label} {dtype}: {drift:?}"
        );
    }
}

/// On the default (Q4_1) model. Limits are the measured figures with margin (measured:
/// f16 95.2 % / 2.23 / 0.208, bf16 97.1 % / 1.97 / 0.216, fp8_e4m3 93.6 % / 6.23 / 0.422,
/// fp8_e5m2 89.2 % / 21.2 / 0.738). The 16-bit types sit at the noise floor of int8 activation
/// quantization, which turns any last-bit change into occasional whole-step flips (llama.cpp
/// against itself, batched vs token by token, differs by mean 0.107 / max 0.83; see
/// `parity_llama_cpp.rs`); the fp8 types are visibly coarser (no calibrated scales).
#[test]
fn reduced_precision_kv_caches_stay_close_to_f32() {
    check_drift(
        &load_default_model(false),
        "Q4_1 weights",
        &[
            (KvCacheDType::F16, 0.90, 4.0, 0.35),
            (KvCacheDType::BF16, 0.90, 4.0, 0.35),
            (KvCacheDType::Fp8E4m3, 0.85, 10.0, 0.6),
            (KvCacheDType::Fp8E5m2, 0.80, 30.0, 1.0),
        ],
    );
}

/// With the weights widened to f32 nothing but the cache rounds, so the 16-bit types' own
/// error shows (measured: f16 100 % / 0.039 / 0.0024, bf16 99.6 % / 0.447 / 0.0213,
/// fp8_e4m3 94.9 % / 5.15 / 0.329, fp8_e5m2 91.4 % / 12.9 / 0.673).
#[test]
fn reduced_precision_kv_caches_stay_close_to_f32_with_f32_weights() {
    check_drift(
        &load_default_model(true),
        "f32 weights",
        &[
            (KvCacheDType::F16, 0.99, 0.2, 0.01),
            (KvCacheDType::BF16, 0.98, 1.0, 0.05),
            (KvCacheDType::Fp8E4m3, 0.88, 8.0, 0.5),
            (KvCacheDType::Fp8E5m2, 0.85, 20.0, 0.9),
        ],
    );
}

/// Greedy output with each cache type is the same alone, batched, and chunk-prefilled (the
/// batch-invariance promise holds per type), and f16 generations are compared with f32's.
#[test]
fn greedy_generation_is_batch_invariant_for_every_kv_type() {
    let model = load_default_model(false);
    let fixture = fixture();
    let prompts: Vec<Vec<u32>> = fixture
        .cases
        .iter()
        .take(6)
        .map(|case| case.prompt_ids.clone())
        .collect();
    let f32_batched = greedy_generate_with_kv(&model, &prompts, 16, 512, 16, KvCacheDType::F32);
    for dtype in KvCacheDType::ALL {
        let batched = greedy_generate_with_kv(&model, &prompts, 16, 512, 16, dtype);
        let chunked = greedy_generate_with_kv(&model, &prompts, 16, 7, 16, dtype);
        assert_eq!(
            batched, chunked,
            "{dtype}: chunked prefill changed the output"
        );
        for (index, prompt) in prompts.iter().enumerate().take(2) {
            let alone =
                greedy_generate_with_kv(&model, std::slice::from_ref(prompt), 16, 512, 16, dtype);
            assert_eq!(alone[0], batched[index], "{dtype}: prompt {index} alone");
        }
        let same_as_f32: usize = batched
            .iter()
            .zip(&f32_batched)
            .map(|(a, b)| a.iter().zip(b).take_while(|(x, y)| x == y).count())
            .sum();
        eprintln!(
            "{dtype}: {same_as_f32}/{} greedy tokens before the first divergence from f32",
            16 * prompts.len()
        );
    }
}
