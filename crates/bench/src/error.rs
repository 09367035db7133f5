//! The one error type of the benchmark client.

use std::path::PathBuf;

/// Everything that stops a benchmark before it can report. A request that fails during the
/// run is not an error here: it is counted as a failed request in the report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An option value is malformed or options contradict each other.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The HTTP client could not be built or a setup request could not be sent.
    #[error("request to {url} failed: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A setup request (model list, tokenize, detokenize) got a non-success answer.
    #[error("{url} answered HTTP {status}: {body}")]
    Server {
        url: String,
        status: u16,
        body: String,
    },
    /// The server's model list was empty or unreadable.
    #[error("could not discover the model at {url}: {message}")]
    ModelDiscovery { url: String, message: String },
    /// The tokenizer could not be loaded or failed on a prompt.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A dataset file is missing, malformed, or yields no usable request.
    #[error("dataset {path}: {message}")]
    Dataset { path: PathBuf, message: String },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON document could not be serialized or parsed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Drawing a sweep plot failed.
    #[error("plot {path}: {message}")]
    Plot { path: PathBuf, message: String },
    /// A benchmark task died (a bug, not a request failure).
    #[error("benchmark task failed: {0}")]
    Task(String),
}

impl BenchError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}
