//! The engine-core thread: owns the scheduler and the executor and runs
//! schedule → execute → update while there is work, sleeping on its command channel when idle.
//!
//! Every request leaves through one method, `EngineLoop::finish` (length, EOS, stop token,
//! stop string, abort, disconnect, shutdown, engine error): it frees the request's blocks and
//! executor state, counts it once in the metrics and queues its last event. Events go out
//! after the iteration's metrics are recorded (`flush_outbox`).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokenmill_core::{
    FinishReason, Request, RequestId, RequestUpdate, Scheduler, SchedulerOutput, StopParams,
};
use tokenmill_metrics::{EngineMetrics, FinishedReason, OtlpTraceExporter, StepMetrics};
use tokenmill_models::SampledToken;
use tokenmill_text::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::executor::{Executor, NewSequence, StepOutput};
use crate::kv_events::KvEventPublisher;
use crate::observer::{FinishedRequest, LoopObserver, ObserverParts, RequestTimes};
use crate::output::OutputProcessor;
use crate::request::{
    GenerateRequest, RequestEvent, RequestFailure, RequestOutput, StopReason, TokenLogprob,
};
use crate::spec::SpecDecoder;
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

impl Active {
    /// A delta with this request's counters; the first one also carries the prompt logprobs.
    fn delta(
        &mut self,
        new_token_ids: Vec<u32>,
        new_text: String,
        logprobs: Vec<TokenLogprob>,
    ) -> RequestOutput {
        RequestOutput {
            new_token_ids,
            new_text,
            logprobs,
            prompt_logprobs: self.prompt_logprobs.take(),
            num_prompt_tokens: self.num_prompt_tokens,
            num_cached_tokens: self.num_cached_tokens,
            num_output_tokens: self.num_output_tokens,
            finish_reason: None,
            stop_reason: None,
        }
    }

    /// Time to first token or the gap since the previous token, and the step's token counts.
    fn record_token_times(&mut self, step: &mut StepMetrics, new_tokens: usize, now: Instant) {
        if new_tokens == 0 {
            return;
        }
        match self.times.last_token {
            None => {
                step.time_to_first_tokens
                    .push((now - self.times.arrival).as_secs_f64());
                step.prompt_tokens += self.num_prompt_tokens as u64;
                self.times.first_token = Some(now);
            }
            Some(last) => step.inter_token_latencies.push((now - last).as_secs_f64()),
        }
        self.times.last_token = Some(now);
        step.generation_tokens += new_tokens as u64;
    }

    /// Detokenizes the update's tokens, stopping at the first token that completes a stop
    /// string (tokens after it, e.g. the rest of an accepted speculative run, are dropped:
    /// `num_tokens` says how many were used); when the scheduler ended the request instead,
    /// releases the held-back text.
    fn detokenize(&mut self, update: &RequestUpdate) -> Result<Detokenized, EngineError> {
        let mut text = String::new();
        for (index, &token) in update.new_token_ids.iter().enumerate() {
            self.num_output_tokens += 1;
            let processed = self.output.push_token(token)?;
            text.push_str(&processed.text);
            if let Some(stop) = processed.stopped_by {
                let finish = (FinishReason::Stop, Some(StopReason::String(stop)));
                return Ok(Detokenized {
                    text,
                    num_tokens: index + 1,
                    finish: Some(finish),
                });
            }
        }
        let finish = match update.finish_reason {
            Some(reason) => {
                text.push_str(&self.output.finish()?);
                Some((reason, update.stop_token_id.map(StopReason::Token)))
            }
            None => None,
        };
        Ok(Detokenized {
            text,
            num_tokens: update.new_token_ids.len(),
            finish,
        })
    }
}

/// One update's text, and what ended the request if it ended this step.
struct Detokenized {
    text: String,
    /// Leading tokens of the update the text covers (fewer than all after a stop string).
    num_tokens: usize,
    finish: Option<(FinishReason, Option<StopReason>)>,
}

