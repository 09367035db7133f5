//! Per-step cost of the scheduler, which the engine pays on every forward pass: a steady
//! decode batch, and admissions that hit a shared prefix in the cache.

// A benchmark has no caller to report to: a failed setup should stop it loudly.
#![allow(clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tokenmill_core::{
    KvCacheGroups, Request, RequestId, Scheduler, SchedulerConfig, SchedulingPolicy,
};

fn config(max_num_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 8192,
        max_num_seqs,
        max_model_len: 4096,
        block_size: 16,
        num_blocks: 65_536,
        enable_prefix_caching: true,
        policy: SchedulingPolicy::Fcfs,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: true,
        sliding_window: None,
        kv_groups: KvCacheGroups::Single,
        state_slots: tokenmill_core::StateSlotConfig::none(),
    }
}

/// One schedule + update with every sampling request given token 1.
fn step(scheduler: &mut Scheduler) -> usize {
    let output = scheduler.schedule();
    let sampled: Vec<(RequestId, u32)> = output
        .scheduled
        .iter()
        .filter(|s| s.samples)
        .map(|s| (s.request_id, 1))
        .collect();
    scheduler
        .update_from_output(&output, &sampled)
        .expect("update_from_output")
        .len()
}

fn decode_batch(c: &mut Criterion) {
    let num_requests = 256;
    let mut scheduler = Scheduler::new(config(num_requests)).expect("valid benchmark setup");
    for id in 0..num_requests as u64 {
        let prompt: Vec<u32> = (0..512).map(|t| (t * 7 + id as u32) % 50_000).collect();
        let request = Request::new(RequestId(id), prompt, 3_000);
        scheduler
            .add_request(request)
            .expect("valid benchmark setup");
    }
    // Prefill everything, then measure decode steps.
    loop {
        let sampled = step(&mut scheduler);
        if sampled == num_requests {
            break;
        }
    }
    // Each iteration runs 32 decode steps on a fresh copy, so the batch never drains and the
    // first step's cold caches and vector growth are amortized as in a long-running engine.
    c.bench_function("32_decode_steps_256_running", |b| {
        b.iter_batched(
            || scheduler.clone(),
            |mut scheduler| {
                let sampled: usize = (0..32).map(|_| step(&mut scheduler)).sum();
                // Returning the copy keeps its drop out of the timing.
                (sampled, scheduler)
            },
            BatchSize::LargeInput,
        )
    });
}

fn prefix_hit_admission(c: &mut Criterion) {
    let system: Vec<u32> = (0..1024).collect();
    let mut warm = Scheduler::new(config(64)).expect("valid benchmark setup");
    warm.add_request(Request::new(RequestId(0), system.clone(), 1))
        .expect("valid benchmark setup");
    while warm.has_unfinished_requests() {
        step(&mut warm);
    }
    c.bench_function("admit_32_requests_sharing_1024_cached_tokens", |b| {
        b.iter_batched(
            || {
                let mut scheduler = warm.clone();
                for id in 1..=32u64 {
                    let mut prompt = system.clone();
                    prompt.extend([id as u32, 7, 7]);
                    scheduler
                        .add_request(Request::new(RequestId(id), prompt, 1))
                        .expect("valid benchmark setup");
                }
                scheduler
            },
            |mut scheduler| (scheduler.schedule(), scheduler),
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, decode_batch, prefix_hit_admission);
criterion_main!(benches);
