//! The pooling runner (`--runner pooling`): a loop thread that owns a [`PoolingModel`] and
//! serves prefill-only requests (embeddings, classification) in batches.
//!
//! Pooling requests need no KV cache and no scheduler state across steps: each is one whole
//! sequence (an encoder attends in both directions, so it is never chunked), its output is
//! one row, and nothing is kept after the step. The loop therefore takes what has arrived
//! in arrival order, packs as many sequences as fit the token budget
//! (`--max-num-batched-tokens`, raised to the model length so any one request fits) and
//! `--max-num-seqs`, runs one pass and answers each request. A row does not depend on what
//! it was batched with, so batching changes no result.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokenmill_kernels::ThreadPool;
use tokenmill_metrics::{
    EngineMetrics, FinishedReason, FinishedRequestMetrics, MetricsConfig, StepMetrics,
};
use tokenmill_models::{
    load_pooling_model_with, EncoderBatch, EncoderWorkspace, ModelSource, PoolingModel,
    PoolingModelInfo, PoolingOptions,
};
use tokenmill_text::Tokenizer;
use tokio::sync::oneshot;

use crate::EngineError;

/// How to start a [`PoolingEngine`].
#[derive(Debug, Clone)]
pub struct PoolingEngineConfig {
    pub model: ModelSource,
    /// An HF tokenizer directory or `tokenizer.json` in place of the model's.
    pub tokenizer: Option<std::path::PathBuf>,
    /// Compute threads (`None` = all cores).
    pub num_threads: Option<usize>,
    /// Tokens per step; raised to the model length if lower.
    pub max_num_batched_tokens: usize,
    /// Sequences per step.
    pub max_num_seqs: usize,
    /// Caps the model's own length limit.
    pub max_model_len: Option<usize>,
    /// The `model_name` label of the metrics.
    pub served_model_name: String,
    /// `--convert` and `--pooler-config`.
    pub options: PoolingOptions,
}

impl PoolingEngineConfig {
    pub fn new(model: ModelSource) -> PoolingEngineConfig {
        PoolingEngineConfig {
            model,
            tokenizer: None,
            num_threads: None,
            max_num_batched_tokens: 16384,
            max_num_seqs: 256,
            max_model_len: None,
            served_model_name: "model".into(),
            options: PoolingOptions::default(),
        }
    }
}

/// A pooling model with its tokenizer, shared by the loop and the server.
pub struct LoadedPoolingModel {
    pub source: ModelSource,
    pub info: PoolingModelInfo,
    pub tokenizer: Arc<Tokenizer>,
    /// The longest input accepted: the model's limit, capped by `--max-model-len`.
    pub max_model_len: usize,
}

impl std::fmt::Debug for LoadedPoolingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPoolingModel")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// One sequence to pool: token ids, and token-type ids for a text pair (cross-encoders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolingInput {
    pub token_ids: Vec<u32>,
    pub token_type_ids: Option<Vec<u32>>,
}

impl PoolingInput {
    pub fn tokens(token_ids: Vec<u32>) -> PoolingInput {
        PoolingInput {
            token_ids,
            token_type_ids: None,
        }
    }
}

struct Job {
    input: PoolingInput,
    arrived: Instant,
    reply: oneshot::Sender<Result<Vec<f32>, String>>,
}

/// A running pooling engine: the loop thread and what the server needs.
pub struct PoolingEngine {
    client: PoolingClient,
    loaded: Arc<LoadedPoolingModel>,
    metrics: Arc<EngineMetrics>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PoolingEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolingEngine")
            .field("model", &self.loaded)
            .finish_non_exhaustive()
    }
}

/// A cheap, cloneable handle to the pooling loop.
#[derive(Debug, Clone)]
pub struct PoolingClient {
    jobs: Sender<Job>,
    alive: Arc<AtomicBool>,
    /// Inputs submitted and not yet answered.
    pending: Arc<AtomicUsize>,
    /// Set by [`PoolingClient::abort_queued`]; the loop clears it once it has.
    abort: Arc<AtomicBool>,
    max_model_len: usize,
}

/// The error of an input aborted by [`PoolingClient::abort_queued`].
pub const ABORTED: &str = "aborted: the server shut down before this input ran";

