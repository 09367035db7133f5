//! Drives a scheduler with a scripted request stream and the paged token executor, checking
//! the scheduler's invariants after every step.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokenmill_core::{
    FinishReason, Request, RequestId, ScheduleKind, Scheduler, SchedulerConfig, SchedulerOutput,
    SchedulerStats, SchedulingPolicy, StopParams,
};

use super::{next_token, PagedTokenExecutor, VOCAB};

#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub arrival_step: usize,
    pub prompt: Vec<u32>,
    pub stop: StopParams,
    pub priority: i32,
    pub salt: Option<u8>,
    pub abort_at_step: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub output_tokens: Vec<u32>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Clone)]
pub struct RunResult {
    /// By index into the request specs.
    pub outcomes: BTreeMap<u64, Outcome>,
    pub stats: SchedulerStats,
    pub steps: usize,
}

fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(message())
    }
}

struct Driver<'a> {
    config: SchedulerConfig,
    specs: &'a [RequestSpec],
    scheduler: Scheduler,
    executor: PagedTokenExecutor,
    outputs: HashMap<RequestId, Vec<u32>>,
    outcomes: BTreeMap<u64, Outcome>,
    admitted_once: HashSet<RequestId>,
    preempted_once: HashSet<RequestId>,
    eos_every: u64,
    /// Speculative drafts: `Some(state)` of the generator that proposes them.
    drafts: Option<u64>,
}

pub fn run(
    config: SchedulerConfig,
    specs: &[RequestSpec],
    eos_every: u64,
    max_steps: usize,
) -> Result<RunResult, String> {
    run_with_drafts(config, specs, eos_every, max_steps, None)
}

/// [`run`] with a sliding-window "model" of `window` positions, whatever the scheduler's
/// `sliding_window` (`None` there: the KV manager keeps every block, the reference).
pub fn run_with_model_window(
    config: SchedulerConfig,
    specs: &[RequestSpec],
    eos_every: u64,
    max_steps: usize,
    window: usize,
) -> Result<RunResult, String> {
    run_inner(
        config,
        specs,
        eos_every,
        max_steps,
        None,
        Some(vec![Some(window)]),
    )
}

/// [`run`] with speculative decoding: after every step each decoding request gets up to four
/// draft tokens from a generator seeded with `draft_seed`, each the true continuation with
/// probability 3/4 and a random token otherwise.
pub fn run_with_drafts(
    config: SchedulerConfig,
    specs: &[RequestSpec],
    eos_every: u64,
    max_steps: usize,
    draft_seed: Option<u64>,
) -> Result<RunResult, String> {
    run_inner(config, specs, eos_every, max_steps, draft_seed, None)
}

fn run_inner(
    config: SchedulerConfig,
    specs: &[RequestSpec],
    eos_every: u64,
    max_steps: usize,
    draft_seed: Option<u64>,
    model_windows: Option<Vec<Option<usize>>>,
) -> Result<RunResult, String> {
    // The "model" attends as the scheduler's KV cache groups say, unless told otherwise.
    let kv = config.kv_cache_config();
    let windows =
        model_windows.unwrap_or_else(|| (0..kv.num_groups()).map(|g| kv.group_window(g)).collect());
    let scheduler = Scheduler::new(config).map_err(|e| e.to_string())?;
    let mut driver = Driver {
        config,
        specs,
        scheduler,
        executor: PagedTokenExecutor::new(config.num_blocks, config.block_size, eos_every)
            .with_group_windows(windows)
            .with_state_slots(config.state_slots.num_slots),
        outputs: HashMap::new(),
        outcomes: BTreeMap::new(),
        admitted_once: HashSet::new(),
        preempted_once: HashSet::new(),
        eos_every,
        drafts: draft_seed,
    };
    let last_arrival = specs.iter().map(|s| s.arrival_step).max().unwrap_or(0);
    let mut step = 0;
    loop {
        driver.arrivals_and_aborts(step)?;
        if step > last_arrival && !driver.scheduler.has_unfinished_requests() {
            break;
        }
        ensure(step < max_steps, || {
            format!(
                "requests still unfinished after {max_steps} steps: {:?}",
                driver.scheduler.stats()
            )
        })?;
        driver.step()?;
        step += 1;
    }
    driver.check_idle()?;
    Ok(RunResult {
        outcomes: driver.outcomes,
        stats: driver.scheduler.stats(),
        steps: step,
    })
}

