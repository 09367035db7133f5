//! The seam between the engine loop and whatever computes tokens.

use std::sync::Arc;
use tokenmill_core::{RequestId, SchedulerOutput};

use tokenmill_models::{LoraAdapter, SampledToken, SamplingParams};

use crate::request::{RequestFailure, TokenLogprob};
use crate::EngineError;

/// What one step produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StepOutput {
    /// The emitted tokens of every request that sampled this step, in order: one sampled
    /// token, or with draft tokens the accepted drafts followed by one token of the target's
    /// own (a request's entries are consecutive).
    pub sampled: Vec<(RequestId, SampledToken)>,
    /// Prompt-token logprobs computed this step, per request, in prompt order (for requests
    /// that asked for them; the first prompt token has none and is not listed).
    pub prompt_logprobs: Vec<(RequestId, Vec<TokenLogprob>)>,
    /// Requests whose own sampling failed this step (no token allowed, a grammar or processor
    /// error, non-finite logits, a panic in a dependency): they have no entry in `sampled`,
    /// the engine ends each with its failure and the step goes on for the others. An error
    /// that is not one request's (the forward pass) is `execute`'s `Err` instead.
    pub failed: Vec<(RequestId, RequestFailure)>,
}

/// A request entering the executor.
#[derive(Debug, Clone, Copy)]
pub struct NewSequence<'a> {
    pub request_id: RequestId,
    pub prompt_token_ids: &'a [u32],
    /// Complete: the engine has filled [`SamplingParams::all_stop_token_ids`].
    pub sampling: &'a SamplingParams,
    /// Compute each prompt token's logprob plus this many alternatives.
    pub prompt_logprobs: Option<usize>,
    /// The LoRA adapter its rows run through (`None`: the base model).
    pub lora: Option<&'a Arc<LoraAdapter>>,
}

/// Runs scheduled steps. Implementations keep per-request sampling state (RNG, the
/// logits-processor chain) between steps; the engine tells them when requests come and go.
pub trait Executor: Send {
    /// A request was admitted to the engine.
    fn add_request(&mut self, sequence: NewSequence<'_>) -> Result<(), EngineError>;

    /// A request finished or was aborted; drop its state.
    fn remove_request(&mut self, request_id: RequestId);

    /// Runs one step over the paged cache and samples for every request with `samples`,
    /// verifying its `draft_token_ids` if it has any.
    fn execute(&mut self, output: &SchedulerOutput) -> Result<StepOutput, EngineError>;
}
