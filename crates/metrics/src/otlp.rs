//! OpenTelemetry tracing: one span per finished request, exported over OTLP/HTTP with the
//! JSON encoding (`POST {endpoint}/v1/traces`, `Content-Type: application/json`), which every
//! OpenTelemetry collector, Jaeger and Tempo accept without a protobuf dependency here.
//!
//! The engine thread must never wait on a collector, so [`OtlpTraceExporter::record`] only does
//! a `try_send` into a bounded queue; a background thread batches spans (up to
//! [`OtlpConfig::max_batch`] spans or [`OtlpConfig::flush_interval`], whichever comes first)
//! and POSTs them with a blocking HTTP client. When the queue is full the span is dropped and
//! counted. Dropping the exporter flushes what is queued and joins the thread.
//!
//! Spans follow vLLM's request span: name `llm_request` (the engine does not know whether a
//! request came from chat or completions, so the GenAI convention's `{operation} {model}` name
//! cannot be formed), kind SERVER, start at arrival, end at finish, and the GenAI semantic
//! convention attributes where they exist (`gen_ai.request.model`, `gen_ai.usage.*`,
//! `gen_ai.response.finish_reasons`, `gen_ai.request.max_tokens`) plus vLLM's
//! `gen_ai.latency.*` names for the phase times.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::engine_metrics::{FinishedReason, FinishedRequestMetrics};
use crate::error::MetricsError;

/// The OTLP/HTTP path for traces, appended to an endpoint that does not already end with it.
pub const OTLP_TRACES_PATH: &str = "/v1/traces";

/// The span name of every request span (vLLM's).
pub const REQUEST_SPAN_NAME: &str = "llm_request";

/// OTLP `SpanKind.SPAN_KIND_SERVER`.
const SPAN_KIND_SERVER: u8 = 2;

/// OTLP `Status.StatusCode.STATUS_CODE_ERROR`.
const STATUS_CODE_ERROR: u8 = 2;

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// `http://host:port` or a full `.../v1/traces` URL; `https://` works too.
    pub endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// `gen_ai.request.model` / `gen_ai.response.model` (the first served model name).
    pub model_name: String,
    /// Spans waiting for export; beyond this, new spans are dropped and counted.
    pub queue_capacity: usize,
    /// Most spans in one POST.
    pub max_batch: usize,
    /// Longest a span waits in a partial batch.
    pub flush_interval: Duration,
    /// Timeout of one POST (connect plus transfer).
    pub timeout: Duration,
}

