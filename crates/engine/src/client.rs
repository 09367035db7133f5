//! Starting the engine thread and talking to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokenmill_metrics::{EngineMetrics, MetricsConfig, OtlpConfig, OtlpTraceExporter};

use tokenmill_core::{capacity, RequestId, Scheduler, SchedulerConfig, SchedulingPolicy};
use tokenmill_models::{kv_layout, read_model_config, JsonGrammarOptions, KvCacheStorage};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::config::DEFAULT_MAX_NUM_BATCHED_TOKENS;
use crate::core_loop::{Command, EngineLoop, LoopParts, Shared};
use crate::executor::Executor;
use crate::kv_events::KvEventPublisher;
use crate::lora::LoraRegistry;
use crate::model_runner::{LoadedModel, ModelRunner};
use crate::request::{GenerateRequest, RequestEvent};
use crate::spec::{DraftSetup, SpecDecoder};
use crate::stats::{CapacityReport, EngineStats};
use crate::{EngineConfig, EngineError};

/// A running engine: the engine thread plus what clients need (tokenizer, limits).
pub struct Engine {
    client: EngineClient,
    loaded: Arc<LoadedModel>,
    capacity: CapacityReport,
    metrics: Arc<EngineMetrics>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// The engine loop's settings besides its parts.
#[derive(Default)]
struct LoopSettings {
    log_stats_interval: Option<Duration>,
    traces: Option<Arc<OtlpTraceExporter>>,
    seed: Option<u64>,
    spec: Option<SpecDecoder>,
    kv_events: Option<KvEventPublisher>,
    lora: Option<Arc<LoraRegistry>>,
}

impl Engine {
    /// Loads the model, sizes the KV pool from the budget, and starts the engine thread.
    pub fn start(config: &EngineConfig) -> Result<Engine, EngineError> {
        tracing::info!("CPU features: {}", tokenmill_kernels::CpuFeatures::get());
        let available_before_load = crate::config::available_memory_bytes();
        let mut loaded = LoadedModel::load(
            &config.model,
            config.chat_template.as_deref(),
            config.tokenizer.as_deref(),
            config.num_threads,
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
        let kv_dtype = config.kv_cache_dtype.storage();
        let bytes_per_block =
            KvCacheStorage::bytes_per_block(loaded.model.kv_layout(), config.block_size, kv_dtype);
        let kv_bytes =
            config.kv_cache_bytes(available_before_load, loaded.model.weight_bytes() as u64);
        let num_blocks = capacity::num_blocks_for_budget(kv_bytes, bytes_per_block);
        let pool_tokens = capacity::kv_cache_size_tokens(num_blocks, config.block_size);
        let max_model_len = match config.max_model_len {
            Some(len) => len,
            None => model_config.max_position_embeddings.min(pool_tokens),
        };
        let capacity = CapacityReport {
            kv_cache_bytes: kv_bytes,
            kv_cache_dtype: config.kv_cache_dtype,
            num_blocks,
            block_size: config.block_size,
            max_model_len,
        };
        if pool_tokens < max_model_len {
            return Err(EngineError::Config(format!(
                "the KV cache holds {pool_tokens} tokens ({num_blocks} blocks of {} from a {} MiB \
                 budget) but one max-length request needs {max_model_len}: raise \
                 --kv-cache-memory (or --gpu-memory-utilization) or lower --max-model-len",
                config.block_size,
                kv_bytes >> 20
            )));
        }
        let mut scheduler = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens.unwrap_or(
                if config.enable_chunked_prefill {
                    DEFAULT_MAX_NUM_BATCHED_TOKENS
                } else {
                    max_model_len.max(2048)
                },
            ),
            max_num_seqs: config.max_num_seqs,
            max_model_len,
            block_size: config.block_size,
            num_blocks,
            enable_prefix_caching: config.enable_prefix_caching,
            policy: config.scheduling_policy,
            long_prefill_token_threshold: None,
            enable_chunked_prefill: config.enable_chunked_prefill,
        })?;
        scheduler.set_max_loras(config.lora.as_ref().map(|lora| lora.max_loras));
        let runner = ModelRunner::new(
            Arc::clone(&loaded),
            num_blocks as usize,
            config.block_size,
            kv_dtype,
        );
        let mut metrics = EngineMetrics::with_spec_decode(
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
        );
        if let Some(lora) = &config.lora {
            metrics.enable_lora(lora.max_loras);
        }
        let metrics = Arc::new(metrics);
        let spec = match &config.speculative {
            Some(speculative) => Some(SpecDecoder::new(
                speculative.clone(),
                &DraftSetup {
                    num_blocks: num_blocks as usize,
                    block_size: config.block_size,
                    vocab_size: model_config.vocab_size,
                    num_threads: config.num_threads,
                },
            )?),
            None => None,
        };
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
        let kv_events = match &config.kv_events {
            Some(kv_events) if kv_events.publishes() => {
                scheduler.enable_kv_events();
                let publisher = KvEventPublisher::start(kv_events, 0, Arc::clone(&metrics))?;
                tracing::info!("publishing KV-cache events on {}", kv_events.endpoint);
                Some(publisher)
            }
            _ => None,
        };
        Self::spawn(
            scheduler,
            runner,
            loaded,
            capacity,
            metrics,
            LoopSettings {
                log_stats_interval: config.log_stats_interval,
                traces,
                seed: config.seed,
                spec,
                kv_events,
                lora,
            },
        )
    }

