//! `POST /v1/chat/completions`: messages (content as a string or as text parts, the shape
//! GuideLLM sends), the request with vLLM's extras, the response and the streaming chunk.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use crate::common::{FinishReason, ResponseFormat, StopInput, StopReason, StreamOptions, Usage};
use crate::error::ProtocolError;
use crate::sampling::{RawSampling, ValidatedSampling, ValidationLimits};
use crate::structured::GuidedDecodingParams;
use crate::tools::{plan_tools, DeltaToolCall, ToolCall, ToolPlan, ToolSettings};

/// Who wrote a message. `developer` is OpenAI's newer name for `system`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The wire spelling, as chat templates expect it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// One element of a list-form `content`. Only `{"type": "text", "text": ...}` is supported;
/// other types (images, audio, files) parse so that validation can name them in a 400.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub part_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// `content`: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const SHAPE: &str = "message `content` must be a string or an array of content parts \
                             like {\"type\": \"text\", \"text\": \"...\"}";
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(text) => Ok(Self::Text(text)),
            value @ serde_json::Value::Array(_) => serde_json::from_value(value)
                .map(Self::Parts)
                .map_err(|error| D::Error::custom(format!("{SHAPE}: {error}"))),
            _ => Err(D::Error::custom(SHAPE)),
        }
    }
}

/// One request message. `tool_calls` are accepted and passed to the chat template untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// An earlier assistant turn's reasoning (vLLM's `reasoning`; `reasoning_content`, its
    /// older name, when `reasoning` is absent), handed to the chat template
    /// ([`ConversationMessage::reasoning_content`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A plain-text message.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(MessageContent::Text(content.into())),
            name: None,
            tool_call_id: None,
            tool_calls: None,
            reasoning: None,
            reasoning_content: None,
        }
    }
}

/// A checked message, content flattened to text, ready for a chat template. Serializes to the
/// `{"role", "content", ...}` object templates read.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationMessage {
    pub role: Role,
    /// `None` only for an assistant message that carries `tool_calls` instead.
    pub content: Option<String>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// An earlier assistant turn's reasoning, for templates that render it: a chat
    /// message's `reasoning` / `reasoning_content`, the Messages API's kept thinking
    /// (`clear_thinking` with `keep`). Templates read it under three names, so it is
    /// serialized under all of them: `reasoning_content` (Qwen3's), `reasoning` (vLLM's
    /// newer name) and `thinking` (gpt-oss's harmony template: the analysis channel).
    pub reasoning_content: Option<String>,
}

impl Serialize for ConversationMessage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", &self.role)?;
        map.serialize_entry("content", &self.content)?;
        if let Some(name) = &self.name {
            map.serialize_entry("name", name)?;
        }
        if let Some(id) = &self.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        if let Some(calls) = &self.tool_calls {
            map.serialize_entry("tool_calls", calls)?;
        }
        if let Some(reasoning) = &self.reasoning_content {
            for key in ["reasoning_content", "reasoning", "thinking"] {
                map.serialize_entry(key, reasoning)?;
            }
        }
        map.end()
    }
}

