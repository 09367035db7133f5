//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while resolving, loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("GGUF error: {0}")]
    Gguf(#[from] tokenmill_gguf::GgufError),
    #[error("kernel error: {0}")]
    Kernel(#[from] tokenmill_kernels::KernelError),
    #[error("invalid config.json at {path}: {source}")]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid safetensors file {path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("unsupported model architecture `{name}` (supported: {supported})")]
    UnsupportedArchitecture { name: String, supported: String },
    #[error("unsupported tensor type {dtype} for tensor `{tensor}`")]
    UnsupportedTensorType { tensor: String, dtype: String },
    #[error("missing model metadata `{0}`")]
    MissingMetadata(String),
    #[error("invalid model metadata `{key}`: {message}")]
    InvalidMetadata { key: String, message: String },
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("model not found: {0}")]
    ModelNotFound(String),
    #[error("downloading {what} failed: {message}")]
    Download { what: String, message: String },
    #[error("invalid sampling parameters: {0}")]
    InvalidSamplingParams(String),
    #[error("invalid structured output: {0}")]
    InvalidGrammar(String),
    /// One request's constraints (`allowed_token_ids`, `bad_words`, the `min_tokens` ban of
    /// its stop tokens, a grammar) left no token to sample at this position.
    #[error("no token is allowed at this position: {0}")]
    NoAllowedToken(String),
    /// A logits row held NaN or +inf (broken weights or an overflow): nothing can be drawn
    /// from it.
    #[error("the model produced a non-finite logit (token {token_id}: {value})")]
    NonFiniteLogits { token_id: u32, value: f32 },
    #[error(transparent)]
    Lora(#[from] crate::lora::LoraError),
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A pooling start-up option (`--convert`, `--pooler-config`) that is malformed or does
    /// not fit the model; the message names it.
    #[error("{0}")]
    PoolingOption(String),
    /// A checkpoint of a known family in a form not read yet; the message says which and
    /// what to do instead.
    #[error("unsupported checkpoint: {0}")]
    Unsupported(String),
}

/// Shorthand for results in this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}
