//! OpenAI's Responses API (`POST /v1/responses`): the request (strict: an unknown field is
//! a 400 naming it), its input items, and how they become the chat path's conversation,
//! template options and OpenAI-shaped tools. The response object and the stream events are
//! in `responses_object.rs`.
//!
//! Items in, chat messages out: `message` items (`input_text` / `output_text` / `refusal`
//! parts joined with `"\n"`) become messages of their role; consecutive `function_call`
//! items become one assistant message's `tool_calls` (joined to the assistant text just
//! before them); a `function_call_output` becomes a `tool` message and must answer a call
//! made earlier in the conversation. `custom_tool_call` items are calls of their tool's
//! function with `{"input": ...}` as arguments (`responses_tools.rs`), their
//! `custom_tool_call_output`s tool messages like a function's; a call of a `namespace` tool
//! is rendered under its `namespace.name`. `reasoning` items are accepted and not rendered:
//! chat templates have no place for earlier reasoning (as with Anthropic's thinking blocks);
//! an `encrypted_content` must be one this server wrote ([`encode_reasoning`]).
//! `instructions` are a first system message and, as in OpenAI, not carried over by
//! `previous_response_id`.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::chat::{ChatTemplateOptions, ConversationMessage, Role};
use crate::common::{ResponseFormat, StopInput};
use crate::error::ProtocolError;
use crate::responses_tools::{custom_arguments, model_tool_name};
use crate::sampling::{RawSampling, ValidatedSampling, ValidationLimits};

/// Built-in tools that need a hosted service: declared ones are not offered to the model
/// (the response says which in its `x-tokenmill-skipped-tools` header); forcing one is a 400.
pub const HOSTED_TOOL_TYPES: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "web_search_2025_08_26",
    "file_search",
    "computer_use",
    "computer_use_preview",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
];

/// The `include` values served.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";
/// Reasoning items carry `encrypted_content`: see [`encode_reasoning`].
pub const INCLUDE_ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";

/// What starts the `encrypted_content` this server writes.
const REASONING_CONTENT_PREFIX: &str = "tokenmill:";

/// A reasoning item's `encrypted_content` (with `include: ["reasoning.encrypted_content"]`):
/// the reasoning text, base64-encoded behind a `tokenmill:` prefix. Not encrypted: the
/// server holds no secret, and the same text is in the item's `content`. Clients that keep
/// no state (`store: false`) send the item back as they got it; [`decode_reasoning`] checks
/// it.
pub fn encode_reasoning(text: &str) -> String {
    use base64::Engine as _;
    format!(
        "{REASONING_CONTENT_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(text)
    )
}

/// The reasoning text of an `encrypted_content` this server wrote (`None`: not one of
/// ours, e.g. another provider's ciphertext).
pub fn decode_reasoning(encrypted: &str) -> Option<String> {
    use base64::Engine as _;
    let encoded = encrypted.strip_prefix(REASONING_CONTENT_PREFIX)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// Who wrote a message item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemRole {
    User,
    Assistant,
    System,
    Developer,
}

impl ItemRole {
    fn chat_role(self) -> Role {
        match self {
            Self::User => Role::User,
            Self::Assistant => Role::Assistant,
            Self::System => Role::System,
            Self::Developer => Role::Developer,
        }
    }
}

/// One part of a message item's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentPart {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
        #[serde(default)]
        annotations: Vec<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<Vec<Value>>,
    },
    Refusal {
        refusal: String,
    },
}

impl ContentPart {
    fn text(&self) -> &str {
        match self {
            Self::InputText { text } | Self::OutputText { text, .. } => text,
            Self::Refusal { refusal } => refusal,
        }
    }
}

/// A message item's content: a string or parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for ItemContent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        const SHAPE: &str = "content must be a string or an array of parts (input_text, \
                             output_text, refusal)";
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            value @ Value::Array(_) => serde_json::from_value(value)
                .map(Self::Parts)
                .map_err(|error| D::Error::custom(format!("{SHAPE}: {error}"))),
            _ => Err(D::Error::custom(SHAPE)),
        }
    }
}

