//! vLLM's hybrid KV cache manager on the real Gemma 3 270M (15 sliding-window layers with a
//! 512-position window, 3 global ones; `$TOKENMILL_GEMMA3_MODEL` or
//! `~/.cache/tokenmill/models/gemma-3-270m-q4_k_m.gguf`, from `scripts/fetch-gemma3.sh`;
//! skipped without it): prompts longer than the window, so the sliding groups release their
//! leading blocks while the global group keeps the whole context. Greedy tokens must be
//! bitwise those of every layer keeping every block (`disable_hybrid_kv_cache_manager`),
//! alone, batched, chunked, preempted and with prefix hits; a budget too small to run one
//! request without the groups proves the memory saved is real. Speculative decoding over
//! those groups (drafts verified and rolled back while the sliding groups release blocks)
//! changes no greedy token either.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{greedy, greedy_run, greedy_token_ids, prompts, run_all, value, wait_idle};
use tokenmill_engine::spec::SpeculativeConfig;
use tokenmill_engine::{Engine, EngineConfig, KvCacheSizing};
use tokenmill_models::ModelSource;

const MAX_TOKENS: u32 = 6;
const MAX_MODEL_LEN: usize = 1024;

/// A config over `model` whose KV budget holds `num_blocks` blocks of the hybrid layout (3
/// layers each): with the hybrid manager disabled the same bytes hold a sixth as many.
fn config(model: &Path, num_blocks: usize) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::from_path(model.to_path_buf()));
    let per_block = Engine::bytes_per_block_for(&config).unwrap();
    config.kv_cache = KvCacheSizing::Bytes((per_block * num_blocks) as u64);
    config.max_model_len = Some(MAX_MODEL_LEN);
    config.num_threads = Some(2);
    config
}

fn disabled(mut config: EngineConfig) -> EngineConfig {
    config.disable_hybrid_kv_cache_manager = true;
    config
}

/// `count` prompts of 600 to 800 tokens: ordinary token ids, concatenated.
fn long_prompts(count: usize, seed: u64) -> Vec<Vec<u32>> {
    let pieces = prompts(count * 40, seed);
    pieces
        .chunks(40)
        .enumerate()
        .map(|(i, chunk)| {
            let mut prompt: Vec<u32> = chunk.concat();
            while prompt.len() < 600 + 60 * i {
                prompt.extend_from_slice(&chunk[0]);
            }
            prompt.truncate(600 + 60 * i);
            prompt
        })
        .collect()
}

fn run(config: &EngineConfig, prompts: &[Vec<u32>], one_by_one: bool) -> Vec<Vec<u32>> {
    greedy_token_ids(config, prompts, MAX_TOKENS, one_by_one)
}

#[test]
fn hybrid_groups_change_no_token_alone_batched_chunked_preempted_and_prefix_cached() {
    let test = "hybrid_groups_change_no_token_alone_batched_chunked_preempted_and_prefix_cached";
    let Some(model) = tokenmill_test_assets::GEMMA3_270M.or_skip(test) else {
        return;
    };
    let prompts = long_prompts(3, 5);
    assert!(prompts.iter().all(|p| p.len() > 512));

    // Reference: every layer keeps every block, one request at a time, no prefix cache.
    let mut keep_all = disabled(config(&model, 6 * 400));
    keep_all.enable_prefix_caching = false;
    let reference = run(&keep_all, &prompts, true);
    assert!(reference.iter().all(|t| t.len() == MAX_TOKENS as usize));

    // 64-token steps: a max-length request holds 64 global-group blocks plus, per sliding
    // group, ceil((511 + 64) / 16) + 1 = 37: 249 blocks. A budget of 252 hybrid blocks is
    // 42 blocks of all 18 layers without the groups, short of the 64 one request needs.
    let mut small = config(&model, 252);
    small.max_num_batched_tokens = Some(64);
    small.enable_prefix_caching = false;
    let refused = Engine::start(&disabled(small.clone())).map(|e| e.shutdown());
    assert!(
        refused.is_err(),
        "252 hybrid blocks fit a request without the groups"
    );
    let engine = Engine::start(&small).unwrap();
    assert_eq!(engine.capacity().blocks_per_request, 64 + 5 * 37);
    assert_eq!(engine.capacity().num_kv_cache_groups, 6);
    engine.shutdown();
    assert_eq!(run(&small, &prompts, true), reference, "alone, 252 blocks");

    // All at once in a roomy pool, and chunked into 64-token steps.
    let mut batched = config(&model, 6 * 400);
    batched.max_num_seqs = 8;
    batched.max_num_batched_tokens = Some(4096);
    batched.enable_prefix_caching = false;
    assert_eq!(run(&batched, &prompts, false), reference, "batched");
    let chunked = EngineConfig {
        max_num_batched_tokens: Some(64),
        ..batched.clone()
    };
    assert_eq!(run(&chunked, &prompts, false), reference, "chunked");

    // All at once in the 252-block pool: a second request's chunks outgrow it, so requests
    // are preempted and recomputed.
    let mut tiny = small.clone();
    tiny.max_num_seqs = 8;
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

    // Prefix hits: the prompts share their first 576 tokens (36 blocks); the hit must be
    // one every group serves (the sliding groups only the blocks inside its window).
    let shared: Vec<u32> = prompts[2][..576].to_vec();
    let prefixed: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| shared.iter().chain(&p[576..]).copied().collect())
        .collect();
    let reference = run(&keep_all, &prefixed, true);
    let mut cached = config(&model, 2 * 252);
    cached.max_num_batched_tokens = Some(64);
    let engine = Engine::start(&cached).unwrap();
    let client = engine.client();
    for (i, prompt) in prefixed.iter().enumerate() {
        let out = run_all(&client, vec![greedy(prompt.clone(), MAX_TOKENS)]);
        assert_eq!(out[0].token_ids, reference[i], "request {i}");
        if i > 0 {
            assert!(
                out[0].num_cached_tokens >= 576,
                "request {i} got {} cached tokens",
                out[0].num_cached_tokens
            );
        }
    }
    let stats = wait_idle(&client);
    assert!(stats.prefix_cache_hits >= 2 * 576, "{stats:?}");
    engine.shutdown();
}