impl PoolingEngine {
    /// Loads the model and tokenizer and starts the loop thread.
    pub fn start(config: &PoolingEngineConfig) -> Result<PoolingEngine, EngineError> {
        tracing::info!("CPU features: {}", tokenmill_kernels::runtime_summary());
        let model = load_pooling_model_with(&config.model, &config.options)?;
        let info = model.info().clone();
        let tokenizer = match (&config.tokenizer, &config.model) {
            (Some(path), _) => load_tokenizer(path)?,
            (None, ModelSource::HfDirectory(dir)) => Tokenizer::from_hf_dir(dir)?,
            (None, ModelSource::Gguf(path)) => Tokenizer::from_gguf(
                &tokenmill_gguf::GgufFile::open(path)
                    .map_err(tokenmill_models::ModelError::from)?,
            )?,
        };
        let max_model_len = config
            .max_model_len
            .map_or(info.max_model_len, |len| len.min(info.max_model_len));
        let max_tokens = config.max_num_batched_tokens.max(max_model_len);
        tracing::info!(
            "pooling model: {} (task {}, {} pooling{}, {} dimensions), {} MiB of weights, \
             max model len {max_model_len}, {max_tokens} tokens per step",
            info.architecture,
            info.task.name(),
            info.method.name(),
            if info.normalize { ", normalized" } else { "" },
            info.output_dim,
            model.weight_bytes() >> 20,
        );
        let metrics = Arc::new(EngineMetrics::new(MetricsConfig {
            model_name: config.served_model_name.clone(),
            max_model_len,
            block_size: 1,
            num_blocks: 0,
            enable_prefix_caching: false,
            cache_dtype: "auto".into(),
        }));
        let loaded = Arc::new(LoadedPoolingModel {
            source: config.model.clone(),
            info,
            tokenizer: Arc::new(tokenizer),
            max_model_len,
        });
        let (jobs, receiver) = mpsc::channel();
        let client = PoolingClient {
            jobs,
            alive: Arc::new(AtomicBool::new(true)),
            pending: Arc::new(AtomicUsize::new(0)),
            abort: Arc::new(AtomicBool::new(false)),
            max_model_len,
        };
        let pool = config
            .num_threads
            .map_or_else(ThreadPool::default, ThreadPool::new);
        let pooling_loop = PoolingLoop {
            model,
            pool,
            receiver,
            queue: VecDeque::new(),
            max_tokens,
            max_seqs: config.max_num_seqs.max(1),
            metrics: Arc::clone(&metrics),
            alive: Arc::clone(&client.alive),
            pending: Arc::clone(&client.pending),
            abort: Arc::clone(&client.abort),
        };
        let thread = std::thread::Builder::new()
            .name("tokenmill-pooling".into())
            .spawn(move || pooling_loop.run())?;
        Ok(PoolingEngine {
            client,
            loaded,
            metrics,
            thread: Some(thread),
        })
    }

    pub fn client(&self) -> PoolingClient {
        self.client.clone()
    }

    pub fn model(&self) -> &Arc<LoadedPoolingModel> {
        &self.loaded
    }

    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    /// Stops the loop after the step in flight and joins it.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.client.alive.store(false, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for PoolingEngine {
    fn drop(&mut self) {
        self.stop();
    }
}

