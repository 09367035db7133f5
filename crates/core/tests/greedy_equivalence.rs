//! Hand-built runs where preemption and prefix-cache hits are known to happen, checked to give
//! the same greedy tokens as an undisturbed run.

mod common;

use tokenmill_core::{KvCacheGroups, SchedulerConfig, SchedulingPolicy, StopParams};

use common::driver::{run, RequestSpec};
use common::EOS;

fn spec(arrival_step: usize, prompt: Vec<u32>, max_tokens: u32, priority: i32) -> RequestSpec {
    RequestSpec {
        arrival_step,
        prompt,
        stop: StopParams {
            max_tokens,
            min_tokens: 0,
            ignore_eos: true,
            eos_token_ids: vec![EOS],
            stop_token_ids: Vec::new(),
        },
        priority,
        salt: None,
        abort_at_step: None,
    }
}

fn config(
    num_blocks: u32,
    budget: usize,
    caching: bool,
    policy: SchedulingPolicy,
) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: 8,
        max_model_len: 32,
        block_size: 4,
        num_blocks,
        enable_prefix_caching: caching,
        policy,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: true,
        sliding_window: None,
        kv_groups: KvCacheGroups::Single,
        state_slots: tokenmill_core::StateSlotConfig::none(),
    }
}

/// Four requests sharing a 12-token system prompt, long enough generations to outgrow a
/// 10-block pool.
fn workload() -> Vec<RequestSpec> {
    let system: Vec<u32> = (1..=12).collect();
    (0..4u32)
        .map(|i| {
            let mut prompt = system.clone();
            prompt.extend([20 + i, 30 + i]);
            spec(i as usize, prompt, 14, i as i32 % 2)
        })
        .collect()
}

#[test]
fn preemption_and_prefix_hits_do_not_change_greedy_tokens() {
    let requests = workload();
    let reference = run(
        config(64, 1_000, false, SchedulingPolicy::Fcfs),
        &requests,
        0,
        1_000,
    )
    .unwrap();
    assert_eq!(reference.stats.num_preemptions, 0);
    assert_eq!(reference.stats.prefix_cache_hits, 0);
    for policy in [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority] {
        for caching in [false, true] {
            let tight = run(config(10, 6, caching, policy), &requests, 0, 10_000).unwrap();
            assert!(
                tight.stats.num_preemptions > 0,
                "{policy:?} caching={caching}: no preemption"
            );
            if caching {
                assert!(
                    tight.stats.prefix_cache_hits > 0,
                    "{policy:?}: no prefix hit"
                );
            }
            assert_eq!(
                tight.outcomes, reference.outcomes,
                "{policy:?} caching={caching}"
            );
        }
    }
}

#[test]
fn eos_stops_are_the_same_under_pressure() {
    let mut requests = workload();
    for request in &mut requests {
        request.stop.ignore_eos = false;
        request.stop.min_tokens = 2;
    }
    let reference = run(
        config(64, 1_000, false, SchedulingPolicy::Fcfs),
        &requests,
        3,
        1_000,
    )
    .unwrap();
    let tight = run(
        config(10, 5, true, SchedulingPolicy::Fcfs),
        &requests,
        3,
        10_000,
    )
    .unwrap();
    assert_eq!(tight.outcomes, reference.outcomes);
}
