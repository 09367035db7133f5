//! Speculative decoding on the engine side: a [`Proposer`] drafts tokens for each decoding
//! request after every step, the scheduler schedules them as lookahead, the executor verifies
//! them in the same forward pass (`ModelRunner`, `Sampler::verify`) and the scheduler keeps
//! the accepted run. Chosen by `--speculative-config` ([`SpeculativeConfig`]).
//!
//! **When not to speculate** (checked per step by [`SpecDecoder::propose`]):
//! 1. *Batch size*: with more running requests than `disable_by_batch_size` (vLLM's key;
//!    default [`default_disable_by_batch_size`], ⌊64 / (1 + k)⌋ at least 2) no request gets
//!    drafts: a large batch already reads the weights once for many tokens, so the step is
//!    compute-bound and draft rows cost about what they might save.
//! 2. *Low acceptance*: each request keeps an exponential average (weight
//!    [`ACCEPTANCE_EMA_WEIGHT`]) of its drafts' acceptance rate, starting at 1. Below
//!    [`MIN_ACCEPTANCE`] the request decodes without drafts for [`BACKOFF_STEPS`] steps,
//!    then tries again from an average of [`MIN_ACCEPTANCE`] × 2.
//!
//! 3. *Probe drafts* (`ngram` and `suffix`): a request drafts its full `k` only right after a
//!    verification that accepted every draft token; otherwise (its first draft, after any
//!    rejection, or after a step with nothing to draft) it drafts at most [`PROBE_DRAFTS`].
//!    Lookup drafts are all or nothing: a continuation that matches the output is copied on
//!    for many tokens (later positions then accept at 0.9+), while a fresh match fails at its
//!    first tokens about half the time, and every verified row costs about a quarter of a
//!    one-row step whether accepted or not. Replaying the input-grounded benchmark's greedy
//!    outputs through this rule with the measured row costs gave 1.96× no speculation at
//!    `k` = 8 against 1.86× drafting `k` every step (`bench/RESULTS.md`).
//!
//! Skips are counted in `tokenmill:spec_decode_skipped_total{reason}`, drafts cut to the probe
//! length in `tokenmill:spec_decode_probe_drafts_total`; drafts and acceptance in vLLM's
//! `vllm:spec_decode_*` counters and the `SpecDecoding metrics` line.

mod config;
mod draft_model;
mod ngram;
mod suffix;

use std::collections::HashMap;

use tokenmill_core::{RequestId, Scheduler};
use tokenmill_metrics::{SpecDecodeStats, SpecSkipReason};

use crate::EngineError;

pub use config::{
    default_disable_by_batch_size, SpecMethod, SpeculativeConfig, MAX_SPECULATIVE_TOKENS,
    SUPPORTED_METHODS,
};
pub use draft_model::{DraftModelProposer, DraftSetup};
pub use ngram::NgramProposer;
pub use suffix::SuffixProposer;

/// Weight of the latest verification in a request's acceptance average.
pub const ACCEPTANCE_EMA_WEIGHT: f64 = 0.3;
/// Acceptance average below which a request stops drafting for a while.
pub const MIN_ACCEPTANCE: f64 = 0.1;
/// Steps a request decodes without drafts after its acceptance fell below [`MIN_ACCEPTANCE`].
pub const BACKOFF_STEPS: u32 = 16;
/// Most draft tokens of a lookup method's request whose previous draft was not accepted whole.
pub const PROBE_DRAFTS: usize = 2;

/// One decoding request a proposer drafts for.
#[derive(Debug, Clone, Copy)]
pub struct DraftRequest<'a> {
    pub request_id: RequestId,
    /// The request's prompt plus its output so far.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the prompt.
    pub num_prompt_tokens: usize,
}

/// Drafts tokens for decoding requests from what they have so far.
pub trait Proposer: Send {
    /// Writes up to `max_drafts` draft tokens for the request whose prompt plus output is
    /// `tokens` (the first `num_prompt_tokens` the prompt) into `drafts` (cleared first;
    /// empty = no proposal).
    fn propose(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        num_prompt_tokens: usize,
        max_drafts: usize,
        drafts: &mut Vec<u32>,
    );

    /// Drafts for all of a step's `requests` at once, `drafts[i]` for `requests[i]` (each
    /// cleared first); the same drafts as [`Proposer::propose`] per request. A proposer that
    /// runs a model overrides it to batch the requests into one forward pass per position.
    fn propose_all(
        &mut self,
        requests: &[DraftRequest<'_>],
        max_drafts: usize,
        drafts: &mut [Vec<u32>],
    ) {
        for (request, drafts) in requests.iter().zip(drafts) {
            self.propose(
                request.request_id,
                request.tokens,
                request.num_prompt_tokens,
                max_drafts,
                drafts,
            );
        }
    }

    /// The request left the engine (a proposer that learns from finished requests keeps
    /// what it needs of what it saw).
    fn finish(&mut self, _request_id: RequestId) {}
}

/// A request's recent acceptance.
#[derive(Debug, Clone, Copy)]
struct Acceptance {
    average: f64,
    backoff_left: u32,
    /// The request's last step verified drafts and accepted all of them.
    whole: bool,
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            average: 1.0,
            backoff_left: 0,
            whole: false,
        }
    }
}

