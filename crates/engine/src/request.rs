//! What a caller submits to the engine and what it gets back.

use std::time::Instant;

use tokenmill_models::SamplingParams;
use tokenmill_text::DecodeOptions;

use crate::lora::LoraRequest;

pub use tokenmill_core::FinishReason;

/// Stop conditions of one request, token-level and string-level (`min_tokens` is a sampling
/// parameter: it holds EOS and stop tokens back, see [`SamplingParams::min_tokens`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StopOptions {
    /// Cap on generated tokens; `None` = up to `max_model_len`.
    pub max_tokens: Option<u32>,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    /// Stop strings, matched on detokenized text across token boundaries.
    pub stop_strings: Vec<String>,
    pub include_stop_str_in_output: bool,
}

impl Default for StopOptions {
    fn default() -> StopOptions {
        StopOptions {
            max_tokens: Some(16),
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            include_stop_str_in_output: false,
        }
    }
}

/// One generation request, already tokenized and validated.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopOptions,
    /// Lower is served first under the priority policy.
    pub priority: i32,
    /// Isolates prefix-cache entries (vLLM's `cache_salt`).
    pub cache_salt: Option<String>,
    /// How the output ids become text (`skip_special_tokens`, `spaces_between_special_tokens`);
    /// token ids are always returned.
    pub decode: DecodeOptions,
    /// Return each prompt token's logprob plus this many alternatives (vLLM's
    /// `prompt_logprobs`; completions `echo` with `logprobs`). Such requests skip prefix-cache
    /// hits, since cached positions would have no logits.
    pub prompt_logprobs: Option<usize>,
    /// When the request reached the process (TTFT and queue time are measured from here).
    pub arrival: Instant,
    /// The LoRA adapter the request runs through (`None`: the base model).
    pub lora: Option<LoraRequest>,
}

impl GenerateRequest {
    /// A request with default sampling and stop options.
    pub fn new(prompt_token_ids: Vec<u32>) -> GenerateRequest {
        GenerateRequest {
            prompt_token_ids,
            sampling: SamplingParams::default(),
            stop: StopOptions::default(),
            priority: 0,
            cache_salt: None,
            decode: DecodeOptions::default(),
            prompt_logprobs: None,
            arrival: Instant::now(),
            lora: None,
        }
    }
}

/// Log-probabilities of one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
    /// Most likely alternatives, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What ended a request with [`FinishReason::Stop`], when it was not EOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Token(u32),
    String(String),
}

/// One delta of a request's output stream.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// Tokens generated since the previous delta.
    pub new_token_ids: Vec<u32>,
    /// Text completed since the previous delta (held back while a stop string may match or a
    /// UTF-8 character is incomplete).
    pub new_text: String,
    /// One entry per new token when logprobs were requested.
    pub logprobs: Vec<TokenLogprob>,
    /// With `prompt_logprobs`, on the first delta: one entry per prompt token, `None` for the
    /// first (nothing precedes it).
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    pub num_prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub num_cached_tokens: usize,
    /// Tokens generated so far, including this delta.
    pub num_output_tokens: usize,
    /// Set on the last delta.
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
}

/// An event on a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    Output(RequestOutput),
    /// The engine refused the request on arrival: its input breaks a rule the front end did
    /// not check first (sampling limits, prompt or context length, an empty bad word...).
    /// The stream ends; servers answer it as a client error (400), not a failure.
    Rejected(String),
    /// The engine failed this request (engine died, executor error); the stream ends.
    Error(String),
    /// This request alone failed while decoding (its constraints left no token, its grammar
    /// or a processor failed, its logits were not finite); the engine ended it, freed its
    /// blocks and went on with the others. The stream ends; servers answer it as a 500 (or an
    /// error event mid-stream) with [`RequestFailure::message`].
    Failed(RequestFailure),
}

/// Why one request failed while the engine kept serving the others. The details (library
/// error texts) are logged by the engine; what a client may see is [`RequestFailure::message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFailure {
    /// `allowed_token_ids`, `bad_words`, the `min_tokens` ban of stop tokens and the
    /// structured output together excluded every token at some position.
    NoAllowedToken,
    /// The structured-output grammar could not go on (it allows no continuation here, or its
    /// matcher failed).
    Grammar,
    /// The model's logits for this request held NaN or +inf.
    NonFiniteLogits,
    /// Anything else in this request's sampling or output (a panic included).
    Internal,
}

impl RequestFailure {
    /// The client-facing text: what failed, never a library's message or a path.
    pub fn message(self) -> &'static str {
        match self {
            RequestFailure::NoAllowedToken => {
                "Generation stopped: the request's constraints (allowed_token_ids, bad_words, \
                 min_tokens, structured output) left no token that may be generated."
            }
            RequestFailure::Grammar => {
                "Generation stopped: the structured output's grammar allows no continuation \
                 of the text generated so far."
            }
            RequestFailure::NonFiniteLogits => {
                "Generation stopped: the model produced non-finite logits for this request."
            }
            RequestFailure::Internal => "The server had an error while processing this request.",
        }
    }

    /// The failure a sampling error means for its request.
    pub fn of_model_error(error: &tokenmill_models::ModelError) -> RequestFailure {
        use tokenmill_models::ModelError as M;
        match error {
            M::NoAllowedToken(_) => RequestFailure::NoAllowedToken,
            M::InvalidGrammar(_) => RequestFailure::Grammar,
            M::NonFiniteLogits { .. } => RequestFailure::NonFiniteLogits,
            _ => RequestFailure::Internal,
        }
    }
}
