//! HTTP server metrics with the names of prometheus-fastapi-instrumentator, which vLLM's API
//! server uses, so existing HTTP panels and alerts keep working.
//!
//! Exposed series (no `model_name`/`engine` labels, as in vLLM):
//! - `http_requests_total{handler, method, status}` counter, status grouped as `2xx`, `4xx`, ...
//! - `http_request_duration_seconds{handler, method}` histogram, buckets 0.1, 0.5, 1
//! - `http_request_duration_highr_seconds` histogram without labels, fine buckets
//!
//! The server decides which handlers to record: vLLM leaves out `/metrics`, `/health`,
//! `/load`, `/ping`, `/version` and `/server_info`. `handler` must be the route template
//! (`/v1/chat/completions`), never a raw path, or an attacker controls the label
//! cardinality.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::buckets::{HTTP_REQUEST_DURATION_HIGHR_SECONDS, HTTP_REQUEST_DURATION_SECONDS};
use crate::histogram::StepHistogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    handler: String,
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    handler: String,
    method: String,
}

type DurationFamily = Family<DurationLabels, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectedLabels {
    reason: String,
}

#[derive(Debug)]
pub(crate) struct HttpMetrics {
    requests_total: Family<RequestLabels, Counter>,
    /// Requests refused before reaching the engine, by reason (`--max-waiting-requests`).
    rejected_total: Family<RejectedLabels, Counter>,
    /// Stored responses evicted by age or count (`--responses-store-ttl`, `-max-entries`).
    response_store_evictions_total: Counter,
    request_duration_seconds: DurationFamily,
    request_duration_highr_seconds: StepHistogram,
}

fn new_duration_histogram() -> Histogram {
    Histogram::new(HTTP_REQUEST_DURATION_SECONDS.iter().copied())
}

impl HttpMetrics {
    pub(crate) fn new() -> Self {
        Self {
            requests_total: Family::default(),
            rejected_total: Family::default(),
            response_store_evictions_total: Counter::default(),
            request_duration_seconds: Family::new_with_constructor(new_duration_histogram),
            request_duration_highr_seconds: StepHistogram::new(HTTP_REQUEST_DURATION_HIGHR_SECONDS),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_requests",
            "Total number of requests by method, status and handler",
            self.requests_total.clone(),
        );
        registry.register(
            "tokenmill:requests_rejected",
            "Requests refused with 503 before reaching the engine, by reason",
            self.rejected_total.clone(),
        );
        registry.register(
            "tokenmill_responses_store_evictions",
            "Stored responses (/v1/responses) evicted by age or count",
            self.response_store_evictions_total.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by \
             handler is important",
            self.request_duration_seconds.clone(),
        );
        registry.register(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate \
             percentile calculations",
            self.request_duration_highr_seconds.clone(),
        );
    }

    pub(crate) fn record_rejected(&self, reason: &str) {
        self.rejected_total
            .get_or_create(&RejectedLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub(crate) fn record_response_store_evictions(&self, count: u64) {
        self.response_store_evictions_total.inc_by(count);
    }

    pub(crate) fn record(&self, handler: &str, method: &str, status: u16, duration_s: f64) {
        self.requests_total
            .get_or_create(&RequestLabels {
                handler: handler.to_string(),
                method: method.to_string(),
                status: status_class(status),
            })
            .inc();
        self.request_duration_seconds
            .get_or_create(&DurationLabels {
                handler: handler.to_string(),
                method: method.to_string(),
            })
            .observe(duration_s);
        self.request_duration_highr_seconds.observe(duration_s);
    }
}

/// The instrumentator groups status codes by their first digit: 200 and 204 are both `2xx`.
pub(crate) fn status_class(status: u16) -> String {
    format!("{}xx", status / 100)
}

#[cfg(test)]
mod tests {
    use super::status_class;

    #[test]
    fn status_codes_are_grouped_by_class() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(204), "2xx");
        assert_eq!(status_class(404), "4xx");
        assert_eq!(status_class(503), "5xx");
    }
}
