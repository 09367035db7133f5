//! vLLM V1's unified scheduler: one token budget per step shared by decodes, prefill chunks and
//! new admissions, with recompute-style preemption when the KV cache runs out.

#[cfg(test)]
mod lora_tests;
mod output;
mod queue;
mod spec;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::block_hash::{BlockHashChain, BlockHashExtraKeys};
use crate::error::SchedulerError;
use crate::kv_cache_manager::{KvCacheConfig, KvCacheGroups, KvCacheManager};
use crate::kv_events::KvCacheEvent;
use crate::request::{FinishReason, Request, RequestId};
use crate::state_slots::StateSlotConfig;

pub use output::{RequestUpdate, ScheduleKind, ScheduledRequest, SchedulerOutput, SchedulerStats};
pub use queue::SchedulingPolicy;
use queue::{QueueKey, WaitingQueue};
use spec::validate_run;

/// Scheduler limits, named as vLLM's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Token budget of one step (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Most requests running at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Longest sequence, prompt plus output (`--max-model-len`).
    pub max_model_len: usize,
    pub block_size: usize,
    pub num_blocks: u32,
    pub enable_prefix_caching: bool,
    pub policy: SchedulingPolicy,
    /// Caps one request's prefill chunk per step, so long prompts do not starve others.
    pub long_prefill_token_threshold: Option<usize>,
    /// Split prompts longer than the step's remaining budget over several steps
    /// (`--enable-chunked-prefill`, the default). Off, a prompt is scheduled whole or waits,
    /// and the budget must hold a whole `max_model_len` sequence, as vLLM requires.
    pub enable_chunked_prefill: bool,
    /// The window of the sliding-window layers the KV manager releases blocks for
    /// ([`KvCacheConfig::sliding_window`]): with [`KvCacheGroups::Single`] every layer has
    /// it; `None` for full-attention models (and for every model run without the hybrid
    /// manager).
    pub sliding_window: Option<usize>,
    /// The KV cache groups (vLLM's hybrid KV cache manager, [`KvCacheGroups`]).
    pub kv_groups: KvCacheGroups,
    /// The recurrent-state slots of a model with recurrent layers (none for a pure
    /// transformer): a request needs a free one to be admitted and holds it while it runs
    /// ([`crate::StateSlotPool`]).
    pub state_slots: StateSlotConfig,
}

impl SchedulerConfig {
    pub fn kv_cache_config(&self) -> KvCacheConfig {
        KvCacheConfig {
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            enable_prefix_caching: self.enable_prefix_caching,
            sliding_window: self.sliding_window,
            groups: self.kv_groups,
            state_slots: self.state_slots,
        }
    }

    /// [`KvCacheConfig::prefix_caching_active`]: `enable_prefix_caching` unless the model has
    /// recurrent-state slots.
    pub fn prefix_caching_active(&self) -> bool {
        self.kv_cache_config().prefix_caching_active()
    }

    /// The most blocks one request may hold at once ([`KvCacheConfig::max_blocks_per_request`]
    /// with this step budget).
    pub fn max_blocks_per_request(&self) -> usize {
        let max_tokens_per_step = if self.enable_chunked_prefill {
            self.max_num_batched_tokens
        } else {
            self.max_num_batched_tokens.max(self.max_model_len)
        };
        self.kv_cache_config()
            .max_blocks_per_request(self.max_model_len, max_tokens_per_step)
    }