/// `{"type": "message", "role", "content"}` (the `type` may be left out on input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub role: ItemRole,
    pub content: ItemContent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub call_id: String,
    pub name: String,
    pub arguments: String,
    /// The `namespace` tool the function belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A call the model made to a custom (free-form) tool: its `input` is raw text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomToolCallItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub call_id: String,
    pub name: String,
    pub input: String,
    /// The `namespace` tool the custom tool belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A call's result, sent back by the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallOutputItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub call_id: String,
    pub output: ItemContent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A custom call's result, sent back by the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomToolCallOutputItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub call_id: String,
    pub output: ItemContent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A text part of a reasoning item (`summary_text` or `reasoning_text`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningPart {
    #[serde(rename = "type")]
    pub part_type: String,
    pub text: String,
}

/// The model's reasoning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub summary: Vec<ReasoningPart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<ReasoningPart>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// An input or output item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    CustomToolCall(CustomToolCallItem),
    CustomToolCallOutput(CustomToolCallOutputItem),
    Reasoning(ReasoningItem),
}

/// The item types this server takes.
const ITEM_TYPES: &[&str] = &[
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
];

impl Item {
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Message(m) => m.id.as_deref(),
            Self::FunctionCall(c) => c.id.as_deref(),
            Self::FunctionCallOutput(o) => o.id.as_deref(),
            Self::CustomToolCall(c) => c.id.as_deref(),
            Self::CustomToolCallOutput(o) => o.id.as_deref(),
            Self::Reasoning(r) => r.id.as_deref(),
        }
    }

    /// As stored and listed (OpenAI's shape): an id (of its type's prefix) if it has none, a
    /// message's string content as one text part.
    fn normalize(&mut self) {
        if let Self::Message(message) = self {
            if let ItemContent::Text(text) = &message.content {
                let text = text.clone();
                message.content = ItemContent::Parts(vec![match message.role {
                    ItemRole::Assistant => ContentPart::OutputText {
                        text,
                        annotations: Vec::new(),
                        logprobs: None,
                    },
                    _ => ContentPart::InputText { text },
                }]);
            }
        }
        let (slot, prefix) = match self {
            Self::Message(m) => (&mut m.id, "msg_"),
            Self::FunctionCall(c) => (&mut c.id, "fc_"),
            Self::FunctionCallOutput(o) => (&mut o.id, "fco_"),
            Self::CustomToolCall(c) => (&mut c.id, "ctc_"),
            Self::CustomToolCallOutput(o) => (&mut o.id, "ctco_"),
            Self::Reasoning(r) => (&mut r.id, "rs_"),
        };
        if slot.is_none() {
            *slot = Some(item_id(prefix));
        }
    }
}

/// `prefix` and 24 alphanumerics (OpenAI's id shape).
pub fn item_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 24)
    )
}

/// `resp_` and 24 alphanumerics.
pub fn response_id() -> String {
    item_id("resp_")
}

/// `input`: a string (one user message) or items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<Value>),
}

/// `text`: the output format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    #[serde(default)]
    pub format: Option<TextFormat>,
    /// Only `medium` (the model's own length) is served.
    #[serde(default)]
    pub verbosity: Option<String>,
}

/// `text.format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TextFormat {
    Text {},
    JsonObject {},
    JsonSchema {
        name: String,
        schema: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

/// `reasoning`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    /// `none`, `minimal`, `low`, `medium`, `high`: passed to the chat template as
    /// `reasoning_effort` (and `enable_thinking: false` for `none`).
    #[serde(default)]
    pub effort: Option<String>,
    /// Only `auto` (which may give no summary) is served: the server writes no summaries.
    #[serde(default)]
    pub summary: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseStreamOptions {
    #[serde(default)]
    pub include_obfuscation: Option<bool>,
}

/// `POST /v1/responses` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub input: Option<ResponseInput>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, deserialize_with = "crate::common::object_only")]
    pub text: Option<TextConfig>,
    #[serde(default, deserialize_with = "crate::common::object_only")]
    pub reasoning: Option<ReasoningConfig>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub include: Option<Vec<String>>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub user: Option<String>,
    /// `disabled` (default: too long is a 400) or `auto` (the oldest items are dropped).
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default, deserialize_with = "crate::common::object_only")]
    pub stream_options: Option<ResponseStreamOptions>,
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub background: Option<bool>,
    /// `auto` or `default` (one tier here).
    #[serde(default)]
    pub service_tier: Option<String>,
    // vLLM's extra sampling fields, as chat completions takes them.
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub seed: Option<i128>,
    #[serde(default)]
    pub stop: Option<StopInput>,
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    #[serde(default)]
    pub min_tokens: Option<i64>,
    #[serde(default)]
    pub include_stop_str_in_output: Option<bool>,
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
    #[serde(default)]
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    #[serde(default)]
    pub allowed_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub bad_words: Option<Vec<String>>,
    #[serde(default)]
    pub priority: Option<i64>,
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// OpenAI's cache-routing hint: echoed. Every request here shares one automatic prefix
    /// cache (`cache_salt` isolates), so no routing is needed for a key's requests to hit.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// The client's own string tags (Codex sends its session and turn ids): logged with the
    /// request under `--enable-log-requests`, as `user` is.
    #[serde(default)]
    pub client_metadata: Option<Map<String, Value>>,
}

