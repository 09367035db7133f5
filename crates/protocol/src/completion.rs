//! `POST /v1/completions`: the request (with vLLM's extra parameters), the response, and the
//! streaming chunk, including the legacy `logprobs` object lm-eval reads.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::common::{
    FinishReason, ResponseFormat, StopInput, StopReason, StreamOptions, TopLogprobMap, Usage,
};
use crate::error::ProtocolError;
use crate::sampling::{
    RawSampling, ValidatedSampling, ValidationLimits, COMPLETION_DEFAULT_MAX_TOKENS,
};
use crate::structured::GuidedDecodingParams;

/// `prompt`: a string, a list of strings, a list of token ids, or a list of token-id lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

/// One prompt of a (possibly batched) completions request, after checking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

const PROMPT_SHAPE: &str = "`prompt` must be a string, an array of strings, an array of token \
                            ids, or an array of arrays of token ids";

fn token_id_from(value: &serde_json::Value) -> Option<u32> {
    value.as_u64().and_then(|id| u32::try_from(id).ok())
}

fn token_ids_from(values: &[serde_json::Value]) -> Option<Vec<u32>> {
    values.iter().map(token_id_from).collect()
}

impl<'de> Deserialize<'de> for PromptInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde_json::Value;
        let items = match Value::deserialize(deserializer)? {
            Value::String(text) => return Ok(Self::Text(text)),
            Value::Array(items) => items,
            _ => return Err(D::Error::custom(PROMPT_SHAPE)),
        };
        // An empty list is well-formed JSON for every list variant; validation rejects it.
        match items.first() {
            None => Ok(Self::Texts(Vec::new())),
            Some(Value::String(_)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(text),
                    _ => Err(D::Error::custom(PROMPT_SHAPE)),
                })
                .collect::<Result<_, _>>()
                .map(Self::Texts),
            Some(Value::Number(_)) => token_ids_from(&items).map(Self::Tokens).ok_or_else(|| {
                D::Error::custom(format!("{PROMPT_SHAPE}; token ids are integers in 0..2^32"))
            }),
            Some(Value::Array(_)) => items
                .iter()
                .map(|item| match item {
                    Value::Array(ids) => token_ids_from(ids),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .map(Self::TokenBatches)
                .ok_or_else(|| D::Error::custom(PROMPT_SHAPE)),
            Some(_) => Err(D::Error::custom(PROMPT_SHAPE)),
        }
    }
}

impl PromptInput {
    /// The prompts as a flat list, rejecting empty prompts, out-of-vocabulary token ids and
    /// batches over `limits.max_prompts`.
    pub fn prompts(&self, limits: &ValidationLimits) -> Result<Vec<Prompt>, ProtocolError> {
        let prompts: Vec<Prompt> = match self {
            Self::Text(text) => vec![Prompt::Text(text.clone())],
            Self::Texts(texts) => texts.iter().cloned().map(Prompt::Text).collect(),
            Self::Tokens(ids) => vec![Prompt::Tokens(ids.clone())],
            Self::TokenBatches(batches) => batches.iter().cloned().map(Prompt::Tokens).collect(),
        };
        if prompts.is_empty() {
            return Err(ProtocolError::invalid(
                "prompt",
                "prompt must not be an empty list.",
            ));
        }
        if prompts.len() > limits.max_prompts {
            return Err(ProtocolError::invalid(
                "prompt",
                format!(
                    "prompt list length {} exceeds the maximum of {} prompts per request.",
                    prompts.len(),
                    limits.max_prompts
                ),
            ));
        }
        for prompt in &prompts {
            match prompt {
                Prompt::Text(text) if text.is_empty() => {
                    return Err(ProtocolError::invalid(
                        "prompt",
                        "prompt must not be empty.",
                    ));
                }
                Prompt::Tokens(ids) if ids.is_empty() => {
                    return Err(ProtocolError::invalid(
                        "prompt",
                        "prompt token id list must not be empty.",
                    ));
                }
                Prompt::Tokens(ids) => {
                    if let Some(id) = ids.iter().find(|&&id| id >= limits.vocab_size) {
                        return Err(ProtocolError::invalid(
                            "prompt",
                            format!(
                                "Token id {id} is out of vocabulary (size {}).",
                                limits.vocab_size
                            ),
                        ));
                    }
                }
                Prompt::Text(_) => {}
            }
        }
        Ok(prompts)
    }
}

