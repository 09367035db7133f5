//! What the engine loop reports, in one place: the Prometheus metrics, the periodic stats and
//! speculative-decoding log lines, the request spans, and the snapshot clients read
//! (`Shared::stats`). The loop fills this iteration's `StepMetrics` as it works
//! (`step_metrics`), tells the observer about each request that leaves (`request_finished`)
//! and calls `step_end` once per iteration; nothing else in the loop touches a sink.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokenmill_core::{RequestId, Scheduler};
use tokenmill_metrics::{
    EngineMetrics, FinishedReason, FinishedRequestMetrics, OtlpTraceExporter, RequestSpan,
    SpecDecodingLogger, StatsLogger, StepMetrics,
};

use crate::core_loop::Shared;

/// Lifecycle timestamps of one request, for vLLM's latency metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestTimes {
    pub arrival: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
}

/// A request leaving the engine, as the metrics and traces see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FinishedRequest {
    pub request_id: RequestId,
    pub times: RequestTimes,
    pub num_prompt_tokens: usize,
    pub num_output_tokens: usize,
    pub max_tokens_param: Option<u32>,
    pub reason: FinishedReason,
}

/// What the observer is built from.
pub(crate) struct ObserverParts {
    pub metrics: Arc<EngineMetrics>,
    /// Request-span exporter; `None` (the default) builds no spans at all.
    pub traces: Option<Arc<OtlpTraceExporter>>,
    /// Where the snapshot clients read (`EngineStats`) is published.
    pub shared: Arc<Shared>,
    /// Data-parallel rank, named in the stats line.
    pub engine_index: usize,
    /// `None` turns the periodic stats line off.
    pub log_stats_interval: Option<Duration>,
    /// Speculating: the `SpecDecoding metrics` line is logged with the stats line.
    pub speculating: bool,
}

/// Cumulative scheduler counters.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    num_preemptions: u64,
}

/// The engine loop's sinks and the per-iteration state that feeds them.
pub(crate) struct LoopObserver {
    metrics: Arc<EngineMetrics>,
    traces: Option<Arc<OtlpTraceExporter>>,
    shared: Arc<Shared>,
    stats_logger: Option<StatsLogger>,
    spec_logger: Option<SpecDecodingLogger>,
    /// This iteration's counters and latencies, handed to the metrics once per iteration.
    step: StepMetrics,
    /// Scheduler counters at the previous iteration, to turn totals into deltas.
    last_counters: Counters,
    /// LoRA adapter names by id, for `vllm:lora_requests_info` (ids are never reused).
    lora_names: HashMap<u32, String>,
}

impl LoopObserver {
    pub fn new(parts: ObserverParts) -> Self {
        let ObserverParts {
            metrics,
            traces,
            shared,
            engine_index,
            log_stats_interval,
            speculating,
        } = parts;
        LoopObserver {
            metrics,
            traces,
            shared,
            stats_logger: log_stats_interval
                .map(|interval| StatsLogger::new(interval).for_engine(engine_index)),
            spec_logger: speculating.then(SpecDecodingLogger::default),
            step: StepMetrics::default(),
            last_counters: Counters::default(),
            lora_names: HashMap::new(),
        }
    }

    /// This iteration's step metrics, for the loop to add token times and draft counts to.
    pub fn step_metrics(&mut self) -> &mut StepMetrics {
        &mut self.step
    }

    /// Names adapter `id` in `vllm:lora_requests_info` from now on.
    pub fn adapter_added(&mut self, id: u32, name: &str) {
        self.lora_names
            .entry(id)
            .or_insert_with(|| name.to_string());
    }

    /// Counts a request that left the engine at `now` and, when tracing is on, queues its span.
    pub fn request_finished(&self, request: &FinishedRequest, now: Instant) {
        let finished = finished_metrics(request, now);
        self.metrics.record_finished(&finished);
        let Some(traces) = self.traces.as_deref() else {
            return;
        };
        // Spans need wall-clock times; the request only carries monotonic instants, so map
        // `now` and the arrival onto the system clock through the current offset.
        let end = SystemTime::now()
            .checked_sub(now.elapsed())
            .unwrap_or_else(SystemTime::now);
        let start = end
            .checked_sub(Duration::from_secs_f64(finished.e2e_latency))
            .unwrap_or(end);
        let times = &request.times;
        let time_to_first_token = times
            .first_token
            .map(|first| first.saturating_duration_since(times.arrival).as_secs_f64());
        traces.record(RequestSpan {
            request_id: request.request_id.0,
            start,
            end,
            time_to_first_token,
            finished,
        });
    }

