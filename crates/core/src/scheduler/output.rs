//! Plain-data results of the scheduler: what to run this step, and what came of it.

use crate::request::{FinishReason, RequestId};

/// How a scheduled request relates to the previous step; an executor that keeps per-request
/// state (for example a persistent batch) uses it to know when to (re)build that state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// Admitted for the first time this step.
    New,
    /// Re-admitted this step after a preemption: it recomputes prompt and generated tokens
    /// (minus any prefix-cache hit) from position `start_position`.
    Resumed,
    /// Was running in the previous step too.
    Continuing,
}

/// One request's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledRequest {
    pub request_id: RequestId,
    pub kind: ScheduleKind,
    /// Tokens to feed this step: a prefill chunk, or the last sampled token for a decode
    /// followed by `draft_token_ids`.
    pub token_ids: Vec<u32>,
    /// Speculative draft tokens, the tail of `token_ids` (decodes only; empty otherwise).
    /// The executor verifies them against the logits of the positions before each and returns
    /// the accepted prefix plus one token of its own.
    pub draft_token_ids: Vec<u32>,
    /// Position of `token_ids[0]` in the sequence (the tokens computed before this step).
    pub start_position: usize,
    /// The request's block tables, one per KV cache group (one unless the model is hybrid),
    /// all of one length; each covers `start_position + token_ids.len()` tokens.
    pub block_tables: Vec<Vec<u32>>,
    /// The request's recurrent-state slot (models with recurrent layers; `None` otherwise),
    /// held from admission until the request finishes or is preempted. A run starting at
    /// position 0 starts from a zero state (the model resets the slot); any other continues
    /// from the state after exactly the positions before `start_position`.
    pub state_slot: Option<u32>,
    /// After this step every known token is computed, so the executor must return one sampled
    /// token for this request (the logits of the last fed token before the drafts), plus the
    /// drafts it accepts.
    pub samples: bool,
    /// Prompt tokens served from the prefix cache on this admission (`New`/`Resumed`; 0 for
    /// `Continuing`). The `New` value is what `usage.prompt_tokens_details.cached_tokens`
    /// reports.
    pub num_cached_tokens: usize,
}

impl ScheduledRequest {
    /// Group 0's block table (the only one unless the model is hybrid).
    pub fn block_table(&self) -> &[u32] {
        self.block_tables.first().map_or(&[][..], Vec::as_slice)
    }
}

/// Everything the executor needs for one step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchedulerOutput {
    /// Identifies the step; `update_from_output` only accepts the latest one.
    pub step: u64,
    /// Running requests first (in running order), then the ones admitted this step.
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests preempted this step; their KV is gone and they wait to be recomputed. For
    /// observers (tests, logs): an executor need not act on it, since a preempted request keeps
    /// its sampling state and returns as [`ScheduleKind::Resumed`]. Finished requests are not
    /// listed here: the engine's finish path tells the executor itself (`remove_request`).
    pub preempted_request_ids: Vec<RequestId>,
    /// Sum of `token_ids.len()` over `scheduled`; never above `max_num_batched_tokens`.
    pub total_num_scheduled_tokens: usize,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// What one step produced for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestUpdate {
    pub request_id: RequestId,
    /// Tokens generated this step (the stop token that ended a request included).
    pub new_token_ids: Vec<u32>,
    /// Set when the request finished this step; its blocks are already freed.
    pub finish_reason: Option<FinishReason>,
    /// The entry of `stop_token_ids` that ended the request (vLLM's `stop_reason`); `None` for
    /// EOS and length.
    pub stop_token_id: Option<u32>,
    /// Generated tokens so far, this step's included.
    pub num_output_tokens: usize,
}

/// A snapshot for metrics and logs. Counters are cumulative since start.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SchedulerStats {
    pub num_running: usize,
    /// Waiting requests, preempted ones included.
    pub num_waiting: usize,
    /// Fraction (0..1) of the KV cache referenced by requests: blocks, and with recurrent
    /// layers state slots, bytes-weighted ([`crate::KvCacheManager::usage`]).
    pub kv_cache_usage: f64,
    pub num_blocks: usize,
    pub num_free_blocks: usize,
    pub num_cached_free_blocks: usize,
    /// Prompt tokens looked up in the prefix cache on admission.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub num_evictions: u64,
    /// Recurrent-state slots in the pool (0 for a model without recurrent layers).
    pub num_state_slots: usize,
    /// Of those, slots no request holds.
    pub num_free_state_slots: usize,
    pub num_scheduled_tokens_last_step: usize,
}
