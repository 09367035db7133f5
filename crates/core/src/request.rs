//! What the engine hands the scheduler for one generation request, and how a request ends.

use std::fmt;

/// Identity of one request inside the engine. The engine assigns it; the scheduler only
/// requires it to be unique among unfinished requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Token-level stop conditions. Stop *strings* are matched by the engine on detokenized text,
/// which then ends the request through [`crate::Scheduler::finish_requests`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopParams {
    /// Hard cap on generated tokens (must be at least 1). Reaching it finishes with
    /// [`FinishReason::Length`].
    pub max_tokens: u32,
    /// EOS and stop tokens do not end the request before this many tokens were generated
    /// (the sampler is expected to mask them too; this is the scheduler's side of the rule).
    pub min_tokens: u32,
    /// Keep generating past an EOS token.
    pub ignore_eos: bool,
    /// The model's end-of-sequence tokens (several for some chat models).
    pub eos_token_ids: Vec<u32>,
    /// User-supplied stop tokens; vLLM reports the one that fired as `stop_reason`.
    pub stop_token_ids: Vec<u32>,
}

/// One generation request as the engine submits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub request_id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    pub stop: StopParams,
    /// Lower values are served first under [`crate::SchedulingPolicy::Priority`] (vLLM's
    /// convention); ignored under FCFS.
    pub priority: i32,
    /// Arrival order as assigned by the engine; breaks priority ties (earlier first) and picks
    /// the preemption victim among equal priorities (latest first).
    pub arrival_seq: u64,
    /// Isolates this request's prefix-cache entries from requests with another salt.
    pub cache_salt: Option<String>,
    /// LoRA-style adapter the KV was computed with; part of every block hash.
    pub adapter_id: Option<u32>,
}

impl Request {
    /// A request with default stop parameters apart from `max_tokens`, priority 0 and no salt.
    pub fn new(request_id: RequestId, prompt_token_ids: Vec<u32>, max_tokens: u32) -> Self {
        Self {
            request_id,
            prompt_token_ids,
            stop: StopParams {
                max_tokens,
                ..StopParams::default()
            },
            priority: 0,
            arrival_seq: request_id.0,
            cache_salt: None,
            adapter_id: None,
        }
    }
}

/// Why a request stopped producing tokens (vLLM's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token, or (through `finish_requests`) a stop string.
    Stop,
    /// `max_tokens` generated or the sequence reached `max_model_len`.
    Length,
    /// Cancelled by the client or the engine.
    Abort,
}

impl FinishReason {
    /// The OpenAI wire spelling (`abort` is vLLM's).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
