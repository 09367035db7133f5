//! Starting the engine thread and talking to it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokenmill_metrics::{EngineMetrics, MetricsConfig, OtlpConfig, OtlpTraceExporter};

use tokenmill_core::{
    capacity, BlockHashExtraKeys, RequestId, Scheduler, SchedulerConfig, SchedulingPolicy,
};
use tokenmill_models::{kv_layout, read_model_config, JsonGrammarOptions, KvCacheGrouping};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::config::DEFAULT_MAX_NUM_BATCHED_TOKENS;
use crate::core_loop::{Command, EngineLoop, LoopParts, Shared};
use crate::dp::{self, PrefixBalancer};
use crate::executor::Executor;
use crate::kv_events::KvEventPublisher;
use crate::kv_groups::{longest_fitting_len, KvPlan};
use crate::lora::LoraRegistry;
use crate::model_runner::{LoadedModel, ModelRunner};
use crate::request::{GenerateRequest, RequestEvent};
use crate::spec::{DraftSetup, SpecDecoder};
use crate::stats::{CapacityReport, EngineStats};
use crate::{EngineConfig, EngineError};

/// A running engine: the engine threads (one per data-parallel rank) plus what clients need
/// (tokenizer, limits).
pub struct Engine {
    client: EngineClient,
    loaded: Arc<LoadedModel>,
    capacity: CapacityReport,
    /// Engine 0's registry, with the other ranks' attached (one scrape for all).
    metrics: Arc<EngineMetrics>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("capacity", &self.capacity)
            .field("data_parallel_size", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// The engine loop's settings besides its parts.
#[derive(Default)]
struct LoopSettings {
    /// Data-parallel rank (`Engine 001: ...`, `engine="1"`).
    engine_index: usize,
    log_stats_interval: Option<Duration>,
    traces: Option<Arc<OtlpTraceExporter>>,
    seed: Option<u64>,
    spec: Option<SpecDecoder>,
    kv_events: Option<KvEventPublisher>,
}

/// What every data-parallel engine is built from besides its own model handle.
struct CoreSetup<'a> {
    config: &'a EngineConfig,
    scheduler_config: SchedulerConfig,
    /// How the runner's layers share block tables and buffers (matches the scheduler's
    /// groups).
    grouping: KvCacheGrouping,
    traces: Option<Arc<OtlpTraceExporter>>,
}

/// One started engine core: its client-side handle, thread and metrics.
struct Core {
    handle: CoreHandle,
    thread: JoinHandle<()>,
    metrics: Arc<EngineMetrics>,
    scheduling_policy: SchedulingPolicy,
}

impl Engine {
    /// Loads the model, sizes the KV pool from the budget, and starts the engine thread, or
    /// with `data_parallel_size` N, N engine threads over the same weights (see [`crate::dp`]).
    pub fn start(config: &EngineConfig) -> Result<Engine, EngineError> {
        tracing::info!("CPU features: {}", tokenmill_kernels::runtime_summary());
        let ranks = config.data_parallel_size.max(1);
        if !config.cpu_affinity.is_empty() && config.cpu_affinity.len() != ranks {
            return Err(EngineError::Config(format!(
                "--cpu-affinity names {} CPU sets but there are {ranks} engines \
                 (--data-parallel-size): give one set per engine",
                config.cpu_affinity.len()
            )));
        }
        // One pool for the only engine, as before; otherwise each engine builds its own
        // (pinned where asked), and the load-time pool only serves the load.
        let own_pools = ranks > 1 || !config.cpu_affinity.is_empty();
        let available_before_load = crate::config::available_memory_bytes();
        let mut loaded = LoadedModel::load(
            &config.model,
            config.chat_template.as_deref(),
            config.tokenizer.as_deref(),
            if own_pools {
                Some(1)
            } else {
                config.num_threads
            },
        )?;
        if config.json_grammar != JsonGrammarOptions::default() {
            loaded.set_json_grammar_options(config.json_grammar)?;
        }
        let loaded = Arc::new(loaded);
        let model_config = loaded.config().clone();
        let lora = match &config.lora {
            Some(lora_config) => {
                let registry = LoraRegistry::new(model_config.clone(), lora_config.clone())?;
                registry.load_modules()?;
                Some(Arc::new(registry))
            }
            None => None,
        };
        let kv_dtype = config.kv_storage()?;
        let kv_plan = KvPlan::for_layout(
            loaded.model.kv_layout(),
            config.disable_hybrid_kv_cache_manager,
        );
        let bytes_per_block = kv_plan.bytes_per_block(config.block_size, kv_dtype);
        // Read once: every engine gets this budget (the flag is per engine, as in vLLM).
        let kv_bytes =
            config.kv_cache_bytes(available_before_load, loaded.model.weight_bytes() as u64);
        let num_blocks = capacity::num_blocks_for_budget(kv_bytes, bytes_per_block);
        let sliding_window = kv_plan.sliding_window;
        let pool_tokens =
            capacity::kv_cache_size_tokens(num_blocks, config.block_size) / kv_plan.num_groups();
        let mut scheduler_config = SchedulerConfig {
            // Without chunked prefill the budget follows max_model_len, set below.
            max_num_batched_tokens: config
                .max_num_batched_tokens
                .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS),
            max_num_seqs: config.max_num_seqs,
            max_model_len: 2,
            block_size: config.block_size,
            num_blocks,
            enable_prefix_caching: config.enable_prefix_caching,
            policy: config.scheduling_policy,
            long_prefill_token_threshold: None,
            enable_chunked_prefill: config.enable_chunked_prefill,
            sliding_window,
            kv_groups: kv_plan.groups,
        };
        scheduler_config.max_model_len = match config.max_model_len {
            Some(len) => len,
            // Under a window on every layer a request holds only the window's blocks.
            None if !kv_plan.is_hybrid() && sliding_window.is_some() => {
                model_config.max_position_embeddings
            }
            None if !kv_plan.is_hybrid() => model_config.max_position_embeddings.min(pool_tokens),
            // Hybrid: the full groups hold the sequence, the sliding ones at most a window.
            None => longest_fitting_len(scheduler_config, model_config.max_position_embeddings),
        };
        let max_model_len = scheduler_config.max_model_len;
        if !config.enable_chunked_prefill && config.max_num_batched_tokens.is_none() {
            scheduler_config.max_num_batched_tokens = max_model_len.max(2048);
        }
        let scheduler_config = scheduler_config;
        let blocks_per_request = scheduler_config.max_blocks_per_request();
        let capacity = CapacityReport {
            kv_cache_bytes: kv_bytes,
            kv_cache_dtype: config.kv_cache_dtype,
            kv_storage: kv_dtype,
            num_blocks,
            block_size: config.block_size,
            max_model_len,
            blocks_per_request,
            num_kv_cache_groups: kv_plan.num_groups(),
        };
        if (num_blocks as usize) < blocks_per_request {
            return Err(EngineError::Config(format!(
                "the KV cache holds {pool_tokens} tokens ({num_blocks} blocks of {} from a {} MiB \
                 budget) but one max-length request of {max_model_len} tokens needs \
                 {blocks_per_request} blocks: raise --kv-cache-memory (or \
                 --gpu-memory-utilization) or lower --max-model-len",
                config.block_size,
                kv_bytes >> 20
            )));
        }
        match sliding_window {
            Some(window) if kv_plan.is_hybrid() => tracing::info!(
                "hybrid KV cache manager: {} KV cache groups ({:?}); blocks before the \
                 {window}-token window are released in the sliding-window groups, a request \
                 holds at most {blocks_per_request} blocks",
                kv_plan.num_groups(),
                kv_plan.groups
            ),
            Some(window) => tracing::info!(
                "sliding window {window} on every layer: KV blocks before the window are \
                 released, a request holds at most {blocks_per_request} blocks"
            ),
            None if loaded
                .model
                .kv_layout()
                .iter()
                .any(|l| l.sliding_window.is_some()) =>
            {
                tracing::info!(
                    "sliding-window layers keep every KV block (the hybrid KV cache manager \
                     is disabled)"
                )
            }
            None => {}
        }
        if let Some(spec) = &config.speculative {
            tracing::info!(
                "speculative decoding: method {}, up to {} draft tokens, skipped above {} \
                 running requests",
                spec.method_name(),
                spec.num_speculative_tokens,
                spec.disable_by_batch_size
            );
        }
        // Only a configured endpoint starts the export thread; without one nothing is built.
        let traces = match &config.otlp_traces_endpoint {
            Some(endpoint) => {
                let exporter =
                    OtlpTraceExporter::start(OtlpConfig::new(endpoint, &config.served_model_name))
                        .map_err(|e| EngineError::Config(e.to_string()))?;
                tracing::info!("exporting request spans over OTLP/HTTP to {endpoint}");
                Some(Arc::new(exporter))
            }
            None => None,
        };
        let setup = CoreSetup {
            config,
            scheduler_config,
            grouping: kv_plan.grouping,
            traces,
        };
        let mut cores = Vec::with_capacity(ranks);
        for rank in 0..ranks {
            let cpus = config.cpu_affinity.get(rank).map(Vec::as_slice);
            let threads = dp::threads_per_engine(config.num_threads, ranks, cpus);
            let shared_loaded = &loaded;
            let setup = &setup;
            let core = dp::on_cpus(rank, cpus, move || {
                let loaded = if own_pools {
                    Arc::new(shared_loaded.with_own_pool(threads))
                } else {
                    Arc::clone(shared_loaded)
                };
                if ranks > 1 {
                    tracing::info!("engine {rank}: {threads} compute threads");
                }
                let threads = own_pools.then_some(threads).or(config.num_threads);
                Self::start_core(rank, setup, loaded, threads)
            })??;
            cores.push(core);
        }
        Ok(Self::assemble(
            cores,
            loaded,
            capacity,
            lora,
            config.enable_prefix_caching,
        ))
    }

