//! The engine's recurrent-state slot plumbing end to end (capacity plan, scheduler slots,
//! runner's `state_slots`, every exit path) over [`RecurrentHashLm`], a test double whose
//! greedy tokens are a hash of the sequence as its state slot saw it. Until a real hybrid
//! model lands (then the batch-invariance tests run on it): a request's tokens are the same
//! alone, batched, chunked, preempted, with fewer slots than requests and on two
//! data-parallel engines; aborts leave KV usage at 0 with every slot free.

use std::sync::{Arc, OnceLock};

use tokenmill_models::{BatchInput, KvCacheStorage, ModelSource, Workspace};

use crate::kv_groups::KvPlan;
use crate::model_runner::LoadedModel;
use crate::request::{GenerateRequest, RequestEvent, StopOptions};
use crate::spec::SpeculativeConfig;
use crate::test_support::{model_path, RecurrentHashLm};
use crate::{Engine, EngineConfig, EngineStats, KvCacheSizing, SamplingParams};

const MAX_TOKENS: u32 = 8;
const MAX_MODEL_LEN: usize = 128;
const BLOCK_SIZE: usize = 16;

/// The default model's tokenizer, template and grammar, loaded once; each engine gets its
/// own handle with the double as its model.
fn loaded_double() -> LoadedModel {
    static BASE: OnceLock<LoadedModel> = OnceLock::new();
    let base = BASE.get_or_init(|| {
        LoadedModel::load(&ModelSource::from_path(model_path()), None, None, Some(1)).unwrap()
    });
    let mut loaded = base.with_own_pool(1);
    loaded.model = Arc::new(RecurrentHashLm::new(base.config()));
    loaded
}

/// An engine config whose budget holds exactly `num_blocks` blocks beside one state slot per
/// sequence (`max_num_seqs`).
fn config(num_blocks: usize, max_num_seqs: usize) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::from_path(model_path()));
    let double = loaded_double();
    let bytes_per_block = KvPlan::for_layout(double.model.kv_layout(), false)
        .bytes_per_block(BLOCK_SIZE, config.kv_storage().unwrap());
    let bytes_per_slot =
        tokenmill_models::StateCacheStorage::bytes_per_slot(double.model.state_layout());
    config.kv_cache =
        KvCacheSizing::Bytes((num_blocks * bytes_per_block + max_num_seqs * bytes_per_slot) as u64);
    config.max_model_len = Some(MAX_MODEL_LEN);
    config.max_num_seqs = max_num_seqs;
    config.block_size = BLOCK_SIZE;
    config.num_threads = Some(1);
    config.log_stats_interval = None;
    config
}

fn start(config: &EngineConfig) -> Engine {
    let own_pools = config.data_parallel_size > 1;
    Engine::start_loaded(config, loaded_double(), None, own_pools).unwrap()
}

fn greedy(prompt: Vec<u32>, max_tokens: u32) -> GenerateRequest {
    let mut request = GenerateRequest::new(prompt);
    request.sampling = SamplingParams::greedy();
    request.stop = StopOptions {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..StopOptions::default()
    };
    request
}

/// Prompts of 3 to 90 tokens (several 16-token blocks, many chunks at a small step budget),
/// the first one repeated last (a prefix-cache hit would skip what its state must see).
fn prompts() -> Vec<Vec<u32>> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut prompts: Vec<Vec<u32>> = (0..11)
        .map(|_| {
            let len = 3 + (next() % 88) as usize;
            (0..len).map(|_| 300 + (next() % 19_700) as u32).collect()
        })
        .collect();
    prompts.push(prompts[0].clone());
    prompts
}

/// Runs every request (all at once, or one after another) and returns their tokens, then
/// checks the engine went idle with nothing held.
fn run(engine: &Engine, prompts: &[Vec<u32>], one_by_one: bool) -> Vec<Vec<u32>> {
    let client = engine.client();
    let collect = |stream: &mut crate::RequestStream| {
        let mut tokens = Vec::new();
        while let Some(event) = stream.blocking_recv() {
            match event {
                RequestEvent::Output(output) => tokens.extend(output.new_token_ids),
                other => panic!("request failed: {other:?}"),
            }
        }
        tokens
    };
    let tokens = if one_by_one {
        prompts
            .iter()
            .map(|p| collect(&mut client.add_request(greedy(p.clone(), MAX_TOKENS)).unwrap()))
            .collect()
    } else {
        let mut streams: Vec<_> = prompts
            .iter()
            .map(|p| client.add_request(greedy(p.clone(), MAX_TOKENS)).unwrap())
            .collect();
        streams.iter_mut().map(collect).collect()
    };
    assert_idle_and_released(engine);
    tokens
}

