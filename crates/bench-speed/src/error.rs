//! The one error type of the forward-pass benchmark.

use std::path::PathBuf;

/// Everything that stops `bench speed` before it can report.
#[derive(Debug, thiserror::Error)]
pub enum SpeedError {
    /// An option value is malformed or options contradict each other.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The JSON report could not be serialized.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The model could not be found, loaded or run.
    #[error("model: {0}")]
    Model(#[from] tokenmill_models::ModelError),
    /// A measurement went wrong (a bug, not a slow machine).
    #[error("benchmark task failed: {0}")]
    Task(String),
}

impl SpeedError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SpeedError::Io {
            path: path.into(),
            source,
        }
    }
}