impl PoolingClient {
    /// Pools every input (each a separate sequence, batched with whatever else is waiting)
    /// and returns one row per input, in order: a raw pooled vector or class logits. Inputs
    /// must be non-empty and within the model length (the server checks first and answers
    /// 400; here it is an `InvalidRequest`).
    pub async fn pool(&self, inputs: Vec<PoolingInput>) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut replies = Vec::with_capacity(inputs.len());
        for input in inputs {
            replies.push(self.submit(input)?);
        }
        let mut rows = Vec::with_capacity(replies.len());
        for reply in replies {
            match reply.await {
                Ok(Ok(row)) => rows.push(row),
                Ok(Err(message)) => return Err(EngineError::Executor(message)),
                Err(_) => return Err(EngineError::EngineDead),
            }
        }
        Ok(rows)
    }

    /// Fails every input not yet in a pass with `ABORTED` (the pass under way finishes):
    /// the server calls this when its shutdown drain times out, as the generation engine
    /// aborts its requests.
    pub fn abort_queued(&self) {
        self.abort.store(true, Ordering::Release);
    }

    /// [`Self::pool`] for callers without an async runtime (offline `embed`).
    pub fn pool_blocking(&self, inputs: Vec<PoolingInput>) -> Result<Vec<Vec<f32>>, EngineError> {
        let replies = inputs
            .into_iter()
            .map(|input| self.submit(input))
            .collect::<Result<Vec<_>, _>>()?;
        replies
            .into_iter()
            .map(|reply| match reply.blocking_recv() {
                Ok(Ok(row)) => Ok(row),
                Ok(Err(message)) => Err(EngineError::Executor(message)),
                Err(_) => Err(EngineError::EngineDead),
            })
            .collect()
    }

    fn submit(
        &self,
        input: PoolingInput,
    ) -> Result<oneshot::Receiver<Result<Vec<f32>, String>>, EngineError> {
        let len = input.token_ids.len();
        if len == 0 || len > self.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "an input of {len} tokens; between 1 and {} are accepted",
                self.max_model_len
            )));
        }
        if !self.is_alive() {
            return Err(EngineError::EngineDead);
        }
        let (reply, receiver) = oneshot::channel();
        self.pending.fetch_add(1, Ordering::AcqRel);
        let job = Job {
            input,
            arrived: Instant::now(),
            reply,
        };
        if self.jobs.send(job).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::EngineDead);
        }
        Ok(receiver)
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Inputs submitted and not answered yet.
    pub fn num_pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }
}

fn load_tokenizer(path: &Path) -> Result<Tokenizer, EngineError> {
    Ok(if path.is_dir() {
        Tokenizer::from_hf_dir(path)?
    } else {
        let config = path.with_file_name("tokenizer_config.json");
        Tokenizer::from_file(path, config.exists().then_some(config.as_path()))?
    })
}

struct PoolingLoop {
    model: Box<dyn PoolingModel>,
    pool: ThreadPool,
    receiver: Receiver<Job>,
    queue: VecDeque<Job>,
    max_tokens: usize,
    max_seqs: usize,
    metrics: Arc<EngineMetrics>,
    alive: Arc<AtomicBool>,
    pending: Arc<AtomicUsize>,
    abort: Arc<AtomicBool>,
}

