//! `EngineMetrics`: every metric of the vLLM compatibility table, fed once per engine step and
//! once per finished request.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::buckets::{
    one_two_five_buckets, INTER_TOKEN_LATENCY_SECONDS, ITERATION_TOKENS, REQUEST_LATENCY_SECONDS,
    REQUEST_PARAMS_N, TIME_TO_FIRST_TOKEN_SECONDS,
};
use crate::exposition::openmetrics_to_prometheus_text;
use crate::histogram::StepHistogram;
use crate::http::HttpMetrics;
use crate::lora::LoraInfo;
use crate::spec_decode::{SpecDecodeMetrics, SpecDecodeStats};
use crate::MetricsError;

/// The engine index label value of the first (or only) engine core; with
/// `--data-parallel-size N` the others are `"1"` to `"N-1"` ([`EngineMetrics::for_engine`]).
pub const ENGINE_INDEX: &str = "0";

/// What the metrics need to know about the served model and the KV cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// The first served model name; the `model_name` label of every engine metric.
    pub model_name: String,
    /// Upper end of the 1-2-5 buckets of the token-count histograms.
    pub max_model_len: usize,
    /// Tokens per KV block (`cache_config_info{block_size}`).
    pub block_size: usize,
    /// KV blocks in the pool (`cache_config_info{num_gpu_blocks}`, vLLM's name even on CPU).
    pub num_blocks: usize,
    /// Whether automatic prefix caching is on.
    pub enable_prefix_caching: bool,
    /// KV cache element type as vLLM spells it (`auto`, `fp8`, ...).
    pub cache_dtype: String,
}

/// What the engine saw in one step. Counters are deltas for this step; gauges are the state
/// after it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepMetrics {
    /// Requests in the running batch after the step.
    pub num_running: usize,
    /// Requests waiting to be scheduled (including preempted ones) after the step.
    pub num_waiting: usize,
    /// Used KV blocks over total blocks, 0..=1.
    pub kv_cache_usage: f64,
    /// Prompt tokens looked up in the prefix cache this step.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found in the cache.
    pub prefix_cache_hits: u64,
    /// Requests preempted this step.
    pub num_preemptions: u64,
    /// Prompt (prefill) tokens computed this step.
    pub prompt_tokens: u64,
    /// Tokens sampled this step.
    pub generation_tokens: u64,
    /// Tokens scheduled this step (prefill plus decode); a step with none is not observed.
    pub iteration_tokens: usize,
    /// Seconds from arrival to first token, for requests whose first token came this step.
    pub time_to_first_tokens: Vec<f64>,
    /// Seconds between consecutive tokens of a request, for tokens emitted this step.
    pub inter_token_latencies: Vec<f64>,
    /// Speculative decoding this step (all zero without it).
    pub spec_decode: SpecDecodeStats,
}

/// Why a request finished; the `finished_reason` label of `vllm:request_success_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishedReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the model length reached.
    Length,
    /// Cancelled by the client or the server.
    Abort,
    /// Failed inside the engine.
    Error,
}

impl FinishedReason {
    /// Every reason, in label order.
    pub const ALL: [FinishedReason; 4] = [
        FinishedReason::Stop,
        FinishedReason::Length,
        FinishedReason::Abort,
        FinishedReason::Error,
    ];

    /// The label value, as vLLM's `FinishReason.__str__`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishedReason::Stop => "stop",
            FinishedReason::Length => "length",
            FinishedReason::Abort => "abort",
            FinishedReason::Error => "error",
        }
    }

    fn index(self) -> usize {
        match self {
            FinishedReason::Stop => 0,
            FinishedReason::Length => 1,
            FinishedReason::Abort => 2,
            FinishedReason::Error => 3,
        }
    }
}

/// One finished request, with vLLM's phase times in seconds: queue = arrival to first
/// scheduled, prefill = first scheduled to first token, decode = first token to last token,
/// inference = prefill + decode, e2e = arrival to finish.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequestMetrics {
    /// Why it finished.
    pub finish_reason: FinishedReason,
    /// Prompt length in tokens.
    pub num_prompt_tokens: u64,
    /// Generated tokens.
    pub num_generation_tokens: u64,
    /// The request's `max_tokens`, when it set one.
    pub max_tokens_param: Option<u32>,
    /// The request's `n`.
    pub n_param: u32,
    /// Arrival to finish.
    pub e2e_latency: f64,
    /// Arrival to first scheduled.
    pub queue_time: f64,
    /// First scheduled to first token.
    pub prefill_time: f64,
    /// First token to last token.
    pub decode_time: f64,
    /// First scheduled to last token.
    pub inference_time: f64,
    /// Decode time over generated tokens after the first; `None` with fewer than two tokens.
    pub mean_time_per_output_token: Option<f64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishedReasonLabels {
    finished_reason: String,
}