/// Checks `messages` and flattens list-form content: text parts are joined with `"\n"`, as
/// vLLM does for string-content templates.
pub fn conversation(messages: &[ChatMessage]) -> Result<Vec<ConversationMessage>, ProtocolError> {
    if messages.is_empty() {
        return Err(ProtocolError::invalid(
            "messages",
            "messages must not be empty.",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let content = match &message.content {
                None => None,
                Some(MessageContent::Text(text)) => Some(text.clone()),
                Some(MessageContent::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for part in parts {
                        match (part.part_type.as_str(), &part.text) {
                            ("text", Some(text)) => texts.push(text.as_str()),
                            ("text", None) => {
                                return Err(ProtocolError::invalid(
                                    "messages",
                                    format!("messages[{index}]: a text content part needs a `text` field."),
                                ));
                            }
                            (other, _) => {
                                return Err(ProtocolError::unsupported(
                                    "messages",
                                    format!(
                                        "messages[{index}]: content part type {other:?} is not \
                                         supported; only \"text\" parts are accepted."
                                    ),
                                ));
                            }
                        }
                    }
                    Some(texts.join("\n"))
                }
            };
            if let Some(position) = message
                .tool_calls
                .iter()
                .flatten()
                .position(|call| !call.is_object())
            {
                return Err(ProtocolError::invalid(
                    "messages",
                    format!("messages[{index}].tool_calls[{position}] must be an object."),
                ));
            }
            let has_tool_calls = message.tool_calls.as_ref().is_some_and(|calls| !calls.is_empty());
            if content.is_none() && !(message.role == Role::Assistant && has_tool_calls) {
                return Err(ProtocolError::invalid(
                    "messages",
                    format!("messages[{index}] ({}) has no content.", message.role.as_str()),
                ));
            }
            if message.role == Role::Tool && message.tool_call_id.is_none() {
                return Err(ProtocolError::invalid(
                    "messages",
                    format!("messages[{index}]: a tool message needs a tool_call_id."),
                ));
            }
            Ok(ConversationMessage {
                reasoning_content: message
                    .reasoning
                    .clone()
                    .or_else(|| message.reasoning_content.clone()),
                role: message.role,
                content,
                name: message.name.clone(),
                tool_call_id: message.tool_call_id.clone(),
                tool_calls: message.tool_calls.clone(),
            })
        })
        .collect()
}

/// `POST /v1/chat/completions` body. Every field but `messages` is optional on the wire
/// (unknown fields are ignored); defaults are applied by [`ChatCompletionRequest::validate`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; either works, that one wins.
    /// Neither: up to the end of the context (or the server's default).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub max_tokens: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub max_completion_tokens: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
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
    /// Return the sampled tokens' logprobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// 0..=20 alternatives per token; needs `logprobs: true`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub top_logprobs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopInput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i128>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Function tools (checked by [`crate::plan_tools`]; passed to the chat template as sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<serde_json::Value>>,
    /// `"none"`, `"auto"` (the default with tools), `"required"` or a named function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<serde_json::Value>,
    /// Default true; false allows at most one call per turn (the grammar allows one in the
    /// forced and generic modes; after a native parser the server keeps the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// vLLM: with a reasoning parser, false drops the reasoning from the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_reasoning: Option<bool>,
    /// `text`, `json_object` or `json_schema` (structured outputs, enforced by llguidance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// vLLM's `structured_outputs` and the legacy `guided_*` fields, at the top level.
    #[serde(flatten)]
    pub guided: GuidedDecodingParams,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_beam_search: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::common::lenient_integer"
    )]
    pub min_tokens: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spaces_between_special_tokens: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
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
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
    /// Leave the last (assistant) message open for the model to continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// Default false: the chat template adds the special tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// A Jinja template overriding the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// OpenAI's `reasoning_effort`: handed to the chat template as `reasoning_effort`, as vLLM
    /// does (templates with an effort switch, such as gpt-oss's, read it; an explicit
    /// `chat_template_kwargs.reasoning_effort` wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// RAG documents handed to templates that support them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
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
    /// vLLM: prepend the last message to the reply when it has the reply's role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
}

/// How to render the conversation into a prompt (the chat-template side of a request).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTemplateOptions {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub chat_template: Option<String>,
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    pub documents: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    /// Tool definitions for templates that render them.
    pub tools: Option<Vec<serde_json::Value>>,
}

/// The reasoning-effort levels OpenAI's `reasoning_effort` takes.
pub const REASONING_EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// Hands a reasoning effort to the chat template as its `reasoning_effort` variable (what
/// vLLM does with the field), unless `chat_template_kwargs` already sets it; an effort outside
/// [`REASONING_EFFORTS`] is a 400 naming `param`.
pub fn set_reasoning_effort(
    options: &mut ChatTemplateOptions,
    param: &str,
    effort: &str,
) -> Result<(), ProtocolError> {
    if !REASONING_EFFORTS.contains(&effort) {
        return Err(ProtocolError::invalid(
            param,
            format!(
                "{param} must be one of {}, got {effort:?}.",
                REASONING_EFFORTS.join(", ")
            ),
        ));
    }
    options
        .chat_template_kwargs
        .entry("reasoning_effort")
        .or_insert_with(|| serde_json::Value::String(effort.to_string()));
    Ok(())
}

