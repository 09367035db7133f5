//! Engine start-up: load the model, plan the KV capacity ([`crate::capacity_plan`]), log
//! what was decided, and start one engine thread per data-parallel rank over the shared
//! weights. [`crate::client`] is what talks to the threads once they run.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokenmill_core::{Scheduler, SchedulerConfig, SchedulingPolicy};
use tokenmill_metrics::{EngineMetrics, MetricsConfig, OtlpConfig, OtlpTraceExporter};
use tokenmill_models::{kv_layout, read_model_config, JsonGrammarOptions, KvCacheGrouping};

use crate::capacity_plan::{plan_capacity, CapacityInputs, CapacityPlan};
use crate::client::{CoreHandle, Engine, EngineClient};
use crate::core_loop::{EngineLoop, LoopParts, Shared};
use crate::dp::{self, PrefixBalancer};
use crate::executor::Executor;
use crate::kv_events::KvEventPublisher;
use crate::kv_groups::KvPlan;
use crate::lora::LoraRegistry;
use crate::model_runner::{LoadedModel, ModelRunner};
use crate::spec::{DraftSetup, SpecDecoder};
use crate::stats::CapacityReport;
use crate::{EngineConfig, EngineError};

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
        Self::start_loaded(config, loaded, available_before_load, own_pools)
    }

    /// [`Self::start`] after the model is loaded: plans the KV capacity for it and starts the
    /// engine threads. `available_before_load` is the memory that was available before the
    /// weights loaded; `own_pools` whether each engine builds its own thread pool. Public so a
    /// test can start an engine on a model it built itself (the Qwen3.5 engine test).
    pub fn start_loaded(
        config: &EngineConfig,
        loaded: LoadedModel,
        available_before_load: Option<u64>,
        own_pools: bool,
    ) -> Result<Engine, EngineError> {
        let ranks = config.data_parallel_size.max(1);
        let state_layout = loaded.model.state_layout();
        if !state_layout.is_empty() {
            if let Some(spec) = &config.speculative {
                return Err(EngineError::Config(format!(
                    "--speculative-config: method {} cannot run on this model: its {} \
                     recurrent layers keep a state that a rejected draft token cannot be \
                     rolled back out of (multi-token-prediction drafting for such models is \
                     not implemented yet); start without --speculative-config",
                    spec.method_name(),
                    state_layout.len()
                )));
            }
            if config.enable_prefix_caching {
                tracing::info!(
                    "prefix caching is off for this model: its {} recurrent layers keep a \
                     per-sequence state and there are no state checkpoints at block \
                     boundaries yet, so every request computes its whole prompt",
                    state_layout.len()
                );
            }
        }
        let loaded = Arc::new(loaded);
        let model_config = loaded.config().clone();
        let lora = match &config.lora {
            Some(_) if model_config.lora_unsupported_reason().is_some() => {
                return Err(EngineError::Config(format!(
                    "--enable-lora: {}; start without --enable-lora",
                    model_config.lora_unsupported_reason().unwrap_or_default()
                )));
            }
            Some(lora_config) => {
                let registry = LoraRegistry::new(model_config.clone(), lora_config.clone())?;
                registry.load_modules()?;
                Some(Arc::new(registry))
            }
            None => None,
        };
        let kv_bytes =
            config.kv_cache_bytes(available_before_load, loaded.model.weight_bytes() as u64);
        let CapacityPlan {
            kv_plan,
            scheduler: scheduler_config,
            report: capacity,
        } = plan_capacity(
            config,
            &CapacityInputs {
                layout: loaded.model.kv_layout(),
                state_layout: loaded.model.state_layout(),
                max_position_embeddings: model_config.max_position_embeddings,
                kv_storage: config.kv_storage()?,
                kv_cache_bytes: kv_bytes,
            },
        )?;
        let (sliding_window, blocks_per_request) =
            (kv_plan.sliding_window, capacity.blocks_per_request);
        if capacity.num_state_slots > 0 && scheduler_config.max_num_seqs < config.max_num_seqs {
            tracing::warn!(
                "max_num_seqs lowered from {} to {}: the KV cache memory holds recurrent state \
                 for {} sequences beside the blocks of one max-length request (raise \
                 --kv-cache-memory to run more at once)",
                config.max_num_seqs,
                scheduler_config.max_num_seqs,
                capacity.num_state_slots
            );
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
            scheduler_config.prefix_caching_active(),
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
        )
        .with_state_slots(scheduler_config.state_slots.num_slots as usize);
        let mut metrics = EngineMetrics::for_engine(
            MetricsConfig {
                model_name: config.served_model_name.clone(),
                max_model_len,
                block_size: config.block_size,
                num_blocks: num_blocks as usize,
                enable_prefix_caching: scheduler_config.prefix_caching_active(),
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
            &kv_layout(&model_config)?,
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
}

#[cfg(test)]
mod tests {
    use tokenmill_core::{RequestId, SchedulerOutput};

    use super::*;
    use crate::executor::{NewSequence, StepOutput};
    use crate::request::{GenerateRequest, RequestEvent};
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
            num_state_slots: 0,
            bytes_per_state_slot: 0,
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
