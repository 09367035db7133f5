//! How much of a Qwen3.5 prefill step the Gated DeltaNet recurrence takes, on Qwen3.5-0.8B's
//! layer shapes (hidden 1024, MLP 3584, attention 8 x 256 / 2 KV heads, DeltaNet 16 x 128
//! heads), four layers (three DeltaNet, one attention, as the real model's 3:1) and a small
//! vocabulary: a 512-token prompt through the whole model against the recurrence alone on the
//! same shape. A measurement, run on demand:
//! `cargo test --release -p tokenmill-models --test qwen35_prefill_share -- --ignored --nocapture`.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;
#[path = "support/qwen35.rs"]
mod qwen35;

use std::time::Instant;

use qwen35::{hybrid_cache, load, load_fixture, pool, scratch_dir, tensor_specs, Qwen35Fixture};
use tokenmill_kernels::{
    gated_delta_rule, l2_normalize_rows, DeltaRuleInputs, DeltaRuleSeq, DeltaRuleShape,
    KeyHeadOrder,
};
use tokenmill_models::{BatchInput, ModelSource, Workspace};

const TOKENS: usize = 512;
const REPEATS: usize = 3;

#[test]
fn the_fixture_specs_are_the_ones_transformers_lists() {
    for name in ["qwen35_08b_like", "qwen35_grouped_values"] {
        let fixture = load_fixture(name);
        let mut ours: Vec<(String, Vec<usize>, f32, f32)> = tensor_specs(&fixture.config)
            .into_iter()
            .map(|s| (s.name, s.shape, s.scale, s.offset))
            .collect();
        let mut theirs: Vec<(String, Vec<usize>, f32, f32)> = fixture
            .tensors
            .iter()
            .map(|s| (s.name.clone(), s.shape.clone(), s.scale, s.offset))
            .collect();
        ours.sort_by(|a, b| a.0.cmp(&b.0));
        theirs.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(ours, theirs, "{name}");
    }
}

#[test]
#[ignore = "a measurement (seconds of CPU); run with --ignored --nocapture"]
fn prefill_share_of_the_recurrence() {
    // The fixture's config with the grouped-values fixture's small sizes replaced by
    // Qwen3.5-0.8B's.
    let mut config = load_fixture("qwen35_grouped_values").config;
    let real = [
        ("hidden_size", 1024),
        ("intermediate_size", 3584),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 2),
        ("head_dim", 256),
        ("linear_key_head_dim", 128),
        ("linear_value_head_dim", 128),
        ("linear_num_key_heads", 16),
        ("linear_num_value_heads", 16),
    ];
    for (key, value) in real {
        config[key] = value.into();
    }
    config["tie_word_embeddings"] = true.into();
    let fixture = Qwen35Fixture {
        tensors: tensor_specs(&config),
        config,
        transformers: Vec::new(),
        llama_cpp: Vec::new(),
    };
    let dir = scratch_dir("qwen35_prefill_share");
    qwen35::write_hf_directory(&fixture, &dir, |_, _| {});
    let model = load(ModelSource::HfDirectory(dir));
    let vocab = model.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..TOKENS as u32).map(|i| (i * 37 + 11) % vocab).collect();
    let pool = pool();
    let blocks = TOKENS.div_ceil(qwen35::BLOCK_SIZE);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut workspace = Workspace::new();
    let mut logits = Vec::new();
    let mut whole = f64::MAX;
    for _ in 0..REPEATS {
        let mut kv = hybrid_cache(model.as_ref(), blocks, qwen35::BLOCK_SIZE, 1);
        let mut batch = BatchInput::default();
        batch
            .add_sequence(&prompt, 0, &table, qwen35::BLOCK_SIZE, true)
            .unwrap();
        batch.state_slots.push(0);
        let start = Instant::now();
        model
            .forward(&pool, &batch, &mut kv, &mut workspace, &mut logits)
            .unwrap();
        whole = whole.min(start.elapsed().as_secs_f64());
    }
    let linear = model.config().linear_attention.unwrap();
    let shape = DeltaRuleShape {
        key_heads: KeyHeadOrder::Grouped,
        ..linear.shape()
    };
    let mut q = vec![0.5f32; TOKENS * shape.key_dim()];
    l2_normalize_rows(&mut q, shape.head_k_dim, 1e-6, 1.0);
    let k = q.clone();
    let v = vec![0.25f32; TOKENS * shape.value_dim()];
    let gates = vec![0.9f32; TOKENS * shape.num_v_heads];
    let mut out = vec![0.0f32; TOKENS * shape.value_dim()];
    let mut recurrence = f64::MAX;
    for _ in 0..REPEATS {
        let mut state = vec![0.0f32; shape.state_elems()];
        let inputs = DeltaRuleInputs {
            q: &q,
            k: &k,
            v: &v,
            decay: &gates,
            beta: &gates,
        };
        let seqs = [DeltaRuleSeq {
            start: 0,
            len: TOKENS,
        }];
        let start = Instant::now();
        gated_delta_rule(&pool, &shape, inputs, &seqs, vec![&mut state], &mut out).unwrap();
        recurrence = recurrence.min(start.elapsed().as_secs_f64());
    }
    let layers = model.state_layout().len() as f64;
    let share = layers * recurrence / whole;
    eprintln!(
        "prefill of {TOKENS} tokens: {:.1} ms; recurrence {:.2} ms per DeltaNet layer x {layers} \
         = {:.0}% of the step ({} threads)",
        whole * 1e3,
        recurrence * 1e3,
        share * 100.0,
        pool.num_threads()
    );
    assert!(share > 0.0 && share < 1.0, "share {share}");
}
