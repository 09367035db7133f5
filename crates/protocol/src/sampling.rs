//! The checked, engine-facing form of a request: [`SamplingOptions`] (how to pick tokens and
//! when to stop) and [`OutputOptions`] (what to send back and how), produced by
//! `CompletionRequest::validate` / `ChatCompletionRequest::validate` from the wire types.
//!
//! Ranges follow vLLM's `SamplingParams._verify_args`, so a request vLLM rejects is rejected
//! here with the same parameter named. Defaults resolve as in vLLM: the request's value, else
//! the server's default (`--generation-config`), else the OpenAI default.

use std::collections::BTreeMap;

use crate::common::{ResponseFormat, ResponseFormatKind, StopInput, StreamOptions};
use crate::error::ProtocolError;
use crate::structured::{GuidedDecodingParams, StructuredOutputRequest};

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_TEMPERATURE_EPSILON: f32 = 1e-5;
/// OpenAI's and vLLM's default cap on logprobs per position.
pub const DEFAULT_MAX_LOGPROBS: u32 = 20;
/// Default cap on `n` when the server sets none (`--max-n`).
pub const DEFAULT_MAX_N: u32 = 128;
/// vLLM's cap on the number of prompts in one completions request.
pub const DEFAULT_MAX_PROMPTS: usize = 1024;
/// Completions' `max_tokens` default (OpenAI and vLLM).
pub const COMPLETION_DEFAULT_MAX_TOKENS: u32 = 16;
/// Longest accepted `cache_salt`, in characters (Unicode scalar values, as the OpenAPI
/// schema's `maxLength` counts them).
pub const MAX_CACHE_SALT_LEN: usize = 1024;

/// Server-side defaults applied when a request leaves a parameter out (vLLM's
/// `default_sampling_params`, filled from `--generation-config`). `None` falls through to the
/// OpenAI default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Default completion length for chat requests that set neither `max_tokens` nor
    /// `max_completion_tokens` (`max_new_tokens` in a generation config).
    pub max_tokens: Option<u32>,
}

/// What the served model and the server configuration allow.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationLimits {
    /// Context length: prompt plus completion tokens.
    pub max_model_len: u32,
    /// Token ids (in prompts, `logit_bias`, `stop_token_ids`, ...) must be below this.
    pub vocab_size: u32,
    /// Cap on `n` (`--max-n`).
    pub max_n: u32,
    /// Cap on `logprobs`, `top_logprobs` and `prompt_logprobs`.
    pub max_logprobs: u32,
    /// Cap on the number of prompts in one completions request.
    pub max_prompts: usize,
    pub defaults: SamplingDefaults,
}

impl ValidationLimits {
    /// Limits for a model with the given context length and vocabulary, other caps at their
    /// defaults.
    pub fn new(max_model_len: u32, vocab_size: u32) -> Self {
        Self {
            max_model_len,
            vocab_size,
            max_n: DEFAULT_MAX_N,
            max_logprobs: DEFAULT_MAX_LOGPROBS,
            max_prompts: DEFAULT_MAX_PROMPTS,
            defaults: SamplingDefaults::default(),
        }
    }
}

/// How to sample one request's tokens and when to stop: plain data, no wire quirks.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingOptions {
    /// Number of independent completions (choices) to return.
    pub n: u32,
    /// 0 means greedy (see [`SamplingOptions::is_greedy`]).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// `None` disables top-k.
    pub top_k: Option<u32>,
    /// 0 disables.
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1 disables.
    pub repetition_penalty: f32,
    /// `None`: unseeded (nondeterministic) sampling.
    pub seed: Option<u64>,
    /// `None`: generate until the context is full (see `ValidatedSampling::resolve_max_tokens`).
    pub max_tokens: Option<u32>,
    /// EOS and stop token ids are ignored until this many tokens are generated.
    pub min_tokens: u32,
    pub ignore_eos: bool,
    /// Stop strings, non-empty, in request order.
    pub stop: Vec<String>,
    /// Extra stop token ids, deduplicated, in request order.
    pub stop_token_ids: Vec<u32>,
    pub include_stop_str_in_output: bool,
    /// Additive logit biases, sorted by token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// When set, only these tokens may be sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words that must not be generated (tokenized by the server).
    pub bad_words: Vec<String>,
    /// Per generated token: `Some(k)` returns the sampled token's logprob plus the top `k`.
    pub logprobs: Option<u32>,
    /// Per prompt token: `Some(k)` returns the prompt token's logprob plus the top `k`.
    pub prompt_logprobs: Option<u32>,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    /// Structured outputs: what the output must match, from `response_format`,
    /// `structured_outputs` or a `guided_*` field (compiled by the server before queuing).
    pub structured_output: Option<StructuredOutputRequest>,
    /// The most tokens the output may spend reasoning (vLLM's `thinking_token_budget`;
    /// enforced by the engine with the reasoning parser's markers).
    pub thinking_token_budget: Option<ThinkingTokenBudget>,
}

