//! The crate's error type.

/// Why a scrape could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// prometheus-client failed to write the exposition.
    #[error("encoding the metrics failed: {0}")]
    Encode(#[from] std::fmt::Error),
    /// The OpenMetrics text could not be turned into the classic text format.
    #[error("converting the exposition to the Prometheus text format failed: {0}")]
    Exposition(String),
}
