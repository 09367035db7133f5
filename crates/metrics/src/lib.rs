//! vLLM-compatible observability for tokenmill: the Prometheus metrics behind `GET /metrics`,
//! the periodic engine stats log line, and the optional OTLP request-span exporter.
//!
//! Operators run vLLM's dashboards, alert rules, autoscalers and routers against whatever
//! serves their models, and those read vLLM's metric names, labels and histogram buckets. This
//! crate owns that contract (see `shared/vllm-compat.md`) so the engine and the server only
//! report what happened and never spell a metric name.
//!
//! # Key types
//!
//! - [`EngineMetrics`]: the registry. Every `vllm:*` metric with labels `model_name` and
//!   `engine="0"`, plus the HTTP metrics of prometheus-fastapi-instrumentator. With data
//!   parallelism each engine has its own (`engine="<rank>"`) and engine 0's scrape merges
//!   the others' in (`attach_engines`), each family declared once.
//! - [`StepMetrics`] / [`FinishedRequestMetrics`]: what the engine reports, once per step and
//!   once per finished request. The engine aggregates per step, so recording never takes a
//!   lock per token.
//! - [`StatsLogger`]: state and formatting of the `Engine 000: Avg prompt throughput: ...`
//!   line; pure, the caller passes the clock.
//! - [`OtlpTraceExporter`]: optional OpenTelemetry tracing, one span per finished request
//!   ([`RequestSpan`]) batched and POSTed as OTLP/HTTP JSON from a background thread.
//!
//! # Usage
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//! use tokenmill_metrics::{EngineMetrics, MetricsConfig, StatsLogger, StepMetrics};
//!
//! let metrics = Arc::new(EngineMetrics::new(MetricsConfig {
//!     model_name: "SmolLM2-135M-Instruct".into(),
//!     max_model_len: 2048,
//!     block_size: 16,
//!     num_blocks: 512,
//!     enable_prefix_caching: true,
//!     cache_dtype: "auto".into(),
//! }));
//! let mut stats_logger = StatsLogger::new(Duration::from_secs(10)).starting_at(Instant::now());
//!
//! // Engine thread, after each step:
//! let step = StepMetrics { num_running: 1, prompt_tokens: 12, iteration_tokens: 12, ..Default::default() };
//! metrics.record_step(&step);
//! stats_logger.observe_step(&step);
//! if let Some((_level, line)) = stats_logger.maybe_log(Instant::now()) {
//!     println!("{line}"); // the engine logs it at `_level` with tracing
//! }
//!
//! // `GET /metrics`: body `metrics.encode()?`, content type `PROMETHEUS_TEXT_CONTENT_TYPE`.
//! let scrape = metrics.encode()?;
//! assert!(scrape.contains("vllm:prompt_tokens_total{model_name=\"SmolLM2-135M-Instruct\",engine=\"0\"} 12"));
//! # Ok::<(), tokenmill_metrics::MetricsError>(())
//! ```
//!
//! # Exposition format
//!
//! [`EngineMetrics::encode`] returns the classic Prometheus text format 0.0.4 (what vLLM
//! serves and `promtool check metrics` reads), converted from prometheus-client's OpenMetrics
//! output; [`EngineMetrics::encode_openmetrics`] returns the OpenMetrics text unchanged for
//! clients that negotiate it.

pub mod buckets;
mod engine_metrics;
mod error;
mod exposition;
mod histogram;
mod http;
mod lora;
mod merge;
mod otlp;
mod spec_decode;
mod stats_logger;

pub use engine_metrics::{
    EngineMetrics, FinishedReason, FinishedRequestMetrics, MetricsConfig, StepMetrics, ENGINE_INDEX,
};
pub use error::MetricsError;
pub use exposition::{
    openmetrics_to_prometheus_text, OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE,
};
pub use histogram::{HistogramSnapshot, StepHistogram};
pub use otlp::{
    export_request_json, OtlpConfig, OtlpExportStats, OtlpTraceExporter, RequestSpan,
    OTLP_TRACES_PATH, REQUEST_SPAN_NAME,
};
pub use spec_decode::{SpecDecodeStats, SpecDecodingLogger, SpecSkipReason};
pub use stats_logger::{StatsLogger, PREFIX_CACHE_WINDOW_STEPS};