    /// The end of an iteration that ran `step_tokens` tokens (0: none ran): feeds the metrics
    /// once, emits the periodic stats line when due, publishes the snapshot clients read, and
    /// starts the next iteration's step metrics.
    pub fn step_end(&mut self, scheduler: &Scheduler, step_tokens: usize) {
        let snapshot = scheduler.stats();
        let counters = Counters {
            prefix_cache_queries: snapshot.prefix_cache_queries,
            prefix_cache_hits: snapshot.prefix_cache_hits,
            num_preemptions: snapshot.num_preemptions,
        };
        let step = &mut self.step;
        step.num_running = snapshot.num_running;
        step.num_waiting = snapshot.num_waiting;
        step.kv_cache_usage = snapshot.kv_cache_usage;
        step.prefix_cache_queries = counters
            .prefix_cache_queries
            .saturating_sub(self.last_counters.prefix_cache_queries);
        step.prefix_cache_hits = counters
            .prefix_cache_hits
            .saturating_sub(self.last_counters.prefix_cache_hits);
        step.num_preemptions = counters
            .num_preemptions
            .saturating_sub(self.last_counters.num_preemptions);
        step.iteration_tokens = step_tokens;
        self.last_counters = counters;
        self.metrics.record_step(step);
        if let Some(spec_logger) = self.spec_logger.as_mut() {
            spec_logger.observe(&step.spec_decode);
        }
        if self.metrics.lora_enabled() {
            let lora = scheduler.lora_stats();
            let names = |counts: &BTreeMap<u32, usize>| -> Vec<String> {
                counts
                    .keys()
                    .filter_map(|id| self.lora_names.get(id).cloned())
                    .collect()
            };
            self.metrics
                .record_lora(&names(&lora.running), &names(&lora.waiting));
        }
        if let Some(logger) = self.stats_logger.as_mut() {
            logger.observe_step(step);
            let now = Instant::now();
            if let Some((level, line)) = logger.maybe_log(now) {
                if level == tracing::Level::INFO {
                    tracing::info!("{line}");
                } else {
                    tracing::debug!("{line}");
                }
                if let Some(line) = self.spec_logger.as_mut().and_then(|l| l.log_line(now)) {
                    tracing::info!("{line}");
                }
            }
        }
        if let Ok(mut stats) = self.shared.stats.lock() {
            if step_tokens > 0 {
                stats.num_steps += 1;
                stats.last_step_tokens = step_tokens;
            }
            stats.num_running = snapshot.num_running;
            stats.num_waiting = snapshot.num_waiting;
            stats.kv_cache_usage = snapshot.kv_cache_usage;
            stats.prefix_cache_queries = snapshot.prefix_cache_queries;
            stats.prefix_cache_hits = snapshot.prefix_cache_hits;
            stats.num_preemptions = snapshot.num_preemptions;
            stats.num_blocks = snapshot.num_blocks;
            stats.num_free_blocks = snapshot.num_free_blocks;
            stats.num_cached_free_blocks = snapshot.num_cached_free_blocks;
            stats.num_state_slots = snapshot.num_state_slots;
            stats.num_free_state_slots = snapshot.num_free_state_slots;
            stats.prompt_tokens += step.prompt_tokens;
            stats.generation_tokens += step.generation_tokens;
        }
        step.prompt_tokens = 0;
        step.generation_tokens = 0;
        step.time_to_first_tokens.clear();
        step.inter_token_latencies.clear();
        step.spec_decode = Default::default();
    }
}

/// vLLM's per-request phase times for a request ending at `now`.
fn finished_metrics(request: &FinishedRequest, now: Instant) -> FinishedRequestMetrics {
    let times = &request.times;
    let seconds = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
        (Some(from), Some(to)) => to.saturating_duration_since(from).as_secs_f64(),
        _ => 0.0,
    };
    let decode_time = seconds(times.first_token, times.last_token);
    FinishedRequestMetrics {
        finish_reason: request.reason,
        num_prompt_tokens: request.num_prompt_tokens as u64,
        num_generation_tokens: request.num_output_tokens as u64,
        max_tokens_param: request.max_tokens_param,
        n_param: 1,
        e2e_latency: now.saturating_duration_since(times.arrival).as_secs_f64(),
        queue_time: seconds(Some(times.arrival), times.first_scheduled),
        prefill_time: seconds(times.first_scheduled, times.first_token),
        decode_time,
        inference_time: seconds(times.first_scheduled, times.last_token),
        mean_time_per_output_token: (request.num_output_tokens > 1)
            .then(|| decode_time / (request.num_output_tokens - 1) as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(output_tokens: usize) -> FinishedRequest {
        let arrival = Instant::now();
        FinishedRequest {
            request_id: RequestId(7),
            times: RequestTimes {
                arrival,
                first_scheduled: Some(arrival + Duration::from_millis(100)),
                first_token: Some(arrival + Duration::from_millis(300)),
                last_token: Some(arrival + Duration::from_millis(700)),
            },
            num_prompt_tokens: 12,
            num_output_tokens: output_tokens,
            max_tokens_param: Some(16),
            reason: FinishedReason::Length,
        }
    }

    #[test]
    fn phase_times_split_the_request_at_its_timestamps() {
        let finished = request(5);
        let now = finished.times.arrival + Duration::from_millis(1000);
        let metrics = finished_metrics(&finished, now);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(metrics.e2e_latency, 1.0));
        assert!(close(metrics.queue_time, 0.1));
        assert!(close(metrics.prefill_time, 0.2));
        assert!(close(metrics.decode_time, 0.4));
        assert!(close(metrics.inference_time, 0.6));
        // Four gaps between five tokens.
        assert!(metrics
            .mean_time_per_output_token
            .is_some_and(|tpot| close(tpot, 0.1)));
        assert_eq!(metrics.num_prompt_tokens, 12);
        assert_eq!(metrics.num_generation_tokens, 5);
        assert_eq!(metrics.max_tokens_param, Some(16));
    }

    #[test]
    fn one_token_has_no_time_per_output_token_and_unscheduled_phases_are_zero() {
        let mut finished = request(1);
        finished.times.first_scheduled = None;
        finished.times.first_token = None;
        finished.times.last_token = None;
        let metrics = finished_metrics(&finished, finished.times.arrival);
        assert_eq!(metrics.mean_time_per_output_token, None);
        assert_eq!(metrics.queue_time, 0.0);
        assert_eq!(metrics.prefill_time, 0.0);
        assert_eq!(metrics.decode_time, 0.0);
    }
}