impl ResponsesRequest {
    /// Whether the stream or background flags are set.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn is_background(&self) -> bool {
        self.background.unwrap_or(false)
    }

    /// Whether reasoning items carry `encrypted_content` (`include`).
    pub fn includes_encrypted_reasoning(&self) -> bool {
        self.include
            .iter()
            .flatten()
            .any(|value| value == INCLUDE_ENCRYPTED_REASONING)
    }

    /// Whether logprobs go into the output text parts (`include`).
    pub fn includes_logprobs(&self) -> bool {
        self.include
            .iter()
            .flatten()
            .any(|value| value == INCLUDE_LOGPROBS)
    }

    /// Sampling and output settings, checked (the budget against the context later, once the
    /// prompt is tokenized). Fields that are not served are a 400 here.
    pub fn validate(&self, limits: &ValidationLimits) -> Result<ValidatedSampling, ProtocolError> {
        for (index, value) in self.include.iter().flatten().enumerate() {
            if value != INCLUDE_LOGPROBS && value != INCLUDE_ENCRYPTED_REASONING {
                return Err(ProtocolError::unsupported(
                    format!("include[{index}]"),
                    format!(
                        "include[{index}]: {value:?} is not supported; only \
                         {INCLUDE_LOGPROBS:?} and {INCLUDE_ENCRYPTED_REASONING:?} are (no \
                         hosted tools run here)."
                    ),
                ));
            }
        }
        check_client_metadata(self.client_metadata.as_ref())?;
        if self.top_logprobs.is_some_and(|k| k > 0) && !self.includes_logprobs() {
            return Err(ProtocolError::invalid(
                "top_logprobs",
                format!("top_logprobs needs include: [{INCLUDE_LOGPROBS:?}]."),
            ));
        }
        if let Some(options) = &self.stream_options {
            if options.include_obfuscation == Some(true) {
                return Err(ProtocolError::unsupported(
                    "stream_options.include_obfuscation",
                    "stream_options.include_obfuscation: true is not supported (no obfuscation \
                     padding is added to stream events).",
                ));
            }
            if !self.is_stream() {
                return Err(ProtocolError::invalid(
                    "stream_options",
                    "stream_options needs stream: true.",
                ));
            }
        }
        if let Some(tier) = self.service_tier.as_deref() {
            if !matches!(tier, "auto" | "default") {
                return Err(ProtocolError::unsupported(
                    "service_tier",
                    format!("service_tier {tier:?} is not served; this server has one tier (\"default\")."),
                ));
            }
        }
        match self.truncation.as_deref() {
            None | Some("disabled" | "auto") => {}
            Some(other) => {
                return Err(ProtocolError::invalid(
                    "truncation",
                    format!("truncation must be \"auto\" or \"disabled\", got {other:?}."),
                ))
            }
        }
        if let Some(verbosity) = self.text.as_ref().and_then(|t| t.verbosity.as_deref()) {
            if verbosity != "medium" {
                return Err(ProtocolError::unsupported(
                    "text.verbosity",
                    format!(
                        "text.verbosity {verbosity:?} is not supported; only \"medium\" (the \
                         model's own length) is."
                    ),
                ));
            }
        }
        if let Some(reasoning) = &self.reasoning {
            if let Some(summary) = reasoning.summary.as_deref() {
                if summary != "auto" {
                    return Err(ProtocolError::unsupported(
                        "reasoning.summary",
                        format!(
                            "reasoning.summary {summary:?} is not supported: this server writes \
                             no reasoning summaries (\"auto\" is accepted and gives none)."
                        ),
                    ));
                }
            }
            if let Some(effort) = reasoning.effort.as_deref() {
                if !matches!(effort, "none" | "minimal" | "low" | "medium" | "high") {
                    return Err(ProtocolError::invalid(
                        "reasoning.effort",
                        format!("reasoning.effort must be one of none, minimal, low, medium, high; got {effort:?}."),
                    ));
                }
            }
        }
        if self.is_background() && self.store == Some(false) {
            return Err(ProtocolError::invalid(
                "background",
                "background responses need store: true.",
            ));
        }
        check_metadata(self.metadata.as_ref())?;
        if let Some(max) = self.max_output_tokens {
            if max < 1 {
                return Err(ProtocolError::invalid(
                    "max_output_tokens",
                    format!("max_output_tokens must be at least 1, got {max}."),
                ));
            }
        }
        let response_format = match self.text.as_ref().and_then(|t| t.format.as_ref()) {
            None | Some(TextFormat::Text {}) => None,
            Some(TextFormat::JsonObject {}) => Some(ResponseFormat {
                format_type: "json_object".into(),
                json_schema: None,
            }),
            Some(TextFormat::JsonSchema { name, schema, .. }) => Some(ResponseFormat {
                format_type: "json_schema".into(),
                json_schema: Some(json!({"name": name, "schema": schema})),
            }),
        };
        let raw = RawSampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            max_tokens: self.max_output_tokens,
            max_tokens_param: "max_output_tokens",
            min_tokens: self.min_tokens,
            stop: self.stop.as_ref(),
            stop_token_ids: self.stop_token_ids.as_deref(),
            include_stop_str_in_output: self.include_stop_str_in_output,
            ignore_eos: self.ignore_eos,
            logit_bias: self.logit_bias.as_ref(),
            allowed_token_ids: self.allowed_token_ids.as_deref(),
            bad_words: self.bad_words.as_deref(),
            logprobs: self
                .includes_logprobs()
                .then_some(self.top_logprobs.unwrap_or(0)),
            logprobs_param: "top_logprobs",
            skip_special_tokens: self.skip_special_tokens,
            stream: self.stream,
            priority: self.priority,
            request_id: self.request_id.as_deref(),
            cache_salt: self.cache_salt.as_deref(),
            response_format: response_format.as_ref(),
            prompt_param: "input",
            ..RawSampling::default()
        };
        let mut validated = raw.validate(limits)?;
        if let Some(structured) = &mut validated.sampling.structured_output {
            // Name the Responses field in a schema's compile error.
            if structured.param == "response_format.json_schema.schema" {
                structured.param = "text.format.schema";
            } else if structured.param == "response_format" {
                structured.param = "text.format";
            }
        }
        Ok(validated)
    }

    /// The request's own input as items, each with an id (a string is one user message).
    pub fn input_items(&self) -> Result<Vec<Item>, ProtocolError> {
        match &self.input {
            None => Err(ProtocolError::invalid("input", "input is required.")),
            Some(ResponseInput::Text(text)) => Ok(vec![Item::Message(MessageItem {
                id: Some(item_id("msg_")),
                role: ItemRole::User,
                content: ItemContent::Parts(vec![ContentPart::InputText { text: text.clone() }]),
                status: None,
            })]),
            Some(ResponseInput::Items(values)) => values
                .iter()
                .enumerate()
                .map(|(index, value)| parse_item(index, value))
                .collect(),
        }
    }

    /// The chat-template settings: `reasoning.effort` as `reasoning_effort` (and
    /// `enable_thinking: false` for `none`).
    pub fn template_options(&self) -> ChatTemplateOptions {
        let mut kwargs = Map::new();
        if let Some(effort) = self.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
            kwargs.insert("reasoning_effort".into(), Value::String(effort.into()));
            if effort == "none" {
                kwargs.insert("enable_thinking".into(), Value::Bool(false));
            }
        }
        ChatTemplateOptions {
            add_generation_prompt: true,
            continue_final_message: false,
            chat_template: None,
            chat_template_kwargs: kwargs,
            documents: None,
            tools: None,
        }
    }
}