/// The vLLM-compatible Prometheus registry of one engine. Shared between the engine thread
/// (`record_step`, `record_finished`), the HTTP layer (`record_http`) and the `/metrics`
/// handler (`encode`) behind an `Arc`; every update is an atomic add or a single short
/// uncontended lock per call, never a lock per token.
#[derive(Debug)]
pub struct EngineMetrics {
    registry: Registry,
    num_requests_running: Gauge,
    num_requests_waiting: Gauge,
    kv_cache_usage_perc: Gauge<f64, AtomicU64>,
    prefix_cache_queries: Counter,
    prefix_cache_hits: Counter,
    num_preemptions: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    /// Indexed by `FinishedReason::index`; each shares its value with the registered family.
    request_success: [Counter; 4],
    request_prompt_tokens: StepHistogram,
    request_generation_tokens: StepHistogram,
    request_params_max_tokens: StepHistogram,
    request_params_n: StepHistogram,
    iteration_tokens: StepHistogram,
    time_to_first_token: StepHistogram,
    inter_token_latency: StepHistogram,
    request_time_per_output_token: StepHistogram,
    e2e_request_latency: StepHistogram,
    request_queue_time: StepHistogram,
    request_inference_time: StepHistogram,
    request_prefill_time: StepHistogram,
    request_decode_time: StepHistogram,
    /// KV-cache events dropped before publishing (`tokenmill_kv_events_dropped_total`; no
    /// `:` in the name, which Prometheus reserves for recording rules, as it is not vLLM's).
    kv_events_dropped: Counter,
    http: HttpMetrics,
    /// Present when the engine speculates.
    spec_decode: Option<SpecDecodeMetrics>,
    /// `vllm:lora_requests_info`, registered by [`EngineMetrics::enable_lora`].
    lora: Option<LoraInfo>,
    /// The other data-parallel engines' registries, merged into this one's scrape.
    other_engines: OnceLock<Vec<Arc<EngineMetrics>>>,
}

impl EngineMetrics {
    /// Registers every metric; they all read zero until the first record call.
    pub fn new(config: MetricsConfig) -> Self {
        Self::with_spec_decode(config, None)
    }

    /// [`Self::new`] plus, for an engine that speculates with up to
    /// `num_speculative_tokens` drafts, the `vllm:spec_decode_*` counters (vLLM registers them
    /// only then).
    pub fn with_spec_decode(config: MetricsConfig, num_speculative_tokens: Option<usize>) -> Self {
        Self::for_engine(config, num_speculative_tokens, 0)
    }