impl PoolingLoop {
    fn run(mut self) {
        let mut batch = EncoderBatch::default();
        let mut workspace = EncoderWorkspace::new();
        let mut out = Vec::new();
        let mut step = Vec::new();
        while self.alive.load(Ordering::Acquire) {
            if self.queue.is_empty() {
                // Idle: wait for work, waking now and then to notice a shutdown.
                match self.receiver.recv_timeout(Duration::from_millis(100)) {
                    Ok(job) => self.queue.push_back(job),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            self.queue.extend(self.receiver.try_iter());
            if self.abort.swap(false, Ordering::AcqRel) {
                self.abort_queue();
                continue;
            }
            self.take_step(&mut step, &mut batch);
            if step.is_empty() {
                continue;
            }
            // vLLM counts pooling requests in the scheduler gauges like generation ones: the
            // step's inputs are running while it runs, the rest of the queue is waiting.
            self.metrics.record_step(&StepMetrics {
                num_running: step.len(),
                num_waiting: self.queue.len(),
                ..StepMetrics::default()
            });
            let started = Instant::now();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.model
                    .pool(&self.pool, &batch, &mut workspace, &mut out)
            }));
            let finished = Instant::now();
            let outcome = match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => {
                    // A panic leaves the workspace in an unknown state: fail everything and
                    // stop, as the generation engine does (`/health` turns 503).
                    self.alive.store(false, Ordering::Release);
                    Err("the pooling engine panicked".to_string())
                }
            };
            self.answer(
                &mut step,
                &out,
                outcome,
                started,
                finished,
                batch.num_tokens(),
            );
        }
        self.alive.store(false, Ordering::Release);
        // Whatever is still queued gets an error (its receivers see a closed channel).
        self.queue.clear();
    }

    /// Answers every queued input with an abort error (counted as `abort` in
    /// `vllm:request_success_total`).
    fn abort_queue(&mut self) {
        let now = Instant::now();
        for job in self.queue.drain(..) {
            let waited = now.duration_since(job.arrived).as_secs_f64();
            self.metrics.record_finished(&FinishedRequestMetrics {
                finish_reason: FinishedReason::Abort,
                num_prompt_tokens: job.input.token_ids.len() as u64,
                num_generation_tokens: 0,
                max_tokens_param: None,
                n_param: 1,
                e2e_latency: waited,
                queue_time: waited,
                prefill_time: 0.0,
                decode_time: 0.0,
                inference_time: 0.0,
                mean_time_per_output_token: None,
            });
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let _ = job.reply.send(Err(ABORTED.to_string()));
        }
        self.metrics.record_step(&StepMetrics::default());
    }

    /// Moves the longest prefix of the queue that fits the budgets into `step` and `batch`
    /// (at least one job: every job fits the token budget alone). Jobs whose client is gone
    /// are dropped.
    fn take_step(&mut self, step: &mut Vec<Job>, batch: &mut EncoderBatch) {
        step.clear();
        batch.clear();
        while let Some(job) = self.queue.front() {
            if job.reply.is_closed() {
                self.queue.pop_front();
                self.pending.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let len = job.input.token_ids.len();
            let full = step.len() >= self.max_seqs || batch.num_tokens() + len > self.max_tokens;
            if full && !step.is_empty() {
                break;
            }
            let Some(job) = self.queue.pop_front() else {
                break;
            };
            if let Err(error) =
                batch.add_sequence(&job.input.token_ids, job.input.token_type_ids.as_deref())
            {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                let _ = job.reply.send(Err(error.to_string()));
                continue;
            }
            step.push(job);
        }
    }

    fn answer(
        &self,
        step: &mut Vec<Job>,
        out: &[f32],
        outcome: Result<(), String>,
        started: Instant,
        finished: Instant,
        num_tokens: usize,
    ) {
        let width = self.model.info().output_dim;
        let reason = if outcome.is_ok() {
            FinishedReason::Stop
        } else {
            FinishedReason::Error
        };
        for (index, job) in step.drain(..).enumerate() {
            let prompt_tokens = job.input.token_ids.len() as u64;
            let row = match &outcome {
                Ok(()) => out
                    .get(index * width..(index + 1) * width)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| "the model returned too few rows".to_string()),
                Err(message) => Err(message.clone()),
            };
            self.metrics.record_finished(&FinishedRequestMetrics {
                finish_reason: reason,
                num_prompt_tokens: prompt_tokens,
                num_generation_tokens: 0,
                max_tokens_param: None,
                n_param: 1,
                e2e_latency: finished.duration_since(job.arrived).as_secs_f64(),
                queue_time: started.duration_since(job.arrived).as_secs_f64(),
                prefill_time: finished.duration_since(started).as_secs_f64(),
                decode_time: 0.0,
                inference_time: finished.duration_since(started).as_secs_f64(),
                mean_time_per_output_token: None,
            });
            self.pending.fetch_sub(1, Ordering::AcqRel);
            let _ = job.reply.send(row);
        }
        self.metrics.record_step(&StepMetrics {
            num_running: 0,
            num_waiting: self.queue.len(),
            prompt_tokens: num_tokens as u64,
            iteration_tokens: num_tokens,
            ..StepMetrics::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_outside_the_model_length_are_refused_before_queueing() {
        let (jobs, _receiver) = mpsc::channel();
        let client = PoolingClient {
            jobs,
            alive: Arc::new(AtomicBool::new(true)),
            pending: Arc::new(AtomicUsize::new(0)),
            abort: Arc::new(AtomicBool::new(false)),
            max_model_len: 4,
        };
        for ids in [vec![], vec![1, 2, 3, 4, 5]] {
            let result = client.pool_blocking(vec![PoolingInput::tokens(ids)]);
            assert!(matches!(result, Err(EngineError::InvalidRequest(_))));
        }
        assert_eq!(client.num_pending(), 0);
    }
}