/// The proposer and the skip rule, owned by the engine loop.
pub struct SpecDecoder {
    config: SpeculativeConfig,
    proposer: Box<dyn Proposer>,
    acceptance: HashMap<RequestId, Acceptance>,
    /// One draft buffer per request of the step, kept across steps.
    drafts: Vec<Vec<u32>>,
}

impl std::fmt::Debug for SpecDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecDecoder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SpecDecoder {
    /// Builds the configured proposer; a draft model is loaded here, its cache sized by
    /// `setup`.
    pub fn new(config: SpeculativeConfig, setup: &DraftSetup) -> Result<SpecDecoder, EngineError> {
        let proposer: Box<dyn Proposer> = match &config.method {
            SpecMethod::Ngram {
                prompt_lookup_min,
                prompt_lookup_max,
            } => Box::new(NgramProposer::new(*prompt_lookup_min, *prompt_lookup_max)),
            SpecMethod::Suffix { .. } => Box::new(SuffixProposer::new(&config)),
            SpecMethod::DraftModel { model } => Box::new(DraftModelProposer::load(model, setup)?),
        };
        Ok(SpecDecoder {
            config,
            proposer,
            acceptance: HashMap::new(),
            drafts: Vec::new(),
        })
    }

    pub fn config(&self) -> &SpeculativeConfig {
        &self.config
    }

    /// Drafts tokens for every decoding request, unless the skip rule says no (see the
    /// module docs), and hands them to the scheduler for its next step. The proposer sees
    /// all of the step's drafting requests at once ([`Proposer::propose_all`]).
    pub fn propose(&mut self, scheduler: &mut Scheduler, stats: &mut SpecDecodeStats) {
        let running = scheduler.running_request_ids().to_vec();
        let batch_too_large = running.len() > self.config.disable_by_batch_size;
        let mut requests = Vec::with_capacity(running.len());
        for request_id in running {
            if !scheduler.is_decoding(request_id) {
                continue;
            }
            if batch_too_large {
                stats.observe_skip(SpecSkipReason::BatchSize);
                continue;
            }
            let acceptance = self.acceptance.entry(request_id).or_default();
            if acceptance.backoff_left > 0 {
                acceptance.backoff_left -= 1;
                if acceptance.backoff_left == 0 {
                    acceptance.average = 2.0 * MIN_ACCEPTANCE;
                }
                stats.observe_skip(SpecSkipReason::LowAcceptance);
                continue;
            }
            let (Some(tokens), Some(num_prompt_tokens)) = (
                scheduler.request_token_ids(request_id),
                scheduler.num_prompt_tokens(request_id),
            ) else {
                continue;
            };
            requests.push(DraftRequest {
                request_id,
                tokens,
                num_prompt_tokens,
            });
        }
        if requests.is_empty() {
            return;
        }
        if self.drafts.len() < requests.len() {
            self.drafts.resize_with(requests.len(), Vec::new);
        }
        let drafts = &mut self.drafts[..requests.len()];
        self.proposer
            .propose_all(&requests, self.config.num_speculative_tokens, drafts);
        let probes = self.config.method.drafts_by_lookup();
        let ids: Vec<RequestId> = requests.iter().map(|r| r.request_id).collect();
        for (request_id, drafts) in ids.into_iter().zip(&mut self.drafts) {
            let acceptance = self.acceptance.entry(request_id).or_default();
            if drafts.is_empty() {
                acceptance.whole = false;
                continue;
            }
            if probes && !acceptance.whole && drafts.len() > PROBE_DRAFTS {
                drafts.truncate(PROBE_DRAFTS);
                stats.observe_probe();
            }
            scheduler.set_draft_token_ids(request_id, drafts);
        }
    }

    /// Records one verification of a request's drafts.
    pub fn observe(&mut self, request_id: RequestId, num_drafts: usize, num_accepted: usize) {
        if num_drafts == 0 {
            return;
        }
        let acceptance = self.acceptance.entry(request_id).or_default();
        acceptance.whole = num_accepted == num_drafts;
        let rate = num_accepted as f64 / num_drafts as f64;
        acceptance.average =
            (1.0 - ACCEPTANCE_EMA_WEIGHT) * acceptance.average + ACCEPTANCE_EMA_WEIGHT * rate;
        if acceptance.average < MIN_ACCEPTANCE {
            acceptance.backoff_left = BACKOFF_STEPS;
        }
    }

