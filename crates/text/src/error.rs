//! The one error type of this crate.

/// Everything that can go wrong loading a tokenizer, encoding, decoding or rendering a chat
/// template. Template errors carry the template engine's message so a server can return it to
/// the client as a 400.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid JSON in {path}: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot open GGUF file: {0}")]
    Gguf(#[from] tokenmill_gguf::GgufError),
    #[error("GGUF metadata key {key} is missing or has the wrong type")]
    MissingMetadata { key: String },
    #[error("unsupported tokenizer model {model:?} (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece, \"gemma4\" SPM-style BPE, \"bert\" WordPiece)")]
    UnsupportedTokenizerModel { model: String },
    #[error("unsupported pre-tokenizer {pre:?} for a BPE vocabulary")]
    UnsupportedPreTokenizer { pre: String },
    #[error("invalid vocabulary: {0}")]
    InvalidVocabulary(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    InvalidTokenId { id: u32, vocab_size: usize },
    #[error("chat template syntax error: {0}")]
    TemplateSyntax(String),
    #[error("chat template rendering failed: {0}")]
    TemplateRender(String),
    /// A render went over one of the chat template's bounds (fuel, output size,
    /// indentation width); the message names the limit.
    #[error("chat template rendering stopped: {0}")]
    TemplateLimit(String),
    #[error("invalid chat request: {0}")]
    InvalidChat(String),
}

impl TextError {
    pub(crate) fn tokenizer(error: impl std::fmt::Display) -> Self {
        TextError::Tokenizer(error.to_string())
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TextError>;