    /// [`Self::with_spec_decode`] for data-parallel engine `engine_index`: its series carry
    /// `engine="<engine_index>"`, as vLLM labels each DP rank's.
    pub fn for_engine(
        config: MetricsConfig,
        num_speculative_tokens: Option<usize>,
        engine_index: usize,
    ) -> Self {
        let token_buckets = one_two_five_buckets(config.max_model_len);
        let request_success_family = Family::<FinishedReasonLabels, Counter>::default();
        let request_success = FinishedReason::ALL.map(|reason| {
            // Creating every label up front makes each series exist (at 0) from the first
            // scrape, so `rate()` sees the first increment, as vLLM does.
            request_success_family.get_or_create_owned(&FinishedReasonLabels {
                finished_reason: reason.as_str().to_string(),
            })
        });
        let cache_config_info = Family::<Vec<(String, String)>, Gauge>::default();
        cache_config_info
            .get_or_create(&cache_config_labels(&config))
            .set(1);

        let mut metrics = Self {
            // Replaced below once every metric is registered in the real registry.
            registry: Registry::default(),
            num_requests_running: Gauge::default(),
            num_requests_waiting: Gauge::default(),
            kv_cache_usage_perc: Gauge::default(),
            prefix_cache_queries: Counter::default(),
            prefix_cache_hits: Counter::default(),
            num_preemptions: Counter::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            request_success,
            request_prompt_tokens: StepHistogram::new(&token_buckets),
            request_generation_tokens: StepHistogram::new(&token_buckets),
            request_params_max_tokens: StepHistogram::new(&token_buckets),
            request_params_n: StepHistogram::new(REQUEST_PARAMS_N),
            iteration_tokens: StepHistogram::new(ITERATION_TOKENS),
            time_to_first_token: StepHistogram::new(TIME_TO_FIRST_TOKEN_SECONDS),
            inter_token_latency: StepHistogram::new(INTER_TOKEN_LATENCY_SECONDS),
            request_time_per_output_token: StepHistogram::new(INTER_TOKEN_LATENCY_SECONDS),
            e2e_request_latency: StepHistogram::new(REQUEST_LATENCY_SECONDS),
            request_queue_time: StepHistogram::new(REQUEST_LATENCY_SECONDS),
            request_inference_time: StepHistogram::new(REQUEST_LATENCY_SECONDS),
            request_prefill_time: StepHistogram::new(REQUEST_LATENCY_SECONDS),
            request_decode_time: StepHistogram::new(REQUEST_LATENCY_SECONDS),
            kv_events_dropped: Counter::default(),
            http: HttpMetrics::new(),
            spec_decode: None,
            lora: None,
            other_engines: OnceLock::new(),
        };

        // HTTP metrics carry no model or engine label (as in vLLM), so they live in the root
        // registry and the engine metrics in a sub-registry that adds both labels.
        let mut root = Registry::default();
        metrics.http.register(&mut root);
        let engine = root.sub_registry_with_labels(
            [
                (
                    Cow::Borrowed("model_name"),
                    Cow::Owned(config.model_name.clone()),
                ),
                (
                    Cow::Borrowed("engine"),
                    Cow::Owned(engine_index.to_string()),
                ),
            ]
            .into_iter(),
        );
        metrics.register_engine_metrics(engine, request_success_family, cache_config_info);
        metrics.spec_decode =
            num_speculative_tokens.map(|k| SpecDecodeMetrics::register(engine, k));
        metrics.registry = root;
        metrics
    }