/// `POST /v1/completions` body. Every field is optional on the wire (unknown fields are
/// ignored); defaults are applied by [`CompletionRequest::validate`] and documented per field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// Served model name; the server may default it when only one model is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<PromptInput>,
    /// Not supported: a non-null value is a 400.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Default 16. With `echo: true`, 0 scores the prompt without generating.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub max_tokens: Option<i64>,
    /// Default 1 (or the server's generation config); 0..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Default 1.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub n: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Legacy logprobs: the number of top alternatives per token, 0..=20.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub logprobs: Option<i64>,
    /// Prepend the prompt to each choice's text (and its logprobs to the choice's logprobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopInput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Only `best_of == n` is supported.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub best_of: Option<i64>,
    /// Token id (as a string) → bias in [-100, 100].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Any 64-bit integer; -1 means unseeded (vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i128>,
    /// Ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// 0 or -1 disables.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub top_k: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    /// Only used by beam search, which tokenmill does not implement; accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_penalty: Option<f64>,
    /// `true` is a 400 (beam search is not implemented).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_beam_search: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub min_tokens: Option<i64>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spaces_between_special_tokens: Option<bool>,
    /// Keep only the last this-many prompt tokens; -1 means max_model_len.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub truncate_prompt_tokens: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub prompt_logprobs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_token_ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bad_words: Option<Vec<String>>,
    /// vLLM's `thinking_token_budget`: the most tokens the output may spend reasoning
    /// (needs `--reasoning-parser`, whose markers the engine counts between and forces).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub thinking_token_budget: Option<i64>,
    /// Default true for completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// Default 0; lower runs earlier under priority scheduling.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_token_ids: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// `text`, `json_object` or `json_schema` (structured outputs, enforced by llguidance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// vLLM's `structured_outputs` and the legacy `guided_*` fields, at the top level.
    #[serde(flatten)]
    pub guided: GuidedDecodingParams,
}

impl CompletionRequest {
    /// Checks every parameter against vLLM's rules and `limits`, applying defaults.
    /// The prompt itself is checked by [`CompletionRequest::prompts`].
    pub fn validate(&self, limits: &ValidationLimits) -> Result<ValidatedSampling, ProtocolError> {
        if self.suffix.is_some() {
            return Err(ProtocolError::unsupported(
                "suffix",
                "suffix is not supported.",
            ));
        }
        if self.prompt.is_none() {
            return Err(ProtocolError::invalid("prompt", "prompt is required."));
        }
        let echo = self.echo.unwrap_or(false);
        let requested_max_tokens = self
            .max_tokens
            .unwrap_or(i64::from(COMPLETION_DEFAULT_MAX_TOKENS));
        let echo_without_generation = echo && requested_max_tokens == 0;
        let raw = RawSampling {
            n: self.n,
            best_of: self.best_of,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            length_penalty: self.length_penalty,
            use_beam_search: self.use_beam_search,
            seed: self.seed,
            max_tokens: Some(if echo_without_generation {
                1
            } else {
                requested_max_tokens
            }),
            max_tokens_param: "max_tokens",
            min_tokens: self.min_tokens,
            stop: self.stop.as_ref(),
            stop_token_ids: self.stop_token_ids.as_deref(),
            include_stop_str_in_output: self.include_stop_str_in_output,
            ignore_eos: self.ignore_eos,
            logit_bias: self.logit_bias.as_ref(),
            allowed_token_ids: self.allowed_token_ids.as_deref(),
            bad_words: self.bad_words.as_deref(),
            thinking_token_budget: self.thinking_token_budget,
            thinking_budget_param: "thinking_token_budget",
            logprobs: self.logprobs,
            logprobs_param: "logprobs",
            prompt_logprobs: self.prompt_logprobs,
            skip_special_tokens: self.skip_special_tokens,
            spaces_between_special_tokens: self.spaces_between_special_tokens,
            stream: self.stream,
            stream_options: self.stream_options.as_ref(),
            echo,
            echo_without_generation,
            priority: self.priority,
            request_id: self.request_id.as_deref(),
            return_token_ids: self.return_token_ids,
            cache_salt: self.cache_salt.as_deref(),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            add_special_tokens: self.add_special_tokens.unwrap_or(true),
            response_format: self.response_format.as_ref(),
            guided: Some(&self.guided),
            prompt_param: "prompt",
        };
        raw.validate(limits)
    }

