//! What the engine's unit tests share: the real model's path and a small scheduler with its
//! metrics (16 blocks of 16 tokens, 64-token requests).

use std::sync::Arc;

use tokenmill_core::{KvCacheGroups, Scheduler, SchedulerConfig, SchedulingPolicy};
use tokenmill_metrics::{EngineMetrics, MetricsConfig};

pub use tokenmill_test_assets::default_model as model_path;

pub fn small_scheduler() -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        max_model_len: 64,
        block_size: 16,
        num_blocks: 16,
        enable_prefix_caching: true,
        policy: SchedulingPolicy::Fcfs,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: true,
        sliding_window: None,
        kv_groups: KvCacheGroups::Single,
    })
    .unwrap()
}

pub fn small_metrics() -> Arc<EngineMetrics> {
    Arc::new(EngineMetrics::new(MetricsConfig {
        model_name: "test".into(),
        max_model_len: 64,
        block_size: 16,
        num_blocks: 16,
        enable_prefix_caching: true,
        cache_dtype: "auto".into(),
    }))
}