/// A checked thinking budget and the request field that set it (named in later errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkingTokenBudget {
    pub tokens: u32,
    pub param: &'static str,
}

impl Default for SamplingOptions {
    /// OpenAI's defaults: one choice, temperature 1, no truncation, no penalties.
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            max_tokens: Some(COMPLETION_DEFAULT_MAX_TOKENS),
            min_tokens: 0,
            ignore_eos: false,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            include_stop_str_in_output: false,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            structured_output: None,
            thinking_token_budget: None,
        }
    }
}

impl SamplingOptions {
    /// Greedy decoding: argmax, no randomness (validation then also clears top-p/k/min-p).
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE_EPSILON
    }
}

/// What to send back, and request bookkeeping that is not sampling.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputOptions {
    pub stream: bool,
    /// `stream_options.include_usage`: a final chunk carrying `usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`: `usage` on every chunk.
    pub continuous_usage_stats: bool,
    /// Completions: prepend the prompt to the text. Chat: vLLM's echo of the last message.
    pub echo: bool,
    /// Completions with `echo: true, max_tokens: 0`: score the prompt only. The engine runs
    /// one step (`max_tokens` is 1) and the server drops the generated token from the response.
    pub echo_without_generation: bool,
    /// Add `token_ids` / `prompt_token_ids` to the choices.
    pub return_token_ids: bool,
    /// Lower runs earlier under priority scheduling.
    pub priority: i64,
    /// The client's `request_id`, if it sent one.
    pub request_id: Option<String>,
    /// Salt for the prefix-cache hashes of this request.
    pub cache_salt: Option<String>,
    /// Keep only the last this-many prompt tokens.
    pub truncate_prompt_tokens: Option<u32>,
    /// Add BOS/EOS special tokens when tokenizing the prompt.
    pub add_special_tokens: bool,
    /// Requested format kind; the constraint it implies is
    /// [`SamplingOptions::structured_output`].
    pub response_format: Option<ResponseFormatKind>,
    /// `max_tokens` or `max_completion_tokens`: named in context-length errors.
    pub max_tokens_param: &'static str,
    /// `prompt` or `messages`: named in context-length errors.
    pub prompt_param: &'static str,
}

/// A request that passed validation: engine-facing sampling plus output handling.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidatedSampling {
    pub sampling: SamplingOptions,
    pub output: OutputOptions,
}