/// Shared by chat completions and chat-form tokenize.
pub(crate) fn template_options(
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    chat_template: Option<&String>,
    chat_template_kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    messages: &[ChatMessage],
) -> Result<ChatTemplateOptions, ProtocolError> {
    let continue_final_message = continue_final_message.unwrap_or(false);
    // Continuing the final message means no new turn: the generation prompt defaults off
    // then, and asking for both explicitly is an error (as in vLLM).
    let add_generation_prompt = add_generation_prompt.unwrap_or(!continue_final_message);
    if continue_final_message && add_generation_prompt {
        return Err(ProtocolError::invalid(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to true.",
        ));
    }
    if continue_final_message
        && messages
            .last()
            .is_some_and(|last| last.role != Role::Assistant)
    {
        return Err(ProtocolError::invalid(
            "continue_final_message",
            "continue_final_message needs the last message to be an assistant message.",
        ));
    }
    Ok(ChatTemplateOptions {
        add_generation_prompt,
        continue_final_message,
        chat_template: chat_template.cloned(),
        chat_template_kwargs: chat_template_kwargs.cloned().unwrap_or_default(),
        documents: None,
        tools: None,
    })
}

impl ChatCompletionRequest {
    /// Checks every sampling and output parameter against vLLM's rules and `limits`.
    /// Messages are checked by [`ChatCompletionRequest::conversation`].
    pub fn validate(&self, limits: &ValidationLimits) -> Result<ValidatedSampling, ProtocolError> {
        let (max_tokens, max_tokens_param) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(value), _) => (Some(value), "max_completion_tokens"),
            (None, value) => (value, "max_tokens"),
        };
        let logprobs_requested = self.logprobs.unwrap_or(false);
        if self.top_logprobs.is_some_and(|count| count > 0) && !logprobs_requested {
            return Err(ProtocolError::invalid(
                "top_logprobs",
                "when using `top_logprobs`, `logprobs` must be set to true.",
            ));
        }
        let raw = RawSampling {
            n: self.n,
            best_of: None,
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
            max_tokens,
            max_tokens_param,
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
            logprobs: logprobs_requested.then_some(self.top_logprobs.unwrap_or(0)),
            logprobs_param: "top_logprobs",
            prompt_logprobs: self.prompt_logprobs,
            skip_special_tokens: self.skip_special_tokens,
            spaces_between_special_tokens: self.spaces_between_special_tokens,
            stream: self.stream,
            stream_options: self.stream_options.as_ref(),
            echo: self.echo.unwrap_or(false),
            echo_without_generation: false,
            priority: self.priority,
            request_id: self.request_id.as_deref(),
            return_token_ids: self.return_token_ids,
            cache_salt: self.cache_salt.as_deref(),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            add_special_tokens: self.add_special_tokens.unwrap_or(false),
            response_format: self.response_format.as_ref(),
            guided: Some(&self.guided),
            prompt_param: "messages",
        };
        raw.validate(limits)
    }

    /// The checked tool fields and how the output is produced (see [`plan_tools`]).
    pub fn tool_plan(
        &self,
        settings: &ToolSettings,
        template_renders_tools: bool,
    ) -> Result<ToolPlan, ProtocolError> {
        plan_tools(
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
            settings,
            template_renders_tools,
        )
    }

    /// The checked messages, content flattened to text (see [`conversation`]).
    pub fn conversation(&self) -> Result<Vec<ConversationMessage>, ProtocolError> {
        conversation(&self.messages)
    }

    /// The chat-template settings of this request.
    pub fn template_options(&self) -> Result<ChatTemplateOptions, ProtocolError> {
        let mut options = template_options(
            self.add_generation_prompt,
            self.continue_final_message,
            self.chat_template.as_ref(),
            self.chat_template_kwargs.as_ref(),
            &self.messages,
        )?;
        options.documents = self.documents.clone();
        options.tools = self.tools.clone();
        if let Some(effort) = &self.reasoning_effort {
            set_reasoning_effort(&mut options, "reasoning_effort", effort)?;
        }
        Ok(options)
    }
}

/// The assistant message of a non-streaming choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponseMessage {
    /// `--response-role` (default `assistant`), or the last message's role without a
    /// generation prompt, as vLLM reports it.
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    /// Reasoning text split off by `--reasoning-parser`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The same text under its older name, which many clients still read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One alternative in a chat `top_logprobs` list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    /// UTF-8 bytes of the token; lets clients rebuild text split inside a character.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}