impl OtlpConfig {
    /// Defaults: service `tokenmill`, a 2048-span queue, batches of 64 or every second, 10 s
    /// timeout.
    pub fn new(endpoint: impl Into<String>, model_name: impl Into<String>) -> OtlpConfig {
        OtlpConfig {
            endpoint: endpoint.into(),
            service_name: "tokenmill".into(),
            model_name: model_name.into(),
            queue_capacity: 2048,
            max_batch: 64,
            flush_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

/// One finished request, as the engine hands it over: the Prometheus record plus what a span
/// needs on top (id, wall-clock times, TTFT).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpan {
    /// The engine's request id (`gen_ai.request.id`).
    pub request_id: u64,
    /// Wall-clock arrival (span start).
    pub start: SystemTime,
    /// Wall-clock finish (span end).
    pub end: SystemTime,
    /// Arrival to first token; `None` when no token was generated.
    pub time_to_first_token: Option<f64>,
    /// Counts, finish reason and phase times.
    pub finished: FinishedRequestMetrics,
}

/// Counters of the exporter's work so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtlpExportStats {
    /// Spans the collector accepted (2xx).
    pub exported: u64,
    /// Spans dropped because the queue was full.
    pub dropped: u64,
    /// Spans lost to a failed POST (connection error or non-2xx status).
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    /// Set when the handle is dropped: a collector that is already failing then gets no more
    /// POSTs, so shutdown waits for at most one timeout instead of one per queued batch.
    shutting_down: AtomicBool,
}

/// Handle to the export thread. Shared behind an `Arc` by the engine loop; dropping the last
/// handle flushes the queue and joins the thread.
#[derive(Debug)]
pub struct OtlpTraceExporter {
    sender: Option<SyncSender<RequestSpan>>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl OtlpTraceExporter {
    /// Validates the endpoint and starts the export thread.
    pub fn start(config: OtlpConfig) -> Result<OtlpTraceExporter, MetricsError> {
        let url = traces_url(&config.endpoint)?;
        let (sender, receiver) = sync_channel(config.queue_capacity.max(1));
        let counters = Arc::new(Counters::default());
        let worker = Worker {
            url,
            agent: ureq::AgentBuilder::new().timeout(config.timeout).build(),
            resource: resource_json(&config.service_name),
            model_name: config.model_name.clone(),
            max_batch: config.max_batch.max(1),
            flush_interval: config.flush_interval,
            counters: Arc::clone(&counters),
            last_export_failed: false,
        };
        let thread = std::thread::Builder::new()
            .name("otlp-traces".into())
            .spawn(move || worker.run(receiver))
            .map_err(MetricsError::OtlpThread)?;
        Ok(OtlpTraceExporter {
            sender: Some(sender),
            counters,
            thread: Some(thread),
        })
    }

    /// Queues one span without blocking; a full queue drops it (counted in
    /// [`OtlpExportStats::dropped`]).
    pub fn record(&self, span: RequestSpan) {
        let Some(sender) = &self.sender else { return };
        match sender.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What the exporter has done so far.
    pub fn stats(&self) -> OtlpExportStats {
        OtlpExportStats {
            exported: self.counters.exported.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
        }
    }

    /// Exports everything queued, stops the thread and returns the final counters.
    pub fn shutdown(mut self) -> OtlpExportStats {
        self.stop();
        self.stats()
    }

    fn stop(&mut self) {
        // Closing the channel makes the worker flush its last batch and return.
        self.counters.shutting_down.store(true, Ordering::Relaxed);
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("the OTLP trace export thread panicked");
            }
        }
    }
}

impl Drop for OtlpTraceExporter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `{endpoint}/v1/traces` unless the endpoint already names that path.
fn traces_url(endpoint: &str) -> Result<String, MetricsError> {
    let endpoint = endpoint.trim();
    let has_host = ["http://", "https://"]
        .iter()
        .any(|scheme| endpoint.len() > scheme.len() && endpoint.starts_with(scheme));
    if !has_host {
        return Err(MetricsError::OtlpEndpoint(endpoint.to_string()));
    }
    let base = endpoint.trim_end_matches('/');
    if base.ends_with(OTLP_TRACES_PATH) {
        Ok(base.to_string())
    } else {
        Ok(format!("{base}{OTLP_TRACES_PATH}"))
    }
}

struct Worker {
    url: String,
    agent: ureq::Agent,
    resource: Value,
    model_name: String,
    max_batch: usize,
    flush_interval: Duration,
    counters: Arc<Counters>,
    /// Whether the previous POST failed, so a down collector logs one warning, not one a batch.
    last_export_failed: bool,
}

impl Worker {
    fn run(mut self, receiver: Receiver<RequestSpan>) {
        let mut batch: Vec<RequestSpan> = Vec::with_capacity(self.max_batch);
        let mut deadline: Option<Instant> = None;
        loop {
            let next = match deadline {
                // Idle: sleep until a span arrives.
                None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(deadline) => {
                    receiver.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                }
            };
            match next {
                Ok(span) => {
                    if batch.is_empty() {
                        deadline = Some(Instant::now() + self.flush_interval);
                    }
                    batch.push(span);
                    if batch.len() >= self.max_batch {
                        self.export(&mut batch);
                        deadline = None;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.export(&mut batch);
                    deadline = None;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.export(&mut batch);
                    return;
                }
            }
        }
    }

    fn export(&mut self, batch: &mut Vec<RequestSpan>) {
        if batch.is_empty() {
            return;
        }
        let count = batch.len() as u64;
        if self.last_export_failed && self.counters.shutting_down.load(Ordering::Relaxed) {
            self.counters.failed.fetch_add(count, Ordering::Relaxed);
            batch.clear();
            return;
        }
        let body = export_request_json(&self.resource, &self.model_name, batch).to_string();
        batch.clear();
        let result = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json")
            .send_string(&body);
        match result {
            Ok(_) => {
                self.counters.exported.fetch_add(count, Ordering::Relaxed);
                if self.last_export_failed {
                    tracing::info!("OTLP trace export to {} recovered", self.url);
                }
                self.last_export_failed = false;
            }
            Err(err) => {
                self.counters.failed.fetch_add(count, Ordering::Relaxed);
                if self.last_export_failed {
                    tracing::debug!("OTLP trace export to {} failed: {err}", self.url);
                } else {
                    tracing::warn!(
                        "OTLP trace export to {} failed, dropping {count} spans: {err}",
                        self.url
                    );
                }
                self.last_export_failed = true;
            }
        }
    }
}

fn resource_json(service_name: &str) -> Value {
    json!({ "attributes": [string_attr("service.name", service_name)] })
}

/// An OTLP `ExportTraceServiceRequest` in the proto3 JSON mapping (ids as hex, 64-bit
/// integers as strings, enums as numbers).
pub fn export_request_json(resource: &Value, model_name: &str, spans: &[RequestSpan]) -> Value {
    let spans: Vec<Value> = spans.iter().map(|s| span_json(model_name, s)).collect();
    json!({
        "resourceSpans": [{
            "resource": resource,
            "scopeSpans": [{
                "scope": { "name": "tokenmill", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans,
            }],
        }],
    })
}

fn span_json(model_name: &str, span: &RequestSpan) -> Value {
    let f = &span.finished;
    let mut attributes = vec![
        string_attr("gen_ai.request.id", &span.request_id.to_string()),
        string_attr("gen_ai.request.model", model_name),
        string_attr("gen_ai.response.model", model_name),
        int_attr("gen_ai.usage.input_tokens", f.num_prompt_tokens),
        int_attr("gen_ai.usage.output_tokens", f.num_generation_tokens),
        // vLLM's older names for the same counts, which vLLM-era trace queries read.
        int_attr("gen_ai.usage.prompt_tokens", f.num_prompt_tokens),
        int_attr("gen_ai.usage.completion_tokens", f.num_generation_tokens),
        json!({
            "key": "gen_ai.response.finish_reasons",
            "value": { "arrayValue": { "values": [{ "stringValue": f.finish_reason.as_str() }] } },
        }),
        int_attr("gen_ai.request.n", u64::from(f.n_param)),
        double_attr("gen_ai.latency.time_in_queue", f.queue_time),
        double_attr("gen_ai.latency.e2e", f.e2e_latency),
        double_attr("gen_ai.latency.time_in_model_prefill", f.prefill_time),
        double_attr("gen_ai.latency.time_in_model_decode", f.decode_time),
        double_attr("gen_ai.latency.time_in_model_inference", f.inference_time),
    ];
    if let Some(max_tokens) = f.max_tokens_param {
        attributes.push(int_attr("gen_ai.request.max_tokens", u64::from(max_tokens)));
    }
    if let Some(ttft) = span.time_to_first_token {
        attributes.push(double_attr("gen_ai.latency.time_to_first_token", ttft));
    }
    let mut value = json!({
        "traceId": hex(&rand::random::<[u8; 16]>()),
        "spanId": hex(&rand::random::<[u8; 8]>()),
        "name": REQUEST_SPAN_NAME,
        "kind": SPAN_KIND_SERVER,
        "startTimeUnixNano": unix_nanos(span.start).to_string(),
        "endTimeUnixNano": unix_nanos(span.end).to_string(),
        "attributes": attributes,
    });
    if f.finish_reason == FinishedReason::Error {
        value["status"] = json!({ "code": STATUS_CODE_ERROR, "message": "engine error" });
    }
    value
}

fn string_attr(key: &str, value: &str) -> Value {
    json!({ "key": key, "value": { "stringValue": value } })
}

fn int_attr(key: &str, value: u64) -> Value {
    // proto3 JSON writes int64 as a string.
    json!({ "key": key, "value": { "intValue": value.to_string() } })
}

fn double_attr(key: &str, value: f64) -> Value {
    json!({ "key": key, "value": { "doubleValue": value } })
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(
            traces_url("http://collector:4318").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/v1/traces").unwrap(),
            "https://otel.example/v1/traces"
        );
        assert_eq!(
            traces_url("http://gw/otel").unwrap(),
            "http://gw/otel/v1/traces"
        );
        assert!(traces_url("collector:4318").is_err());
        assert!(traces_url("http://").is_err());
    }

    #[test]
    fn ids_are_lowercase_hex_of_the_right_width() {
        assert_eq!(hex(&[0x00, 0xab, 0x0f]), "00ab0f");
        let span = RequestSpan {
            request_id: 7,
            start: UNIX_EPOCH + Duration::from_secs(1),
            end: UNIX_EPOCH + Duration::from_millis(1500),
            time_to_first_token: None,
            finished: FinishedRequestMetrics {
                finish_reason: FinishedReason::Error,
                num_prompt_tokens: 3,
                num_generation_tokens: 0,
                max_tokens_param: None,
                n_param: 1,
                e2e_latency: 0.5,
                queue_time: 0.5,
                prefill_time: 0.0,
                decode_time: 0.0,
                inference_time: 0.0,
                mean_time_per_output_token: None,
            },
        };
        let value = span_json("m", &span);
        assert_eq!(value["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(value["spanId"].as_str().unwrap().len(), 16);
        assert_eq!(value["startTimeUnixNano"], "1000000000");
        assert_eq!(value["endTimeUnixNano"], "1500000000");
        assert_eq!(value["status"]["code"], 2);
        let keys: Vec<&str> = value["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["key"].as_str().unwrap())
            .collect();
        // No token, no TTFT; no max_tokens given, no max_tokens attribute.
        assert!(!keys.contains(&"gen_ai.latency.time_to_first_token"));
        assert!(!keys.contains(&"gen_ai.request.max_tokens"));
    }
}