impl ValidatedSampling {
    /// The completion budget once the prompt length is known: the requested `max_tokens` if
    /// the prompt plus it fit the context, else a 400; without one, the rest of the context
    /// (or the server default, whichever is smaller).
    pub fn resolve_max_tokens(
        &self,
        prompt_tokens: usize,
        limits: &ValidationLimits,
    ) -> Result<u32, ProtocolError> {
        let max_model_len = limits.max_model_len as usize;
        if prompt_tokens >= max_model_len {
            return Err(ProtocolError::ContextLengthExceeded {
                param: self.output.prompt_param.to_string(),
                message: format!(
                    "This model's maximum context length is {max_model_len} tokens. However, \
                     your request has {prompt_tokens} input tokens, which leaves no room for a \
                     completion. Please reduce the length of the input."
                ),
            });
        }
        let room = max_model_len - prompt_tokens;
        let max_tokens = match self.sampling.max_tokens {
            Some(requested) if requested as usize > room => {
                return Err(ProtocolError::ContextLengthExceeded {
                    param: self.output.max_tokens_param.to_string(),
                    message: format!(
                        "'{}' is too large: {requested}. This model's maximum context length \
                         is {max_model_len} tokens and your request has {prompt_tokens} input \
                         tokens ({requested} > {max_model_len} - {prompt_tokens}).",
                        self.output.max_tokens_param
                    ),
                });
            }
            Some(requested) => requested,
            None => {
                let room = u32::try_from(room).unwrap_or(u32::MAX);
                limits
                    .defaults
                    .max_tokens
                    .map_or(room, |default| default.min(room))
            }
        };
        if self.sampling.min_tokens > max_tokens {
            return Err(ProtocolError::invalid(
                "min_tokens",
                format!(
                    "min_tokens ({}) is larger than the {max_tokens} tokens left for the \
                     completion after the {prompt_tokens}-token prompt.",
                    self.sampling.min_tokens
                ),
            ));
        }
        Ok(max_tokens)
    }
}

/// The sampling-relevant fields of either request kind, borrowed, before any checking.
/// Each endpoint fills it from its wire type; [`RawSampling::validate`] is shared.
#[derive(Debug, Default)]
pub(crate) struct RawSampling<'a> {
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub length_penalty: Option<f64>,
    pub use_beam_search: Option<bool>,
    pub seed: Option<i128>,
    /// Already resolved to the endpoint's default and to the `max_tokens` /
    /// `max_completion_tokens` choice.
    pub max_tokens: Option<i64>,
    pub max_tokens_param: &'static str,
    pub min_tokens: Option<i64>,
    pub stop: Option<&'a StopInput>,
    pub stop_token_ids: Option<&'a [u32]>,
    pub include_stop_str_in_output: Option<bool>,
    pub ignore_eos: Option<bool>,
    pub logit_bias: Option<&'a BTreeMap<String, f64>>,
    pub allowed_token_ids: Option<&'a [u32]>,
    pub bad_words: Option<&'a [String]>,
    pub thinking_token_budget: Option<i64>,
    /// The field `thinking_token_budget` came from (empty: `thinking_token_budget`).
    pub thinking_budget_param: &'static str,
    /// Already mapped to a count of top alternatives (chat: `top_logprobs` when `logprobs`).
    pub logprobs: Option<i64>,
    pub logprobs_param: &'static str,
    pub prompt_logprobs: Option<i64>,
    pub skip_special_tokens: Option<bool>,
    pub spaces_between_special_tokens: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<&'a StreamOptions>,
    pub echo: bool,
    pub echo_without_generation: bool,
    pub priority: Option<i64>,
    pub request_id: Option<&'a str>,
    pub return_token_ids: Option<bool>,
    pub cache_salt: Option<&'a str>,
    pub truncate_prompt_tokens: Option<i64>,
    pub add_special_tokens: bool,
    pub response_format: Option<&'a ResponseFormat>,
    /// `structured_outputs` and the legacy `guided_*` fields.
    pub guided: Option<&'a GuidedDecodingParams>,
    pub prompt_param: &'static str,
}

fn check_finite(param: &str, value: f64) -> Result<(), ProtocolError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(ProtocolError::invalid(
            param,
            format!("{param} must be a finite number."),
        ))
    }
}

fn check_range(param: &str, value: f64, low: f64, high: f64) -> Result<f32, ProtocolError> {
    check_finite(param, value)?;
    if !(low..=high).contains(&value) {
        return Err(ProtocolError::invalid(
            param,
            format!("{param} must be in [{low}, {high}], got {value}."),
        ));
    }
    Ok(value as f32)
}

fn check_token_ids(param: &str, ids: &[u32], vocab_size: u32) -> Result<(), ProtocolError> {
    match ids.iter().find(|&&id| id >= vocab_size) {
        Some(id) => Err(ProtocolError::invalid(
            param,
            format!(
                "{param} contains token id {id}, which is out of vocabulary (size {vocab_size})."
            ),
        )),
        None => Ok(()),
    }
}