/// The logprob of one generated token and its top alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobToken {
    pub token: String,
    pub logprob: f32,
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    #[serde(default)]
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// A choice's `logprobs`: `{"content": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    #[serde(default)]
    pub content: Option<Vec<ChatLogprobToken>>,
}

/// One choice of a non-streaming chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatResponseMessage,
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `POST /v1/chat/completions` response (`object: "chat.completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// With `return_token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

impl ChatCompletionResponse {
    pub const OBJECT: &'static str = "chat.completion";

    /// A response with `object` set; `created` is passed in (Unix seconds).
    pub fn new(
        id: String,
        created: u64,
        model: String,
        choices: Vec<ChatChoice>,
        usage: Usage,
    ) -> Self {
        Self {
            id,
            object: Self::OBJECT.to_string(),
            created,
            model,
            choices,
            usage,
            prompt_token_ids: None,
        }
    }
}

/// A streamed message fragment: the first chunk of each choice carries `role`, later ones
/// `content`, reasoning (under both names) or tool-call pieces.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

/// One choice's delta in a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    #[serde(default)]
    pub logprobs: Option<ChatLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<FinishReason>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// One SSE `data:` payload of a streamed chat completion (`object: "chat.completion.chunk"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// With `return_token_ids`, on the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

impl ChatCompletionChunk {
    pub const OBJECT: &'static str = "chat.completion.chunk";

    /// A chunk with `object` set.
    pub fn new(id: String, created: u64, model: String, choices: Vec<ChatChunkChoice>) -> Self {
        Self {
            id,
            object: Self::OBJECT.to_string(),
            created,
            model,
            choices,
            usage: None,
            prompt_token_ids: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An assistant turn's `reasoning` (or `reasoning_content`) reaches the template under
    /// the three names templates read: gpt-oss's `thinking`, vLLM's `reasoning`, Qwen3's
    /// `reasoning_content`; `reasoning` wins over the older name.
    #[test]
    fn earlier_reasoning_reaches_the_template_under_every_name() {
        let messages: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "reasoning_content": "old name",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "w", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "assistant", "content": "Mild.", "reasoning": "new", "reasoning_content": "old"},
        ]))
        .unwrap();
        let rendered = serde_json::to_value(conversation(&messages).unwrap()).unwrap();
        for key in ["thinking", "reasoning", "reasoning_content"] {
            assert_eq!(rendered[1][key], "old name", "{key}");
            assert_eq!(rendered[3][key], "new", "{key}");
            assert!(rendered[0].get(key).is_none(), "{key}");
        }
        assert!(rendered[1]["content"].is_null());
    }
    use serde_json::json;

    #[test]
    fn text_parts_are_joined_with_newlines() {
        let messages: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "first"},
                {"type": "text", "text": "second"}
            ]}
        ]))
        .unwrap();
        let conversation = conversation(&messages).unwrap();
        assert_eq!(conversation[1].content.as_deref(), Some("first\nsecond"));
        assert_eq!(
            serde_json::to_value(&conversation[0]).unwrap(),
            json!({"role": "system", "content": "Be brief."})
        );
    }

    #[test]
    fn assistant_tool_calls_may_replace_content() {
        let messages: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ]))
        .unwrap();
        let conversation = conversation(&messages).unwrap();
        assert_eq!(conversation[1].content, None);
        assert_eq!(conversation[2].tool_call_id.as_deref(), Some("call_1"));
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let request: ChatCompletionRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5, "max_completion_tokens": 7
        }))
        .unwrap();
        let validated = request.validate(&ValidationLimits::new(100, 1000)).unwrap();
        assert_eq!(validated.sampling.max_tokens, Some(7));
        assert_eq!(validated.output.max_tokens_param, "max_completion_tokens");
        assert!(!validated.output.add_special_tokens);
    }

    #[test]
    fn logprobs_flag_maps_to_top_logprobs_count() {
        let request: ChatCompletionRequest = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": true, "top_logprobs": 3
        }))
        .unwrap();
        let validated = request.validate(&ValidationLimits::new(100, 1000)).unwrap();
        assert_eq!(validated.sampling.logprobs, Some(3));
        let plain: ChatCompletionRequest =
            serde_json::from_value(json!({"messages": [], "logprobs": true})).unwrap();
        assert_eq!(
            plain
                .validate(&ValidationLimits::new(100, 1000))
                .unwrap()
                .sampling
                .logprobs,
            Some(0)
        );
    }
}
