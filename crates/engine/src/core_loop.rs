//! The engine-core thread: owns the scheduler and the executor and runs
//! schedule → execute → update while there is work, sleeping on its command channel when idle.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokenmill_core::{FinishReason, Request, RequestId, Scheduler, StopParams};
use tokenmill_metrics::{
    EngineMetrics, FinishedReason, FinishedRequestMetrics, OtlpTraceExporter, RequestSpan,
    StatsLogger, StepMetrics,
};
use tokenmill_text::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::executor::{Executor, NewSequence};
use crate::output::OutputProcessor;
use crate::request::{GenerateRequest, RequestEvent, RequestOutput, StopReason, TokenLogprob};
use crate::stats::EngineStats;
use crate::EngineError;

/// Messages from clients to the engine thread.
pub(crate) enum Command {
    Add {
        request_id: RequestId,
        request: Box<GenerateRequest>,
        events: UnboundedSender<RequestEvent>,
    },
    Abort(RequestId),
    Shutdown,
}

/// State shared between the engine thread and its clients.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub alive: AtomicBool,
    pub stats: Mutex<EngineStats>,
}

/// A request the engine is working on, from the output side.
struct Active {
    events: UnboundedSender<RequestEvent>,
    output: OutputProcessor,
    num_prompt_tokens: usize,
    num_cached_tokens: usize,
    num_output_tokens: usize,
    wants_logprobs: bool,
    /// Prompt logprobs gathered so far (`None` when not requested); sent with the first delta.
    prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    times: RequestTimes,
    max_tokens_param: Option<u32>,
}

/// Lifecycle timestamps of one request, for vLLM's latency metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestTimes {
    pub arrival: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
}

/// What the engine loop is built from.
pub(crate) struct LoopParts<E: Executor> {
    pub scheduler: Scheduler,
    pub executor: E,
    pub tokenizer: Arc<Tokenizer>,
    pub max_model_len: usize,
    pub commands: Receiver<Command>,
    pub shared: Arc<Shared>,
    pub metrics: Arc<EngineMetrics>,
    /// `None` turns the periodic stats line off.
    pub log_stats_interval: Option<Duration>,
    /// Request-span exporter; `None` (the default) builds no spans at all.
    pub traces: Option<Arc<OtlpTraceExporter>>,
}

pub(crate) struct EngineLoop<E: Executor> {
    pub scheduler: Scheduler,
    pub executor: E,
    pub tokenizer: Arc<Tokenizer>,
    pub eos_token_ids: Vec<u32>,
    pub max_model_len: usize,
    pub commands: Receiver<Command>,
    pub shared: Arc<Shared>,
    active: HashMap<RequestId, Active>,
    arrival_seq: u64,
    metrics: Arc<EngineMetrics>,
    traces: Option<Arc<OtlpTraceExporter>>,
    stats_logger: Option<StatsLogger>,
    /// This iteration's counters and latencies, handed to the metrics once per iteration.
    step_metrics: StepMetrics,
    /// Output events of this step, sent only after the step's metrics are recorded, so a
    /// client that saw its request finish also sees it counted on `/metrics`.
    outbox: Vec<(UnboundedSender<RequestEvent>, RequestEvent)>,
    /// Scheduler counters at the previous iteration, to turn totals into deltas.
    last_counters: Counters,
}

/// Cumulative scheduler counters.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    num_preemptions: u64,
}

/// How long the idle loop waits for a command before re-checking client liveness.
const IDLE_POLL: Duration = Duration::from_millis(100);

impl<E: Executor> EngineLoop<E> {
    pub fn new(parts: LoopParts<E>) -> Self {
        let LoopParts {
            scheduler,
            executor,
            tokenizer,
            max_model_len,
            commands,
            shared,
            metrics,
            log_stats_interval,
            traces,
        } = parts;
        let eos_token_ids = tokenizer.eos_token_ids();
        EngineLoop {
            scheduler,
            executor,
            tokenizer,
            eos_token_ids,
            max_model_len,
            commands,
            shared,
            active: HashMap::new(),
            arrival_seq: 0,
            metrics,
            traces,
            stats_logger: log_stats_interval.map(StatsLogger::new),
            step_metrics: StepMetrics::default(),
            outbox: Vec::new(),
            last_counters: Counters::default(),
        }
    }