    fn register_engine_metrics(
        &self,
        engine: &mut Registry,
        request_success: Family<FinishedReasonLabels, Counter>,
        cache_config_info: Family<Vec<(String, String)>, Gauge>,
    ) {
        // Help texts are vLLM's; prometheus-client appends the final full stop itself.
        engine.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches",
            self.num_requests_running.clone(),
        );
        engine.register(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed",
            self.num_requests_waiting.clone(),
        );
        engine.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage",
            self.kv_cache_usage_perc.clone(),
        );
        engine.register(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            cache_config_info,
        );
        engine.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens",
            self.prefix_cache_queries.clone(),
        );
        engine.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens",
            self.prefix_cache_hits.clone(),
        );
        engine.register(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine",
            self.num_preemptions.clone(),
        );
        engine.register(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed",
            self.prompt_tokens.clone(),
        );
        engine.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed",
            self.generation_tokens.clone(),
        );
        engine.register(
            "tokenmill_kv_events_dropped",
            "KV-cache events dropped because the publisher fell behind",
            self.kv_events_dropped.clone(),
        );
        engine.register(
            "vllm:request_success",
            "Count of successfully processed requests",
            request_success,
        );
        let histograms: [(&str, &str, &StepHistogram); 13] = [
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed",
                &self.request_prompt_tokens,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed",
                &self.request_generation_tokens,
            ),
            (
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter",
                &self.request_params_max_tokens,
            ),
            (
                "vllm:request_params_n",
                "Histogram of the n request parameter",
                &self.request_params_n,
            ),
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step",
                &self.iteration_tokens,
            ),
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds",
                &self.time_to_first_token,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds",
                &self.inter_token_latency,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request",
                &self.request_time_per_output_token,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds",
                &self.e2e_request_latency,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request",
                &self.request_queue_time,
            ),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request",
                &self.request_inference_time,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request",
                &self.request_prefill_time,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request",
                &self.request_decode_time,
            ),
        ];
        for (name, help, histogram) in histograms {
            engine.register(name, help, histogram.clone());
        }
    }

    /// Registers `vllm:lora_requests_info` (LoRA serving on, `--max-loras max_loras`).
    pub fn enable_lora(&mut self, max_loras: usize) {
        self.lora = Some(LoraInfo::register(&mut self.registry, max_loras));
    }

    /// Whether `vllm:lora_requests_info` is registered.
    pub fn lora_enabled(&self) -> bool {
        self.lora.is_some()
    }

    /// Sets the LoRA gauge for this step's running and waiting adapter names (a no-op
    /// unless [`EngineMetrics::enable_lora`] was called).
    pub fn record_lora(&self, running: &[String], waiting: &[String]) {
        if let Some(lora) = &self.lora {
            lora.record(running, waiting);
        }
    }

    /// Records one engine step: gauges take the step's values, counters add its deltas, and
    /// the step's latencies go into their histograms (one lock per histogram per step).
    pub fn record_step(&self, step: &StepMetrics) {
        self.num_requests_running
            .set(saturating_i64(step.num_running));
        self.num_requests_waiting
            .set(saturating_i64(step.num_waiting));
        self.kv_cache_usage_perc.set(step.kv_cache_usage);
        self.prefix_cache_queries.inc_by(step.prefix_cache_queries);
        self.prefix_cache_hits.inc_by(step.prefix_cache_hits);
        self.num_preemptions.inc_by(step.num_preemptions);
        self.prompt_tokens.inc_by(step.prompt_tokens);
        self.generation_tokens.inc_by(step.generation_tokens);
        if step.iteration_tokens > 0 {
            self.iteration_tokens.observe(step.iteration_tokens as f64);
        }
        self.time_to_first_token
            .observe_all(step.time_to_first_tokens.iter().copied());
        self.inter_token_latency
            .observe_all(step.inter_token_latencies.iter().copied());
        if let Some(spec_decode) = &self.spec_decode {
            spec_decode.record(&step.spec_decode);
        }
    }

    /// Records a request that left the engine, for whatever reason.
    pub fn record_finished(&self, request: &FinishedRequestMetrics) {
        self.request_success[request.finish_reason.index()].inc();
        self.e2e_request_latency.observe(request.e2e_latency);
        self.request_queue_time.observe(request.queue_time);
        self.request_prefill_time.observe(request.prefill_time);
        self.request_inference_time.observe(request.inference_time);
        self.request_decode_time.observe(request.decode_time);
        self.request_prompt_tokens
            .observe(request.num_prompt_tokens as f64);
        self.request_generation_tokens
            .observe(request.num_generation_tokens as f64);
        self.request_params_n.observe(f64::from(request.n_param));
        // vLLM skips a falsy max_tokens, so 0 is treated as unset too.
        if let Some(max_tokens) = request.max_tokens_param.filter(|&value| value > 0) {
            self.request_params_max_tokens
                .observe(f64::from(max_tokens));
        }
        if let Some(time_per_output_token) = request.mean_time_per_output_token {
            self.request_time_per_output_token
                .observe(time_per_output_token);
        }
    }

    /// Counts KV-cache events dropped on the way to the publisher socket.
    pub fn record_kv_events_dropped(&self, count: u64) {
        self.kv_events_dropped.inc_by(count);
    }

    /// Records one served HTTP request. `handler` is the route template, `status` the
    /// response code (grouped to `2xx`, ... in the label).
    pub fn record_http(&self, handler: &str, method: &str, status: u16, duration_s: f64) {
        self.http.record(handler, method, status, duration_s);
    }

    /// Counts a request refused before reaching the engine (`tokenmill:requests_rejected_total`).
    pub fn record_rejected(&self, reason: &str) {
        self.http.record_rejected(reason);
    }

    /// Counts stored responses evicted by age or count
    /// (`tokenmill_responses_store_evictions_total`).
    pub fn record_response_store_evictions(&self, count: u64) {
        self.http.record_response_store_evictions(count);
    }

    /// The scrape in the classic Prometheus text format; serve it with
    /// [`crate::PROMETHEUS_TEXT_CONTENT_TYPE`]. This is what vLLM serves and what
    /// `promtool check metrics` reads.
    pub fn encode(&self) -> Result<String, MetricsError> {
        openmetrics_to_prometheus_text(&self.encode_openmetrics()?)
    }

    /// The scrape in OpenMetrics 1.0 text, for a client that negotiates
    /// [`crate::OPENMETRICS_CONTENT_TYPE`].
    pub fn encode_openmetrics(&self) -> Result<String, MetricsError> {
        let own = self.encode_own()?;
        match self.other_engines.get() {
            Some(others) if !others.is_empty() => {
                let mut texts = vec![own];
                for other in others {
                    texts.push(other.encode_own()?);
                }
                Ok(crate::merge::merge_openmetrics(&texts))
            }
            _ => Ok(own),
        }
    }

    /// This registry alone, without the attached engines.
    fn encode_own(&self) -> Result<String, MetricsError> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Makes this (engine 0's) scrape include the other data-parallel engines' series, each
    /// family declared once. Only the first call takes effect; returns whether it did.
    pub fn attach_engines(&self, others: Vec<Arc<EngineMetrics>>) -> bool {
        self.other_engines.set(others).is_ok()
    }
}

