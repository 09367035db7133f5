//! What every handler shares.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokenmill_engine::{EngineClient, GenerateRequest, LoadedModel, RequestId, RequestStream};
use tokenmill_metrics::EngineMetrics;
use tokenmill_protocol::ValidationLimits;

use crate::admission::Admission;
use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::responses_runs::Responses;

/// Bytes of text per (longest piece × context position) accepted before tokenizing.
const PROMPT_BYTES_MARGIN: usize = 4;

/// Shared handler state: the engine handle, the model's tokenizer/template, limits, and the
/// drain flag. Cheap to clone (all `Arc`s).
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub engine: EngineClient,
    pub model: Arc<LoadedModel>,
    pub config: ServerConfig,
    pub limits: ValidationLimits,
    pub draining: AtomicBool,
    /// Generation requests in flight (a drain waits for this to reach zero).
    pub in_flight: AtomicUsize,
    /// Engine requests of the in-flight generation requests, so a drain that times out can
    /// abort them (their clients then get `finish_reason: "abort"`).
    pub engine_requests: Mutex<HashSet<RequestId>>,
    /// Unix seconds at start-up (`created` of the model cards).
    pub started_at: u64,
    /// The engine's Prometheus registry (`/metrics`), which also counts HTTP requests.
    pub metrics: Arc<EngineMetrics>,
    /// Texts longer than this cannot tokenize into the context (see [`AppState::max_prompt_bytes`]).
    pub max_prompt_bytes: usize,
    /// Whether the model's chat template renders `tools` (else the generic tool prompt).
    pub template_renders_tools: bool,
    /// `/v1/responses`: the store and the background runs.
    pub responses: Responses,
    /// The bounded pool for expensive work before admission (templates, grammars, long
    /// prompts' tokenizing).
    pub admission: Admission,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("served_model_names", &self.inner.config.served_model_names)
            .finish_non_exhaustive()
    }
}

impl AppState {
    pub fn new(
        engine: EngineClient,
        model: Arc<LoadedModel>,
        config: ServerConfig,
        metrics: Arc<EngineMetrics>,
    ) -> AppState {
        let vocab_size = u32::try_from(model.config().vocab_size).unwrap_or(u32::MAX);
        let max_model_len = u32::try_from(engine.max_model_len()).unwrap_or(u32::MAX);
        let mut limits = ValidationLimits::new(max_model_len, vocab_size);
        limits.max_n = config.max_n;
        limits.max_logprobs = config.max_logprobs;
        limits.defaults = config.sampling_defaults.clone();
        // Normalizers and merged unknown characters can make a token stand for more text than
        // its piece, hence the margin.
        let max_prompt_bytes = model
            .tokenizer
            .max_token_bytes()
            .max(1)
            .saturating_mul(max_model_len as usize)
            .saturating_mul(PROMPT_BYTES_MARGIN);
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let template_renders_tools = model.chat_template.renders_tools();
        AppState {
            inner: Arc::new(Inner {
                responses: Responses::new(config.response_store.clone()),
                admission: Admission::new(config.max_admission_jobs),
                template_renders_tools,
                engine,
                model,
                config,
                limits,
                draining: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                engine_requests: Mutex::new(HashSet::new()),
                started_at,
                metrics,
                max_prompt_bytes,
            }),
        }
    }

    /// Requests waiting for the engine: the engine's own count after its last step, or the
    /// engine requests in flight that it is not running yet (arrivals since that step),
    /// whichever is larger.
    pub(crate) fn num_waiting(&self) -> usize {
        let stats = self.inner.engine.stats();
        let in_flight = self
            .inner
            .engine_requests
            .lock()
            .map_or(0, |requests| requests.len());
        stats
            .num_waiting
            .max(in_flight.saturating_sub(stats.num_running))
    }

    /// The longest text that may still fit the context: the longest vocabulary piece times
    /// the context length (times a margin).
    pub(crate) fn max_prompt_bytes(&self) -> usize {
        self.inner.max_prompt_bytes
    }

    /// The bounded pool for expensive work before admission.
    pub(crate) fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// How logprob entries name tokens (`--return-tokens-as-token-ids`).
    pub(crate) fn token_names(&self) -> crate::generation::TokenNames<'_> {
        crate::generation::TokenNames {
            tokenizer: &self.inner.model.tokenizer,
            as_ids: self.inner.config.return_tokens_as_token_ids,
        }
    }

    /// Stop accepting generation requests; `/health` turns 503.
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// Aborts every engine request still in flight (the end of a drain that timed out).
    /// Returns how many were aborted.
    pub fn abort_in_flight(&self) -> usize {
        let ids: Vec<RequestId> = match self.inner.engine_requests.lock() {
            Ok(ids) => ids.iter().copied().collect(),
            Err(_) => return 0,
        };
        for &id in &ids {
            self.inner.engine.abort(id);
        }
        ids.len()
    }

    pub fn engine(&self) -> &EngineClient {
        &self.inner.engine
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }
}

/// Counts a generation request as in flight until dropped (the response, streamed or not, is
/// complete or abandoned), with the engine requests it started.
#[derive(Debug)]
pub(crate) struct InFlightGuard {
    state: AppState,
    engine_requests: Vec<RequestId>,
}

impl InFlightGuard {
    pub fn new(state: &AppState) -> InFlightGuard {
        state.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlightGuard {
            state: state.clone(),
            engine_requests: Vec::new(),
        }
    }

    /// Submits one engine request on behalf of this HTTP request and tracks it (so a drain
    /// that times out can abort it).
    pub fn submit(&mut self, request: GenerateRequest) -> Result<RequestStream, ApiError> {
        let stream = self
            .state
            .engine()
            .add_request(request)
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
        self.track(stream.request_id());
        Ok(stream)
    }

    /// Records an engine request of this HTTP request.
    pub fn track(&mut self, request_id: RequestId) {
        if let Ok(mut ids) = self.state.inner.engine_requests.lock() {
            ids.insert(request_id);
        }
        self.engine_requests.push(request_id);
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Ok(mut ids) = self.state.inner.engine_requests.lock() {
            for id in &self.engine_requests {
                ids.remove(id);
            }
        }
        self.state.inner.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Unix seconds now (`created` fields).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