    /// Runs until shutdown or until every client handle is gone. A panic inside a step is
    /// caught: in-flight requests get an error event and the engine is marked dead.
    pub fn run(mut self) {
        self.shared.alive.store(true, Ordering::SeqCst);
        loop {
            let keep_going = catch_unwind(AssertUnwindSafe(|| self.iteration()));
            match keep_going {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => break,
                Ok(Err(err)) => {
                    tracing::error!("engine step failed: {err}");
                    self.fail_all(&format!("engine step failed: {err}"));
                    break;
                }
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    tracing::error!("engine thread panicked: {message}");
                    self.fail_all(&format!("engine crashed: {message}"));
                    break;
                }
            }
        }
        self.shared.alive.store(false, Ordering::SeqCst);
    }

    /// One pass: take commands (blocking when idle), then run one step if there is work.
    fn iteration(&mut self) -> Result<bool, EngineError> {
        if self.active.is_empty() {
            match self.commands.recv_timeout(IDLE_POLL) {
                Ok(command) => {
                    if !self.handle(command) {
                        return Ok(false);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    // Idle: still refresh gauges and let the periodic stats line fall due.
                    self.publish_stats(0);
                    return Ok(true);
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(false),
            }
        }
        while let Ok(command) = self.commands.try_recv() {
            if !self.handle(command) {
                return Ok(false);
            }
        }
        self.abort_disconnected();
        let step_tokens = if self.active.is_empty() {
            0
        } else {
            self.step()?
        };
        self.publish_stats(step_tokens);
        for (events, event) in self.outbox.drain(..) {
            let _ = events.send(event);
        }
        Ok(true)
    }

    /// Applies one command; `false` means shut down.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Add {
                request_id,
                request,
                events,
            } => self.add(request_id, *request, events),
            Command::Abort(request_id) => self.abort(request_id),
            Command::Shutdown => {
                let ids: Vec<RequestId> = self.active.keys().copied().collect();
                for id in ids {
                    self.abort(id);
                }
                return false;
            }
        }
        true
    }

    fn add(
        &mut self,
        request_id: RequestId,
        mut request: GenerateRequest,
        events: UnboundedSender<RequestEvent>,
    ) {
        let num_prompt_tokens = request.prompt_token_ids.len();
        let max_tokens = request
            .stop
            .max_tokens
            .unwrap_or_else(|| self.max_model_len.saturating_sub(num_prompt_tokens) as u32);
        let stop = StopParams {
            max_tokens,
            min_tokens: request.sampling.min_tokens,
            ignore_eos: request.stop.ignore_eos,
            eos_token_ids: self.eos_token_ids.clone(),
            stop_token_ids: request.stop.stop_token_ids.clone(),
        };
        // What `min_tokens` holds back: the same ids that would end the request.
        let all_stop = &mut request.sampling.all_stop_token_ids;
        all_stop.clone_from(&request.stop.stop_token_ids);
        if !request.stop.ignore_eos {
            all_stop.extend_from_slice(&self.eos_token_ids);
        }
        self.arrival_seq += 1;
        // Prompt logprobs need logits at every prompt position, so such a request must not
        // reuse cached blocks: a salt nobody else has keeps its hashes private.
        let cache_salt = match request.prompt_logprobs {
            Some(_) => Some(format!("prompt-logprobs-{request_id}")),
            None => request.cache_salt.clone(),
        };
        let core_request = Request {
            request_id,
            prompt_token_ids: request.prompt_token_ids.clone(),
            stop,
            priority: request.priority,
            arrival_seq: self.arrival_seq,
            cache_salt,
            adapter_id: None,
        };
        let admitted = self
            .executor
            .add_request(NewSequence {
                request_id,
                prompt_token_ids: &request.prompt_token_ids,
                sampling: &request.sampling,
                prompt_logprobs: request.prompt_logprobs,
            })
            .and_then(|()| {
                self.scheduler
                    .add_request(core_request)
                    .map_err(EngineError::from)
            });
        if let Err(err) = admitted {
            self.executor.remove_request(request_id);
            let _ = events.send(RequestEvent::Error(err.to_string()));
            return;
        }
        let output = OutputProcessor::new(
            Arc::clone(&self.tokenizer),
            &request.prompt_token_ids,
            request.decode,
            request.stop.stop_strings,
            request.stop.include_stop_str_in_output,
        );
        self.active.insert(
            request_id,
            Active {
                events,
                output,
                num_prompt_tokens,
                num_cached_tokens: 0,
                num_output_tokens: 0,
                wants_logprobs: request.sampling.logprobs.is_some(),
                prompt_logprobs: request.prompt_logprobs.map(|_| vec![None]),
                times: RequestTimes {
                    arrival: request.arrival,
                    first_scheduled: None,
                    first_token: None,
                    last_token: None,
                },
                max_tokens_param: request.stop.max_tokens,
            },
        );
    }

    /// Clients that went away (dropped their stream) get their requests aborted.
    fn abort_disconnected(&mut self) {
        let gone: Vec<RequestId> = self
            .active
            .iter()
            .filter(|(_, active)| active.events.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.abort(id);
        }
    }

    /// Aborts a request (client gone, abort command, shutdown): frees its blocks and sends a
    /// final delta with `finish_reason: abort` and no held-back text.
    fn abort(&mut self, request_id: RequestId) {
        self.scheduler
            .finish_requests([request_id], FinishReason::Abort);
        self.executor.remove_request(request_id);
        if let Some(mut active) = self.active.remove(&request_id) {
            report_finished(
                &self.metrics,
                self.traces.as_deref(),
                request_id,
                &active,
                FinishedReason::Abort,
                Instant::now(),
            );
            let _ = active.events.send(RequestEvent::Output(RequestOutput {
                new_token_ids: Vec::new(),
                new_text: String::new(),
                logprobs: Vec::new(),
                prompt_logprobs: active.prompt_logprobs.take(),
                num_prompt_tokens: active.num_prompt_tokens,
                num_cached_tokens: active.num_cached_tokens,
                num_output_tokens: active.num_output_tokens,
                finish_reason: Some(FinishReason::Abort),
                stop_reason: None,
            }));
        }
    }

    /// Runs one schedule → execute → update step; returns the tokens it computed.
    fn step(&mut self) -> Result<usize, EngineError> {
        let scheduled = self.scheduler.schedule();
        if scheduled.scheduled.is_empty() {
            // Work exists but nothing fits this step (should not happen with a pool that holds
            // one max-length request); avoid spinning.
            std::thread::sleep(Duration::from_millis(1));
            return Ok(0);
        }
        let scheduled_at = Instant::now();
        for request in &scheduled.scheduled {
            if let Some(active) = self.active.get_mut(&request.request_id) {
                if request.num_cached_tokens > 0 {
                    active.num_cached_tokens = request.num_cached_tokens;
                }
                active.times.first_scheduled.get_or_insert(scheduled_at);
            }
        }
        let step = self.executor.execute(&scheduled)?;
        let sampled: Vec<(RequestId, u32)> = step
            .sampled
            .iter()
            .map(|(id, token)| (*id, token.token_id))
            .collect();
        let updates = self.scheduler.update_from_output(&scheduled, &sampled)?;
        let now = Instant::now();
        for (request_id, entries) in step.prompt_logprobs {
            if let Some(gathered) = self
                .active
                .get_mut(&request_id)
                .and_then(|active| active.prompt_logprobs.as_mut())
            {
                gathered.extend(entries.into_iter().map(Some));
            }
        }
        let mut logprobs_by_request: HashMap<RequestId, TokenLogprob> = step
            .sampled
            .into_iter()
            .filter_map(|(id, token)| {
                token.logprob.map(|logprob| {
                    (
                        id,
                        TokenLogprob {
                            token_id: token.token_id,
                            logprob,
                            top: token.top_logprobs,
                        },
                    )
                })
            })
            .collect();

        let mut stop_string_finishes = Vec::new();
        for update in updates {
            let Some(active) = self.active.get_mut(&update.request_id) else {
                continue;
            };
            if !update.new_token_ids.is_empty() {
                let times = &mut active.times;
                match times.last_token {
                    None => {
                        self.step_metrics
                            .time_to_first_tokens
                            .push((now - times.arrival).as_secs_f64());
                        self.step_metrics.prompt_tokens += active.num_prompt_tokens as u64;
                        times.first_token = Some(now);
                    }
                    Some(last) => self
                        .step_metrics
                        .inter_token_latencies
                        .push((now - last).as_secs_f64()),
                }
                times.last_token = Some(now);
                self.step_metrics.generation_tokens += update.new_token_ids.len() as u64;
            }
            let mut text = String::new();
            let mut stopped_by = None;
            for &token in &update.new_token_ids {
                active.num_output_tokens += 1;
                let processed = active.output.push_token(token)?;
                text.push_str(&processed.text);
                if processed.stopped_by.is_some() {
                    stopped_by = processed.stopped_by;
                    break;
                }
            }
            let logprobs = match logprobs_by_request.remove(&update.request_id) {
                Some(lp) if active.wants_logprobs => vec![lp],
                _ => Vec::new(),
            };
            let (finish_reason, stop_reason) = match (&stopped_by, update.finish_reason) {
                (Some(stop), _) => (
                    Some(FinishReason::Stop),
                    Some(StopReason::String(stop.clone())),
                ),
                (None, Some(reason)) => {
                    let rest = active.output.finish()?;
                    text.push_str(&rest);
                    (Some(reason), update.stop_token_id.map(StopReason::Token))
                }
                (None, None) => (None, None),
            };
            self.outbox.push((
                active.events.clone(),
                RequestEvent::Output(RequestOutput {
                    new_token_ids: update.new_token_ids.clone(),
                    new_text: text,
                    logprobs,
                    prompt_logprobs: active.prompt_logprobs.take(),
                    num_prompt_tokens: active.num_prompt_tokens,
                    num_cached_tokens: active.num_cached_tokens,
                    num_output_tokens: active.num_output_tokens,
                    finish_reason,
                    stop_reason,
                }),
            ));
            if stopped_by.is_some() && update.finish_reason.is_none() {
                stop_string_finishes.push(update.request_id);
            } else if let Some(reason) = finish_reason {
                self.executor.remove_request(update.request_id);
                if let Some(active) = self.active.remove(&update.request_id) {
                    report_finished(
                        &self.metrics,
                        self.traces.as_deref(),
                        update.request_id,
                        &active,
                        metrics_reason(reason),
                        now,
                    );
                }
            }
        }
        for id in stop_string_finishes {
            self.scheduler.finish_requests([id], FinishReason::Stop);
            self.executor.remove_request(id);
            if let Some(active) = self.active.remove(&id) {
                report_finished(
                    &self.metrics,
                    self.traces.as_deref(),
                    id,
                    &active,
                    FinishedReason::Stop,
                    now,
                );
            }
        }
        Ok(scheduled.total_num_scheduled_tokens)
    }

    /// Publishes the snapshot clients read, feeds the metrics once for this iteration, and
    /// emits the periodic stats line when due.
    fn publish_stats(&mut self, step_tokens: usize) {
        let snapshot = self.scheduler.stats();
        let counters = Counters {
            prefix_cache_queries: snapshot.prefix_cache_queries,
            prefix_cache_hits: snapshot.prefix_cache_hits,
            num_preemptions: snapshot.num_preemptions,
        };
        let step = &mut self.step_metrics;
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
        if let Some(logger) = self.stats_logger.as_mut() {
            logger.observe_step(step);
            if let Some((level, line)) = logger.maybe_log(Instant::now()) {
                if level == tracing::Level::INFO {
                    tracing::info!("{line}");
                } else {
                    tracing::debug!("{line}");
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
            stats.prompt_tokens += step.prompt_tokens;
            stats.generation_tokens += step.generation_tokens;
        }
        step.prompt_tokens = 0;
        step.generation_tokens = 0;
        step.time_to_first_tokens.clear();
        step.inter_token_latencies.clear();
    }

    fn fail_all(&mut self, message: &str) {
        let now = Instant::now();
        for (id, active) in self.active.drain() {
            report_finished(
                &self.metrics,
                self.traces.as_deref(),
                id,
                &active,
                FinishedReason::Error,
                now,
            );
            let _ = active.events.send(RequestEvent::Error(message.to_string()));
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

fn metrics_reason(reason: FinishReason) -> FinishedReason {
    match reason {
        FinishReason::Stop => FinishedReason::Stop,
        FinishReason::Length => FinishedReason::Length,
        FinishReason::Abort => FinishedReason::Abort,
    }
}

/// Records a finished request in the metrics and, when tracing is on, queues its span.
fn report_finished(
    metrics: &EngineMetrics,
    traces: Option<&OtlpTraceExporter>,
    request_id: RequestId,
    active: &Active,
    reason: FinishedReason,
    now: Instant,
) {
    let finished = finished_metrics(active, reason, now);
    metrics.record_finished(&finished);
    if let Some(traces) = traces {
        // Spans need wall-clock times; the request only carries monotonic instants, so map
        // `now` and the arrival onto the system clock through the current offset.
        let end = SystemTime::now()
            .checked_sub(now.elapsed())
            .unwrap_or_else(SystemTime::now);
        let start = end
            .checked_sub(Duration::from_secs_f64(finished.e2e_latency))
            .unwrap_or(end);
        let times = &active.times;
        let time_to_first_token = times
            .first_token
            .map(|first| first.saturating_duration_since(times.arrival).as_secs_f64());
        traces.record(RequestSpan {
            request_id: request_id.0,
            start,
            end,
            time_to_first_token,
            finished,
        });
    }
}

/// vLLM's per-request phase times for a request ending at `now`.
fn finished_metrics(
    active: &Active,
    reason: FinishedReason,
    now: Instant,
) -> FinishedRequestMetrics {
    let times = &active.times;
    let seconds = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
        (Some(from), Some(to)) => to.saturating_duration_since(from).as_secs_f64(),
        _ => 0.0,
    };
    let decode_time = seconds(times.first_token, times.last_token);
    FinishedRequestMetrics {
        finish_reason: reason,
        num_prompt_tokens: active.num_prompt_tokens as u64,
        num_generation_tokens: active.num_output_tokens as u64,
        max_tokens_param: active.max_tokens_param,
        n_param: 1,
        e2e_latency: now.saturating_duration_since(times.arrival).as_secs_f64(),
        queue_time: seconds(Some(times.arrival), times.first_scheduled),
        prefill_time: seconds(times.first_scheduled, times.first_token),
        decode_time,
        inference_time: seconds(times.first_scheduled, times.last_token),
        mean_time_per_output_token: (active.num_output_tokens > 1)
            .then(|| decode_time / (active.num_output_tokens - 1) as f64),
    }
}