/// The `cache_config_info` labels besides `model_name` and `engine`, spelled as vLLM's
/// `CacheConfig.metrics_info()` (Python `str()` of each value, so booleans read `True`).
fn cache_config_labels(config: &MetricsConfig) -> Vec<(String, String)> {
    let python_bool = |value: bool| if value { "True" } else { "False" };
    vec![
        ("block_size".to_string(), config.block_size.to_string()),
        ("cache_dtype".to_string(), config.cache_dtype.clone()),
        (
            "enable_prefix_caching".to_string(),
            python_bool(config.enable_prefix_caching).to_string(),
        ),
        ("num_gpu_blocks".to_string(), config.num_blocks.to_string()),
    ]
}

fn saturating_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_metrics_can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<EngineMetrics>();
    }

    #[test]
    fn data_parallel_engines_share_one_scrape_with_engine_labels() {
        let config = MetricsConfig {
            model_name: "m".to_string(),
            max_model_len: 128,
            block_size: 16,
            num_blocks: 10,
            enable_prefix_caching: true,
            cache_dtype: "auto".to_string(),
        };
        let engine0 = EngineMetrics::for_engine(config.clone(), None, 0);
        let engine1 = Arc::new(EngineMetrics::for_engine(config, None, 1));
        engine0.record_step(&StepMetrics {
            num_running: 2,
            ..Default::default()
        });
        engine1.record_step(&StepMetrics {
            num_running: 5,
            ..Default::default()
        });
        engine0.record_http("/v1/completions", "POST", 200, 0.1);
        assert!(engine0.attach_engines(vec![Arc::clone(&engine1)]));
        assert!(
            !engine0.attach_engines(Vec::new()),
            "only the first call counts"
        );
        let scrape = engine0.encode().unwrap();
        assert_eq!(
            scrape
                .matches("# TYPE vllm:num_requests_running gauge")
                .count(),
            1,
            "{scrape}"
        );
        assert!(scrape.contains("vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2"));
        assert!(scrape.contains("vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 5"));
        let cache_info = |engine: &str| {
            scrape.lines().any(|line| {
                line.starts_with("vllm:cache_config_info{")
                    && line.contains(&format!("engine=\"{engine}\""))
            })
        };
        assert!(cache_info("0") && cache_info("1"), "{scrape}");
        let http_series = scrape
            .lines()
            .filter(|line| line.starts_with("http_requests_total{"))
            .count();
        assert_eq!(http_series, 1, "{scrape}");
    }

    #[test]
    fn finished_reason_labels_are_vllms() {
        let labels: Vec<&str> = FinishedReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, vec!["stop", "length", "abort", "error"]);
        let indices: Vec<usize> = FinishedReason::ALL.iter().map(|r| r.index()).collect();
        assert_eq!(indices, vec![0, 1, 2, 3]);
    }

    #[test]
    fn cache_config_booleans_are_spelled_as_python_does() {
        let config = MetricsConfig {
            model_name: "m".to_string(),
            max_model_len: 128,
            block_size: 32,
            num_blocks: 10,
            enable_prefix_caching: false,
            cache_dtype: "auto".to_string(),
        };
        let labels = cache_config_labels(&config);
        assert!(labels.contains(&("enable_prefix_caching".to_string(), "False".to_string())));
        assert!(labels.contains(&("block_size".to_string(), "32".to_string())));
    }
}