/// `count` prompts of 560 to 640 tokens, each a random span of ordinary tokens repeated, so
/// the model's continuation copies it and lookup drafts are accepted.
fn repeating_long_prompts(count: usize, seed: u64) -> Vec<Vec<u32>> {
    prompts(count, seed)
        .into_iter()
        .enumerate()
        .map(|(i, span)| {
            let span = &span[..span.len().clamp(12, 40)];
            span.iter().copied().cycle().take(560 + 40 * i).collect()
        })
        .collect()
}

#[test]
fn speculation_over_released_window_blocks_changes_no_token() {
    let test = "speculation_over_released_window_blocks_changes_no_token";
    let Some(model) = tokenmill_test_assets::GEMMA3_270M.or_skip(test) else {
        return;
    };
    // Prompts past the 512-position window and 40 tokens each: the sliding groups release a
    // block every 16 positions while drafts are verified, accepted and rolled back.
    const TOKENS: u32 = 40;
    let prompts = repeating_long_prompts(3, 21);
    assert!(prompts.iter().all(|p| p.len() > 512));
    let named = |mut config: EngineConfig| {
        config.served_model_name = "tm-test".into();
        config.enable_prefix_caching = false;
        config.max_num_seqs = 8;
        config
    };
    let reference = greedy_token_ids(
        &named(disabled(config(&model, 6 * 400))),
        &prompts,
        TOKENS,
        true,
    );
    assert!(reference.iter().all(|t| t.len() == TOKENS as usize));
    for json in [
        r#"{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2,
            "prompt_lookup_max": 4, "disable_by_batch_size": 64}"#,
        r#"{"method": "suffix", "num_speculative_tokens": 8, "disable_by_batch_size": 64}"#,
    ] {
        let speculative = SpeculativeConfig::from_json(json).unwrap();
        let with_spec = |mut config: EngineConfig| {
            config.speculative = Some(speculative.clone());
            named(config)
        };
        let roomy = with_spec(config(&model, 6 * 400));
        let chunked = EngineConfig {
            max_num_batched_tokens: Some(64),
            ..roomy.clone()
        };
        // 252 hybrid blocks hold one such request (41 global-group blocks and 5 x 37), not
        // three: they are preempted and recomputed.
        let mut tiny = with_spec(config(&model, 252));
        tiny.max_num_batched_tokens = Some(64);
        for (name, config, one_by_one) in [
            ("alone", &roomy, true),
            ("batched", &roomy, false),
            ("chunked", &chunked, false),
            ("preempted", &tiny, false),
        ] {
            let (tokens, scrape) = greedy_run(config, &prompts, TOKENS, one_by_one);
            let accepted = value(&scrape, "vllm:spec_decode_num_accepted_tokens_total", None);
            let preemptions = value(&scrape, "vllm:num_preemptions_total", None);
            assert_eq!(tokens, reference, "{json} {name}");
            assert!(accepted > 0.0, "{json} {name}: no draft token was accepted");
            if name == "preempted" {
                assert!(preemptions > 0.0, "{json}: nothing was preempted");
            }
        }
    }
}