/// How a request leaves the engine: the data that differs between exits.
#[derive(Debug, Clone)]
enum Finish {
    /// Length, EOS or stop token (the scheduler already ended it) or a stop string (ended in
    /// the scheduler now); `last` is the step's delta, sent with the reasons set.
    Completed {
        reason: FinishReason,
        stop_reason: Option<StopReason>,
        last: RequestOutput,
    },
    /// Abort command, client disconnect or shutdown: a final empty delta with `abort`.
    Abort,
    /// This request failed on its own (sampling, grammar, output): a failure event; the
    /// engine goes on.
    Failed(RequestFailure),
    /// The engine failed: an error event.
    Error(String),
}

impl Finish {
    /// The reason `Scheduler::finish_requests` records (the scheduler has no error reason).
    fn scheduler_reason(&self) -> FinishReason {
        match self {
            Finish::Completed { reason, .. } => *reason,
            Finish::Abort | Finish::Failed(_) | Finish::Error(_) => FinishReason::Abort,
        }
    }

    /// vLLM's `finished_reason` label.
    fn metrics_reason(&self) -> FinishedReason {
        match self {
            Finish::Completed { reason, .. } => metrics_reason(*reason),
            Finish::Abort => FinishedReason::Abort,
            Finish::Failed(_) | Finish::Error(_) => FinishedReason::Error,
        }
    }
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
    /// Data-parallel rank, named in the stats line.
    pub engine_index: usize,
    /// `None` turns the periodic stats line off.
    pub log_stats_interval: Option<Duration>,
    /// Request-span exporter; `None` (the default) builds no spans at all.
    pub traces: Option<Arc<OtlpTraceExporter>>,
    /// `--seed`: seeds requests that bring none, from their arrival number.
    pub seed: Option<u64>,
    /// `--speculative-config`: the proposer and its skip rule; `None` = no speculation.
    pub spec: Option<SpecDecoder>,
    /// KV-cache event publisher; `None` when events are off (the scheduler then logs none).
    pub kv_events: Option<KvEventPublisher>,
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
    seed: Option<u64>,
    /// Metrics, stats lines, spans and the clients' snapshot: every sink the loop feeds.
    observer: LoopObserver,
    spec: Option<SpecDecoder>,
    /// Output events of this step, sent only after the step's metrics are recorded, so a
    /// client that saw its request finish also sees it counted on `/metrics`.
    outbox: Vec<(UnboundedSender<RequestEvent>, RequestEvent)>,
    kv_events: Option<KvEventPublisher>,
}