/// `client_metadata`: string values only (they are logged as given).
fn check_client_metadata(metadata: Option<&Map<String, Value>>) -> Result<(), ProtocolError> {
    for (key, value) in metadata.into_iter().flatten() {
        if !value.is_string() {
            return Err(ProtocolError::invalid(
                "client_metadata",
                format!("client_metadata[{key:?}] must be a string."),
            ));
        }
    }
    Ok(())
}

fn check_metadata(metadata: Option<&Map<String, Value>>) -> Result<(), ProtocolError> {
    let Some(metadata) = metadata else {
        return Ok(());
    };
    if metadata.len() > 16 {
        return Err(ProtocolError::invalid(
            "metadata",
            "metadata holds at most 16 keys.",
        ));
    }
    for (key, value) in metadata {
        let ok =
            key.chars().count() <= 64 && value.as_str().is_some_and(|v| v.chars().count() <= 512);
        if !ok {
            return Err(ProtocolError::invalid(
                "metadata",
                format!(
                    "metadata[{key:?}]: keys are at most 64 characters, values strings of at \
                     most 512."
                ),
            ));
        }
    }
    Ok(())
}

/// One input item, checked (an unknown type is a 400 naming `input[i].type`).
fn parse_item(index: usize, value: &Value) -> Result<Item, ProtocolError> {
    let place = format!("input[{index}]");
    let Some(object) = value.as_object() else {
        return Err(ProtocolError::invalid(
            place.clone(),
            format!("{place} must be an object."),
        ));
    };
    let mut object = object.clone();
    let kind = match object.get("type") {
        None if object.contains_key("role") => {
            object.insert("type".into(), Value::String("message".into()));
            "message".to_string()
        }
        Some(Value::String(kind)) => kind.clone(),
        _ => {
            return Err(ProtocolError::invalid(
                format!("{place}.type"),
                format!("{place} needs a string `type`."),
            ))
        }
    };
    if !ITEM_TYPES.contains(&kind.as_str()) {
        return Err(ProtocolError::unsupported(
            format!("{place}.type"),
            format!(
                "{place}.type: item type {kind:?} is not supported; this server takes {}.",
                ITEM_TYPES.join(", ")
            ),
        ));
    }
    let mut item: Item = serde_json::from_value(Value::Object(object))
        .map_err(|e| ProtocolError::invalid(place.clone(), format!("{place}: {e}")))?;
    if let Item::Reasoning(reasoning) = &item {
        if let Some(encrypted) = &reasoning.encrypted_content {
            if decode_reasoning(encrypted).is_none() {
                return Err(ProtocolError::unsupported(
                    format!("{place}.encrypted_content"),
                    format!(
                        "{place}.encrypted_content was not written by this server (it can \
                         only read back the encrypted_content it sends); send the reasoning \
                         item without it."
                    ),
                ));
            }
        }
    }
    item.normalize();
    Ok(item)
}