    /// Builds data-parallel engine `rank`'s scheduler, runner, metrics, speculation and KV
    /// events over `loaded`, and starts its loop.
    /// `num_threads` is the engine's own thread count (also its draft model's).
    fn start_core(
        rank: usize,
        setup: &CoreSetup<'_>,
        loaded: Arc<LoadedModel>,
        num_threads: Option<usize>,
    ) -> Result<Core, EngineError> {
        let CoreSetup {
            config,
            scheduler_config,
            ref grouping,
            ..
        } = *setup;
        let SchedulerConfig {
            num_blocks,
            max_model_len,
            ..
        } = scheduler_config;
        let mut scheduler = Scheduler::new(scheduler_config)?;
        scheduler.set_max_loras(config.lora.as_ref().map(|lora| lora.max_loras));
        let kv_dtype = config.kv_storage()?;
        let runner = ModelRunner::new(
            Arc::clone(&loaded),
            grouping.clone(),
            num_blocks as usize,
            config.block_size,
            kv_dtype,
        );
        let mut metrics = EngineMetrics::for_engine(
            MetricsConfig {
                model_name: config.served_model_name.clone(),
                max_model_len,
                block_size: config.block_size,
                num_blocks: num_blocks as usize,
                enable_prefix_caching: config.enable_prefix_caching,
                cache_dtype: config.kv_cache_dtype.as_str().into(),
            },
            config
                .speculative
                .as_ref()
                .map(|spec| spec.num_speculative_tokens),
            rank,
        );
        if let Some(lora) = &config.lora {
            metrics.enable_lora(lora.max_loras);
        }
        let metrics = Arc::new(metrics);
        let spec = match &config.speculative {
            Some(speculative) => Some(SpecDecoder::new(
                speculative.clone(),
                &DraftSetup {
                    // Blocks per KV cache group: the positions the target holds (a hybrid
                    // pool's block is a few layers, not a token's whole KV).
                    num_blocks: num_blocks as usize / grouping.num_groups().max(1),
                    block_size: config.block_size,
                    vocab_size: loaded.config().vocab_size,
                    num_threads,
                    kv_dtype,
                },
            )?),
            None => None,
        };
        let kv_events = match &config.kv_events {
            Some(kv_events) if kv_events.publishes() => {
                scheduler.enable_kv_events();
                let publisher = KvEventPublisher::start(kv_events, rank, Arc::clone(&metrics))?;
                tracing::info!("engine {rank}: publishing KV-cache events");
                Some(publisher)
            }
            _ => None,
        };
        Self::spawn_core(
            scheduler,
            runner,
            &loaded,
            max_model_len,
            metrics,
            LoopSettings {
                engine_index: rank,
                log_stats_interval: config.log_stats_interval,
                traces: setup.traces.clone(),
                seed: config.seed,
                spec,
                kv_events,
            },
        )
    }

