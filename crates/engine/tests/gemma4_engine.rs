//! Gemma 4 (text) through the whole engine, on the models crate's E2B-like formula-weight
//! fixture (its GGUF as llama.cpp's converter writes it): hybrid KV groups for its sliding and
//! global layers of different head sizes, the KV-shared last layers reading the cache of the
//! earlier ones, prefix caching and speculative decoding. A request's greedy tokens are the
//! same alone, batched, chunked at a small step budget, preempted, served from the prefix cache
//! and speculated (n-gram); KV usage returns to 0.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod models_support;

use std::sync::{Arc, OnceLock};

use common::{greedy, run_all, wait_idle};
use models_support::{gemma4, qwen35};
use tokenmill_engine::spec::SpeculativeConfig;
use tokenmill_engine::{Engine, EngineConfig, KvCacheSizing, LoadedModel};
use tokenmill_models::{KvCacheGrouping, ModelSource};

const MAX_TOKENS: u32 = 6;
const MAX_MODEL_LEN: usize = 128;
const BLOCK_SIZE: usize = 16;

/// The default model's tokenizer and template with the Gemma 4 fixture as the model (the
/// prompts are token ids below its 512-token vocabulary).
fn loaded_gemma4() -> LoadedModel {
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
        let fixture = qwen35::load_fixture("gemma4_e2b_like");
        let path = qwen35::scratch_dir("gemma4_engine").join("gemma4_e2b_like.gguf");
        gemma4::write_gguf(&fixture, &path);
        Arc::from(qwen35::load(ModelSource::from_path(path)))
    });
    let mut loaded = base.with_own_pool(1);
    loaded.model = Arc::clone(model);
    loaded
}

/// A budget of exactly `num_blocks` hybrid blocks.
fn config(num_blocks: usize, max_num_seqs: usize, prefix_caching: bool) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::from_path(common::model_path()));
    let loaded = loaded_gemma4();
    let grouping = KvCacheGrouping::hybrid(loaded.model.kv_layout()).unwrap();
    let bytes_per_block = grouping.bytes_per_block(BLOCK_SIZE, config.kv_storage().unwrap());
    config.kv_cache = KvCacheSizing::Bytes((num_blocks * bytes_per_block) as u64);
    config.max_model_len = Some(MAX_MODEL_LEN);
    config.max_num_seqs = max_num_seqs;
    config.block_size = BLOCK_SIZE;
    config.num_threads = Some(1);
    config.log_stats_interval = None;
    config.enable_prefix_caching = prefix_caching;
    config
}

/// Eight prompts, the even ones sharing a 40-token prefix (so the prefix cache has hits);
/// each has a repeated 4-gram, so n-gram drafting proposes.
fn prompts() -> Vec<Vec<u32>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let prefix: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 512).collect();
    (0..8)
        .map(|index| {
            let len = 3 + (next() % 50) as usize;
            let mut prompt: Vec<u32> = if index % 2 == 0 {
                prefix.clone()
            } else {
                Vec::new()
            };
            prompt.extend((0..len).map(|_| (next() % 512) as u32));
            let gram: Vec<u32> = prompt.iter().rev().take(4).copied().collect();
            prompt.extend(gram.iter().rev());
            prompt
        })
        .collect()
}

/// Every prompt's greedy tokens on an engine with `config`, all submitted at once (or one by
/// one); the engine ends idle with every block free. Returns the tokens, the preemptions and
/// the prefix-cache hits counted.
fn run(config: &EngineConfig, one_by_one: bool) -> (Vec<Vec<u32>>, u64, u64) {
    let engine = Engine::start_loaded(config, loaded_gemma4(), None, false).unwrap();
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
    engine.shutdown();
    (tokens, stats.num_preemptions, stats.prefix_cache_hits)
}

#[test]
fn gemma4_greedy_tokens_are_identical_alone_batched_chunked_preempted_cached_and_speculated() {
    let (alone, _, _) = run(&config(128, 8, false), true);
    assert!(alone.iter().all(|t| t.len() == MAX_TOKENS as usize));
    assert!(alone.iter().any(|t| t != &alone[0]), "{alone:?}");

    let (batched, _, _) = run(&config(128, 8, false), false);
    assert_eq!(batched, alone, "batched");

    let mut chunked = config(128, 8, false);
    chunked.max_num_batched_tokens = Some(7);
    assert_eq!(run(&chunked, false).0, alone, "chunked");

    // 32 blocks, what one max-length request may need over the four groups (one global, three
    // sliding): eight running requests of up to 13 blocks each preempt each other.
    let (preempted, preemptions, _) = run(&config(32, 8, false), false);
    assert!(preemptions > 0, "no preemption");
    assert_eq!(preempted, alone, "preempted");

    // One by one with prefix caching: the even prompts after the first hit the shared
    // prefix's blocks (which the KV-shared layers read too).
    let (cached, _, hits) = run(&config(128, 8, true), true);
    assert!(hits >= 3 * 32, "{hits} prefix-cache hits");
    assert_eq!(cached, alone, "prefix-cached");

    let mut speculated = config(128, 8, false);
    speculated.speculative = Some(
        SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                "prompt_lookup_max": 4}"#,
        )
        .unwrap(),
    );
    assert_eq!(run(&speculated, false).0, alone, "speculated");
}
