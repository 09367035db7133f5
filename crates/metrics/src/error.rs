//! The crate's error type.

/// Why a scrape could not be produced or the trace exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// prometheus-client failed to write the exposition.
    #[error("encoding the metrics failed: {0}")]
    Encode(#[from] std::fmt::Error),
    /// The OpenMetrics text could not be turned into the classic text format.
    #[error("converting the exposition to the Prometheus text format failed: {0}")]
    Exposition(String),
    /// `--otlp-traces-endpoint` is not an `http://` or `https://` URL.
    #[error("invalid OTLP traces endpoint {0:?}: expected http://host:port or https://host:port")]
    OtlpEndpoint(String),
    /// The trace export thread could not be started.
    #[error("cannot start the OTLP trace export thread: {0}")]
    OtlpThread(std::io::Error),
}