fn stats_when_idle(engine: &Engine) -> EngineStats {
    let client = engine.client();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let stats = client.stats();
        if stats.num_running == 0 && stats.num_waiting == 0 && stats.num_steps > 0 {
            return stats;
        }
        assert!(std::time::Instant::now() < deadline, "not idle: {stats:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn assert_idle_and_released(engine: &Engine) {
    let stats = stats_when_idle(engine);
    assert_eq!(stats.kv_cache_usage, 0.0, "{stats:?}");
    assert!(stats.num_state_slots > 0, "{stats:?}");
    assert_eq!(
        stats.num_free_state_slots, stats.num_state_slots,
        "{stats:?}"
    );
}

#[test]
fn greedy_tokens_are_identical_alone_batched_chunked_preempted_and_slot_starved() {
    let prompts = prompts();
    let alone_engine = start(&config(64, 4));
    assert_eq!(alone_engine.capacity().num_state_slots, 4);
    let alone = run(&alone_engine, &prompts, true);
    alone_engine.shutdown();
    assert!(alone.iter().all(|t| t.len() == MAX_TOKENS as usize));
    // The repeated prompt gives the same tokens (no prefix hit skipped its state's input).
    assert_eq!(alone[0], alone[prompts.len() - 1]);
    // Different prompts give different tokens: the double is not constant.
    assert_ne!(alone[0], alone[1]);

    let batched_engine = start(&config(256, 16));
    let batched = run(&batched_engine, &prompts, false);
    batched_engine.shutdown();
    assert_eq!(batched, alone, "batched");

    let mut chunked_config = config(256, 16);
    chunked_config.max_num_batched_tokens = Some(7);
    let chunked_engine = start(&chunked_config);
    let chunked = run(&chunked_engine, &prompts, false);
    chunked_engine.shutdown();
    assert_eq!(chunked, alone, "chunked");

    // 10 blocks: one 128-token request needs 8, so running requests preempt each other.
    let preempt_engine = start(&config(10, 8));
    let preempted = run(&preempt_engine, &prompts, false);
    let stats = stats_when_idle(&preempt_engine);
    preempt_engine.shutdown();
    assert!(stats.num_preemptions > 0, "{stats:?}");
    assert_eq!(preempted, alone, "preempted");

    // Two slots for twelve requests: admission waits for a slot, which is then reused.
    let starved_engine = start(&config(256, 2));
    let starved = run(&starved_engine, &prompts, false);
    starved_engine.shutdown();
    assert_eq!(starved, alone, "two slots");

    let mut dp_config = config(256, 8);
    dp_config.data_parallel_size = 2;
    let dp_engine = start(&dp_config);
    let dp = run(&dp_engine, &prompts, false);
    dp_engine.shutdown();
    assert_eq!(dp, alone, "two data-parallel engines");
}

#[test]
fn aborts_leave_no_block_and_no_state_slot_held() {
    let engine = start(&config(32, 4));
    let client = engine.client();
    let mut streams: Vec<_> = prompts()
        .into_iter()
        .map(|p| client.add_request(greedy(p, 30)).unwrap())
        .collect();
    // Abort half once they have produced something, drop (disconnect) the rest unread.
    for stream in streams.iter_mut().step_by(2) {
        let first = stream.blocking_recv();
        assert!(matches!(first, Some(RequestEvent::Output(_))), "{first:?}");
        client.abort(stream.request_id());
    }
    drop(streams);
    assert_idle_and_released(&engine);
    // The engine still serves a request from a slot others used.
    let tokens = run(&engine, &prompts()[..1], true);
    assert_eq!(tokens[0].len(), MAX_TOKENS as usize);
    engine.shutdown();
}

#[test]
fn speculative_decoding_is_refused_for_a_model_with_recurrent_layers() {
    let mut config = config(64, 4);
    config.speculative = Some(
        SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 3}"#)
            .unwrap(),
    );
    let message = match Engine::start_loaded(&config, loaded_double(), None, false) {
        Ok(_) => panic!("an engine with speculative decoding started on recurrent layers"),
        Err(error) => error.to_string(),
    };
    assert!(message.contains("--speculative-config"), "{message}");
    assert!(message.contains("recurrent"), "{message}");
}

/// The double itself: its state carries across chunks, and a continuing run over a reset or
/// foreign slot fails instead of reading a wrong state (the negative control of the tests
/// above).
#[test]
fn the_double_carries_state_across_chunks_and_rejects_a_stale_slot() {
    let loaded = loaded_double();
    let model = &loaded.model;
    let kv = || {
        KvCacheStorage::new(model.kv_layout(), 8, BLOCK_SIZE).with_state(
            tokenmill_models::StateCacheStorage::new(model.state_layout(), 2),
        )
    };
    let tokens: Vec<u32> = (400..420).collect();
    let table: Vec<u32> = (0..8).collect();
    let forward = |kv: &mut KvCacheStorage, chunk: &[u32], start: usize, slot: u32| {
        let mut batch = BatchInput::default();
        batch
            .add_sequence(chunk, start, &table, BLOCK_SIZE, true)
            .unwrap();
        batch.state_slots.push(slot);
        let mut logits = Vec::new();
        model
            .forward(
                &loaded.pool,
                &batch,
                kv,
                &mut Workspace::default(),
                &mut logits,
            )
            .map(|()| logits)
    };
    let mut whole_kv = kv();
    let whole = forward(&mut whole_kv, &tokens, 0, 0).unwrap();
    let mut chunked_kv = kv();
    forward(&mut chunked_kv, &tokens[..7], 0, 1).unwrap();
    let chunked = forward(&mut chunked_kv, &tokens[7..], 7, 1).unwrap();
    assert_eq!(chunked, whole);
    // Continuing from the other (never used) slot, or from a slot another sequence wrote
    // over at position 0, is refused.
    assert!(forward(&mut chunked_kv, &tokens[..1], 20, 0).is_err());
    forward(&mut chunked_kv, &tokens[3..5], 0, 1).unwrap();
    assert!(forward(&mut chunked_kv, &tokens[..1], 20, 1).is_err());
}