    /// The request left the engine.
    pub fn finish(&mut self, request_id: RequestId) {
        self.acceptance.remove(&request_id);
        self.proposer.finish(request_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_core::{KvCacheGroups, Request, SchedulerConfig, SchedulingPolicy};

    fn decoding_scheduler(num_requests: u64) -> Scheduler {
        let prompts = vec![vec![1, 2, 3, 4, 1, 2, 3]; num_requests as usize];
        scheduler_with(&prompts)
    }

    /// One request per prompt (ids 0, 1, ...), each prefilled and given the token 4.
    fn scheduler_with(prompts: &[Vec<u32>]) -> Scheduler {
        let mut scheduler = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: 256,
            max_num_seqs: 16,
            max_model_len: 64,
            block_size: 4,
            num_blocks: 256,
            enable_prefix_caching: false,
            policy: SchedulingPolicy::Fcfs,
            long_prefill_token_threshold: None,
            enable_chunked_prefill: true,
            sliding_window: None,
            kv_groups: KvCacheGroups::Single,
            state_slots: tokenmill_core::StateSlotConfig::none(),
        })
        .unwrap();
        for (id, prompt) in prompts.iter().enumerate() {
            scheduler
                .add_request(Request::new(RequestId(id as u64), prompt.clone(), 16))
                .unwrap();
        }
        let output = scheduler.schedule();
        let sampled: Vec<(RequestId, u32)> =
            output.scheduled.iter().map(|s| (s.request_id, 4)).collect();
        scheduler.update_from_output(&output, &sampled).unwrap();
        scheduler
    }

    fn ngram(disable_by_batch_size: usize) -> SpecDecoder {
        let config = SpeculativeConfig {
            method: SpecMethod::Ngram {
                prompt_lookup_min: 2,
                prompt_lookup_max: 3,
            },
            num_speculative_tokens: 3,
            disable_by_batch_size,
        };
        let setup = DraftSetup {
            num_blocks: 0,
            block_size: 16,
            vocab_size: 0,
            num_threads: None,
            kv_dtype: tokenmill_models::KvCacheDType::F16,
        };
        SpecDecoder::new(config, &setup).unwrap()
    }

    #[test]
    fn drafts_reach_the_scheduler_unless_the_batch_is_too_large() {
        let mut scheduler = decoding_scheduler(2);
        let mut stats = SpecDecodeStats::default();
        ngram(2).propose(&mut scheduler, &mut stats);
        let output = scheduler.schedule();
        // [1 2 3 4 1 2 3 4]: "2 3 4" occurred before, followed by "1 2 3"; a first draft is a
        // probe.
        assert_eq!(output.scheduled[0].draft_token_ids, vec![1, 2]);
        assert_eq!(stats.num_skipped, [0, 0]);
        assert_eq!(stats.num_probes, 2);

        let mut scheduler = decoding_scheduler(3);
        ngram(2).propose(&mut scheduler, &mut stats);
        assert!(scheduler
            .schedule()
            .scheduled
            .iter()
            .all(|s| s.draft_token_ids.is_empty()));
        assert_eq!(stats.num_skipped, [3, 0]);
    }

    #[test]
    fn low_acceptance_backs_off_then_retries() {
        let mut scheduler = decoding_scheduler(1);
        let mut decoder = ngram(4);
        let mut stats = SpecDecodeStats::default();
        for _ in 0..7 {
            decoder.observe(RequestId(0), 3, 0);
        }
        // 0.7^7 = 0.082 < 0.1: backing off.
        for _ in 0..BACKOFF_STEPS {
            decoder.propose(&mut scheduler, &mut stats);
        }
        assert_eq!(stats.num_skipped, [0, u64::from(BACKOFF_STEPS)]);
        decoder.propose(&mut scheduler, &mut stats);
        assert_eq!(
            scheduler.schedule().scheduled[0].draft_token_ids,
            vec![1, 2]
        );
    }

    #[test]
    fn lookup_drafts_are_probes_until_one_is_accepted_whole() {
        let mut stats = SpecDecodeStats::default();
        let mut decoder = ngram(4);
        let drafts = |decoder: &mut SpecDecoder, stats: &mut SpecDecodeStats| {
            let mut scheduler = decoding_scheduler(1);
            decoder.propose(&mut scheduler, stats);
            scheduler.schedule().scheduled[0].draft_token_ids.clone()
        };
        assert_eq!(drafts(&mut decoder, &mut stats), vec![1, 2]);
        // Both probe tokens accepted: the full k next.
        decoder.observe(RequestId(0), 2, 2);
        assert_eq!(drafts(&mut decoder, &mut stats), vec![1, 2, 3]);
        decoder.observe(RequestId(0), 3, 3);
        assert_eq!(drafts(&mut decoder, &mut stats), vec![1, 2, 3]);
        // A rejection, even late in the draft: back to a probe.
        decoder.observe(RequestId(0), 3, 2);
        assert_eq!(drafts(&mut decoder, &mut stats), vec![1, 2]);
        assert_eq!(stats.num_probes, 2);
        // A step with nothing to draft (no repeat in 5 6 7 4) also ends a run of whole
        // acceptances.
        decoder.observe(RequestId(0), 2, 2);
        decoder.propose(&mut scheduler_with(&[vec![5, 6, 7]]), &mut stats);
        assert_eq!(drafts(&mut decoder, &mut stats), vec![1, 2]);
    }
}
