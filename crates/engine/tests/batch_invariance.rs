//! Architecture invariant 3 on the real default model: a request's greedy tokens do not depend
//! on what it was batched with, on chunked prefill, on preemption and recompute, or on its
//! prefix being served from the prefix cache. The same holds for the default model with a
//! sliding window on every layer (shorter than most prompts), where every query sees a
//! different suffix of its context.

mod common;

use std::path::{Path, PathBuf};

use common::{config_for, greedy, model_path, prompts, run_all, wait_idle};
use tokenmill_engine::{Engine, EngineConfig};

const NUM_REQUESTS: usize = 64;
const MAX_TOKENS: u32 = 12;

#[test]
fn greedy_tokens_are_identical_alone_batched_chunked_preempted_and_prefix_cached() {
    check_alone_batched_chunked_preempted(&model_path());
}

#[test]
fn greedy_tokens_are_identical_with_a_shared_prefix_from_the_prefix_cache() {
    check_prefix_cache(&model_path());
}

#[test]
fn sliding_window_greedy_tokens_are_identical_alone_batched_chunked_and_preempted() {
    let path = common::sliding_window_model_path();
    let source = tokenmill_models::ModelSource::Gguf(path.clone());
    let model_config = tokenmill_models::read_model_config(&source).unwrap();
    let layout = tokenmill_models::kv_layout(&model_config).unwrap();
    assert!(layout
        .iter()
        .all(|layer| layer.sliding_window == Some(common::SLIDING_WINDOW)));
    check_alone_batched_chunked_preempted(&path);
}

#[test]
fn sliding_window_greedy_tokens_are_identical_with_a_shared_prefix_from_the_prefix_cache() {
    check_prefix_cache(&common::sliding_window_model_path());
}

fn config(model: &Path, num_blocks: usize, max_model_len: usize) -> EngineConfig {
    config_for(PathBuf::from(model), num_blocks, max_model_len)
}

#[allow(clippy::unwrap_used)]
fn check_alone_batched_chunked_preempted(model: &Path) {
    let config = |num_blocks, max_model_len| config(model, num_blocks, max_model_len);
    let prompts = prompts(NUM_REQUESTS, 7);

    // Alone: one request at a time, no prefix caching.
    let mut alone_config = config(512, 256);
    alone_config.enable_prefix_caching = false;
    let engine = Engine::start(&alone_config).unwrap();
    let client = engine.client();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            run_all(&client, vec![greedy(p.clone(), MAX_TOKENS)])[0]
                .token_ids
                .clone()
        })
        .collect();
    assert!(alone.iter().all(|t| t.len() == MAX_TOKENS as usize));
    engine.shutdown();

    // All together in one continuous batch.
    let mut batched_config = config(1024, 256);
    batched_config.max_num_seqs = NUM_REQUESTS;
    batched_config.max_num_batched_tokens = Some(4096);
    batched_config.enable_prefix_caching = false;
    let engine = Engine::start(&batched_config).unwrap();
    let together = run_all(
        &engine.client(),
        prompts
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    );
    for (i, out) in together.iter().enumerate() {
        assert_eq!(out.token_ids, alone[i], "request {i} differs when batched");
    }
    engine.shutdown();

    // Heavy chunking: 32 tokens per step.
    let mut chunked_config = config(1024, 256);
    chunked_config.max_num_seqs = NUM_REQUESTS;
    chunked_config.max_num_batched_tokens = Some(32);
    chunked_config.enable_prefix_caching = false;
    let engine = Engine::start(&chunked_config).unwrap();
    let chunked = run_all(
        &engine.client(),
        prompts
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    );
    for (i, out) in chunked.iter().enumerate() {
        assert_eq!(out.token_ids, alone[i], "request {i} differs when chunked");
    }
    engine.shutdown();

    // No chunked prefill: every prompt whole in one step (the budget defaults to hold one).
    let mut unchunked_config = config(1024, 256);
    unchunked_config.max_num_seqs = NUM_REQUESTS;
    unchunked_config.enable_chunked_prefill = false;
    unchunked_config.enable_prefix_caching = false;
    let engine = Engine::start(&unchunked_config).unwrap();
    let unchunked = run_all(
        &engine.client(),
        prompts
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    );
    for (i, out) in unchunked.iter().enumerate() {
        assert_eq!(
            out.token_ids, alone[i],
            "request {i} differs without chunked prefill"
        );
    }
    engine.shutdown();

    // A pool so small that running requests must be preempted and recomputed.
    let mut tiny_config = config(24, 128);
    tiny_config.max_num_seqs = NUM_REQUESTS;
    tiny_config.max_num_batched_tokens = Some(256);
    tiny_config.enable_prefix_caching = false;
    let engine = Engine::start(&tiny_config).unwrap();
    let client = engine.client();
    let preempted = run_all(
        &client,
        prompts
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    );
    for (i, out) in preempted.iter().enumerate() {
        assert_eq!(
            out.token_ids, alone[i],
            "request {i} differs after preemption"
        );
    }
    let stats = wait_idle(&client);
    assert!(
        stats.num_preemptions > 0,
        "the tiny pool caused no preemption: {stats:?}"
    );
    engine.shutdown();
}

#[allow(clippy::unwrap_used)]
fn check_prefix_cache(model: &Path) {
    let config = |num_blocks, max_model_len| config(model, num_blocks, max_model_len);
    // A 112-token shared prefix (7 full blocks) in front of varied suffixes.
    let prefix: Vec<u32> = (0..112).map(|i| 400 + (i * 37) % 9000).collect();
    let prompts: Vec<Vec<u32>> = prompts(16, 11)
        .into_iter()
        .map(|suffix| prefix.iter().copied().chain(suffix).collect())
        .collect();

    let mut uncached_config = config(1024, 256);
    uncached_config.enable_prefix_caching = false;
    let engine = Engine::start(&uncached_config).unwrap();
    let reference = run_all(
        &engine.client(),
        prompts
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    );
    engine.shutdown();

    let cached_config = config(1024, 256);
    let engine = Engine::start(&cached_config).unwrap();
    let client = engine.client();
    // The first request fills the cache; the rest hit it.
    let first = run_all(&client, vec![greedy(prompts[0].clone(), MAX_TOKENS)]);
    assert_eq!(first[0].token_ids, reference[0].token_ids);
    let rest = run_all(
        &client,
        prompts[1..]
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    );
    for (i, out) in rest.iter().enumerate() {
        assert_eq!(
            out.token_ids,
            reference[i + 1].token_ids,
            "request {} differs with prefix hits",
            i + 1
        );
        assert!(
            out.num_cached_tokens >= 112,
            "request {} got {} cached tokens",
            i + 1,
            out.num_cached_tokens
        );
    }
    let stats = wait_idle(&client);
    assert!(stats.prefix_cache_hits >= 15 * 112, "{stats:?}");
    engine.shutdown();
}