    fn validate(&self) -> Result<(), SchedulerError> {
        let invalid = |reason: String| Err(SchedulerError::InvalidConfig { reason });
        if self.max_num_batched_tokens == 0 {
            return invalid("max_num_batched_tokens must be at least 1".to_owned());
        }
        if self.max_num_seqs == 0 {
            return invalid("max_num_seqs must be at least 1".to_owned());
        }
        if self.max_model_len < 2 {
            return invalid("max_model_len must be at least 2".to_owned());
        }
        if self.block_size == 0 {
            return invalid("block_size must be at least 1".to_owned());
        }
        if self.long_prefill_token_threshold == Some(0) {
            return invalid("long_prefill_token_threshold must be at least 1 when set".to_owned());
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return invalid(format!(
                "max_num_batched_tokens ({}) is smaller than max_model_len ({}); without \
                 chunked prefill a prompt must fit in one step: raise max_num_batched_tokens \
                 or lower max_model_len",
                self.max_num_batched_tokens, self.max_model_len
            ));
        }
        if let Some(reason) = self.kv_cache_config().invalid_reason() {
            return invalid(reason);
        }
        // Otherwise a request of max_model_len could never be scheduled, even alone.
        let needed = self.max_blocks_per_request();
        if (self.num_blocks as usize) < needed {
            let capacity = (self.num_blocks as usize).saturating_mul(self.block_size);
            return invalid(format!(
                "the KV cache holds {capacity} tokens ({} blocks of {}), but one request of \
                 max_model_len {} needs {needed} blocks; lower max_model_len or give the cache \
                 more memory",
                self.num_blocks, self.block_size, self.max_model_len
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestStatus {
    Waiting,
    Preempted,
    Running,
}

#[derive(Debug, Clone)]
struct RequestState {
    request: Request,
    /// Prompt followed by the generated tokens.
    all_token_ids: Vec<u32>,
    num_computed_tokens: usize,
    status: RequestStatus,
    block_hashes: BlockHashChain,
    queue_key: Option<QueueKey>,
    /// Draft tokens proposed for the next decode step (speculative decoding); used once.
    draft_token_ids: Vec<u32>,
}

impl RequestState {
    fn num_tokens(&self) -> usize {
        self.all_token_ids.len()
    }

    fn num_output_tokens(&self) -> usize {
        self.all_token_ids.len() - self.request.prompt_token_ids.len()
    }

    fn preemption_rank(&self) -> (i32, u64) {
        (self.request.priority, self.request.arrival_seq)
    }
}

#[derive(Debug, Clone, Copy)]
struct PlannedRequest {
    request_id: RequestId,
    /// Including `num_draft_tokens`.
    num_new_tokens: usize,
    kind: ScheduleKind,
    num_cached_tokens: usize,
    num_draft_tokens: usize,
}

/// The scheduler: owns the request states, the waiting and running queues and the KV-cache
/// manager. See the crate docs for the step loop.
#[derive(Debug, Clone)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<RequestId, RequestState>,
    waiting: WaitingQueue,
    /// Admission order; FCFS preempts from the back.
    running: Vec<RequestId>,
    step: u64,
    pending_step: Option<u64>,
    num_preemptions: u64,
    num_scheduled_tokens_last_step: usize,
    /// Most distinct LoRA adapters in the running set (`--max-loras`); `None`: no limit.
    max_loras: Option<usize>,
}

/// Requests per LoRA adapter id, running and waiting (vLLM's `running_lora_adapters` /
/// `waiting_lora_adapters`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraStats {
    pub running: BTreeMap<u32, usize>,
    pub waiting: BTreeMap<u32, usize>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedulerError> {
        config.validate()?;
        Ok(Self {
            config,
            kv: KvCacheManager::new(config.kv_cache_config())?,
            requests: HashMap::new(),
            waiting: WaitingQueue::new(config.policy),
            running: Vec::new(),
            step: 0,
            pending_step: None,
            num_preemptions: 0,
            num_scheduled_tokens_last_step: 0,
            max_loras: None,
        })
    }

    /// Admits a waiting request with an adapter only while the running set holds fewer than
    /// `max_loras` distinct adapters or already holds its adapter; others wait, in order,
    /// and requests behind them (base or a running adapter) are admitted past them.
    pub fn set_max_loras(&mut self, max_loras: Option<usize>) {
        self.max_loras = max_loras;
    }

    /// Distinct adapters of the running set.
    fn running_adapters(&self) -> HashSet<u32> {
        self.running
            .iter()
            .filter_map(|id| self.requests.get(id)?.request.adapter_id)
            .collect()
    }

    /// Requests per adapter, running and waiting.
    pub fn lora_stats(&self) -> LoraStats {
        let mut stats = LoraStats::default();
        for state in self.requests.values() {
            if let Some(adapter) = state.request.adapter_id {
                let counts = match state.status {
                    RequestStatus::Running => &mut stats.running,
                    RequestStatus::Waiting | RequestStatus::Preempted => &mut stats.waiting,
                };
                *counts.entry(adapter).or_default() += 1;
            }
        }
        stats
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Read access to the KV-cache manager (block tables, counters, invariant checks).
    pub fn kv_cache_manager(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Queues a request. Rejected: an empty prompt, `max_tokens == 0`, `min_tokens >
    /// max_tokens`, a prompt of `max_model_len` tokens or more (no room for one output token),
    /// `prompt_len + max_tokens > max_model_len` (the engine resolves an absent `max_tokens` to
    /// `max_model_len - prompt_len` first), and an id already in use.
    pub fn add_request(&mut self, request: Request) -> Result<(), SchedulerError> {
        let request_id = request.request_id;
        let prompt_len = request.prompt_token_ids.len();
        let max_model_len = self.config.max_model_len;
        let stop = &request.stop;
        if prompt_len == 0 {
            return Err(SchedulerError::EmptyPrompt { request_id });
        }
        if stop.max_tokens == 0 {
            return Err(SchedulerError::ZeroMaxTokens { request_id });
        }
        if stop.min_tokens > stop.max_tokens {
            return Err(SchedulerError::MinTokensExceedMaxTokens {
                request_id,
                min_tokens: stop.min_tokens,
                max_tokens: stop.max_tokens,
            });
        }
        if prompt_len >= max_model_len {
            return Err(SchedulerError::PromptTooLong {
                request_id,
                prompt_len,
                max_model_len,
            });
        }
        if prompt_len + stop.max_tokens as usize > max_model_len {
            return Err(SchedulerError::ExceedsMaxModelLen {
                request_id,
                prompt_len,
                max_tokens: stop.max_tokens,
                max_model_len,
            });
        }
        if self.requests.contains_key(&request_id) {
            return Err(SchedulerError::DuplicateRequest { request_id });
        }
        let mut block_hashes = BlockHashChain::new(
            self.config.block_size,
            BlockHashExtraKeys {
                cache_salt: request.cache_salt.clone(),
                adapter_id: request.adapter_id,
            },
        );
        if self.config.prefix_caching_active() {
            block_hashes.extend(&request.prompt_token_ids);
        }
        let queue_key = self.waiting.push_back(&request);
        self.requests.insert(
            request_id,
            RequestState {
                all_token_ids: request.prompt_token_ids.clone(),
                request,
                num_computed_tokens: 0,
                status: RequestStatus::Waiting,
                block_hashes,
                queue_key: Some(queue_key),
                draft_token_ids: Vec::new(),
            },
        );
        Ok(())
    }

    /// Plans one step. Running requests are served first, in admission order: a decode takes
    /// one token, a request still prefilling takes a chunk of what budget is left. When the KV
    /// cache cannot grow a running request, the policy's victim is preempted (possibly the
    /// request itself, which ends the running pass). Only in a step without preemption are
    /// waiting requests admitted, in policy order, while `max_num_seqs`, the budget, the free
    /// blocks and (with recurrent layers) the free state slots allow; the first one that does
    /// not fit stops admission.
    ///
    /// Calling `schedule` again without `update_from_output` discards the previous plan (its
    /// tokens count as not computed).
    pub fn schedule(&mut self) -> SchedulerOutput {
        self.step += 1;
        let mut budget = self.config.max_num_batched_tokens;
        let mut planned: Vec<PlannedRequest> = Vec::new();
        let mut preempted: Vec<RequestId> = Vec::new();

        let mut index = 0;
        'running: while index < self.running.len() && budget > 0 {
            let request_id = self.running[index];
            let Some(state) = self.requests.get(&request_id) else {
                self.running.remove(index);
                continue;
            };
            let remaining = state.num_tokens() - state.num_computed_tokens;
            let num_draft_tokens = self.num_draft_tokens(state, remaining, budget);
            let num_new_tokens = self.chunk_len(remaining, budget) + num_draft_tokens;
            if num_new_tokens == 0 {
                index += 1;
                continue;
            }
            let num_total_tokens = state.num_computed_tokens + num_new_tokens;
            // Blocks this request's queries no longer see go back first (sliding window).
            self.kv
                .remove_skipped_blocks(request_id, state.num_computed_tokens);
            loop {
                if self
                    .kv
                    .allocate_slots(request_id, num_total_tokens, None)
                    .is_ok()
                {
                    planned.push(PlannedRequest {
                        request_id,
                        num_new_tokens,
                        kind: ScheduleKind::Continuing,
                        num_cached_tokens: 0,
                        num_draft_tokens,
                    });
                    budget -= num_new_tokens;
                    index += 1;
                    break;
                }
                let victim_index = self.preemption_victim();
                let victim = self.running.remove(victim_index);
                if victim_index < index {
                    index -= 1;
                }
                if let Some(position) = planned.iter().position(|p| p.request_id == victim) {
                    budget += planned.remove(position).num_new_tokens;
                }
                self.preempt(victim);
                preempted.push(victim);
                if victim == request_id {
                    break 'running;
                }
            }
        }

        if preempted.is_empty() {
            self.admit_waiting(&mut planned, &mut budget);
        }

        let scheduled: Vec<ScheduledRequest> = planned
            .iter()
            .filter_map(|plan| self.materialize(plan))
            .collect();
        self.clear_draft_token_ids();
        let total_num_scheduled_tokens = scheduled.iter().map(|s| s.token_ids.len()).sum();
        self.num_scheduled_tokens_last_step = total_num_scheduled_tokens;
        self.pending_step = Some(self.step);
        SchedulerOutput {
            step: self.step,
            scheduled,
            preempted_request_ids: preempted,
            total_num_scheduled_tokens,
        }
    }

    fn admit_waiting(&mut self, planned: &mut Vec<PlannedRequest>, budget: &mut usize) {
        let mut adapters = self.running_adapters();
        // Waiting requests whose adapter would exceed `max_loras`; they keep their place.
        let mut held: HashSet<RequestId> = HashSet::new();
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let next = match self.max_loras {
                None => self.waiting.peek(),
                Some(_) => self.waiting.ids().find(|id| !held.contains(id)),
            };
            let Some(request_id) = next else {
                break;
            };
            let Some(state) = self.requests.get(&request_id) else {
                break;
            };
            if let (Some(max), Some(adapter)) = (self.max_loras, state.request.adapter_id) {
                if !adapters.contains(&adapter) && adapters.len() >= max {
                    held.insert(request_id);
                    continue;
                }
                adapters.insert(adapter);
            }
            let num_tokens = state.num_tokens();
            let prefix_hit = self
                .config
                .prefix_caching_active()
                .then(|| self.kv.get_computed_blocks(&state.block_hashes, num_tokens));
            let num_cached_tokens = prefix_hit
                .as_ref()
                .map_or(0, |hit| hit.num_computed_tokens());
            let num_new_tokens = self.chunk_len(num_tokens - num_cached_tokens, *budget);
            if num_new_tokens == 0 {
                break;
            }
            if self
                .kv
                .allocate_slots(
                    request_id,
                    num_cached_tokens + num_new_tokens,
                    prefix_hit.as_ref(),
                )
                .is_err()
            {
                break;
            }
            // A hit's last block vouches for the prefix even where the window skips it.
            self.kv.remove_skipped_blocks(request_id, num_cached_tokens);
            let Some(state) = self.requests.get_mut(&request_id) else {
                break;
            };
            if let Some(key) = state.queue_key.take() {
                self.waiting.remove(&key);
            }
            let kind = if state.status == RequestStatus::Preempted {
                ScheduleKind::Resumed
            } else {
                ScheduleKind::New
            };
            state.status = RequestStatus::Running;
            state.num_computed_tokens = num_cached_tokens;
            self.running.push(request_id);
            planned.push(PlannedRequest {
                request_id,
                num_new_tokens,
                kind,
                num_cached_tokens,
                num_draft_tokens: 0,
            });
            *budget -= num_new_tokens;
        }
    }

    /// Tokens a request may take this step: what it has left, capped by the long-prefill
    /// threshold and the remaining budget.
    fn chunk_len(&self, remaining: usize, budget: usize) -> usize {
        if !self.config.enable_chunked_prefill {
            // Whole or not at all (0 = wait for a step with room).
            return if remaining <= budget { remaining } else { 0 };
        }
        let capped = match self.config.long_prefill_token_threshold {
            Some(threshold) => remaining.min(threshold),
            None => remaining,
        };
        capped.min(budget)
    }

    /// Index in `running` of the request to preempt: the latest admitted under FCFS, the
    /// largest `(priority, arrival_seq)` under priority.
    fn preemption_victim(&self) -> usize {
        match self.config.policy {
            SchedulingPolicy::Fcfs => self.running.len().saturating_sub(1),
            SchedulingPolicy::Priority => self
                .running
                .iter()
                .enumerate()
                .max_by_key(|(_, id)| {
                    self.requests
                        .get(id)
                        .map(RequestState::preemption_rank)
                        .unwrap_or((i32::MAX, u64::MAX))
                })
                .map_or(0, |(index, _)| index),
        }
    }

    /// Frees the request's KV and sends it to the front of the waiting queue; it will
    /// recompute its prompt and generated tokens when re-admitted.
    fn preempt(&mut self, request_id: RequestId) {
        self.kv.free(request_id);
        if let Some(state) = self.requests.get_mut(&request_id) {
            state.num_computed_tokens = 0;
            state.draft_token_ids.clear();
            state.status = RequestStatus::Preempted;
            state.queue_key = Some(self.waiting.push_front(&state.request));
        }
        self.num_preemptions += 1;
    }

    fn materialize(&self, plan: &PlannedRequest) -> Option<ScheduledRequest> {
        let state = self.requests.get(&plan.request_id)?;
        let start = state.num_computed_tokens;
        let end = start + plan.num_new_tokens - plan.num_draft_tokens;
        let draft_token_ids = state.draft_token_ids.get(..plan.num_draft_tokens)?.to_vec();
        let mut token_ids = state.all_token_ids.get(start..end)?.to_vec();
        token_ids.extend_from_slice(&draft_token_ids);
        Some(ScheduledRequest {
            request_id: plan.request_id,
            kind: plan.kind,
            token_ids,
            draft_token_ids,
            start_position: start,
            block_tables: self.kv.block_tables(plan.request_id),
            state_slot: self.kv.state_slot(plan.request_id),
            samples: end == state.num_tokens(),
            num_cached_tokens: plan.num_cached_tokens,
        })
    }

    /// Applies the executor's results for `output` when every sampling request got exactly one
    /// token (no speculation): [`Self::update_from_token_runs`] with runs of one.
    pub fn update_from_output(
        &mut self,
        output: &SchedulerOutput,
        sampled: &[(RequestId, u32)],
    ) -> Result<Vec<RequestUpdate>, SchedulerError> {
        let runs: Vec<(RequestId, Vec<u32>)> = sampled
            .iter()
            .map(|&(request_id, token)| (request_id, vec![token]))
            .collect();
        self.update_from_token_runs(output, &runs)
    }

    /// Applies the executor's results for `output`: advances computed tokens, caches newly
    /// full blocks, appends each request's run of tokens and checks stop conditions after
    /// every token of it (nothing past a stop is kept). Finished requests are freed and
    /// reported once. `runs` must hold exactly one run for every request of `output` with
    /// `samples` set that is still running: the accepted draft tokens (a prefix of its
    /// `draft_token_ids`) followed by one token the executor sampled, so 1 to `k + 1` tokens.
    /// Rejected draft positions are rolled back: they do not count as computed and blocks
    /// past the computed tokens are freed. Runs for requests finished since `schedule` (e.g.
    /// aborted) are ignored. On error nothing changed.
    pub fn update_from_token_runs(
        &mut self,
        output: &SchedulerOutput,
        runs: &[(RequestId, Vec<u32>)],
    ) -> Result<Vec<RequestUpdate>, SchedulerError> {
        if self.pending_step != Some(output.step) {
            return Err(SchedulerError::StaleOutput {
                got: output.step,
                expected: self.pending_step,
            });
        }
        let sampling: HashMap<RequestId, &[u32]> = output
            .scheduled
            .iter()
            .filter(|s| s.samples)
            .map(|s| (s.request_id, s.draft_token_ids.as_slice()))
            .collect();
        let mut samples: HashMap<RequestId, &[u32]> = HashMap::with_capacity(runs.len());
        for (request_id, run) in runs {
            let request_id = *request_id;
            let Some(drafts) = sampling.get(&request_id) else {
                return Err(SchedulerError::UnexpectedSample { request_id });
            };
            if samples.insert(request_id, run).is_some() {
                return Err(SchedulerError::UnexpectedSample { request_id });
            }
            validate_run(request_id, run, drafts)?;
        }
        for scheduled in &output.scheduled {
            if scheduled.samples
                && self.is_live(scheduled)
                && !samples.contains_key(&scheduled.request_id)
            {
                return Err(SchedulerError::MissingSample {
                    request_id: scheduled.request_id,
                });
            }
        }
        self.pending_step = None;

        let mut updates = Vec::new();
        let mut finished: HashSet<RequestId> = HashSet::new();
        for scheduled in &output.scheduled {
            if !self.is_live(scheduled) {
                continue;
            }
            let request_id = scheduled.request_id;
            let Some(state) = self.requests.get_mut(&request_id) else {
                continue;
            };
            let num_drafts = scheduled.draft_token_ids.len();
            let fed = scheduled.token_ids.len() - num_drafts;
            let run = match samples.get(&request_id) {
                Some(run) if scheduled.samples => *run,
                _ => {
                    state.num_computed_tokens += fed;
                    self.kv.cache_full_blocks(
                        request_id,
                        &state.block_hashes,
                        &state.all_token_ids,
                        state.num_computed_tokens,
                    );
                    continue;
                }
            };
            let mut new_token_ids = Vec::with_capacity(run.len());
            let mut stop = None;
            for &token in run {
                state.all_token_ids.push(token);
                new_token_ids.push(token);
                stop = check_stop(state, self.config.max_model_len);
                if stop.is_some() {
                    break;
                }
            }
            if self.config.prefix_caching_active() {
                state.block_hashes.extend(&state.all_token_ids);
            }
            // Accepted drafts hold valid KV; the run's last token (and anything cut by a stop)
            // has none yet.
            state.num_computed_tokens =
                (state.num_computed_tokens + fed + run.len() - 1).min(state.num_tokens() - 1);
            self.kv.cache_full_blocks(
                request_id,
                &state.block_hashes,
                &state.all_token_ids,
                state.num_computed_tokens,
            );
            if num_drafts > 0 {
                self.kv.truncate(request_id, state.num_computed_tokens);
            }
            let (finish_reason, stop_token_id) = match stop {
                Some((reason, stop_token)) => (Some(reason), stop_token),
                None => (None, None),
            };
            if finish_reason.is_some() {
                finished.insert(request_id);
            }
            updates.push(RequestUpdate {
                request_id,
                new_token_ids,
                finish_reason,
                stop_token_id,
                num_output_tokens: state.num_output_tokens(),
            });
        }
        if !finished.is_empty() {
            self.running.retain(|id| !finished.contains(id));
            for update in &updates {
                if finished.contains(&update.request_id) {
                    self.release(update.request_id);
                }
            }
        }
        Ok(updates)
    }

    /// Whether `scheduled` still describes a running request (it may have been finished
    /// between `schedule` and `update_from_output`).
    fn is_live(&self, scheduled: &ScheduledRequest) -> bool {
        self.requests
            .get(&scheduled.request_id)
            .is_some_and(|state| {
                state.status == RequestStatus::Running
                    && state.num_computed_tokens == scheduled.start_position
            })
    }

    /// Drops a request that is no longer running or waiting.
    fn release(&mut self, request_id: RequestId) {
        self.kv.free(request_id);
        self.requests.remove(&request_id);
    }

    /// Ends requests from outside the step loop: abort, client disconnect, or a stop string
    /// matched by the engine (`FinishReason::Stop`). Works on waiting and running requests and
    /// frees all their blocks; already computed full blocks stay in the prefix cache. Returns
    /// one update (no new tokens, `finish_reason` = `reason`) per request that was known;
    /// unknown or already finished ids are skipped.
    pub fn finish_requests(
        &mut self,
        request_ids: impl IntoIterator<Item = RequestId>,
        reason: FinishReason,
    ) -> Vec<RequestUpdate> {
        let mut updates = Vec::new();
        for request_id in request_ids {
            let Some(state) = self.requests.get_mut(&request_id) else {
                continue;
            };
            if let Some(key) = state.queue_key.take() {
                self.waiting.remove(&key);
            }
            if state.status == RequestStatus::Running {
                self.running.retain(|id| *id != request_id);
            }
            updates.push(RequestUpdate {
                request_id,
                new_token_ids: Vec::new(),
                finish_reason: Some(reason),
                stop_token_id: None,
                num_output_tokens: state.num_output_tokens(),
            });
            self.release(request_id);
        }
        updates
    }

    /// Aborts one request; `false` if it was unknown or already finished.
    pub fn abort(&mut self, request_id: RequestId) -> bool {
        !self
            .finish_requests([request_id], FinishReason::Abort)
            .is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_unfinished_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Running requests in admission order.
    pub fn running_request_ids(&self) -> &[RequestId] {
        &self.running
    }

    /// Waiting requests in the order they would be admitted.
    pub fn waiting_request_ids(&self) -> Vec<RequestId> {
        self.waiting.ids().collect()
    }

    /// Prompt plus generated tokens of an unfinished request.
    pub fn request_token_ids(&self, request_id: RequestId) -> Option<&[u32]> {
        self.requests
            .get(&request_id)
            .map(|state| state.all_token_ids.as_slice())
    }

    /// Starts logging the prefix cache's [`KvCacheEvent`]s (vLLM's KV events).
    pub fn enable_kv_events(&mut self) {
        self.kv.enable_events();
    }

    /// Moves the KV events logged since the last call to the end of `out`, oldest first.
    pub fn drain_kv_events(&mut self, out: &mut Vec<KvCacheEvent>) {
        self.kv.drain_events(out);
    }

    /// Drops cached content of free blocks (vLLM's `/reset_prefix_cache`).
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.kv.reset_prefix_cache()
    }

    pub fn stats(&self) -> SchedulerStats {
        let prefix = self.kv.prefix_cache_stats();
        SchedulerStats {
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            kv_cache_usage: self.kv.usage(),
            num_blocks: self.kv.num_blocks(),
            num_free_blocks: self.kv.num_free_blocks(),
            num_cached_free_blocks: self.kv.num_cached_free_blocks(),
            prefix_cache_queries: prefix.queries,
            prefix_cache_hits: prefix.hits,
            num_preemptions: self.num_preemptions,
            num_evictions: self.kv.num_evictions(),
            num_state_slots: self.kv.num_state_slots(),
            num_free_state_slots: self.kv.num_free_state_slots(),
            num_scheduled_tokens_last_step: self.num_scheduled_tokens_last_step,
        }
    }
}

/// vLLM's order: length limits first, then (once `min_tokens` is reached) EOS unless ignored,
/// then stop tokens.
fn check_stop(state: &RequestState, max_model_len: usize) -> Option<(FinishReason, Option<u32>)> {
    let stop = &state.request.stop;
    let num_output = state.num_output_tokens();
    if state.num_tokens() >= max_model_len || num_output >= stop.max_tokens as usize {
        return Some((FinishReason::Length, None));
    }
    if num_output < stop.min_tokens as usize {
        return None;
    }
    let last = *state.all_token_ids.last()?;
    if !stop.ignore_eos && stop.eos_token_ids.contains(&last) {
        return Some((FinishReason::Stop, None));
    }
    if stop.stop_token_ids.contains(&last) {
        return Some((FinishReason::Stop, Some(last)));
    }
    None
}