fn parts_text(content: &ItemContent) -> String {
    match content {
        ItemContent::Text(text) => text.clone(),
        ItemContent::Parts(parts) => parts
            .iter()
            .map(ContentPart::text)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn chat_message(role: Role, content: Option<String>) -> ConversationMessage {
    ConversationMessage {
        reasoning_content: None,
        role,
        content,
        name: None,
        tool_call_id: None,
        tool_calls: None,
    }
}

/// Adds a call to the assistant message just before it (or a new one).
fn push_call(messages: &mut Vec<ConversationMessage>, call_id: &str, name: &str, arguments: &str) {
    let entry = json!({
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    });
    if let Some(last) = messages
        .last_mut()
        .filter(|last| last.role == Role::Assistant)
    {
        last.tool_calls.get_or_insert_with(Vec::new).push(entry);
    } else {
        messages.push(ConversationMessage {
            tool_calls: Some(vec![entry]),
            ..chat_message(Role::Assistant, None)
        });
    }
}

/// The chat conversation of `items` (earlier context first, then this request's input)
/// after `instructions`. A `function_call_output` whose `call_id` no earlier call made is a
/// 400.
pub fn items_conversation(
    instructions: Option<&str>,
    items: &[Item],
) -> Result<Vec<ConversationMessage>, ProtocolError> {
    let mut messages = Vec::new();
    if let Some(instructions) = instructions {
        messages.push(chat_message(Role::System, Some(instructions.to_string())));
    }
    let mut calls: HashSet<&str> = HashSet::new();
    for item in items {
        match item {
            Item::Message(message) => messages.push(chat_message(
                message.role.chat_role(),
                Some(parts_text(&message.content)),
            )),
            Item::FunctionCall(call) => {
                calls.insert(call.call_id.as_str());
                let name = model_tool_name(call.namespace.as_deref(), &call.name);
                push_call(&mut messages, &call.call_id, &name, &call.arguments);
            }
            Item::CustomToolCall(call) => {
                calls.insert(call.call_id.as_str());
                let name = model_tool_name(call.namespace.as_deref(), &call.name);
                push_call(
                    &mut messages,
                    &call.call_id,
                    &name,
                    &custom_arguments(&call.input),
                );
            }
            Item::FunctionCallOutput(FunctionCallOutputItem {
                call_id, output, ..
            })
            | Item::CustomToolCallOutput(CustomToolCallOutputItem {
                call_id, output, ..
            }) => {
                if !calls.contains(call_id.as_str()) {
                    return Err(ProtocolError::invalid(
                        "input",
                        format!(
                            "No tool call found for tool call output with call_id {call_id:?}."
                        ),
                    ));
                }
                messages.push(ConversationMessage {
                    tool_call_id: Some(call_id.clone()),
                    ..chat_message(Role::Tool, Some(parts_text(output)))
                });
            }
            // Not rendered: see the module docs.
            Item::Reasoning(_) => {}
        }
    }
    if messages.is_empty() {
        return Err(ProtocolError::invalid(
            "input",
            "input holds nothing to answer.",
        ));
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ResponsesRequest, ProtocolError> {
        crate::anthropic::parse_anthropic(body.to_string().as_bytes())
    }

    #[test]
    fn object_settings_refuse_arrays() {
        for field in ["reasoning", "text", "stream_options"] {
            let error = parse(json!({"input": "hi", field: [null, null]})).unwrap_err();
            assert!(error.message().contains("an object"), "{field}: {error}");
            assert!(
                parse(json!({"input": "hi", field: null})).is_ok(),
                "{field}"
            );
        }
        let request = parse(json!({"input": "hi", "reasoning": {"effort": "low"}})).unwrap();
        assert_eq!(request.reasoning.unwrap().effort.as_deref(), Some("low"));
    }

    #[test]
    fn unknown_fields_and_item_types_are_400s_naming_them() {
        let error = parse(json!({"input": "hi", "prompt": {"id": "p"}})).unwrap_err();
        assert!(error.message().contains("prompt"), "{error}");
        let request = parse(json!({"input": [{"type": "web_search_call", "id": "x"}]})).unwrap();
        let error = request.input_items().unwrap_err();
        assert_eq!(error.param(), Some("input[0].type"));
        let request =
            parse(json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}))
                .unwrap();
        assert!(request
            .input_items()
            .unwrap_err()
            .message()
            .contains("input_image"));
    }

    #[test]
    fn items_render_as_the_chat_tool_round_trip() {
        let request = parse(json!({
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            ]
        }))
        .unwrap();
        let items = request.input_items().unwrap();
        assert!(items.iter().all(|item| item.id().is_some()));
        let conversation = items_conversation(request.instructions.as_deref(), &items).unwrap();
        let roles: Vec<&str> = conversation.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(conversation[2].content.as_deref(), Some("Checking."));
        let calls = conversation[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(conversation[3].tool_call_id.as_deref(), Some("call_1"));
        // An orphan output is a 400.
        let orphan = parse(json!({"input": [
            {"type": "function_call_output", "call_id": "nope", "output": "x"}
        ]}))
        .unwrap();
        let error = items_conversation(None, &orphan.input_items().unwrap()).unwrap_err();
        assert!(error.message().contains("nope"), "{error}");
    }

    #[test]
    fn custom_and_namespaced_calls_render_as_function_calls() {
        let request = parse(json!({
            "input": [
                {"role": "user", "content": "Patch it."},
                {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": "*** Begin Patch\n"},
                {"type": "function_call", "call_id": "call_2", "name": "spawn", "namespace": "agents", "arguments": "{}"},
                {"type": "custom_tool_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "done"}]},
                {"type": "function_call_output", "call_id": "call_2", "output": "spawned"},
            ]
        }))
        .unwrap();
        let items = request.input_items().unwrap();
        assert!(items[1].id().is_some_and(|id| id.starts_with("ctc_")));
        assert!(items[3].id().is_some_and(|id| id.starts_with("ctco_")));
        let conversation = items_conversation(None, &items).unwrap();
        let roles: Vec<&str> = conversation.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool"]);
        let calls = conversation[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["function"]["name"], "apply_patch");
        assert_eq!(
            calls[0]["function"]["arguments"],
            "{\"input\":\"*** Begin Patch\\n\"}"
        );
        assert_eq!(calls[1]["function"]["name"], "agents.spawn");
        assert_eq!(conversation[2].content.as_deref(), Some("done"));
        let orphan = parse(json!({"input": [
            {"type": "custom_tool_call_output", "call_id": "nope", "output": "x"}
        ]}))
        .unwrap();
        let error = items_conversation(None, &orphan.input_items().unwrap()).unwrap_err();
        assert!(error.message().contains("nope"), "{error}");
    }

    #[test]
    fn encrypted_reasoning_is_ours_or_a_400() {
        let encoded = encode_reasoning("think \u{e9}");
        assert!(encoded.starts_with("tokenmill:"));
        assert_eq!(decode_reasoning(&encoded).as_deref(), Some("think \u{e9}"));
        assert_eq!(decode_reasoning("gAAAAABfoo"), None);
        let ours = parse(json!({"input": [
            {"type": "reasoning", "summary": [], "encrypted_content": encoded},
            {"role": "user", "content": "go on"},
        ]}))
        .unwrap();
        assert!(ours.input_items().is_ok());
        let foreign = parse(json!({"input": [
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABfoo"},
        ]}))
        .unwrap();
        assert_eq!(
            foreign.input_items().unwrap_err().param(),
            Some("input[0].encrypted_content")
        );
        let limits = ValidationLimits::new(2048, 49152);
        let request = parse(json!({
            "input": "x", "include": [INCLUDE_ENCRYPTED_REASONING], "store": false,
            "prompt_cache_key": "session-1", "client_metadata": {"session_id": "s"},
        }))
        .unwrap();
        assert!(request.validate(&limits).is_ok());
        assert!(request.includes_encrypted_reasoning());
    }

    #[test]
    fn validation_maps_the_fields() {
        let limits = ValidationLimits::new(2048, 49152);
        let request = parse(json!({
            "input": "x", "max_output_tokens": 7, "temperature": 0.5, "top_k": 3,
            "include": [INCLUDE_LOGPROBS], "top_logprobs": 2,
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
            "reasoning": {"effort": "none"},
        }))
        .unwrap();
        let validated = request.validate(&limits).unwrap();
        assert_eq!(validated.sampling.max_tokens, Some(7));
        assert_eq!(validated.sampling.top_k, Some(3));
        assert_eq!(validated.sampling.logprobs, Some(2));
        assert_eq!(
            validated.sampling.structured_output.unwrap().param,
            "text.format.schema"
        );
        let options = request.template_options();
        assert_eq!(options.chat_template_kwargs["enable_thinking"], false);
        for (body, param) in [
            (
                json!({"input": "x", "include": ["code_interpreter_call.outputs"]}),
                "include[0]",
            ),
            (
                json!({"input": "x", "client_metadata": {"k": 1}}),
                "client_metadata",
            ),
            (json!({"input": "x", "top_logprobs": 2}), "top_logprobs"),
            (
                json!({"input": "x", "reasoning": {"summary": "detailed"}}),
                "reasoning.summary",
            ),
            (
                json!({"input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (
                json!({"input": "x", "background": true, "store": false}),
                "background",
            ),
            (json!({"input": "x", "truncation": "middle"}), "truncation"),
        ] {
            let error = parse(body).unwrap().validate(&limits).unwrap_err();
            assert_eq!(error.param(), Some(param), "{error}");
        }
    }
}