fn check_logprob_count(
    param: &str,
    value: Option<i64>,
    max_logprobs: u32,
) -> Result<Option<u32>, ProtocolError> {
    let Some(value) = value else { return Ok(None) };
    if value < 0 || value > i64::from(max_logprobs) {
        return Err(ProtocolError::invalid(
            param,
            format!("{param} must be between 0 and {max_logprobs}, got {value}."),
        ));
    }
    Ok(Some(value as u32))
}

impl RawSampling<'_> {
    pub(crate) fn validate(
        &self,
        limits: &ValidationLimits,
    ) -> Result<ValidatedSampling, ProtocolError> {
        let defaults = &limits.defaults;

        if self.use_beam_search == Some(true) {
            return Err(ProtocolError::unsupported(
                "use_beam_search",
                "Beam search is not supported by tokenmill.",
            ));
        }
        if let Some(length_penalty) = self.length_penalty {
            // Only beam search reads it; checked so a typo'd value still gets a clear error.
            check_finite("length_penalty", length_penalty)?;
        }

        let n = self.n.unwrap_or(1);
        if n < 1 {
            return Err(ProtocolError::invalid(
                "n",
                format!("n must be at least 1, got {n}."),
            ));
        }
        if n > i64::from(limits.max_n) {
            return Err(ProtocolError::invalid(
                "n",
                format!("n must be at most {}, got {n}.", limits.max_n),
            ));
        }
        let n = n as u32;
        if let Some(best_of) = self.best_of {
            if best_of < i64::from(n) {
                return Err(ProtocolError::invalid(
                    "best_of",
                    format!("best_of must be greater than or equal to n ({n}), got {best_of}."),
                ));
            }
            if best_of > i64::from(n) {
                return Err(ProtocolError::unsupported(
                    "best_of",
                    format!(
                        "best_of > n is not supported: tokenmill does not rank candidate \
                         sequences, so best_of must equal n ({n}) or be omitted; got {best_of}."
                    ),
                ));
            }
        }

        let temperature = match self.temperature {
            Some(value) => {
                check_finite("temperature", value)?;
                if value < 0.0 {
                    return Err(ProtocolError::invalid(
                        "temperature",
                        format!("temperature must be non-negative, got {value}."),
                    ));
                }
                check_range("temperature", value, 0.0, 2.0)?
            }
            None => defaults.temperature.unwrap_or(1.0),
        };
        let top_p = match self.top_p {
            Some(value) => {
                check_finite("top_p", value)?;
                if !(value > 0.0 && value <= 1.0) {
                    return Err(ProtocolError::invalid(
                        "top_p",
                        format!("top_p must be in (0, 1], got {value}."),
                    ));
                }
                // A positive value below f32's range (e.g. 5e-324) keeps only the most
                // likely token, as any top_p under its probability does; as an f32 it
                // would round to 0, which the sampler refuses.
                (value as f32).max(f32::MIN_POSITIVE)
            }
            None => defaults.top_p.unwrap_or(1.0),
        };
        let top_k_value = self.top_k.or(defaults.top_k).unwrap_or(0);
        let top_k = match top_k_value {
            // vLLM: 0 disables, -1 is quietly accepted as disabled too.
            -1 | 0 => None,
            value if value < -1 => {
                return Err(ProtocolError::invalid(
                    "top_k",
                    format!("top_k must be 0 or -1 (disabled), or at least 1, got {value}."),
                ));
            }
            value if value > i64::from(limits.vocab_size) => {
                return Err(ProtocolError::invalid(
                    "top_k",
                    format!(
                        "top_k cannot be greater than the vocabulary size ({}), got {value}.",
                        limits.vocab_size
                    ),
                ));
            }
            value => Some(value as u32),
        };
        let min_p = match self.min_p {
            Some(value) => check_range("min_p", value, 0.0, 1.0)?,
            None => defaults.min_p.unwrap_or(0.0),
        };
        let presence_penalty = match self.presence_penalty {
            Some(value) => check_range("presence_penalty", value, -2.0, 2.0)?,
            None => defaults.presence_penalty.unwrap_or(0.0),
        };
        let frequency_penalty = match self.frequency_penalty {
            Some(value) => check_range("frequency_penalty", value, -2.0, 2.0)?,
            None => defaults.frequency_penalty.unwrap_or(0.0),
        };
        let repetition_penalty = match self.repetition_penalty {
            Some(value) => {
                check_finite("repetition_penalty", value)?;
                // The sampler works in f32: the penalty must be a positive, finite f32 (a
                // positive f64 such as 5e-324 or 1e300 rounds to 0 or infinity there).
                let penalty = value as f32;
                if !(penalty > 0.0 && penalty.is_finite()) {
                    return Err(ProtocolError::invalid(
                        "repetition_penalty",
                        format!(
                            "repetition_penalty must be greater than zero and at most {}, got {value}.",
                            f32::MAX
                        ),
                    ));
                }
                penalty
            }
            None => defaults.repetition_penalty.unwrap_or(1.0),
        };

        let seed = match self.seed {
            None | Some(-1) => None,
            Some(value) if value < i128::from(i64::MIN) || value > i128::from(u64::MAX) => {
                return Err(ProtocolError::invalid(
                    "seed",
                    format!("seed must fit in a 64-bit integer, got {value}."),
                ));
            }
            // Negative seeds keep their two's-complement bits: distinct seeds stay distinct.
            Some(value) if value < 0 => Some(value as i64 as u64),
            Some(value) => Some(value as u64),
        };

        let max_tokens_param = self.max_tokens_param;
        let max_tokens = match self.max_tokens {
            None => None,
            Some(value) if value < 1 => {
                return Err(ProtocolError::invalid(
                    max_tokens_param,
                    format!("{max_tokens_param} must be at least 1, got {value}."),
                ));
            }
            Some(value) if value > i64::from(limits.max_model_len) => {
                return Err(ProtocolError::ContextLengthExceeded {
                    param: max_tokens_param.to_string(),
                    message: format!(
                        "{max_tokens_param} ({value}) is larger than this model's maximum \
                         context length of {} tokens.",
                        limits.max_model_len
                    ),
                });
            }
            Some(value) => Some(value as u32),
        };
        let min_tokens = self.min_tokens.unwrap_or(0);
        if min_tokens < 0 {
            return Err(ProtocolError::invalid(
                "min_tokens",
                format!("min_tokens must be greater than or equal to 0, got {min_tokens}."),
            ));
        }
        if let Some(max_tokens) = max_tokens {
            if min_tokens > i64::from(max_tokens) {
                return Err(ProtocolError::invalid(
                    "min_tokens",
                    format!(
                        "min_tokens must be less than or equal to \
                         {max_tokens_param}={max_tokens}, got {min_tokens}."
                    ),
                ));
            }
        }
        let min_tokens = u32::try_from(min_tokens).unwrap_or(u32::MAX);

        let stop = self.stop.map(StopInput::to_vec).unwrap_or_default();
        if stop.iter().any(String::is_empty) {
            return Err(ProtocolError::invalid(
                "stop",
                "stop cannot contain an empty string.",
            ));
        }
        let mut stop_token_ids: Vec<u32> = Vec::new();
        if let Some(ids) = self.stop_token_ids {
            check_token_ids("stop_token_ids", ids, limits.vocab_size)?;
            for &id in ids {
                if !stop_token_ids.contains(&id) {
                    stop_token_ids.push(id);
                }
            }
        }

        let mut logit_bias = Vec::new();
        if let Some(bias) = self.logit_bias {
            for (key, &value) in bias {
                let token_id: u32 = key.trim().parse().map_err(|_| {
                    ProtocolError::invalid(
                        "logit_bias",
                        format!(
                            "logit_bias key {key:?} is not a token id (a non-negative integer)."
                        ),
                    )
                })?;
                if token_id >= limits.vocab_size {
                    return Err(ProtocolError::invalid(
                        "logit_bias",
                        format!(
                            "logit_bias token id {token_id} is out of vocabulary (size {}).",
                            limits.vocab_size
                        ),
                    ));
                }
                if !value.is_finite() || !(-100.0..=100.0).contains(&value) {
                    return Err(ProtocolError::invalid(
                        "logit_bias",
                        format!("logit_bias values must be in [-100, 100], got {value} for token {token_id}."),
                    ));
                }
                logit_bias.push((token_id, value as f32));
            }
            logit_bias.sort_by_key(|&(token_id, _)| token_id);
            if logit_bias.windows(2).any(|pair| pair[0].0 == pair[1].0) {
                return Err(ProtocolError::invalid(
                    "logit_bias",
                    "logit_bias names the same token id twice.",
                ));
            }
        }

        let allowed_token_ids = match self.allowed_token_ids {
            None => None,
            Some([]) => {
                return Err(ProtocolError::invalid(
                    "allowed_token_ids",
                    "allowed_token_ids must not be empty.",
                ));
            }
            Some(ids) => {
                check_token_ids("allowed_token_ids", ids, limits.vocab_size)?;
                Some(ids.to_vec())
            }
        };
        let bad_words = self.bad_words.map(<[String]>::to_vec).unwrap_or_default();
        if bad_words.iter().any(|word| word.trim().is_empty()) {
            return Err(ProtocolError::invalid(
                "bad_words",
                "bad_words cannot contain an empty string.",
            ));
        }

        let thinking_budget_param = match self.thinking_budget_param {
            "" => "thinking_token_budget",
            param => param,
        };
        let thinking_token_budget = match self.thinking_token_budget {
            None => None,
            Some(tokens) => Some(ThinkingTokenBudget {
                tokens: u32::try_from(tokens).map_err(|_| {
                    ProtocolError::invalid(
                        thinking_budget_param,
                        format!(
                            "{thinking_budget_param} must be between 0 and {}, got {tokens}.",
                            u32::MAX
                        ),
                    )
                })?,
                param: thinking_budget_param,
            }),
        };

        let logprobs =
            check_logprob_count(self.logprobs_param, self.logprobs, limits.max_logprobs)?;
        let stream = self.stream.unwrap_or(false);
        let mut prompt_logprobs =
            check_logprob_count("prompt_logprobs", self.prompt_logprobs, limits.max_logprobs)?;
        if prompt_logprobs.is_some() && stream {
            return Err(ProtocolError::invalid(
                "prompt_logprobs",
                "prompt_logprobs are not available when stream is true.",
            ));
        }
        if prompt_logprobs.is_none() && self.echo {
            // Echoed prompt tokens carry logprobs when generated ones do (lm-eval scoring).
            prompt_logprobs = logprobs;
        }

        if self.stream_options.is_some() && !stream {
            return Err(ProtocolError::invalid(
                "stream_options",
                "stream_options can only be set when stream is true.",
            ));
        }
        let stream_options = self.stream_options.cloned().unwrap_or_default();

        let truncate_prompt_tokens = match self.truncate_prompt_tokens {
            None => None,
            Some(-1) => Some(limits.max_model_len),
            Some(value) if value < 1 => {
                return Err(ProtocolError::invalid(
                    "truncate_prompt_tokens",
                    format!("truncate_prompt_tokens must be -1 or at least 1, got {value}."),
                ));
            }
            Some(value) if value > i64::from(limits.max_model_len) => {
                return Err(ProtocolError::invalid(
                    "truncate_prompt_tokens",
                    format!(
                        "truncate_prompt_tokens ({value}) is greater than max_model_len ({}).",
                        limits.max_model_len
                    ),
                ));
            }
            Some(value) => Some(value as u32),
        };

        if let Some(salt) = self.cache_salt {
            if salt.is_empty() || salt.chars().count() > MAX_CACHE_SALT_LEN {
                return Err(ProtocolError::invalid(
                    "cache_salt",
                    format!("cache_salt must be 1 to {MAX_CACHE_SALT_LEN} characters long."),
                ));
            }
        }
        if let Some(request_id) = self.request_id {
            if request_id.is_empty() {
                return Err(ProtocolError::invalid(
                    "request_id",
                    "request_id must not be empty.",
                ));
            }
        }

        let response_format = match self.response_format {
            None => None,
            Some(format) => Some(match format.format_type.as_str() {
                "text" => ResponseFormatKind::Text,
                "json_object" => ResponseFormatKind::JsonObject,
                "json_schema" => {
                    if format.json_schema.is_none() {
                        return Err(ProtocolError::invalid(
                            "response_format",
                            "When response_format type is 'json_schema', the 'json_schema' \
                             field must be provided.",
                        ));
                    }
                    ResponseFormatKind::JsonSchema
                }
                other => {
                    return Err(ProtocolError::invalid(
                        "response_format",
                        format!(
                            "response_format type must be 'text', 'json_object' or \
                             'json_schema', got {other:?}."
                        ),
                    ));
                }
            }),
        };

        let structured_output = self
            .guided
            .cloned()
            .unwrap_or_default()
            .validate(self.response_format)?;

        let mut sampling = SamplingOptions {
            n,
            temperature,
            top_p,
            top_k,
            min_p,
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
            seed,
            max_tokens,
            min_tokens,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop,
            stop_token_ids,
            include_stop_str_in_output: self.include_stop_str_in_output.unwrap_or(false),
            logit_bias,
            allowed_token_ids,
            bad_words,
            logprobs,
            prompt_logprobs,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            spaces_between_special_tokens: self.spaces_between_special_tokens.unwrap_or(true),
            structured_output,
            thinking_token_budget,
        };
        if sampling.is_greedy() {
            if sampling.n > 1 {
                // As vLLM: n greedy choices would be n identical copies.
                return Err(ProtocolError::invalid(
                    "n",
                    format!("n must be 1 when using greedy sampling (temperature 0), got {n}."),
                ));
            }
            sampling.temperature = 0.0;
            sampling.top_p = 1.0;
            sampling.top_k = None;
            sampling.min_p = 0.0;
        }

        Ok(ValidatedSampling {
            sampling,
            output: OutputOptions {
                stream,
                include_usage: stream && stream_options.include_usage.unwrap_or(false),
                continuous_usage_stats: stream
                    && stream_options.continuous_usage_stats.unwrap_or(false),
                echo: self.echo,
                echo_without_generation: self.echo_without_generation,
                return_token_ids: self.return_token_ids.unwrap_or(false),
                priority: self.priority.unwrap_or(0),
                request_id: self.request_id.map(str::to_string),
                cache_salt: self.cache_salt.map(str::to_string),
                truncate_prompt_tokens,
                add_special_tokens: self.add_special_tokens,
                response_format,
                max_tokens_param,
                prompt_param: self.prompt_param,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawSampling<'static> {
        RawSampling {
            max_tokens: Some(16),
            max_tokens_param: "max_tokens",
            logprobs_param: "logprobs",
            prompt_param: "prompt",
            add_special_tokens: true,
            ..RawSampling::default()
        }
    }

    #[test]
    fn a_thinking_budget_is_checked_and_keeps_the_field_it_came_from() {
        let limits = ValidationLimits::new(2048, 49152);
        let budget = |tokens, param| RawSampling {
            thinking_token_budget: Some(tokens),
            thinking_budget_param: param,
            ..raw()
        };
        let chat = budget(0, "").validate(&limits).unwrap();
        assert_eq!(
            chat.sampling.thinking_token_budget,
            Some(ThinkingTokenBudget {
                tokens: 0,
                param: "thinking_token_budget"
            })
        );
        let anthropic = budget(2048, "thinking.budget_tokens")
            .validate(&limits)
            .unwrap();
        assert_eq!(
            anthropic.sampling.thinking_token_budget.map(|b| b.param),
            Some("thinking.budget_tokens")
        );
        let negative = budget(-1, "").validate(&limits).unwrap_err();
        assert!(
            negative.to_string().contains("thinking_token_budget"),
            "{negative}"
        );
    }

    #[test]
    fn defaults_are_openai_defaults() {
        let validated = raw().validate(&ValidationLimits::new(2048, 49152)).unwrap();
        let expected = SamplingOptions::default();
        assert_eq!(validated.sampling, expected);
        assert!(!validated.output.stream);
        assert_eq!(validated.output.priority, 0);
    }

    #[test]
    fn server_defaults_fill_gaps_but_request_wins() {
        let mut limits = ValidationLimits::new(2048, 49152);
        limits.defaults.temperature = Some(0.6);
        limits.defaults.top_k = Some(40);
        let from_defaults = raw().validate(&limits).unwrap();
        assert_eq!(from_defaults.sampling.temperature, 0.6);
        assert_eq!(from_defaults.sampling.top_k, Some(40));
        let request = RawSampling {
            temperature: Some(0.9),
            top_k: Some(-1),
            ..raw()
        };
        let from_request = request.validate(&limits).unwrap();
        assert_eq!(from_request.sampling.temperature, 0.9);
        assert_eq!(from_request.sampling.top_k, None);
    }

    #[test]
    fn greedy_clears_truncation() {
        let request = RawSampling {
            temperature: Some(0.0),
            top_p: Some(0.5),
            top_k: Some(5),
            min_p: Some(0.2),
            ..raw()
        };
        let sampling = request
            .validate(&ValidationLimits::new(2048, 100))
            .unwrap()
            .sampling;
        assert!(sampling.is_greedy());
        assert_eq!(
            (sampling.top_p, sampling.top_k, sampling.min_p),
            (1.0, None, 0.0)
        );
    }

    #[test]
    fn negative_seed_keeps_bits_and_minus_one_means_unseeded() {
        let limits = ValidationLimits::new(2048, 100);
        let negative = RawSampling {
            seed: Some(-2),
            ..raw()
        }
        .validate(&limits)
        .unwrap();
        assert_eq!(negative.sampling.seed, Some(u64::MAX - 1));
        let unseeded = RawSampling {
            seed: Some(-1),
            ..raw()
        }
        .validate(&limits)
        .unwrap();
        assert_eq!(unseeded.sampling.seed, None);
        let big = RawSampling {
            seed: Some(i128::from(u64::MAX)),
            ..raw()
        };
        assert_eq!(big.validate(&limits).unwrap().sampling.seed, Some(u64::MAX));
    }

    #[test]
    fn resolve_max_tokens_checks_the_context() {
        let limits = ValidationLimits::new(100, 1000);
        let validated = raw().validate(&limits).unwrap();
        assert_eq!(validated.resolve_max_tokens(84, &limits).unwrap(), 16);
        let error = validated.resolve_max_tokens(85, &limits).unwrap_err();
        assert_eq!(error.param(), Some("max_tokens"));
        assert!(
            error.message().contains("(16 > 100 - 85)"),
            "{}",
            error.message()
        );
        let error = validated.resolve_max_tokens(100, &limits).unwrap_err();
        assert_eq!(error.param(), Some("prompt"));

        let unbounded = RawSampling {
            max_tokens: None,
            ..raw()
        }
        .validate(&limits)
        .unwrap();
        assert_eq!(unbounded.resolve_max_tokens(30, &limits).unwrap(), 70);
        let mut with_default = limits.clone();
        with_default.defaults.max_tokens = Some(50);
        assert_eq!(unbounded.resolve_max_tokens(30, &with_default).unwrap(), 50);
        assert_eq!(unbounded.resolve_max_tokens(80, &with_default).unwrap(), 20);

        let min_tokens = RawSampling {
            max_tokens: None,
            min_tokens: Some(30),
            ..raw()
        };
        let min_tokens = min_tokens.validate(&limits).unwrap();
        let error = min_tokens.resolve_max_tokens(80, &limits).unwrap_err();
        assert_eq!(error.param(), Some("min_tokens"));
    }

    #[test]
    fn logit_bias_is_sorted_by_token_id() {
        let bias: BTreeMap<String, f64> = [("20".to_string(), 1.0), ("3".to_string(), -100.0)]
            .into_iter()
            .collect();
        let request = RawSampling {
            logit_bias: Some(&bias),
            ..raw()
        };
        let sampling = request
            .validate(&ValidationLimits::new(100, 1000))
            .unwrap()
            .sampling;
        assert_eq!(sampling.logit_bias, vec![(3, -100.0), (20, 1.0)]);
    }
}