    /// Bytes one KV block takes for `config`'s model (in its KV cache grouping), read from
    /// its metadata only.
    pub fn bytes_per_block_for(config: &EngineConfig) -> Result<usize, EngineError> {
        let model_config = read_model_config(&config.model)?;
        let plan = KvPlan::for_layout(
            &kv_layout(&model_config),
            config.disable_hybrid_kv_cache_manager,
        );
        Ok(plan.bytes_per_block(config.block_size, config.kv_storage()?))
    }

    /// Starts one engine thread over any executor.
    fn spawn_core<E: Executor + 'static>(
        scheduler: Scheduler,
        executor: E,
        loaded: &LoadedModel,
        max_model_len: usize,
        metrics: Arc<EngineMetrics>,
        settings: LoopSettings,
    ) -> Result<Core, EngineError> {
        let LoopSettings {
            engine_index,
            log_stats_interval,
            traces,
            seed,
            spec,
            kv_events,
        } = settings;
        let (commands_tx, commands_rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let scheduling_policy = scheduler.config().policy;
        let engine_loop = EngineLoop::new(LoopParts {
            scheduler,
            executor,
            tokenizer: Arc::clone(&loaded.tokenizer),
            max_model_len,
            commands: commands_rx,
            shared: Arc::clone(&shared),
            metrics: Arc::clone(&metrics),
            engine_index,
            log_stats_interval,
            traces,
            seed,
            spec,
            kv_events,
        });
        // Mark alive before returning so a health check right after start-up is green.
        shared.alive.store(true, Ordering::SeqCst);
        let name = if engine_index == 0 {
            "engine-core".to_string()
        } else {
            format!("engine-core-{engine_index}")
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || engine_loop.run())?;
        Ok(Core {
            handle: CoreHandle {
                commands: commands_tx,
                shared,
                in_flight: Arc::new(AtomicUsize::new(0)),
            },
            thread,
            metrics,
            scheduling_policy,
        })
    }

    /// The engine over started cores (rank order), engine 0's metrics scraping them all.
    fn assemble(
        cores: Vec<Core>,
        loaded: Arc<LoadedModel>,
        capacity: CapacityReport,
        lora: Option<Arc<LoraRegistry>>,
        prefix_locality: bool,
    ) -> Engine {
        let scheduling_policy = cores
            .first()
            .map_or(SchedulingPolicy::Fcfs, |core| core.scheduling_policy);
        let mut handles = Vec::with_capacity(cores.len());
        let mut threads = Vec::with_capacity(cores.len());
        let mut metrics = Vec::with_capacity(cores.len());
        for core in cores {
            handles.push(core.handle);
            threads.push(core.thread);
            metrics.push(core.metrics);
        }
        let front_metrics = metrics.remove(0);
        if !metrics.is_empty() {
            front_metrics.attach_engines(metrics);
        }
        let balancer = (handles.len() > 1).then(|| {
            Arc::new(Mutex::new(PrefixBalancer::new(
                capacity.block_size,
                prefix_locality,
            )))
        });
        Engine {
            client: EngineClient {
                cores: handles.into(),
                balancer,
                next_id: Arc::new(AtomicU64::new(1)),
                max_model_len: capacity.max_model_len,
                scheduling_policy,
                lora,
            },
            loaded,
            capacity,
            metrics: front_metrics,
            threads,
        }
    }

    /// The Prometheus registry the engine feeds (served on `/metrics`); with several
    /// engines, engine 0's, whose scrape includes the others'.
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    pub fn client(&self) -> EngineClient {
        self.client.clone()
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.loaded
    }

    /// The KV capacity of one engine (each data-parallel engine has this much).
    pub fn capacity(&self) -> &CapacityReport {
        &self.capacity
    }

    /// Aborts whatever is in flight and joins the engine threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for core in self.client.cores.iter() {
            let _ = core.commands.send(Command::Shutdown);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One engine thread as clients see it: its command channel, its state after the latest
/// step, and its requests in flight (the balancer's load).
#[derive(Debug)]
struct CoreHandle {
    commands: Sender<Command>,
    shared: Arc<Shared>,
    in_flight: Arc<AtomicUsize>,
}

/// One request counted in its engine's load until dropped (finished or abandoned).
#[derive(Debug)]
struct LoadTicket(Arc<AtomicUsize>);

impl Drop for LoadTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A cheap, cloneable handle to the engine threads.
#[derive(Debug, Clone)]
pub struct EngineClient {
    /// One per data-parallel rank, in rank order.
    cores: Arc<[CoreHandle]>,
    /// Present with more than one engine.
    balancer: Option<Arc<Mutex<PrefixBalancer>>>,
    next_id: Arc<AtomicU64>,
    max_model_len: usize,
    scheduling_policy: SchedulingPolicy,
    lora: Option<Arc<LoraRegistry>>,
}

impl EngineClient {
    /// The served LoRA adapters; `None` unless LoRA serving is on (`--enable-lora`). One
    /// registry serves every engine, so loading or unloading reaches them all.
    pub fn lora(&self) -> Option<&Arc<LoraRegistry>> {
        self.lora.as_ref()
    }

    /// Submits a request to the engine the balancer picks; its outputs arrive on the
    /// returned stream. Dropping the stream aborts the request.
    pub fn add_request(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        if !self.is_alive() {
            return Err(EngineError::EngineDead);
        }
        let rank = self.route(&request);
        let core = self.cores.get(rank).ok_or(EngineError::EngineDead)?;
        // The rank is the id modulo the engine count, so an abort finds the owner.
        let ranks = self.cores.len() as u64;
        let request_id =
            RequestId(self.next_id.fetch_add(1, Ordering::Relaxed) * ranks + rank as u64);
        core.in_flight.fetch_add(1, Ordering::Relaxed);
        let ticket = LoadTicket(Arc::clone(&core.in_flight));
        let (events_tx, events_rx) = unbounded_channel();
        core.commands
            .send(Command::Add {
                request_id,
                request: Box::new(request),
                events: events_tx,
            })
            .map_err(|_| EngineError::EngineDead)?;
        Ok(RequestStream {
            request_id,
            events: events_rx,
            commands: core.commands.clone(),
            finished: false,
            ticket: Some(ticket),
        })
    }

    /// The engine for `request`: the only one, or the balancer's choice.
    fn route(&self, request: &GenerateRequest) -> usize {
        let Some(balancer) = &self.balancer else {
            return 0;
        };
        let loads: Vec<usize> = self
            .cores
            .iter()
            .map(|core| core.in_flight.load(Ordering::Relaxed))
            .collect();
        let extra_keys = BlockHashExtraKeys {
            cache_salt: request.cache_salt.clone(),
            adapter_id: request.lora.as_ref().map(|lora| lora.id),
        };
        match balancer.lock() {
            Ok(mut balancer) => balancer.route(&request.prompt_token_ids, extra_keys, &loads),
            Err(_) => dp::choose_engine(&loads, None, 0),
        }
    }

    /// Aborts a request on the engine that owns it.
    pub fn abort(&self, request_id: RequestId) {
        let rank = (request_id.0 % self.cores.len() as u64) as usize;
        if let Some(core) = self.cores.get(rank) {
            let _ = core.commands.send(Command::Abort(request_id));
        }
    }

    /// False once any engine thread stopped or crashed.
    pub fn is_alive(&self) -> bool {
        self.cores
            .iter()
            .all(|core| core.shared.alive.load(Ordering::SeqCst))
    }

    /// The state after the most recent step, summed over the engines.
    pub fn stats(&self) -> EngineStats {
        EngineStats::combined(&self.engine_stats())
    }

    /// Each engine's state after its most recent step, in rank order.
    pub fn engine_stats(&self) -> Vec<EngineStats> {
        self.cores
            .iter()
            .map(|core| {
                core.shared
                    .stats
                    .lock()
                    .map(|s| s.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// How many engines serve (`--data-parallel-size`).
    pub fn data_parallel_size(&self) -> usize {
        self.cores.len()
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// How the scheduler orders waiting requests (`priority` is only meaningful under
    /// [`SchedulingPolicy::Priority`]).
    pub fn scheduling_policy(&self) -> SchedulingPolicy {
        self.scheduling_policy
    }
}

/// The output events of one request. Dropping it before the request finished aborts it.
#[derive(Debug)]
pub struct RequestStream {
    request_id: RequestId,
    events: UnboundedReceiver<RequestEvent>,
    commands: Sender<Command>,
    finished: bool,
    /// Counts the request in its engine's load until it finishes.
    ticket: Option<LoadTicket>,
}

impl RequestStream {
    pub fn request_id(&self) -> RequestId {
        self.request_id
    }

    /// The next event, or `None` once the request finished (or the engine went away).
    pub async fn recv(&mut self) -> Option<RequestEvent> {
        if self.finished {
            return None;
        }
        let event = self.events.recv().await;
        self.note(&event);
        event
    }

    /// Blocking variant for synchronous callers (offline generation, the CLI).
    pub fn blocking_recv(&mut self) -> Option<RequestEvent> {
        if self.finished {
            return None;
        }
        let event = self.events.blocking_recv();
        self.note(&event);
        event
    }

    fn note(&mut self, event: &Option<RequestEvent>) {
        match event {
            Some(RequestEvent::Output(output)) if output.finish_reason.is_some() => {
                self.finished = true;
            }
            Some(RequestEvent::Rejected(_) | RequestEvent::Error(_) | RequestEvent::Failed(_))
            | None => {
                self.finished = true;
            }
            Some(RequestEvent::Output(_)) => {}
        }
        if self.finished {
            self.ticket = None;
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort(self.request_id));
        }
    }
}

#[cfg(test)]
mod tests {
    use tokenmill_core::SchedulerOutput;

    use super::*;
    use crate::executor::{NewSequence, StepOutput};
    use crate::test_support::{model_path, small_metrics, small_scheduler};
    use crate::CacheDtype;

    /// An executor whose every step panics, standing in for a kernel bug.
    struct PanickingExecutor;

    impl Executor for PanickingExecutor {
        fn add_request(&mut self, _: NewSequence<'_>) -> Result<(), EngineError> {
            Ok(())
        }

        fn remove_request(&mut self, _: RequestId) {}

        fn execute(&mut self, _: &SchedulerOutput) -> Result<StepOutput, EngineError> {
            panic!("kernel exploded");
        }
    }

    #[test]
    fn a_panicking_step_fails_in_flight_requests_and_marks_the_engine_dead() {
        let source = tokenmill_models::ModelSource::from_path(model_path());
        let loaded = Arc::new(LoadedModel::load(&source, None, None, Some(1)).unwrap());
        let scheduler = small_scheduler();
        let capacity = CapacityReport {
            kv_cache_bytes: 0,
            kv_cache_dtype: CacheDtype::Auto,
            kv_storage: tokenmill_models::KvCacheDType::F16,
            num_blocks: 16,
            block_size: 16,
            max_model_len: 64,
            blocks_per_request: 4,
            num_kv_cache_groups: 1,
        };
        let metrics = small_metrics();
        let core = Engine::spawn_core(
            scheduler,
            PanickingExecutor,
            &loaded,
            capacity.max_model_len,
            metrics,
            LoopSettings::default(),
        )
        .unwrap();
        let engine = Engine::assemble(vec![core], loaded, capacity, None, true);
        let client = engine.client();
        let mut stream = client
            .add_request(GenerateRequest::new(vec![504, 3575, 282]))
            .unwrap();
        match stream.blocking_recv() {
            Some(RequestEvent::Error(message)) => {
                assert!(message.contains("kernel exploded"), "{message}");
            }
            other => panic!("expected an error event, got {other:?}"),
        }
        assert_eq!(stream.blocking_recv(), None);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while client.is_alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!client.is_alive());
        assert!(matches!(
            client.add_request(GenerateRequest::new(vec![1])),
            Err(EngineError::EngineDead)
        ));
    }
}
