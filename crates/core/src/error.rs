//! Error types of the KV-cache manager and the scheduler.

use crate::request::RequestId;

/// Errors of [`crate::KvCacheManager`] and [`crate::BlockPool`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvCacheError {
    #[error("invalid KV cache config: {reason}")]
    InvalidConfig { reason: String },
    /// Not enough free (or evictable) blocks; nothing was changed. The scheduler answers
    /// this by preempting or by not admitting.
    #[error("not enough free KV blocks: need {needed}, {available} available")]
    OutOfBlocks { needed: usize, available: usize },
    /// Every recurrent-state slot is held; nothing was changed. Admission waits, as for
    /// blocks.
    #[error("no free recurrent-state slot: all {num_slots} are held")]
    OutOfStateSlots { num_slots: u32 },
    #[error("request {request_id} already holds KV blocks; prefix hits apply only on admission")]
    AlreadyAllocated { request_id: RequestId },
    #[error("KV cache invariant violated: {detail}")]
    InvariantViolated { detail: String },
}

/// Errors of [`crate::Scheduler`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("invalid scheduler config: {reason}")]
    InvalidConfig { reason: String },
    #[error("request {request_id}: the prompt is empty")]
    EmptyPrompt { request_id: RequestId },
    /// vLLM needs room for at least one generated token, so a prompt of `max_model_len`
    /// tokens is already too long.
    #[error(
        "request {request_id}: prompt of {prompt_len} tokens does not fit the maximum context \
         length of {max_model_len} tokens"
    )]
    PromptTooLong {
        request_id: RequestId,
        prompt_len: usize,
        max_model_len: usize,
    },
    #[error(
        "request {request_id}: this model's maximum context length is {max_model_len} tokens, \
         but {prompt_len} prompt tokens + {max_tokens} max_tokens were requested"
    )]
    ExceedsMaxModelLen {
        request_id: RequestId,
        prompt_len: usize,
        max_tokens: u32,
        max_model_len: usize,
    },
    #[error("request {request_id}: max_tokens must be at least 1")]
    ZeroMaxTokens { request_id: RequestId },
    #[error("request {request_id}: min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})")]
    MinTokensExceedMaxTokens {
        request_id: RequestId,
        min_tokens: u32,
        max_tokens: u32,
    },
    #[error("request {request_id} is already known to the scheduler")]
    DuplicateRequest { request_id: RequestId },
    /// `update_from_output` got an output that is not the one `schedule` returned last, or
    /// got it twice.
    #[error("scheduler output of step {got} is stale (awaiting step {expected:?})")]
    StaleOutput { got: u64, expected: Option<u64> },
    #[error("request {request_id} was scheduled to sample but no sampled token was returned")]
    MissingSample { request_id: RequestId },
    #[error("a sampled token was returned for request {request_id}, which did not sample")]
    UnexpectedSample { request_id: RequestId },
    /// A token run that is not the accepted prefix of the request's drafts plus one token.
    #[error(
        "request {request_id}: a run of {len} tokens does not match its {num_drafts} draft \
         tokens (it must be an accepted prefix of them plus one sampled token)"
    )]
    InvalidTokenRun {
        request_id: RequestId,
        len: usize,
        num_drafts: usize,
    },
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
}