    /// The checked prompts (see [`PromptInput::prompts`]).
    pub fn prompts(&self, limits: &ValidationLimits) -> Result<Vec<Prompt>, ProtocolError> {
        match &self.prompt {
            Some(prompt) => prompt.prompts(limits),
            None => Err(ProtocolError::invalid("prompt", "prompt is required.")),
        }
    }
}

/// Legacy completions logprobs, one entry per token. With `echo`, the prompt's tokens come
/// first and the very first one has `null` logprob and `null` top_logprobs (nothing precedes
/// it). `text_offset` counts characters (Unicode scalar values) into the choice's text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    #[serde(default)]
    pub tokens: Vec<String>,
    #[serde(default)]
    pub token_logprobs: Vec<Option<f32>>,
    #[serde(default)]
    pub top_logprobs: Vec<Option<TopLogprobMap>>,
    #[serde(default)]
    pub text_offset: Vec<u32>,
}

/// One prompt-token alternative in vLLM's `prompt_logprobs` (keyed by token id as a string).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptLogprob {
    pub logprob: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoded_token: Option<String>,
}

/// vLLM's `prompt_logprobs`: per prompt position, token id → logprob (`null` at position 0).
pub type PromptLogprobs = Vec<Option<BTreeMap<String, PromptLogprob>>>;

/// One choice of a non-streaming completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// With `return_token_ids`: the generated token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// With `return_token_ids`: the prompt's token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `prompt_logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// `POST /v1/completions` response (`object: "text_completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

impl CompletionResponse {
    pub const OBJECT: &'static str = "text_completion";

    /// A response with `object` set; `created` is passed in (Unix seconds).
    pub fn new(
        id: String,
        created: u64,
        model: String,
        choices: Vec<CompletionChoice>,
        usage: Usage,
    ) -> Self {
        Self {
            id,
            object: Self::OBJECT.to_string(),
            created,
            model,
            choices,
            usage,
        }
    }
}

/// One choice's delta in a streamed completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionStreamChoice {
    pub index: u32,
    pub text: String,
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// With `return_token_ids`: this chunk's new token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// With `return_token_ids`: the prompt's ids, on the choice's first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// One SSE `data:` payload of a streamed completion. The final usage chunk (with
/// `stream_options.include_usage`) has empty `choices` and `usage` set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionStreamChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionStreamChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl CompletionStreamChunk {
    /// A chunk with `object` set (streamed completions reuse `"text_completion"`).
    pub fn new(
        id: String,
        created: u64,
        model: String,
        choices: Vec<CompletionStreamChoice>,
    ) -> Self {
        Self {
            id,
            object: CompletionResponse::OBJECT.to_string(),
            created,
            model,
            choices,
            usage: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompt_shapes_parse() {
        let parse = |value| serde_json::from_value::<PromptInput>(value);
        assert_eq!(parse(json!("hi")).unwrap(), PromptInput::Text("hi".into()));
        assert_eq!(
            parse(json!(["a", "b"])).unwrap(),
            PromptInput::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            parse(json!([1, 2, 3])).unwrap(),
            PromptInput::Tokens(vec![1, 2, 3])
        );
        assert_eq!(
            parse(json!([[1], [2, 3]])).unwrap(),
            PromptInput::TokenBatches(vec![vec![1], vec![2, 3]])
        );
        for bad in [
            json!(3),
            json!([1, "a"]),
            json!([-1]),
            json!([1.5]),
            json!([[1], 2]),
            json!({}),
        ] {
            let error = parse(bad.clone()).unwrap_err();
            assert!(
                error.to_string().contains("`prompt` must be"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn echo_with_zero_max_tokens_scores_the_prompt() {
        let request: CompletionRequest = serde_json::from_value(
            json!({"prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 1}),
        )
        .unwrap();
        let validated = request.validate(&ValidationLimits::new(128, 1000)).unwrap();
        assert!(validated.output.echo_without_generation);
        assert_eq!(validated.sampling.max_tokens, Some(1));
        assert_eq!(validated.sampling.prompt_logprobs, Some(1));
    }
}
