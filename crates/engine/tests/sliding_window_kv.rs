//! Sliding-window KV release on the real default model with a 24-position window on every
//! layer (`common::sliding_window_model_path`, Mistral-style): prompts of 100 to 200 tokens,
//! so a request's leading blocks go back to the pool while it runs. Greedy tokens must be
//! bitwise those of the path that keeps every block (`disable_hybrid_kv_cache_manager`, vLLM's
//! flag), alone, batched, chunked, preempted and with prefix hits that take only the window's
//! blocks; pools too small for one request without the release prove the release happens.

#![allow(clippy::unwrap_used)]

mod common;

use common::{
    config_for, greedy, greedy_token_ids, prompts, run_all, sliding_window_model_path, wait_idle,
};
use tokenmill_engine::{Engine, EngineConfig};

const MAX_TOKENS: u32 = 12;
const MAX_MODEL_LEN: usize = 256;

fn config(num_blocks: usize) -> EngineConfig {
    config_for(sliding_window_model_path(), num_blocks, MAX_MODEL_LEN)
}

/// 16 prompts of 100 to 200 tokens: ordinary token ids from `common::prompts`, concatenated.
fn long_prompts() -> Vec<Vec<u32>> {
    let pieces = prompts(96, 23);
    pieces
        .chunks(6)
        .map(|chunk| {
            let mut prompt: Vec<u32> = chunk.concat();
            while prompt.len() < 100 {
                prompt.extend_from_slice(&chunk[0]);
            }
            prompt.truncate(200);
            prompt
        })
        .collect()
}

fn run(config: &EngineConfig, prompts: &[Vec<u32>], one_by_one: bool) -> Vec<Vec<u32>> {
    greedy_token_ids(config, prompts, MAX_TOKENS, one_by_one)
}

#[test]
fn released_blocks_change_no_token_alone_batched_chunked_and_preempted() {
    let prompts = long_prompts();
    assert!(prompts.iter().all(|p| (100..=200).contains(&p.len())));

    // Reference: every block kept, one request at a time, no prefix cache.
    let mut keep_all = config(1024);
    keep_all.disable_hybrid_kv_cache_manager = true;
    keep_all.enable_prefix_caching = false;
    let reference = run(&keep_all, &prompts, true);
    assert!(reference.iter().all(|t| t.len() == MAX_TOKENS as usize));

    // Alone with release, in a pool of 6 blocks (96 tokens): shorter than every prompt, and
    // refused outright when every block must be kept.
    let mut small = config(6);
    small.max_num_batched_tokens = Some(32);
    small.enable_prefix_caching = false;
    let mut small_keep_all = small.clone();
    small_keep_all.disable_hybrid_kv_cache_manager = true;
    let refused = Engine::start(&small_keep_all).map(|e| e.shutdown());
    assert!(refused.is_err(), "a 6-block pool fits a 256-token request");
    let engine = Engine::start(&small).unwrap();
    assert_eq!(engine.capacity().blocks_per_request, 5);
    assert!(engine.capacity().log_lines()[3].ends_with("1.20x"));
    engine.shutdown();
    assert_eq!(run(&small, &prompts, true), reference, "alone, 6 blocks");

    // All at once in a roomy pool, and with heavy chunking.
    let mut batched = config(1024);
    batched.max_num_seqs = 16;
    batched.max_num_batched_tokens = Some(4096);
    batched.enable_prefix_caching = false;
    assert_eq!(run(&batched, &prompts, false), reference, "batched");
    let mut chunked = config(1024);
    chunked.max_num_seqs = 16;
    chunked.max_num_batched_tokens = Some(32);
    chunked.enable_prefix_caching = false;
    assert_eq!(run(&chunked, &prompts, false), reference, "chunked");

    // Sixteen requests in 5 blocks (what one request may hold with 32-token steps): a
    // decode plus an admitted prompt's chunks outgrow the pool, so requests are preempted
    // and recomputed.
    let mut tiny = config(5);
    tiny.max_num_seqs = 16;
    tiny.max_num_batched_tokens = Some(32);
    tiny.enable_prefix_caching = false;
    let engine = Engine::start(&tiny).unwrap();
    let client = engine.client();
    let preempted: Vec<Vec<u32>> = run_all(
        &client,
        prompts
            .iter()
            .map(|p| greedy(p.clone(), MAX_TOKENS))
            .collect(),
    )
    .into_iter()
    .map(|c| c.token_ids)
    .collect();
    let stats = wait_idle(&client);
    engine.shutdown();
    assert_eq!(preempted, reference, "preempted");
    assert!(stats.num_preemptions > 0, "no preemption: {stats:?}");
}

#[test]
fn prefix_hits_take_only_the_window_blocks_and_change_no_token() {
    // A 160-token shared prefix (10 blocks) in front of varied suffixes.
    let prefix: Vec<u32> = (0..160).map(|i| 400 + (i * 37) % 9000).collect();
    let prompts: Vec<Vec<u32>> = prompts(8, 11)
        .into_iter()
        .map(|suffix| prefix.iter().copied().chain(suffix).collect())
        .collect();
    let mut keep_all = config(1024);
    keep_all.disable_hybrid_kv_cache_manager = true;
    keep_all.enable_prefix_caching = false;
    let reference = run(&keep_all, &prompts, true);

    // Release on, prefix caching on, a pool that holds a few requests' windows only.
    let mut cached = config(24);
    cached.max_num_batched_tokens = Some(64);
    let engine = Engine::start(&cached).unwrap();
    let client = engine.client();
    let first = run_all(&client, vec![greedy(prompts[0].clone(), MAX_TOKENS)]);
    assert_eq!(first[0].token_ids, reference[0]);
    for (i, prompt) in prompts.iter().enumerate().skip(1) {
        let out = run_all(&client, vec![greedy(prompt.clone(), MAX_TOKENS)]);
        assert_eq!(
            out[0].token_ids, reference[i],
            "request {i} with a prefix hit"
        );
        assert!(
            out[0].num_cached_tokens >= 160,
            "request {i} got {} cached tokens",
            out[0].num_cached_tokens
        );
    }
    let stats = wait_idle(&client);
    assert!(stats.prefix_cache_hits >= 7 * 160, "{stats:?}");
    engine.shutdown();
}