/// What the command phase of an iteration leaves to do.
enum CommandPhase {
    /// Requests are in flight: run a step.
    Work,
    /// Nothing arrived while idle.
    Idle,
    /// Shutdown, or every client handle is gone.
    Stop,
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
            engine_index,
            log_stats_interval,
            traces,
            seed,
            spec,
            kv_events,
        } = parts;
        let eos_token_ids = tokenizer.eos_token_ids();
        let observer = LoopObserver::new(ObserverParts {
            metrics,
            traces,
            shared: Arc::clone(&shared),
            engine_index,
            log_stats_interval,
            speculating: spec.is_some(),
        });
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
            seed,
            observer,
            spec,
            outbox: Vec::new(),
            kv_events,
        }
    }

    /// Runs until shutdown or until every client handle is gone. A failed or panicking step
    /// is caught: in-flight requests finish with an error event and the engine is marked dead.
    pub fn run(mut self) {
        self.shared.alive.store(true, Ordering::SeqCst);
        let failure = loop {
            match catch_unwind(AssertUnwindSafe(|| self.iteration())) {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => break None,
                Ok(Err(err)) => {
                    tracing::error!("engine step failed: {err}");
                    break Some(format!("engine step failed: {err}"));
                }
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    tracing::error!("engine thread panicked: {message}");
                    break Some(format!("engine crashed: {message}"));
                }
            }
        };
        // Requests still in flight leave through the finish path too; then the last gauges
        // (KV usage back to 0) and events go out. Guarded: the state may be what panicked.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if let Some(message) = failure {
                self.finish_all(&Finish::Error(message));
            }
            self.observer.step_end(&self.scheduler, 0);
            self.flush_outbox();
        }));
        self.shared.alive.store(false, Ordering::SeqCst);
    }

    /// One pass: commands, disconnected clients, one step if there is work, then the step's
    /// metrics and events.
    fn iteration(&mut self) -> Result<bool, EngineError> {
        match self.take_commands() {
            CommandPhase::Stop => return Ok(false),
            CommandPhase::Idle => {
                // Still refresh gauges and let the periodic stats line fall due.
                self.observer.step_end(&self.scheduler, 0);
                return Ok(true);
            }
            CommandPhase::Work => {}
        }
        self.abort_disconnected();
        // Aborts are counted already: their final events need not wait for the step.
        self.flush_outbox();
        let step_tokens = if self.active.is_empty() {
            0
        } else {
            self.step()?
        };
        self.publish_kv_events();
        self.observer.step_end(&self.scheduler, step_tokens);
        self.flush_outbox();
        Ok(true)
    }

    /// Applies pending commands, waiting for one (at most [`IDLE_POLL`]) when idle.
    fn take_commands(&mut self) -> CommandPhase {
        if self.active.is_empty() {
            match self.commands.recv_timeout(IDLE_POLL) {
                Ok(command) => {
                    if !self.handle(command) {
                        return CommandPhase::Stop;
                    }
                }
                Err(RecvTimeoutError::Timeout) => return CommandPhase::Idle,
                Err(RecvTimeoutError::Disconnected) => return CommandPhase::Stop,
            }
        }
        while let Ok(command) = self.commands.try_recv() {
            if !self.handle(command) {
                return CommandPhase::Stop;
            }
        }
        CommandPhase::Work
    }

    /// Applies one command; `false` means shut down.
    fn handle(&mut self, command: Command) -> bool {
        match command {
            Command::Add {
                request_id,
                request,
                events,
            } => self.add(request_id, *request, events),
            Command::Abort(request_id) => self.finish(request_id, Finish::Abort, Instant::now()),
            Command::Shutdown => {
                self.finish_all(&Finish::Abort);
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
        if request.sampling.seed.is_none() {
            request.sampling.seed = self.seed.map(|base| request_seed(base, self.arrival_seq));
        }
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
            adapter_id: request.lora.as_ref().map(|lora| lora.id),
        };
        if let Some(lora) = &request.lora {
            self.observer.adapter_added(lora.id, &lora.name);
        }
        let admitted = self
            .executor
            .add_request(NewSequence {
                request_id,
                prompt_token_ids: &request.prompt_token_ids,
                sampling: &request.sampling,
                prompt_logprobs: request.prompt_logprobs,
                lora: request.lora.as_ref().map(|lora| &lora.adapter),
            })
            .and_then(|()| {
                self.scheduler
                    .add_request(core_request)
                    .map_err(EngineError::from)
            });
        if let Err(err) = admitted {
            self.executor.remove_request(request_id);
            let event = if err.is_invalid_request() {
                RequestEvent::Rejected(err.to_string())
            } else {
                RequestEvent::Error(err.to_string())
            };
            let _ = events.send(event);
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
            self.finish(id, Finish::Abort, Instant::now());
        }
    }

    /// Ends a request, whatever ended it: the one exit path. It always frees the request's
    /// blocks in the scheduler (a no-op when the scheduler finished the request itself), drops
    /// the executor's state, forgets the output state, counts the request once in the metrics
    /// and queues its final event. What differs between exits is `how`.
    fn finish(&mut self, request_id: RequestId, how: Finish, now: Instant) {
        self.scheduler
            .finish_requests([request_id], how.scheduler_reason());
        self.executor.remove_request(request_id);
        if let Some(spec) = self.spec.as_mut() {
            spec.finish(request_id);
        }
        let Some(mut active) = self.active.remove(&request_id) else {
            return;
        };
        self.observer.request_finished(
            &FinishedRequest {
                request_id,
                times: active.times,
                num_prompt_tokens: active.num_prompt_tokens,
                num_output_tokens: active.num_output_tokens,
                max_tokens_param: active.max_tokens_param,
                reason: how.metrics_reason(),
            },
            now,
        );
        let event = match how {
            Finish::Completed {
                reason,
                stop_reason,
                last,
            } => RequestEvent::Output(RequestOutput {
                finish_reason: Some(reason),
                stop_reason,
                ..last
            }),
            Finish::Abort => RequestEvent::Output(RequestOutput {
                finish_reason: Some(FinishReason::Abort),
                ..active.delta(Vec::new(), String::new(), Vec::new())
            }),
            Finish::Failed(failure) => RequestEvent::Failed(failure),
            Finish::Error(message) => RequestEvent::Error(message),
        };
        self.outbox.push((active.events, event));
    }

    /// Ends every request the same way (shutdown, engine failure).
    fn finish_all(&mut self, how: &Finish) {
        let now = Instant::now();
        let ids: Vec<RequestId> = self.active.keys().copied().collect();
        for id in ids {
            self.finish(id, how.clone(), now);
        }
    }

    /// Sends the queued events. Called once the metrics they imply are recorded.
    fn flush_outbox(&mut self) {
        for (events, event) in self.outbox.drain(..) {
            let _ = events.send(event);
        }
    }

    /// One step in phases: schedule, note first scheduling, execute, update the scheduler,
    /// gather prompt logprobs, then each request's update. Returns the tokens it computed.
    fn step(&mut self) -> Result<usize, EngineError> {
        let scheduled = self.scheduler.schedule();
        if scheduled.scheduled.is_empty() {
            // Work exists but nothing fits this step (should not happen with a pool that holds
            // one max-length request); avoid spinning.
            std::thread::sleep(Duration::from_millis(1));
            return Ok(0);
        }
        self.mark_scheduled(&scheduled);
        let StepOutput {
            sampled,
            prompt_logprobs,
            failed,
        } = self.executor.execute(&scheduled)?;
        // A request whose own sampling failed leaves now, through the one exit (its blocks
        // go back to the pool); the scheduler then no longer expects its sample.
        for (request_id, failure) in failed {
            self.finish(request_id, Finish::Failed(failure), Instant::now());
        }
        let runs = token_runs(&sampled);
        self.observe_drafts(&scheduled, &runs);
        let updates = self.scheduler.update_from_token_runs(&scheduled, &runs)?;
        let now = Instant::now();
        self.gather_prompt_logprobs(prompt_logprobs);
        let mut logprobs = sampled_logprobs(sampled);
        for update in updates {
            let logprobs = logprobs.remove(&update.request_id).unwrap_or_default();
            self.process_update(update, logprobs, now);
        }
        if let Some(spec) = self.spec.as_mut() {
            spec.propose(
                &mut self.scheduler,
                &mut self.observer.step_metrics().spec_decode,
            );
        }
        Ok(scheduled.total_num_scheduled_tokens)
    }

    /// Counts each verified draft (drafted tokens, the accepted prefix) for the metrics and
    /// the skip rule. A run's tokens before its last are the accepted drafts.
    fn observe_drafts(&mut self, scheduled: &SchedulerOutput, runs: &[(RequestId, Vec<u32>)]) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        for request in scheduled
            .scheduled
            .iter()
            .filter(|s| !s.draft_token_ids.is_empty())
        {
            let Some((_, run)) = runs.iter().find(|(id, _)| *id == request.request_id) else {
                continue;
            };
            let num_accepted = run.len().saturating_sub(1);
            let num_drafts = request.draft_token_ids.len();
            spec.observe(request.request_id, num_drafts, num_accepted);
            self.observer
                .step_metrics()
                .spec_decode
                .observe_draft(num_drafts, num_accepted);
        }
    }

    /// Notes the first time each request is scheduled (queue time) and its prefix-cache hit.
    fn mark_scheduled(&mut self, scheduled: &SchedulerOutput) {
        let scheduled_at = Instant::now();
        for request in &scheduled.scheduled {
            if let Some(active) = self.active.get_mut(&request.request_id) {
                if request.num_cached_tokens > 0 {
                    active.num_cached_tokens = request.num_cached_tokens;
                }
                active.times.first_scheduled.get_or_insert(scheduled_at);
            }
        }
    }

    /// Appends this step's prompt logprobs to what each request gathered so far.
    fn gather_prompt_logprobs(&mut self, computed: Vec<(RequestId, Vec<TokenLogprob>)>) {
        for (request_id, entries) in computed {
            if let Some(gathered) = self
                .active
                .get_mut(&request_id)
                .and_then(|active| active.prompt_logprobs.as_mut())
            {
                gathered.extend(entries.into_iter().map(Some));
            }
        }
    }

    /// One request's share of a step: timings, detokenization and stop strings, then either a
    /// delta on its stream or, when the step ended it, the finish path. A detokenizer error
    /// (or panic) is this request's failure alone.
    fn process_update(
        &mut self,
        mut update: RequestUpdate,
        mut logprobs: Vec<TokenLogprob>,
        now: Instant,
    ) {
        let request_id = update.request_id;
        let Some(active) = self.active.get_mut(&request_id) else {
            return;
        };
        let detokenized = catch_unwind(AssertUnwindSafe(|| active.detokenize(&update)));
        let Detokenized {
            text,
            num_tokens,
            finish,
        } = match detokenized {
            Ok(Ok(detokenized)) => detokenized,
            Ok(Err(error)) => {
                tracing::warn!("request {request_id} failed in its output: {error}");
                self.finish(request_id, Finish::Failed(RequestFailure::Internal), now);
                return;
            }
            Err(panic) => {
                let message = panic_message(panic.as_ref());
                tracing::error!("request {request_id}: detokenizing panicked: {message}");
                self.finish(request_id, Finish::Failed(RequestFailure::Internal), now);
                return;
            }
        };
        // Nothing past a stop string goes out, token ids and logprobs included.
        update.new_token_ids.truncate(num_tokens);
        active.record_token_times(
            self.observer.step_metrics(),
            update.new_token_ids.len(),
            now,
        );
        if active.wants_logprobs {
            logprobs.truncate(num_tokens);
        } else {
            logprobs.clear();
        }
        let output = active.delta(update.new_token_ids, text, logprobs);
        match finish {
            None => self
                .outbox
                .push((active.events.clone(), RequestEvent::Output(output))),
            Some((reason, stop_reason)) => {
                let how = Finish::Completed {
                    reason,
                    stop_reason,
                    last: output,
                };
                self.finish(update.request_id, how, now);
            }
        }
    }

    /// Hands the step's KV-cache events, if any, to the publisher thread (never waits).
    fn publish_kv_events(&mut self) {
        if let Some(publisher) = &self.kv_events {
            let mut events = Vec::new();
            self.scheduler.drain_kv_events(&mut events);
            if !events.is_empty() {
                publisher.publish(events);
            }
        }
    }
}