    /// Bytes one KV block takes for `config`'s model, read from its metadata only.
    pub fn bytes_per_block_for(config: &EngineConfig) -> Result<usize, EngineError> {
        let model_config = read_model_config(&config.model)?;
        Ok(KvCacheStorage::bytes_per_block(
            &kv_layout(&model_config),
            config.block_size,
            config.kv_cache_dtype.storage(),
        ))
    }

    /// Starts the engine thread over any executor.
    fn spawn<E: Executor + 'static>(
        scheduler: Scheduler,
        executor: E,
        loaded: Arc<LoadedModel>,
        capacity: CapacityReport,
        metrics: Arc<EngineMetrics>,
        settings: LoopSettings,
    ) -> Result<Engine, EngineError> {
        let LoopSettings {
            log_stats_interval,
            traces,
            seed,
            spec,
            kv_events,
            lora,
        } = settings;
        let (commands_tx, commands_rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let scheduling_policy = scheduler.config().policy;
        let engine_loop = EngineLoop::new(LoopParts {
            scheduler,
            executor,
            tokenizer: Arc::clone(&loaded.tokenizer),
            max_model_len: capacity.max_model_len,
            commands: commands_rx,
            shared: Arc::clone(&shared),
            metrics: Arc::clone(&metrics),
            log_stats_interval,
            traces,
            seed,
            spec,
            kv_events,
        });
        // Mark alive before returning so a health check right after start-up is green.
        shared.alive.store(true, Ordering::SeqCst);
        let thread = std::thread::Builder::new()
            .name("engine-core".into())
            .spawn(move || engine_loop.run())?;
        Ok(Engine {
            client: EngineClient {
                commands: commands_tx,
                shared,
                next_id: Arc::new(AtomicU64::new(1)),
                max_model_len: capacity.max_model_len,
                scheduling_policy,
                lora,
            },
            loaded,
            capacity,
            metrics,
            thread: Some(thread),
        })
    }

    /// The Prometheus registry the engine feeds (served on `/metrics`).
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    pub fn client(&self) -> EngineClient {
        self.client.clone()
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.loaded
    }

    pub fn capacity(&self) -> &CapacityReport {
        &self.capacity
    }

    /// Aborts whatever is in flight and joins the engine thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.client.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A cheap, cloneable handle to the engine thread.
#[derive(Debug, Clone)]
pub struct EngineClient {
    commands: Sender<Command>,
    shared: Arc<Shared>,
    next_id: Arc<AtomicU64>,
    max_model_len: usize,
    scheduling_policy: SchedulingPolicy,
    lora: Option<Arc<LoraRegistry>>,
}

impl EngineClient {
    /// The served LoRA adapters; `None` unless LoRA serving is on (`--enable-lora`).
    pub fn lora(&self) -> Option<&Arc<LoraRegistry>> {
        self.lora.as_ref()
    }

    /// Submits a request; its outputs arrive on the returned stream. Dropping the stream
    /// aborts the request.
    pub fn add_request(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        if !self.is_alive() {
            return Err(EngineError::EngineDead);
        }
        let request_id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (events_tx, events_rx) = unbounded_channel();
        self.commands
            .send(Command::Add {
                request_id,
                request: Box::new(request),
                events: events_tx,
            })
            .map_err(|_| EngineError::EngineDead)?;
        Ok(RequestStream {
            request_id,
            events: events_rx,
            commands: self.commands.clone(),
            finished: false,
        })
    }

    pub fn abort(&self, request_id: RequestId) {
        let _ = self.commands.send(Command::Abort(request_id));
    }

    /// False once the engine thread stopped or crashed.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// The state after the most recent step.
    pub fn stats(&self) -> EngineStats {
        self.shared
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
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
            Some(RequestEvent::Error(_)) | None => self.finished = true,
            Some(RequestEvent::Output(_)) => {}
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
            num_blocks: 16,
            block_size: 16,
            max_model_len: 64,
        };
        let metrics = small_metrics();
        let engine = Engine::spawn(
            scheduler,
            PanickingExecutor,
            loaded,
            capacity,
            metrics,
            LoopSettings::default(),
        )
        .unwrap();
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