impl Driver<'_> {
    fn arrivals_and_aborts(&mut self, step: usize) -> Result<(), String> {
        for (index, spec) in self.specs.iter().enumerate() {
            let request_id = RequestId(index as u64);
            if spec.arrival_step == step {
                let request = Request {
                    request_id,
                    prompt_token_ids: spec.prompt.clone(),
                    stop: spec.stop.clone(),
                    priority: spec.priority,
                    arrival_seq: index as u64,
                    cache_salt: spec.salt.map(|s| format!("salt-{s}")),
                    adapter_id: None,
                };
                self.scheduler
                    .add_request(request)
                    .map_err(|e| format!("add_request: {e}"))?;
                self.outputs.insert(request_id, Vec::new());
            }
            if spec.abort_at_step == Some(step) && spec.arrival_step <= step {
                for update in self
                    .scheduler
                    .finish_requests([request_id], FinishReason::Abort)
                {
                    ensure(update.finish_reason == Some(FinishReason::Abort), || {
                        "abort update without abort reason".to_owned()
                    })?;
                    self.finish(request_id, FinishReason::Abort)?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, request_id: RequestId, reason: FinishReason) -> Result<(), String> {
        let output_tokens = self.outputs.remove(&request_id).unwrap_or_default();
        let previous = self.outcomes.insert(
            request_id.0,
            Outcome {
                output_tokens,
                finish_reason: reason,
            },
        );
        ensure(previous.is_none(), || {
            format!("request {request_id} finished twice")
        })
    }

    fn truth(&self) -> HashMap<RequestId, (Vec<u32>, Option<u8>)> {
        self.scheduler
            .running_request_ids()
            .iter()
            .map(|&id| {
                let tokens = self
                    .scheduler
                    .request_token_ids(id)
                    .map(<[u32]>::to_vec)
                    .unwrap_or_default();
                (id, (tokens, self.specs[id.0 as usize].salt))
            })
            .collect()
    }

    fn step(&mut self) -> Result<(), String> {
        let waiting_before = self.scheduler.waiting_request_ids();
        if self.config.policy == SchedulingPolicy::Priority {
            let keys: Vec<(i32, u64)> = waiting_before
                .iter()
                .map(|id| (self.specs[id.0 as usize].priority, id.0))
                .collect();
            ensure(keys.windows(2).all(|w| w[0] <= w[1]), || {
                format!("waiting queue out of priority order: {keys:?}")
            })?;
        }
        let output = self.scheduler.schedule();
        let truth = self.truth();
        self.check_output(&output, &waiting_before, &truth)?;
        self.check_blocks()?;

        let sampled = self.executor.execute(&output, &truth)?;
        let updates = self
            .scheduler
            .update_from_token_runs(&output, &sampled)
            .map_err(|e| format!("update_from_token_runs: {e}"))?;
        for update in updates {
            let spec = &self.specs[update.request_id.0 as usize];
            let tokens = self
                .outputs
                .get_mut(&update.request_id)
                .ok_or_else(|| format!("update for unknown request {}", update.request_id))?;
            tokens.extend_from_slice(&update.new_token_ids);
            ensure(tokens.len() == update.num_output_tokens, || {
                "num_output_tokens disagrees with the tokens streamed".to_owned()
            })?;
            check_stop_decision(spec, tokens, update.finish_reason, update.stop_token_id)?;
            if let Some(reason) = update.finish_reason {
                self.finish(update.request_id, reason)?;
            }
        }
        self.propose_drafts();
        self.check_blocks()
    }

    fn propose_drafts(&mut self) {
        let Some(mut state) = self.drafts else {
            return;
        };
        let mut next_random = move || {
            // splitmix64
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        for id in self.scheduler.running_request_ids().to_vec() {
            if !self.scheduler.is_decoding(id) {
                continue;
            }
            let mut sequence = self
                .scheduler
                .request_token_ids(id)
                .map(<[u32]>::to_vec)
                .unwrap_or_default();
            let k = (next_random() % 5) as usize;
            let mut drafts = Vec::with_capacity(k);
            for _ in 0..k {
                let token = if next_random() % 4 == 0 {
                    (next_random() % u64::from(VOCAB)) as u32
                } else {
                    next_token(&sequence, self.eos_every)
                };
                drafts.push(token);
                sequence.push(token);
            }
            self.scheduler.set_draft_token_ids(id, &drafts);
        }
        self.drafts = Some(next_random());
    }

    fn check_output(
        &mut self,
        output: &SchedulerOutput,
        waiting_before: &[RequestId],
        truth: &HashMap<RequestId, (Vec<u32>, Option<u8>)>,
    ) -> Result<(), String> {
        let config = &self.config;
        let total: usize = output.scheduled.iter().map(|s| s.token_ids.len()).sum();
        ensure(total == output.total_num_scheduled_tokens, || {
            "total_num_scheduled_tokens is not the sum".to_owned()
        })?;
        ensure(total <= config.max_num_batched_tokens, || {
            format!(
                "{total} tokens over budget {}",
                config.max_num_batched_tokens
            )
        })?;
        ensure(
            self.scheduler.stats().num_scheduled_tokens_last_step == total,
            || "stats disagree on scheduled tokens".to_owned(),
        )?;
        ensure(output.scheduled.len() <= config.max_num_seqs, || {
            "more scheduled requests than max_num_seqs".to_owned()
        })?;
        ensure(self.scheduler.num_running() <= config.max_num_seqs, || {
            "more running requests than max_num_seqs".to_owned()
        })?;
        if self.scheduler.has_unfinished_requests() {
            ensure(
                !output.scheduled.is_empty() || !output.preempted_request_ids.is_empty(),
                || "unfinished requests but an idle step".to_owned(),
            )?;
        }

        self.preempted_once
            .extend(output.preempted_request_ids.iter().copied());
        let mut seen = HashSet::new();
        let mut admitted = Vec::new();
        for scheduled in &output.scheduled {
            let id = scheduled.request_id;
            ensure(seen.insert(id), || format!("request {id} scheduled twice"))?;
            let (tokens, _) = truth
                .get(&id)
                .ok_or_else(|| format!("scheduled request {id} is not running"))?;
            let start = scheduled.start_position;
            let num_drafts = scheduled.draft_token_ids.len();
            let end = start + scheduled.token_ids.len() - num_drafts;
            ensure(
                scheduled.token_ids[scheduled.token_ids.len() - num_drafts..]
                    == scheduled.draft_token_ids[..],
                || format!("request {id}: drafts are not the tail of its tokens"),
            )?;
            ensure(num_drafts == 0 || scheduled.samples, || {
                format!("request {id}: drafts on a step that does not sample")
            })?;
            ensure(!scheduled.token_ids.is_empty(), || {
                format!("request {id} scheduled with no tokens")
            })?;
            if let Some(threshold) = config.long_prefill_token_threshold {
                ensure(scheduled.token_ids.len() <= threshold, || {
                    "chunk over long_prefill_token_threshold".to_owned()
                })?;
            }
            ensure(
                end <= tokens.len() && tokens[start..end] == scheduled.token_ids[..end - start],
                || format!("request {id} fed wrong tokens"),
            )?;
            ensure(scheduled.samples == (end == tokens.len()), || {
                format!("request {id}: samples flag wrong")
            })?;
            let kv = self.scheduler.kv_cache_manager();
            ensure(scheduled.block_tables.len() == kv.num_groups(), || {
                format!("request {id}: a table per group expected")
            })?;
            for (group, table) in scheduled.block_tables.iter().enumerate() {
                ensure(
                    table.len() == (end + num_drafts).div_ceil(config.block_size),
                    || format!("request {id}: group {group}'s table does not match its tokens"),
                )?;
                ensure(kv.group_block_table(id, group) == Some(&table[..]), || {
                    format!("request {id}: group {group}'s table differs from the manager's")
                })?;
                // Sliding window: exactly the blocks before the first query's window are
                // released (and never more than one request may hold are held).
                let skipped = kv.group_num_skipped_blocks(id, group);
                ensure(
                    skipped == config.kv_cache_config().group_skipped_blocks(group, start),
                    || {
                        format!(
                            "request {id}: {skipped} blocks of group {group} skipped at \
                             position {start}"
                        )
                    },
                )?;
            }
            ensure(scheduled.state_slot == kv.state_slot(id), || {
                format!("request {id}: its state slot differs from the manager's")
            })?;
            ensure(
                scheduled.state_slot.is_some() == config.state_slots.is_enabled(),
                || format!("request {id}: state slot {:?}", scheduled.state_slot),
            )?;
            let held = kv.num_owned_blocks(id);
            ensure(held <= config.max_blocks_per_request(), || {
                format!(
                    "request {id} holds {held} blocks, over {}",
                    config.max_blocks_per_request()
                )
            })?;
            match scheduled.kind {
                ScheduleKind::Continuing => {
                    ensure(scheduled.num_cached_tokens == 0, || {
                        "cached tokens on a continuing request".to_owned()
                    })?;
                }
                kind => {
                    admitted.push(id);
                    ensure(start == scheduled.num_cached_tokens, || {
                        "admitted request does not start after its prefix hit".to_owned()
                    })?;
                    ensure(scheduled.num_cached_tokens % config.block_size == 0, || {
                        "prefix hit not in whole blocks".to_owned()
                    })?;
                    ensure(config.prefix_caching_active() || start == 0, || {
                        "prefix hit with caching disabled (or with recurrent state)".to_owned()
                    })?;
                    let was_preempted = self.preempted_once.contains(&id);
                    let first = self.admitted_once.insert(id);
                    ensure(
                        (kind == ScheduleKind::New) == first
                            && (kind == ScheduleKind::Resumed) == was_preempted,
                        || format!("request {id}: kind {kind:?} wrong"),
                    )?;
                }
            }
        }
        ensure(
            admitted.len() <= waiting_before.len()
                && admitted[..] == waiting_before[..admitted.len()],
            || format!("admitted {admitted:?} out of queue order {waiting_before:?}"),
        )?;
        ensure(
            output.preempted_request_ids.is_empty() || admitted.is_empty(),
            || "admitted requests in a step that preempted".to_owned(),
        )?;
        let waiting_now = self.scheduler.waiting_request_ids();
        for &id in &output.preempted_request_ids {
            ensure(!seen.contains(&id), || {
                format!("preempted request {id} also scheduled")
            })?;
            ensure(waiting_now.contains(&id), || {
                format!("preempted request {id} not waiting")
            })?;
            ensure(
                self.scheduler.kv_cache_manager().block_table(id).is_none(),
                || format!("preempted request {id} still holds blocks"),
            )?;
        }
        Ok(())
    }

    /// Block accounting from the outside: reference counts equal the number of running
    /// requests' tables (in every KV cache group) holding each block, waiting requests hold
    /// nothing, and free + cached-free + used == total.
    fn check_blocks(&self) -> Result<(), String> {
        let kv = self.scheduler.kv_cache_manager();
        kv.verify().map_err(|e| e.to_string())?;
        let mut owners = vec![0u32; kv.num_blocks()];
        for &id in self.scheduler.running_request_ids() {
            for group in 0..kv.num_groups() {
                let table = kv
                    .group_owned_blocks(id, group)
                    .ok_or_else(|| format!("running request {id} has no table"))?;
                for &block in table {
                    owners[block as usize] += 1;
                }
            }
        }
        ensure(kv.num_tables() == self.scheduler.num_running(), || {
            "a waiting or finished request holds blocks".to_owned()
        })?;
        for (block, &count) in owners.iter().enumerate() {
            ensure(kv.ref_count(block as u32) == count, || {
                format!(
                    "block {block}: ref count {} vs {count} owners",
                    kv.ref_count(block as u32)
                )
            })?;
        }
        // Recurrent-state slots: held exactly by the running requests, one each, never shared.
        let mut slots: Vec<u32> = self
            .scheduler
            .running_request_ids()
            .iter()
            .filter_map(|&id| kv.state_slot(id))
            .collect();
        let state = self.config.state_slots;
        let expected_slots = if state.is_enabled() {
            self.scheduler.num_running()
        } else {
            0
        };
        ensure(slots.len() == expected_slots, || {
            format!(
                "{} of {} running requests hold a state slot",
                slots.len(),
                self.scheduler.num_running()
            )
        })?;
        slots.sort_unstable();
        ensure(slots.windows(2).all(|pair| pair[0] != pair[1]), || {
            format!("two running requests share a state slot: {slots:?}")
        })?;
        ensure(
            slots.iter().all(|&slot| slot < state.num_slots)
                && kv.num_free_state_slots() + slots.len() == state.num_slots as usize,
            || format!("state slots {slots:?} of {}: some leaked", state.num_slots),
        )?;
        for id in self.scheduler.waiting_request_ids() {
            ensure(kv.state_slot(id).is_none(), || {
                format!("waiting request {id} holds a state slot")
            })?;
        }
        let used = owners.iter().filter(|&&c| c > 0).count();
        let cached_free = kv.num_cached_free_blocks();
        let free = kv.num_free_blocks() - cached_free;
        ensure(
            used == kv.num_used_blocks() && free + cached_free + used == kv.num_blocks(),
            || format!("accounting: free {free} + cached {cached_free} + used {used} != total"),
        )?;
        let stats = self.scheduler.stats();
        ensure(
            stats.prefix_cache_hits <= stats.prefix_cache_queries,
            || "more prefix hits than queries".to_owned(),
        )?;
        let expected_usage = if state.is_enabled() {
            let (block, slot) = (state.bytes_per_block as f64, state.bytes_per_slot as f64);
            (used as f64 * block + slots.len() as f64 * slot)
                / (kv.num_blocks() as f64 * block + f64::from(state.num_slots) * slot)
        } else {
            used as f64 / kv.num_blocks() as f64
        };
        ensure(
            (stats.kv_cache_usage - expected_usage).abs() < 1e-12,
            || "usage fraction wrong".to_owned(),
        )
    }

    fn check_idle(&self) -> Result<(), String> {
        let kv = self.scheduler.kv_cache_manager();
        ensure(kv.num_used_blocks() == 0 && kv.usage() == 0.0, || {
            "blocks still used after every request ended".to_owned()
        })?;
        ensure(kv.num_free_state_slots() == kv.num_state_slots(), || {
            "state slots still held after every request ended".to_owned()
        })?;
        for block in 0..kv.num_blocks() as u32 {
            ensure(kv.ref_count(block) == 0, || {
                format!("block {block} still referenced")
            })?;
        }
        ensure(self.outcomes.len() == self.specs.len(), || {
            format!(
                "{} of {} requests finished",
                self.outcomes.len(),
                self.specs.len()
            )
        })
    }
}

fn check_stop_decision(
    spec: &RequestSpec,
    tokens: &[u32],
    finish_reason: Option<FinishReason>,
    stop_token_id: Option<u32>,
) -> Result<(), String> {
    let stop = &spec.stop;
    let count = tokens.len();
    let last = tokens.last().copied();
    let min_reached = count >= stop.min_tokens as usize;
    let is_eos = last.is_some_and(|t| !stop.ignore_eos && stop.eos_token_ids.contains(&t));
    let is_stop_token = last.is_some_and(|t| stop.stop_token_ids.contains(&t));
    ensure(count <= stop.max_tokens as usize, || {
        "generated past max_tokens".to_owned()
    })?;
    let expected = if count == stop.max_tokens as usize {
        Some((FinishReason::Length, None))
    } else if min_reached && is_eos {
        Some((FinishReason::Stop, None))
    } else if min_reached && is_stop_token {
        Some((FinishReason::Stop, last))
    } else {
        None
    };
    let got = finish_reason.map(|reason| (reason, stop_token_id));
    ensure(got == expected, || {
        format!("after {tokens:?} finish {got:?}, expected {expected:?} for {stop:?}")
    })
}