/// The seed of the `arrival`-th request under `--seed base`: splitmix64 of the pair, so
/// neighbouring requests draw unrelated streams and a rerun in the same order repeats them.
fn request_seed(base: u64, arrival: u64) -> u64 {
    let mut z = base
        .wrapping_add(arrival.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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

/// Each request's emitted tokens as one run (a request's entries are consecutive).
fn token_runs(sampled: &[(RequestId, SampledToken)]) -> Vec<(RequestId, Vec<u32>)> {
    let mut runs: Vec<(RequestId, Vec<u32>)> = Vec::new();
    for (id, token) in sampled {
        match runs.last_mut() {
            Some((last, run)) if last == id => run.push(token.token_id),
            _ => runs.push((*id, vec![token.token_id])),
        }
    }
    runs
}

/// Each request's emitted tokens' logprob entries, in order (empty where none were computed).
fn sampled_logprobs(
    sampled: Vec<(RequestId, SampledToken)>,
) -> HashMap<RequestId, Vec<TokenLogprob>> {
    let mut logprobs: HashMap<RequestId, Vec<TokenLogprob>> = HashMap::new();
    for (id, token) in sampled {
        if let Some(logprob) = token.logprob {
            logprobs.entry(id).or_default().push(TokenLogprob {
                token_id: token.token_id,
                logprob,
                top: token.top_logprobs,
            });
        }
    }
    logprobs
}

fn metrics_reason(reason: FinishReason) -> FinishedReason {
    match reason {
        FinishReason::Stop => FinishedReason::Stop,
        FinishReason::Length => FinishedReason::Length,
        FinishReason::Abort => FinishedReason::Abort,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use tokenmill_gguf::GgufFile;
    use tokio::sync::mpsc::unbounded_channel;

    use super::*;
    use crate::test_support::{model_path, small_metrics, small_scheduler};

    /// Admits requests and fails every step, as an executor error would; records removals.
    struct FailingExecutor {
        removed: Arc<Mutex<Vec<RequestId>>>,
    }

    impl Executor for FailingExecutor {
        fn add_request(&mut self, _: NewSequence<'_>) -> Result<(), EngineError> {
            Ok(())
        }

        fn remove_request(&mut self, request_id: RequestId) {
            if let Ok(mut removed) = self.removed.lock() {
                removed.push(request_id);
            }
        }

        fn execute(&mut self, _: &SchedulerOutput) -> Result<StepOutput, EngineError> {
            Err(EngineError::Executor("out of device memory".into()))
        }
    }

    /// Samples token 42 for every request except `victim`, whose sampling fails each step (as
    /// a grammar with no continuation would); records removals.
    struct OneFailingExecutor {
        victim: RequestId,
        removed: Arc<Mutex<Vec<RequestId>>>,
    }

    impl Executor for OneFailingExecutor {
        fn add_request(&mut self, _: NewSequence<'_>) -> Result<(), EngineError> {
            Ok(())
        }

        fn remove_request(&mut self, request_id: RequestId) {
            if let Ok(mut removed) = self.removed.lock() {
                removed.push(request_id);
            }
        }

        fn execute(&mut self, scheduled: &SchedulerOutput) -> Result<StepOutput, EngineError> {
            let mut step = StepOutput::default();
            for request in scheduled.scheduled.iter().filter(|r| r.samples) {
                if request.request_id == self.victim {
                    step.failed
                        .push((request.request_id, RequestFailure::NoAllowedToken));
                } else {
                    let token = SampledToken {
                        token_id: 42,
                        logprob: None,
                        top_logprobs: Vec::new(),
                    };
                    step.sampled.push((request.request_id, token));
                }
            }
            Ok(step)
        }
    }

    #[test]
    fn a_request_that_fails_alone_leaves_and_the_others_finish() {
        let metrics = small_metrics();
        let removed = Arc::new(Mutex::new(Vec::new()));
        let (commands_tx, commands) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let engine_loop = EngineLoop::new(LoopParts {
            scheduler: small_scheduler(),
            executor: OneFailingExecutor {
                victim: RequestId(7),
                removed: Arc::clone(&removed),
            },
            tokenizer: Arc::new(tokenizer()),
            max_model_len: 64,
            commands,
            shared: Arc::clone(&shared),
            metrics: Arc::clone(&metrics),
            engine_index: 0,
            log_stats_interval: None,
            traces: None,
            seed: None,
            spec: None,
            kv_events: None,
        });
        let mut streams = Vec::new();
        for id in [7, 8] {
            let (events, stream) = unbounded_channel();
            let mut request = GenerateRequest::new(vec![504, 3575, 282, 1116, 30, 42]);
            request.stop.max_tokens = Some(4);
            request.stop.ignore_eos = true;
            commands_tx
                .send(Command::Add {
                    request_id: RequestId(id),
                    request: Box::new(request),
                    events,
                })
                .unwrap();
            streams.push(stream);
        }
        // Both requests end, then the dropped sender stops the loop: it never failed.
        drop(commands_tx);
        std::thread::spawn(move || engine_loop.run())
            .join()
            .unwrap();

        let mut victim = streams.remove(0);
        assert_eq!(
            victim.blocking_recv(),
            Some(RequestEvent::Failed(RequestFailure::NoAllowedToken))
        );
        assert_eq!(victim.blocking_recv(), None);
        let mut bystander = streams.remove(0);
        let mut tokens = Vec::new();
        let mut finish = None;
        while let Some(event) = bystander.blocking_recv() {
            match event {
                RequestEvent::Output(output) => {
                    tokens.extend(output.new_token_ids);
                    finish = output.finish_reason.or(finish);
                }
                other => panic!("the bystander got {other:?}"),
            }
        }
        assert_eq!(tokens, vec![42; 4]);
        assert_eq!(finish, Some(FinishReason::Length));
        let removed = removed.lock().unwrap().clone();
        assert!(removed.contains(&RequestId(7)), "{removed:?}");
        let stats = shared.stats.lock().unwrap().clone();
        assert_eq!(stats.kv_cache_usage, 0.0, "{stats:?}");
        assert_eq!(stats.num_running + stats.num_waiting, 0, "{stats:?}");
        let text = metrics.encode().unwrap();
        let counted = |reason: &str| {
            text.lines().any(|l| {
                l.starts_with("vllm:request_success_total{")
                    && l.contains(&format!("finished_reason=\"{reason}\""))
                    && l.ends_with(" 1")
            })
        };
        assert!(counted("error") && counted("length"), "{text}");
    }

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_gguf(&GgufFile::open(&model_path()).unwrap()).unwrap()
    }

    #[test]
    fn an_engine_error_finishes_requests_through_the_one_path() {
        let scheduler = small_scheduler();
        let metrics = small_metrics();
        let removed = Arc::new(Mutex::new(Vec::new()));
        let (commands_tx, commands) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let engine_loop = EngineLoop::new(LoopParts {
            scheduler,
            executor: FailingExecutor {
                removed: Arc::clone(&removed),
            },
            tokenizer: Arc::new(tokenizer()),
            max_model_len: 64,
            commands,
            shared: Arc::clone(&shared),
            metrics: Arc::clone(&metrics),
            engine_index: 0,
            log_stats_interval: None,
            traces: None,
            seed: None,
            spec: None,
            kv_events: None,
        });
        let (events, mut stream) = unbounded_channel();
        commands_tx
            .send(Command::Add {
                request_id: RequestId(7),
                request: Box::new(GenerateRequest::new(vec![504, 3575, 282, 1116, 30, 42])),
                events,
            })
            .unwrap();
        std::thread::spawn(move || engine_loop.run())
            .join()
            .unwrap();

        match stream.blocking_recv() {
            Some(RequestEvent::Error(message)) => {
                assert!(message.contains("out of device memory"), "{message}");
            }
            other => panic!("expected an error event, got {other:?}"),
        }
        assert_eq!(stream.blocking_recv(), None);
        assert_eq!(*removed.lock().unwrap(), vec![RequestId(7)]);
        let stats = shared.stats.lock().unwrap().clone();
        assert_eq!(stats.kv_cache_usage, 0.0, "{stats:?}");
        assert_eq!(stats.num_running + stats.num_waiting, 0, "{stats:?}");
        assert!(!shared.alive.load(Ordering::SeqCst));
        let text = metrics.encode().unwrap();
        let finished: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("vllm:request_success_total{") && !l.ends_with(" 0"))
            .collect();
        assert_eq!(finished.len(), 1, "{finished:?}");
        assert!(
            finished[0].contains("finished_reason=\"error\"") && finished[0].ends_with(" 1"),
            "{finished:?}"
        );
    }
}
