//! Qwen3.5 (Gated DeltaNet hybrid) through the whole engine: the capacity plan's state slots,
//! the scheduler's slot per request and the runner's `state_slots`, on the real model built
//! from the models crate's formula-weight fixture (its GGUF as llama.cpp's converter writes
//! it). A request's greedy tokens are the same alone, batched, chunked at a small step budget,
//! preempted (a pool too small for every running request) and with fewer state slots than
//! requests; KV usage returns to 0 with every slot free.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod models_support;

use std::sync::{Arc, OnceLock};

use common::{greedy, run_all, wait_idle};
use models_support::qwen35;
use tokenmill_engine::{Engine, EngineConfig, KvCacheSizing, LoadedModel};
use tokenmill_models::{KvCacheStorage, ModelSource, StateCacheStorage};

const MAX_TOKENS: u32 = 6;
const MAX_MODEL_LEN: usize = 96;
const BLOCK_SIZE: usize = 16;

/// The default model's tokenizer and template with the Qwen3.5 fixture as the model (the
/// prompts are token ids below its 512-token vocabulary).
fn loaded_qwen35() -> LoadedModel {
    static BASE: OnceLock<LoadedModel> = OnceLock::new();
    static MODEL: OnceLock<Arc<dyn tokenmill_models::CausalLm>> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        LoadedModel::load(
            &ModelSource::from_path(common::model_path()),
            None,
            None,
            Some(1),
        )
        .unwrap()
    });
    let model = MODEL.get_or_init(|| {
        let fixture = qwen35::load_fixture("qwen35_grouped_values");
        let path = qwen35::scratch_dir("qwen35_engine").join("qwen35_grouped_values.gguf");
        qwen35::write_gguf(&fixture, &path);
        Arc::from(qwen35::load(ModelSource::from_path(path)))
    });
    let mut loaded = base.with_own_pool(1);
    loaded.model = Arc::clone(model);
    loaded
}

/// A budget of exactly `num_blocks` blocks beside one state slot per sequence.
fn config(num_blocks: usize, max_num_seqs: usize) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::from_path(common::model_path()));
    let loaded = loaded_qwen35();
    let bytes_per_block = KvCacheStorage::bytes_per_block(
        loaded.model.kv_layout(),
        BLOCK_SIZE,
        config.kv_storage().unwrap(),
    );
    let bytes_per_slot = StateCacheStorage::bytes_per_slot(loaded.model.state_layout());
    config.kv_cache =
        KvCacheSizing::Bytes((num_blocks * bytes_per_block + max_num_seqs * bytes_per_slot) as u64);
    config.max_model_len = Some(MAX_MODEL_LEN);
    config.max_num_seqs = max_num_seqs;
    config.block_size = BLOCK_SIZE;
    config.num_threads = Some(1);
    config.log_stats_interval = None;
    config
}

fn prompts() -> Vec<Vec<u32>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..8)
        .map(|_| {
            let len = 3 + (next() % 70) as usize;
            (0..len).map(|_| (next() % 512) as u32).collect()
        })
        .collect()
}

/// Every prompt's greedy tokens on an engine with `config`, all submitted at once (or one by
/// one); the engine ends idle with every block and slot free. Returns the tokens and the
/// preemptions counted.
fn run(config: &EngineConfig, one_by_one: bool) -> (Vec<Vec<u32>>, u64) {
    let engine = Engine::start_loaded(config, loaded_qwen35(), None, false).unwrap();
    let client = engine.client();
    let requests = || prompts().into_iter().map(|p| greedy(p, MAX_TOKENS));
    let tokens: Vec<Vec<u32>> = if one_by_one {
        requests()
            .flat_map(|request| run_all(&client, vec![request]))
            .map(|collected| collected.token_ids)
            .collect()
    } else {
        run_all(&client, requests().collect())
            .into_iter()
            .map(|collected| collected.token_ids)
            .collect()
    };
    let stats = wait_idle(&client);
    assert_eq!(stats.kv_cache_usage, 0.0, "{stats:?}");
    assert_eq!(
        stats.num_free_state_slots, stats.num_state_slots,
        "{stats:?}"
    );
    engine.shutdown();
    (tokens, stats.num_preemptions)
}

#[test]
fn qwen35_greedy_tokens_are_identical_alone_batched_chunked_preempted_and_slot_starved() {
    let (alone, _) = run(&config(64, 4), true);
    assert!(alone.iter().all(|t| t.len() == MAX_TOKENS as usize));
    // The model is not constant over prompts: a wrong state would show.
    assert!(alone.iter().any(|t| t != &alone[0]), "{alone:?}");

    let (batched, _) = run(&config(128, 8), false);
    assert_eq!(batched, alone, "batched");

    let mut chunked = config(128, 8);
    chunked.max_num_batched_tokens = Some(5);
    assert_eq!(run(&chunked, false).0, alone, "chunked");

    // 8 blocks: a request needs up to 5, so running requests preempt each other.
    let (preempted, preemptions) = run(&config(8, 4), false);
    assert!(preemptions > 0, "no preemption");
    assert_eq!(preempted, alone, "preempted");

    // Two slots for eight requests: admission waits for a slot, which is then reused.
    assert_eq!(run(&config(128, 2), false).0, alone, "two slots");
}
