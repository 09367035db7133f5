//! tokenmill-core: the KV-cache manager and the scheduler of the engine, as pure synchronous
//! state machines (no tensors, IO, clocks or threads), so that every batching, preemption and
//! prefix-caching decision is deterministic and testable without a model.
//!
//! Key types:
//! - [`Scheduler`] (vLLM V1's unified scheduler) with [`SchedulerConfig`] and
//!   [`SchedulingPolicy`]: takes [`Request`]s, plans each step as a [`SchedulerOutput`] (plain
//!   data: per request the tokens to feed, their start position, the full block table and
//!   whether it samples), and turns sampled tokens into [`RequestUpdate`]s.
//! - [`KvCacheManager`] over a [`BlockPool`]: ref-counted fixed-size blocks, an LRU free
//!   queue and automatic prefix caching by chained [`BlockHash`]es. The scheduler sees block
//!   ids and token counts only.
//! - [`StateSlotPool`]: one recurrent-state slot per running request of a hybrid model
//!   (Gated DeltaNet / Mamba layers), owned by the KV manager beside the block tables.
//! - [`KvCacheEvent`]: the prefix cache's stored/removed/cleared log, recorded on demand and
//!   drained by the engine once per step (vLLM's KV events).
//! - [`capacity`]: blocks from a memory budget and vLLM's start-up capacity lines.
//!
//! The engine's loop:
//!
//! ```
//! use tokenmill_core::{Request, RequestId, Scheduler, SchedulerConfig, SchedulingPolicy};
//!
//! let mut scheduler = Scheduler::new(SchedulerConfig {
//!     max_num_batched_tokens: 8,
//!     max_num_seqs: 4,
//!     max_model_len: 32,
//!     block_size: 4,
//!     num_blocks: 16,
//!     enable_prefix_caching: true,
//!     policy: SchedulingPolicy::Fcfs,
//!     long_prefill_token_threshold: None,
//!     enable_chunked_prefill: true,
//!     sliding_window: None,
//!     kv_groups: tokenmill_core::KvCacheGroups::Single,
//!     state_slots: tokenmill_core::StateSlotConfig::none(),
//! })?;
//! scheduler.add_request(Request::new(RequestId(1), vec![1, 2, 3, 4, 5], 3))?;
//! while scheduler.has_unfinished_requests() {
//!     let output = scheduler.schedule();
//!     // The executor runs the model on `output` and samples one token per `samples` request.
//!     let sampled: Vec<(RequestId, u32)> = output
//!         .scheduled
//!         .iter()
//!         .filter(|s| s.samples)
//!         .map(|s| (s.request_id, 7))
//!         .collect();
//!     for update in scheduler.update_from_output(&output, &sampled)? {
//!         // Stream `update.new_token_ids`; `update.finish_reason` ends the request.
//!         let _ = update;
//!     }
//! }
//! assert_eq!(scheduler.stats().kv_cache_usage, 0.0);
//! # Ok::<(), tokenmill_core::SchedulerError>(())
//! ```

mod block_hash;
mod block_pool;
pub mod capacity;
mod error;
mod free_queue;
mod kv_cache_manager;
mod kv_events;
mod request;
mod scheduler;
mod state_slots;

pub use block_hash::{hash_block, BlockHash, BlockHashChain, BlockHashExtraKeys};
pub use block_pool::BlockPool;
pub use error::{KvCacheError, SchedulerError};
pub use kv_cache_manager::{
    ComputedBlocks, KvCacheConfig, KvCacheGroups, KvCacheManager, PrefixCacheStats,
};
pub use kv_events::KvCacheEvent;
pub use request::{FinishReason, Request, RequestId, StopParams};
pub use scheduler::{
    LoraStats, RequestUpdate, ScheduleKind, ScheduledRequest, Scheduler, SchedulerConfig,
    SchedulerOutput, SchedulerStats, SchedulingPolicy,
};
pub use state_slots::{StateSlotConfig, StateSlotPool};
