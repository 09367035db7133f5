//! The engine's error type.

/// Everything that can go wrong starting the engine or submitting to it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] tokenmill_models::ModelError),
    #[error(transparent)]
    Text(#[from] tokenmill_text::TextError),
    #[error(transparent)]
    Scheduler(#[from] tokenmill_core::SchedulerError),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Lora(#[from] tokenmill_models::LoraError),
    #[error("The lora adapter '{0}' has already been loaded.")]
    LoraAlreadyLoaded(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    LoraNotFound(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the engine is not running (it stopped or crashed)")]
    EngineDead,
    #[error("executor failed: {0}")]
    Executor(String),
    #[error("cannot start the engine thread: {0}")]
    Spawn(#[from] std::io::Error),
}

impl EngineError {
    /// Whether the error is the request's fault (bad input the engine refused) rather than
    /// the engine's: such requests are answered [`crate::RequestEvent::Rejected`].
    pub fn is_invalid_request(&self) -> bool {
        use tokenmill_core::SchedulerError as S;
        use tokenmill_models::ModelError as M;
        match self {
            EngineError::InvalidRequest(_) => true,
            EngineError::Model(err) => {
                matches!(err, M::InvalidSamplingParams(_) | M::InvalidGrammar(_))
            }
            EngineError::Scheduler(err) => matches!(
                err,
                S::EmptyPrompt { .. }
                    | S::PromptTooLong { .. }
                    | S::ExceedsMaxModelLen { .. }
                    | S::ZeroMaxTokens { .. }
                    | S::MinTokensExceedMaxTokens { .. }
            ),
            _ => false,
        }
    }
}
