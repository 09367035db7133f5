//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): the
//! request with its content blocks, checked into the same pieces a chat completion is made of
//! (a [`ConversationMessage`] list, chat-template options, OpenAI-shaped `tools` /
//! `tool_choice` for [`crate::plan_tools`], a [`ValidatedSampling`]), and the response, the
//! streamed events and the error body in Anthropic's shapes.
//!
//! Strict on the wire: every object refuses fields it does not know (a 400 naming the field
//! and where it is), and blocks or tools tokenmill cannot serve (`image`, `document`, server
//! tools such as `web_search`) are a 400 naming them, never accepted and ignored.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value};

use crate::chat::{set_reasoning_effort, ChatTemplateOptions, ConversationMessage, Role};
use crate::common::StopInput;
use crate::error::{ErrorResponse, ProtocolError};
use crate::sampling::{RawSampling, ValidatedSampling, ValidationLimits};
use crate::structured::{schema_text, StructuredConstraint, StructuredOutputRequest};

/// Anthropic's smallest `thinking.budget_tokens`.
pub const MIN_THINKING_BUDGET: i64 = 1024;
/// Text a cleared tool result is replaced by (`context_management`'s `clear_tool_uses`).
pub const CLEARED_TOOL_RESULT: &str = "[tool result cleared to save context]";

/// `cache_control` on a block, tool or system part. Accepted: tokenmill's prefix cache is
/// automatic, so every prompt prefix is cached whether marked or not (the usage reports the
/// hits as `cache_read_input_tokens`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheControl {
    #[serde(rename = "type")]
    pub kind: CacheControlKind,
    /// `5m` or `1h`: how long Anthropic keeps the entry; here the LRU decides.
    #[serde(default)]
    pub ttl: Option<CacheTtl>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheControlKind {
    Ephemeral,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum CacheTtl {
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
}

/// A `text` block.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextBlock {
    pub text: String,
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
    /// Only `null` or `[]`: citations need documents, which are not supported.
    #[serde(default)]
    pub citations: Option<Vec<Value>>,
}

/// A `tool_use` block (an earlier call of the assistant).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolUseBlock {
    pub id: String,
    pub name: String,
    pub input: Map<String, Value>,
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// A `tool_result` block: the answer to a `tool_use`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolResultBlock {
    pub tool_use_id: String,
    #[serde(default)]
    pub content: Option<ToolResultContent>,
    #[serde(default)]
    pub is_error: Option<bool>,
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// A `thinking` block of an earlier turn.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThinkingBlock {
    pub thinking: String,
    pub signature: String,
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// A `redacted_thinking` block of an earlier turn.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactedThinkingBlock {
    pub data: String,
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// One request content block.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentBlock {
    Text(TextBlock),
    ToolUse(ToolUseBlock),
    ToolResult(ToolResultBlock),
    Thinking(ThinkingBlock),
    RedactedThinking(RedactedThinkingBlock),
}

impl ContentBlock {
    fn type_name(&self) -> &'static str {
        match self {
            Self::Text(_) => "text",
            Self::ToolUse(_) => "tool_use",
            Self::ToolResult(_) => "tool_result",
            Self::Thinking(_) => "thinking",
            Self::RedactedThinking(_) => "redacted_thinking",
        }
    }
}

/// Reads a tagged object: `type` picks the struct, which then refuses unknown fields.
fn tagged_object(value: Value) -> Result<(String, Map<String, Value>), String> {
    let Value::Object(mut object) = value else {
        return Err("expected an object with a `type` field".to_string());
    };
    match object.remove("type") {
        Some(Value::String(kind)) => Ok((kind, object)),
        Some(_) => Err("`type` must be a string".to_string()),
        None => Err("missing field `type`".to_string()),
    }
}

fn from_object<T: DeserializeOwned>(object: Map<String, Value>) -> Result<T, String> {
    serde_json::from_value(Value::Object(object)).map_err(|e| e.to_string())
}

fn unsupported_block(kind: &str) -> String {
    match kind {
        "image" | "document" => format!(
            "`{kind}` content blocks are not supported: tokenmill serves text-only models \
             (vision is a separate issue)."
        ),
        _ => format!(
            "content block type `{kind}` is not supported; tokenmill accepts `text`, \
             `tool_use`, `tool_result`, `thinking` and `redacted_thinking`."
        ),
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (kind, object) =
            tagged_object(Value::deserialize(deserializer)?).map_err(D::Error::custom)?;
        let block = match kind.as_str() {
            "text" => from_object(object).map(Self::Text),
            "tool_use" => from_object(object).map(Self::ToolUse),
            "tool_result" => from_object(object).map(Self::ToolResult),
            "thinking" => from_object(object).map(Self::Thinking),
            "redacted_thinking" => from_object(object).map(Self::RedactedThinking),
            other => Err(unsupported_block(other)),
        };
        block.map_err(|e| D::Error::custom(format!("`{kind}` block: {e}")))
    }
}

/// Reads a JSON array element by element so an error names the element's index.
fn indexed_list<T: DeserializeOwned>(items: Vec<Value>) -> Result<Vec<T>, String> {
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| serde_json::from_value(item).map_err(|e| format!("[{index}]: {e}")))
        .collect()
}

/// `content` of a message: a string or a list of blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageContent {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            Value::Array(items) => indexed_list(items)
                .map(Self::Blocks)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "`content` must be a string or an array of content blocks",
            )),
        }
    }
}

/// `content` of a `tool_result`: a string or text blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolResultContent {
    Text(String),
    Blocks(Vec<TextBlock>),
}

impl<'de> Deserialize<'de> for ToolResultContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            Value::Array(items) => {
                let mut blocks = Vec::with_capacity(items.len());
                for (index, item) in items.into_iter().enumerate() {
                    let (kind, object) = tagged_object(item)
                        .map_err(|e| D::Error::custom(format!("[{index}]: {e}")))?;
                    if kind != "text" {
                        return Err(D::Error::custom(format!(
                            "[{index}]: {}",
                            unsupported_block(&kind)
                        )));
                    }
                    blocks.push(
                        from_object(object)
                            .map_err(|e| D::Error::custom(format!("[{index}]: {e}")))?,
                    );
                }
                Ok(Self::Blocks(blocks))
            }
            _ => Err(D::Error::custom(
                "tool_result `content` must be a string or an array of text blocks",
            )),
        }
    }
}

/// Who wrote a message. `system` entries inside `messages` (newer Claude Code sends them)
/// become system messages where they stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageRole {
    User,
    Assistant,
    System,
}

/// One entry of `messages`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: MessageRole,
    pub content: MessageContent,
}

/// `system`: a string or text blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<TextBlock>),
}

impl<'de> Deserialize<'de> for SystemPrompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match ToolResultContent::deserialize(deserializer).map_err(|e| {
            D::Error::custom(format!("`system` must be a string or text blocks: {e}"))
        })? {
            ToolResultContent::Text(text) => Ok(Self::Text(text)),
            ToolResultContent::Blocks(blocks) => Ok(Self::Blocks(blocks)),
        }
    }
}

/// A client tool (`type` absent or `custom`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDefinition {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub input_schema: Value,
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// Server tools run by Anthropic's hosted services; their `type` is versioned
/// (`web_search_20250305`), so the prefix names them.
const SERVER_TOOLS: &[&str] = &[
    "web_search",
    "web_fetch",
    "code_execution",
    "computer",
    "bash",
    "text_editor",
    "memory",
    "tool_search_tool",
    "mcp_toolset",
];

/// `tools`: every entry a client tool; a server tool is a 400 naming it.
fn tool_definitions<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<ToolDefinition>>, D::Error> {
    let Some(items) = Option::<Vec<Value>>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let mut tools = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("custom");
        if kind != "custom" {
            let known = SERVER_TOOLS.iter().find(|prefix| kind.starts_with(*prefix));
            return Err(D::Error::custom(match known {
                Some(name) => format!(
                    "[{index}]: the server tool `{kind}` ({name}) is not supported: it needs \
                     a hosted service that tokenmill does not run; define a client tool \
                     with `name` and `input_schema` instead."
                ),
                None => format!(
                    "[{index}]: tool type `{kind}` is not supported; only client tools \
                     (`name`, `description`, `input_schema`) are."
                ),
            }));
        }
        let tool: ToolDefinition = serde_json::from_value(item)
            .map_err(|e| D::Error::custom(format!("[{index}]: {e}")))?;
        if !tool.input_schema.is_object() {
            return Err(D::Error::custom(format!(
                "[{index}].input_schema must be a JSON schema object."
            )));
        }
        tools.push(tool);
    }
    Ok(Some(tools))
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum ToolChoice {
    Auto {
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    Any {
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    Tool {
        name: String,
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    None {},
}

/// `thinking`: whether the model reasons before answering (the chat template's
/// `enable_thinking` switch; the reasoning parser splits the output into `thinking` blocks).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum ThinkingConfig {
    Enabled {
        budget_tokens: i64,
        #[serde(default)]
        display: Option<ThinkingDisplay>,
    },
    Disabled {},
    /// The model decides how much to think (Claude Code 2.1's default): thinking on.
    Adaptive {
        #[serde(default)]
        display: Option<ThinkingDisplay>,
    },
}

/// `thinking.display`: `omitted` sends thinking blocks with empty text (their signature
/// still made from the thinking), `summarized` (the default here) sends the thinking whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThinkingDisplay {
    Summarized,
    Omitted,
}

/// `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// An opaque id of the end user; written to the request log with `--enable-log-requests`.
    #[serde(default)]
    pub user_id: Option<String>,
}

/// `service_tier`: tokenmill has one tier, reported as `standard` in the usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceTier {
    Auto,
    StandardOnly,
}

/// `output_config`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// `low`, `medium`, `high` or `max`: handed to the chat template as `reasoning_effort`
    /// (`max` as `high`), as OpenAI's `reasoning_effort` is.
    #[serde(default)]
    pub effort: Option<String>,
    /// `{"type": "json_schema", "schema": {...}}`: the output is constrained to the schema.
    #[serde(default)]
    pub format: Option<OutputFormat>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OutputFormat {
    JsonSchema { schema: Value },
}

/// `context_management`: server-side edits of the conversation before it is rendered.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextManagement {
    #[serde(default)]
    pub edits: Vec<ContextEdit>,
}

/// One `context_management.edits` entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
pub enum ContextEdit {
    /// Replaces the results of older tool uses by [`CLEARED_TOOL_RESULT`] once the prompt is
    /// over `trigger` input tokens, keeping the `keep` most recent ones.
    #[serde(rename = "clear_tool_uses_20250919")]
    ClearToolUses {
        #[serde(default)]
        trigger: Option<EditAmount>,
        #[serde(default)]
        keep: Option<EditAmount>,
        #[serde(default)]
        clear_at_least: Option<EditAmount>,
        #[serde(default)]
        exclude_tools: Option<Vec<String>>,
        #[serde(default)]
        clear_tool_inputs: Option<bool>,
    },
    /// Thinking of earlier turns: without this edit it is not rendered; with it, the thinking
    /// of the `keep` latest assistant turns reaches the template as the message's
    /// `reasoning_content` (templates that render earlier reasoning, Qwen3's and others, show
    /// it; the others drop it) and older thinking is cleared.
    #[serde(rename = "clear_thinking_20251015")]
    ClearThinking {
        #[serde(default)]
        keep: Option<Value>,
    },
}

/// `{"type": "input_tokens" | "tool_uses", "value": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditAmount {
    #[serde(rename = "type")]
    pub kind: EditUnit,
    pub value: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EditUnit {
    InputTokens,
    ToolUses,
}

/// `POST /v1/messages` body.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: i64,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub system: Option<SystemPrompt>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default, deserialize_with = "tool_definitions")]
    pub tools: Option<Vec<ToolDefinition>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub thinking: Option<ThinkingConfig>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
    #[serde(default)]
    pub service_tier: Option<ServiceTier>,
    #[serde(default)]
    pub context_management: Option<ContextManagement>,
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    /// Automatic caching of the whole prompt: what tokenmill's prefix cache always does.
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// `POST /v1/messages/count_tokens` body: the prompt side of a [`MessagesRequest`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountTokensRequest {
    pub model: String,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub system: Option<SystemPrompt>,
    #[serde(default, deserialize_with = "tool_definitions")]
    pub tools: Option<Vec<ToolDefinition>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub thinking: Option<ThinkingConfig>,
    #[serde(default)]
    pub context_management: Option<ContextManagement>,
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
    /// See [`MessagesRequest::cache_control`].
    #[serde(default)]
    pub cache_control: Option<CacheControl>,
}

/// Parses a Messages API body; an error names the path of the field at fault
/// (`messages[1].content[0]: unknown field ...`).
pub fn parse_anthropic<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let message = if path == "." || path.is_empty() {
            format!("Invalid request body: {inner}")
        } else {
            format!("{path}: {inner}")
        };
        ProtocolError::MalformedJson { message }
    })?;
    deserializer
        .end()
        .map_err(|error| ProtocolError::MalformedJson {
            message: format!("Invalid request body: {error}"),
        })?;
    Ok(value)
}

/// The prompt side shared by both routes, checked into what the chat path takes.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesPrompt {
    pub conversation: Vec<ConversationMessage>,
    pub template: ChatTemplateOptions,
    /// `tools` in OpenAI's shape, for [`crate::plan_tools`].
    pub tools: Option<Vec<Value>>,
    /// `tool_choice` in OpenAI's shape.
    pub tool_choice: Option<Value>,
    /// `disable_parallel_tool_use` as OpenAI's `parallel_tool_calls`.
    pub parallel_tool_calls: Option<bool>,
    /// How many tool results `context_management` cleared (reported back).
    pub cleared_tool_uses: usize,
    /// `thinking.display: omitted`: thinking blocks without their text.
    pub omit_thinking: bool,
}

/// The fields [`MessagesPrompt`] is built from.
struct PromptFields<'a> {
    messages: &'a [InputMessage],
    system: Option<&'a SystemPrompt>,
    tools: Option<&'a [ToolDefinition]>,
    tool_choice: Option<&'a ToolChoice>,
    thinking: Option<&'a ThinkingConfig>,
    context_management: Option<&'a ContextManagement>,
    output_config: Option<&'a OutputConfig>,
}

/// The prompt side both request types share: their fields as [`PromptFields`], the checked
/// prompt and the `clear_tool_uses` trigger.
macro_rules! prompt_source {
    ($request:ty) => {
        impl $request {
            fn fields(&self) -> PromptFields<'_> {
                PromptFields {
                    messages: &self.messages,
                    system: self.system.as_ref(),
                    tools: self.tools.as_deref(),
                    tool_choice: self.tool_choice.as_ref(),
                    thinking: self.thinking.as_ref(),
                    context_management: self.context_management.as_ref(),
                    output_config: self.output_config.as_ref(),
                }
            }

            /// The conversation, template options and tool fields (`over_trigger`: whether
            /// the rendered prompt is over a `clear_tool_uses` trigger, asked once the server
            /// knows the length; see `clear_trigger`).
            pub fn prompt(&self, over_trigger: bool) -> Result<MessagesPrompt, ProtocolError> {
                self.fields().prompt(over_trigger)
            }

            /// When `context_management` clears old tool results: over which input-token
            /// count, and how many tokens a clearing must free to be applied.
            pub fn clear_trigger(&self) -> Result<Option<ClearRule>, ProtocolError> {
                clear_trigger(self.context_management.as_ref())
            }
        }
    };
}

prompt_source!(MessagesRequest);
prompt_source!(CountTokensRequest);

impl MessagesRequest {
    /// Sampling and output settings, checked (`max_tokens` against the context later, once
    /// the prompt is tokenized: [`check_context`]).
    pub fn validate(&self, limits: &ValidationLimits) -> Result<ValidatedSampling, ProtocolError> {
        if self.max_tokens < 1 {
            return Err(ProtocolError::invalid(
                "max_tokens",
                format!("max_tokens: must be at least 1, got {}.", self.max_tokens),
            ));
        }
        if let Some(temperature) = self.temperature {
            if !(0.0..=1.0).contains(&temperature) {
                return Err(ProtocolError::invalid(
                    "temperature",
                    format!("temperature: must be in [0, 1], got {temperature}."),
                ));
            }
        }
        if let Some(ThinkingConfig::Enabled { budget_tokens, .. }) = &self.thinking {
            if *budget_tokens < MIN_THINKING_BUDGET || *budget_tokens >= self.max_tokens {
                return Err(ProtocolError::invalid(
                    "thinking.budget_tokens",
                    format!(
                        "thinking.budget_tokens: must be at least {MIN_THINKING_BUDGET} and \
                         less than max_tokens ({}), got {budget_tokens}.",
                        self.max_tokens
                    ),
                ));
            }
        }
        let stop = self.stop_sequences.clone().map(StopInput::Many);
        let raw = RawSampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens: Some(self.max_tokens),
            max_tokens_param: "max_tokens",
            stop: stop.as_ref(),
            logprobs_param: "top_logprobs",
            stream: self.stream,
            prompt_param: "messages",
            thinking_token_budget: match &self.thinking {
                Some(ThinkingConfig::Enabled { budget_tokens, .. }) => Some(*budget_tokens),
                _ => None,
            },
            thinking_budget_param: "thinking.budget_tokens",
            ..RawSampling::default()
        };
        let mut validated = raw.validate(limits)?;
        if let Some(OutputFormat::JsonSchema { schema }) =
            self.output_config.as_ref().and_then(|c| c.format.as_ref())
        {
            let param = "output_config.format.schema";
            validated.sampling.structured_output = Some(StructuredOutputRequest {
                constraint: StructuredConstraint::JsonSchema(schema_text(param, schema)?),
                param,
            });
        }
        Ok(validated)
    }
}

/// Anthropic's default `clear_tool_uses` trigger and kept tool uses.
const DEFAULT_CLEAR_TRIGGER: u64 = 100_000;
const DEFAULT_CLEAR_KEEP: u64 = 3;

/// A `clear_tool_uses` edit's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearRule {
    /// Old tool results are cleared once the prompt is over this many input tokens.
    pub trigger: u64,
    /// `clear_at_least`: a clearing that frees fewer input tokens than this is not applied
    /// (0: any clearing is).
    pub at_least: u64,
}

fn clear_trigger(context: Option<&ContextManagement>) -> Result<Option<ClearRule>, ProtocolError> {
    let Some(context) = context else {
        return Ok(None);
    };
    let mut trigger = None;
    for (index, edit) in context.edits.iter().enumerate() {
        match edit {
            ContextEdit::ClearToolUses {
                trigger: edit_trigger,
                keep,
                clear_at_least,
                ..
            } => {
                let param = format!("context_management.edits[{index}]");
                if edit_trigger.is_some_and(|t| t.kind != EditUnit::InputTokens) {
                    return Err(ProtocolError::invalid(
                        param,
                        "clear_tool_uses: `trigger` must be in `input_tokens`.",
                    ));
                }
                if keep.is_some_and(|k| k.kind != EditUnit::ToolUses) {
                    return Err(ProtocolError::invalid(
                        param,
                        "clear_tool_uses: `keep` must be in `tool_uses`.",
                    ));
                }
                if clear_at_least.is_some_and(|c| c.kind != EditUnit::InputTokens) {
                    return Err(ProtocolError::invalid(
                        param,
                        "clear_tool_uses: `clear_at_least` must be in `input_tokens`.",
                    ));
                }
                trigger = Some(ClearRule {
                    trigger: edit_trigger.map_or(DEFAULT_CLEAR_TRIGGER, |t| t.value),
                    at_least: clear_at_least.map_or(0, |c| c.value),
                });
            }
            ContextEdit::ClearThinking { keep } => {
                thinking_turns_kept(keep.as_ref(), index)?;
            }
        }
    }
    Ok(trigger)
}

/// How many of the latest assistant turns keep their thinking in the prompt: none without a
/// `clear_thinking` edit (thinking of earlier turns is not rendered), else the edit's `keep`
/// (`"all"`, or `{"type": "thinking_turns", "value": N}`; Anthropic's default is 1 turn).
fn kept_thinking_turns(context: Option<&ContextManagement>) -> Result<usize, ProtocolError> {
    let mut kept = 0;
    for (index, edit) in context.iter().flat_map(|c| c.edits.iter().enumerate()) {
        if let ContextEdit::ClearThinking { keep } = edit {
            kept = thinking_turns_kept(keep.as_ref(), index)?;
        }
    }
    Ok(kept)
}

fn thinking_turns_kept(keep: Option<&Value>, index: usize) -> Result<usize, ProtocolError> {
    let invalid = || {
        ProtocolError::invalid(
            format!("context_management.edits[{index}].keep"),
            "clear_thinking: `keep` must be \"all\" or {\"type\": \"thinking_turns\", \"value\": N}.",
        )
    };
    match keep {
        None => Ok(1),
        Some(Value::String(all)) if all == "all" => Ok(usize::MAX),
        Some(Value::Object(amount)) => {
            if amount.len() != 2
                || amount.get("type").and_then(Value::as_str) != Some("thinking_turns")
            {
                return Err(invalid());
            }
            let value = amount
                .get("value")
                .and_then(Value::as_u64)
                .ok_or_else(invalid)?;
            Ok(usize::try_from(value).unwrap_or(usize::MAX))
        }
        Some(_) => Err(invalid()),
    }
}

fn text_of_blocks(blocks: &[TextBlock], place: &str) -> Result<String, ProtocolError> {
    for block in blocks {
        if block.citations.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(ProtocolError::unsupported(
                place,
                format!("{place}: citations are not supported (they need document blocks)."),
            ));
        }
    }
    Ok(blocks
        .iter()
        .map(|block| block.text.as_str())
        .collect::<Vec<_>>()
        .join("\n"))
}

fn message(role: Role, content: String) -> ConversationMessage {
    ConversationMessage {
        reasoning_content: None,
        role,
        content: Some(content),
        name: None,
        tool_call_id: None,
        tool_calls: None,
    }
}

impl PromptFields<'_> {
    fn prompt(&self, over_trigger: bool) -> Result<MessagesPrompt, ProtocolError> {
        if self.messages.is_empty() {
            return Err(ProtocolError::invalid(
                "messages",
                "messages: at least one message is required.",
            ));
        }
        clear_trigger(self.context_management)?;
        let kept_turns = kept_thinking_turns(self.context_management)?;
        // The assistant turns (counted from the end) whose thinking stays in the prompt.
        let assistant_turns = self
            .messages
            .iter()
            .filter(|m| m.role == MessageRole::Assistant)
            .count();
        let first_kept_turn = assistant_turns.saturating_sub(kept_turns);
        let mut assistant_turn = 0;
        let mut conversation = Vec::new();
        if let Some(system) = self.system {
            let text = match system {
                SystemPrompt::Text(text) => text.clone(),
                SystemPrompt::Blocks(blocks) => text_of_blocks(blocks, "system")?,
            };
            conversation.push(message(Role::System, text));
        }
        let (cleared, clear_inputs) = if over_trigger {
            self.tool_uses_to_clear()
        } else {
            (Vec::new(), false)
        };
        for (index, input) in self.messages.iter().enumerate() {
            let place = format!("messages[{index}]");
            let blocks = match &input.content {
                MessageContent::Text(text) => vec![ContentBlock::Text(TextBlock {
                    text: text.clone(),
                    cache_control: None,
                    citations: None,
                })],
                MessageContent::Blocks(blocks) => blocks.clone(),
            };
            match input.role {
                MessageRole::System => {
                    let mut texts = Vec::new();
                    for block in &blocks {
                        match block {
                            ContentBlock::Text(text) => texts.push(text.clone()),
                            other => {
                                return Err(ProtocolError::invalid(
                                    "messages",
                                    format!(
                                        "{place}: a system message holds only text blocks, \
                                         not `{}`.",
                                        other.type_name()
                                    ),
                                ))
                            }
                        }
                    }
                    conversation.push(message(Role::System, text_of_blocks(&texts, &place)?));
                }
                MessageRole::User => {
                    let mut texts = Vec::new();
                    for block in &blocks {
                        match block {
                            ContentBlock::Text(text) => texts.push(text.clone()),
                            ContentBlock::ToolResult(result) => {
                                let mut content = match &result.content {
                                    None => String::new(),
                                    Some(ToolResultContent::Text(text)) => text.clone(),
                                    Some(ToolResultContent::Blocks(blocks)) => {
                                        text_of_blocks(blocks, &place)?
                                    }
                                };
                                if cleared.contains(&result.tool_use_id.as_str()) {
                                    content = CLEARED_TOOL_RESULT.to_string();
                                } else if result.is_error == Some(true) {
                                    content = format!("Error: {content}");
                                }
                                conversation.push(ConversationMessage {
                                    tool_call_id: Some(result.tool_use_id.clone()),
                                    ..message(Role::Tool, content)
                                });
                            }
                            other => {
                                return Err(ProtocolError::invalid(
                                    "messages",
                                    format!(
                                        "{place}: a user message may not hold a `{}` block.",
                                        other.type_name()
                                    ),
                                ))
                            }
                        }
                    }
                    if !texts.is_empty() {
                        conversation.push(message(Role::User, text_of_blocks(&texts, &place)?));
                    }
                }
                MessageRole::Assistant => {
                    let keeps_thinking = assistant_turn >= first_kept_turn;
                    assistant_turn += 1;
                    let mut thinking = Vec::new();
                    let mut texts = Vec::new();
                    let mut calls = Vec::new();
                    for block in &blocks {
                        match block {
                            ContentBlock::Text(text) => texts.push(text.clone()),
                            ContentBlock::ToolUse(call) => {
                                // `clear_tool_inputs`: a cleared use keeps its name, not its
                                // arguments.
                                let arguments =
                                    if clear_inputs && cleared.contains(&call.id.as_str()) {
                                        "{}".to_string()
                                    } else {
                                        Value::Object(call.input.clone()).to_string()
                                    };
                                calls.push(json!({
                                    "id": call.id,
                                    "type": "function",
                                    "function": {"name": call.name, "arguments": arguments},
                                }))
                            }
                            // Rendered only where `clear_thinking` keeps it (see
                            // `ContextEdit::ClearThinking`); redacted thinking has no text.
                            ContentBlock::Thinking(block) if keeps_thinking => {
                                thinking.push(block.thinking.as_str());
                            }
                            ContentBlock::Thinking(_) | ContentBlock::RedactedThinking(_) => {}
                            ContentBlock::ToolResult(_) => {
                                return Err(ProtocolError::invalid(
                                    "messages",
                                    format!(
                                        "{place}: an assistant message may not hold a \
                                         `tool_result` block."
                                    ),
                                ))
                            }
                        }
                    }
                    let text = text_of_blocks(&texts, &place)?;
                    conversation.push(ConversationMessage {
                        content: (!text.is_empty() || calls.is_empty()).then_some(text),
                        tool_calls: (!calls.is_empty()).then_some(calls),
                        reasoning_content: (!thinking.is_empty()).then(|| thinking.join("\n")),
                        ..message(Role::Assistant, String::new())
                    });
                }
            }
        }
        // A final assistant message is a prefill: the reply continues it.
        let prefill = self.messages.last().is_some_and(|last| {
            last.role == MessageRole::Assistant
                && !matches!(&last.content, MessageContent::Blocks(b) if b.iter().any(|b| matches!(b, ContentBlock::ToolUse(_))))
        });
        let mut kwargs = Map::new();
        match self.thinking {
            Some(ThinkingConfig::Enabled { .. } | ThinkingConfig::Adaptive { .. }) => {
                kwargs.insert("enable_thinking".into(), Value::Bool(true));
            }
            Some(ThinkingConfig::Disabled {}) => {
                kwargs.insert("enable_thinking".into(), Value::Bool(false));
            }
            None => {}
        }
        let mut template = ChatTemplateOptions {
            add_generation_prompt: !prefill,
            continue_final_message: prefill,
            chat_template: None,
            chat_template_kwargs: kwargs,
            documents: None,
            tools: None,
        };
        if let Some(effort) = self.output_config.and_then(|c| c.effort.as_deref()) {
            // Anthropic's levels; `max` is the template's highest.
            let level = match effort {
                "low" | "medium" | "high" => effort,
                "max" => "high",
                other => {
                    return Err(ProtocolError::invalid(
                        "output_config.effort",
                        format!(
                            "output_config.effort must be one of low, medium, high, max, got \
                             {other:?}."
                        ),
                    ))
                }
            };
            set_reasoning_effort(&mut template, "output_config.effort", level)?;
        }
        let tools = self.tools.filter(|t| !t.is_empty()).map(|tools| {
            tools
                .iter()
                .map(|tool| {
                    let mut function = json!({"name": tool.name, "parameters": tool.input_schema});
                    if let Some(description) = &tool.description {
                        function["description"] = Value::String(description.clone());
                    }
                    json!({"type": "function", "function": function})
                })
                .collect()
        });
        let (tool_choice, parallel_tool_calls) = match self.tool_choice {
            None => (None, None),
            Some(ToolChoice::Auto {
                disable_parallel_tool_use,
            }) => (Some(json!("auto")), disable_parallel_tool_use.map(|d| !d)),
            Some(ToolChoice::Any {
                disable_parallel_tool_use,
            }) => (
                Some(json!("required")),
                disable_parallel_tool_use.map(|d| !d),
            ),
            Some(ToolChoice::Tool {
                name,
                disable_parallel_tool_use,
            }) => (
                Some(json!({"type": "function", "function": {"name": name}})),
                disable_parallel_tool_use.map(|d| !d),
            ),
            Some(ToolChoice::None {}) => (Some(json!("none")), None),
        };
        Ok(MessagesPrompt {
            conversation,
            template,
            tools,
            tool_choice,
            parallel_tool_calls,
            cleared_tool_uses: cleared.len(),
            omit_thinking: matches!(
                self.thinking,
                Some(
                    ThinkingConfig::Enabled {
                        display: Some(ThinkingDisplay::Omitted),
                        ..
                    } | ThinkingConfig::Adaptive {
                        display: Some(ThinkingDisplay::Omitted)
                    }
                )
            ),
        })
    }

    /// The ids of the tool uses whose results `clear_tool_uses` clears (all but the `keep`
    /// most recent, minus those of `exclude_tools`), and whether their inputs go too
    /// (`clear_tool_inputs`).
    fn tool_uses_to_clear(&self) -> (Vec<&str>, bool) {
        let Some(ContextEdit::ClearToolUses {
            keep,
            exclude_tools,
            clear_tool_inputs,
            ..
        }) = self.context_management.and_then(|c| {
            c.edits
                .iter()
                .find(|e| matches!(e, ContextEdit::ClearToolUses { .. }))
        })
        else {
            return (Vec::new(), false);
        };
        let keep = keep.map_or(DEFAULT_CLEAR_KEEP, |k| k.value) as usize;
        let excluded = exclude_tools.as_deref().unwrap_or_default();
        let uses: Vec<&ToolUseBlock> = self
            .messages
            .iter()
            .filter_map(|m| match &m.content {
                MessageContent::Blocks(blocks) => Some(blocks),
                MessageContent::Text(_) => None,
            })
            .flatten()
            .filter_map(|block| match block {
                ContentBlock::ToolUse(call) => Some(call),
                _ => None,
            })
            .collect();
        let clearable = uses.len().saturating_sub(keep);
        let ids = uses[..clearable]
            .iter()
            .filter(|call| !excluded.contains(&call.name))
            .map(|call| call.id.as_str())
            .collect();
        (ids, clear_tool_inputs.unwrap_or(false))
    }
}

/// The completion budget once the prompt is tokenized, with Anthropic's messages (Claude
/// Code reads "prompt is too long" to compact its conversation, and the second form to lower
/// `max_tokens`).
pub fn check_context(
    prompt_tokens: usize,
    max_tokens: u32,
    max_model_len: u32,
) -> Result<u32, ProtocolError> {
    let limit = max_model_len as usize;
    if prompt_tokens >= limit {
        return Err(ProtocolError::ContextLengthExceeded {
            param: "messages".into(),
            message: format!(
                "prompt is too long: {prompt_tokens} tokens > {} maximum (this model's \
                 context is {limit} tokens).",
                limit - 1
            ),
        });
    }
    if prompt_tokens + max_tokens as usize > limit {
        return Err(ProtocolError::ContextLengthExceeded {
            param: "max_tokens".into(),
            message: format!(
                "input length and `max_tokens` exceed context limit: {prompt_tokens} + \
                 {max_tokens} > {limit}, decrease input length or `max_tokens` and try again"
            ),
        });
    }
    Ok(max_tokens)
}

/// `msg_` and 24 alphanumerics.
pub fn message_id() -> String {
    prefixed_id("msg_")
}

/// `toolu_` and 24 alphanumerics.
pub fn tool_use_id() -> String {
    prefixed_id("toolu_")
}

/// `req_` and 24 alphanumerics (the `request-id` header).
pub fn anthropic_request_id() -> String {
    prefixed_id("req_")
}

fn prefixed_id(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 24)
    )
}

/// A `thinking` block's `signature`: an opaque tag of its text (clients send it back with
/// the block; tokenmill does not render earlier thinking, so nothing is verified against it).
pub fn thinking_signature(thinking: &str) -> String {
    // FNV-1a: stable across processes and versions, unlike `DefaultHasher`.
    let hash = thinking
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("tokenmill-{hash:016x}")
}

/// Why a message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnthropicStopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

/// A response content block (and the start of a streamed one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
}

/// `usage`. `input_tokens` counts the prompt tokens not read from the prefix cache, as
/// Anthropic does (the whole prompt is `input_tokens + cache_read_input_tokens`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesUsage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Always 0: the prefix cache is written as a side effect of every prompt, at no cost.
    pub cache_creation_input_tokens: u32,
    pub cache_read_input_tokens: u32,
    pub service_tier: Option<String>,
}

impl MessagesUsage {
    pub fn new(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Self {
        Self {
            input_tokens: prompt_tokens.saturating_sub(cached_tokens),
            output_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached_tokens,
            service_tier: Some("standard".into()),
        }
    }
}

/// The response message (`type: "message"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub content: Vec<ResponseBlock>,
    pub model: String,
    pub stop_reason: Option<AnthropicStopReason>,
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
    /// With `context_management`: the edits that were applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_management: Option<Value>,
}

impl MessageResponse {
    /// A message with no content yet (also the `message_start` event's message).
    pub fn new(id: String, model: String, usage: MessagesUsage) -> Self {
        Self {
            id,
            kind: "message".into(),
            role: "assistant".into(),
            content: Vec::new(),
            model,
            stop_reason: None,
            stop_sequence: None,
            usage,
            context_management: None,
        }
    }
}

/// `context_management` of a response: the `clear_tool_uses` edit when it cleared results,
/// with the input tokens the clearing freed.
pub fn applied_edits(cleared_tool_uses: usize, cleared_input_tokens: usize) -> Value {
    let edits = if cleared_tool_uses > 0 {
        vec![
            json!({"type": "clear_tool_uses_20250919", "cleared_tool_uses": cleared_tool_uses,
            "cleared_input_tokens": cleared_input_tokens}),
        ]
    } else {
        Vec::new()
    };
    json!({"applied_edits": edits})
}

/// A streamed block's delta.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
    ThinkingDelta { thinking: String },
    SignatureDelta { signature: String },
}

/// `message_delta`'s `delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageDelta {
    pub stop_reason: Option<AnthropicStopReason>,
    pub stop_sequence: Option<String>,
}

/// One streamed event; its `type` is also the SSE `event:` name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart {
        message: MessageResponse,
    },
    ContentBlockStart {
        index: usize,
        content_block: ResponseBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: MessagesUsage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_management: Option<Value>,
    },
    MessageStop,
    Ping,
    Error {
        error: AnthropicErrorBody,
    },
}

impl StreamEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Ping => "ping",
            Self::Error { .. } => "error",
        }
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicError {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnthropicErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// HTTP status Anthropic answers "overloaded" with (the SDKs retry it).
pub const OVERLOADED_STATUS: u16 = 529;

impl AnthropicError {
    /// The Anthropic form of an OpenAI-shaped error: its status and body (a 503 becomes
    /// Anthropic's 529 `overloaded_error`; any other 5xx a 500 `api_error`).
    pub fn from_openai(error: &ErrorResponse) -> (u16, Self) {
        let (status, kind) = match error.status() {
            400 | 405 | 408 | 422 => (error.status(), "invalid_request_error"),
            401 => (401, "authentication_error"),
            403 => (403, "permission_error"),
            404 => (404, "not_found_error"),
            413 => (413, "request_too_large"),
            429 => (429, "rate_limit_error"),
            503 | 529 => (OVERLOADED_STATUS, "overloaded_error"),
            _ => (500, "api_error"),
        };
        (
            status,
            AnthropicError {
                kind: "error".into(),
                error: AnthropicErrorBody {
                    kind: kind.into(),
                    message: error.error.message.clone(),
                },
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<MessagesRequest, ProtocolError> {
        parse_anthropic(body.to_string().as_bytes())
    }

    fn minimal(extra: Value) -> Value {
        let mut body = json!({"model": "m", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        for (body, path, field) in [
            (minimal(json!({"frobnicate": 1})), "", "frobnicate"),
            (
                minimal(json!({"messages": [{"role": "user", "content": "x", "name": "n"}]})),
                "messages[0]",
                "name",
            ),
            (
                minimal(json!({"messages": [{"role": "user", "content": [
                    {"type": "text", "text": "a"}, {"type": "text", "text": "b", "bold": true}]}]})),
                "messages[0].content",
                "bold",
            ),
            (
                minimal(json!({"tool_choice": {"type": "auto", "extra": 1}})),
                "tool_choice",
                "extra",
            ),
            (
                minimal(
                    json!({"tools": [{"name": "f", "input_schema": {"type": "object"}, "x": 1}]}),
                ),
                "tools",
                "x",
            ),
        ] {
            let message = request(body).unwrap_err().to_string();
            assert!(message.contains(field), "{message}");
            assert!(message.starts_with(path), "{path}: {message}");
        }
        let message = request(minimal(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b", "bold": true}]}]})))
        .unwrap_err()
        .to_string();
        assert!(message.contains("[1]"), "{message}");
    }

    #[test]
    fn unsupported_blocks_and_server_tools_are_named() {
        let image = minimal(json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}));
        let message = request(image).unwrap_err().to_string();
        assert!(
            message.contains("`image` content blocks are not supported"),
            "{message}"
        );
        let search =
            minimal(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}));
        let message = request(search).unwrap_err().to_string();
        assert!(
            message.contains("web_search_20250305") && message.contains("server tool"),
            "{message}"
        );
        let result_image = minimal(json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]}));
        assert!(request(result_image)
            .unwrap_err()
            .to_string()
            .contains("`document`"));
        let effort = request(minimal(json!({"output_config": {"effort": "max"}}))).unwrap();
        assert_eq!(
            effort.prompt(false).unwrap().template.chat_template_kwargs["reasoning_effort"],
            "high"
        );
        let effort = request(minimal(json!({"output_config": {"effort": "extreme"}}))).unwrap();
        assert_eq!(
            effort.prompt(false).unwrap_err().param(),
            Some("output_config.effort")
        );
    }

    #[test]
    fn max_tokens_and_model_are_required() {
        let message = request(json!({"model": "m", "messages": []}))
            .unwrap_err()
            .to_string();
        assert!(message.contains("max_tokens"), "{message}");
        let message = request(json!({"max_tokens": 3, "messages": []}))
            .unwrap_err()
            .to_string();
        assert!(message.contains("model"), "{message}");
    }

    #[test]
    fn a_tool_round_trip_becomes_chat_messages() {
        let body = minimal(json!({
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "system", "content": "Reminder."},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true},
                    {"type": "text", "text": "Thanks"}]}],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "disabled"},
            "metadata": {"user_id": "u"}, "service_tier": "auto"
        }));
        let prompt = request(body).unwrap().prompt(false).unwrap();
        let roles: Vec<&str> = prompt
            .conversation
            .iter()
            .map(|m| m.role.as_str())
            .collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "system",
                "tool",
                "tool",
                "user"
            ]
        );
        let assistant = &prompt.conversation[2];
        assert_eq!(assistant.content.as_deref(), Some("Checking."));
        let calls = assistant.tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["id"], "toolu_1");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(prompt.conversation[4].content.as_deref(), Some("sunny"));
        assert_eq!(
            prompt.conversation[4].tool_call_id.as_deref(),
            Some("toolu_1")
        );
        assert_eq!(
            prompt.conversation[5].content.as_deref(),
            Some("Error: boom")
        );
        assert_eq!(prompt.tool_choice, Some(json!("required")));
        assert_eq!(prompt.parallel_tool_calls, Some(false));
        assert_eq!(
            prompt.tools.unwrap()[0],
            json!({"type": "function", "function": {"name": "get_weather",
                "description": "Weather", "parameters": {"type": "object"}}})
        );
        assert_eq!(
            prompt.template.chat_template_kwargs["enable_thinking"],
            json!(false)
        );
        assert!(prompt.template.add_generation_prompt);
    }

    #[test]
    fn thinking_display_and_automatic_caching_are_read() {
        let omitted = request(minimal(
            json!({"thinking": {"type": "adaptive", "display": "omitted"},
            "cache_control": {"type": "ephemeral", "ttl": "1h"}}),
        ))
        .unwrap();
        let prompt = omitted.prompt(false).unwrap();
        assert!(prompt.omit_thinking);
        assert_eq!(
            prompt.template.chat_template_kwargs["enable_thinking"],
            json!(true)
        );
        let shown = request(minimal(
            json!({"thinking": {"type": "enabled", "budget_tokens": 2048,
            "display": "summarized"}, "max_tokens": 4096}),
        ))
        .unwrap();
        assert!(!shown.prompt(false).unwrap().omit_thinking);
        assert!(request(minimal(
            json!({"thinking": {"type": "adaptive", "display": "full"}})
        ))
        .is_err());
        assert!(request(minimal(json!({"cache_control": {"type": "persistent"}}))).is_err());
    }

    #[test]
    fn a_final_assistant_message_is_continued() {
        let body = minimal(json!({"messages": [{"role": "user", "content": "Count"},
            {"role": "assistant", "content": "1, 2,"}]}));
        let prompt = request(body).unwrap().prompt(false).unwrap();
        assert!(prompt.template.continue_final_message);
        assert!(!prompt.template.add_generation_prompt);
    }

    #[test]
    fn sampling_follows_anthropics_ranges() {
        let limits = ValidationLimits::new(100, 1000);
        let ok = request(minimal(
            json!({"temperature": 0.5, "top_k": 5, "stop_sequences": ["END"], "stream": true}),
        ))
        .unwrap()
        .validate(&limits)
        .unwrap();
        assert_eq!(ok.sampling.max_tokens, Some(16));
        assert_eq!(ok.sampling.stop, ["END"]);
        assert!(ok.output.stream);
        for (extra, param) in [
            (json!({"temperature": 1.5}), "temperature"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (
                json!({"thinking": {"type": "enabled", "budget_tokens": 100}}),
                "thinking.budget_tokens",
            ),
            (json!({"top_p": 0}), "top_p"),
        ] {
            let error = request(minimal(extra))
                .unwrap()
                .validate(&limits)
                .unwrap_err();
            assert_eq!(error.param(), Some(param));
        }
        let schema = request(minimal(
            json!({"output_config": {"format": {"type": "json_schema",
            "schema": {"type": "object"}}}}),
        ))
        .unwrap()
        .validate(&limits)
        .unwrap();
        assert_eq!(
            schema.sampling.structured_output.unwrap().param,
            "output_config.format.schema"
        );
    }

    #[test]
    fn context_messages_are_anthropics() {
        let long = check_context(200, 10, 200).unwrap_err();
        assert!(
            long.to_string()
                .starts_with("prompt is too long: 200 tokens > 199"),
            "{long}"
        );
        let both = check_context(150, 100, 200).unwrap_err();
        assert!(both.to_string().contains("150 + 100 > 200"), "{both}");
        assert_eq!(check_context(100, 100, 200).unwrap(), 100);
    }

    #[test]
    fn clear_tool_uses_keeps_the_latest_results() {
        let turn = |id: &str| {
            vec![
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "f", "input": {}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "data"}]}),
            ]
        };
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for id in ["a", "b", "c"] {
            messages.extend(turn(id));
        }
        let body = minimal(
            json!({"messages": messages, "context_management": {"edits": [
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10},
             "keep": {"type": "tool_uses", "value": 1}},
            {"type": "clear_thinking_20251015"}]}}),
        );
        let request = request(body).unwrap();
        assert_eq!(
            request.clear_trigger().unwrap(),
            Some(ClearRule {
                trigger: 10,
                at_least: 0
            })
        );
        let untouched = request.prompt(false).unwrap();
        assert_eq!(untouched.cleared_tool_uses, 0);
        let cleared = request.prompt(true).unwrap();
        assert_eq!(cleared.cleared_tool_uses, 2);
        let results: Vec<&str> = cleared
            .conversation
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| m.content.as_deref())
            .collect();
        assert_eq!(results, [CLEARED_TOOL_RESULT, CLEARED_TOOL_RESULT, "data"]);
    }

    #[test]
    fn clear_tool_inputs_clears_the_cleared_uses_arguments_and_clear_at_least_is_read() {
        let turn = |id: &str| {
            vec![
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "f", "input": {"q": id}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "data"}]}),
            ]
        };
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for id in ["a", "b", "c"] {
            messages.extend(turn(id));
        }
        let arguments = |clear_inputs: bool| {
            let body = minimal(
                json!({"messages": messages.clone(), "context_management": {"edits": [
                {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1},
                 "clear_at_least": {"type": "input_tokens", "value": 500},
                 "clear_tool_inputs": clear_inputs}]}}),
            );
            let request = request(body).unwrap();
            assert_eq!(
                request.clear_trigger().unwrap(),
                Some(ClearRule {
                    trigger: DEFAULT_CLEAR_TRIGGER,
                    at_least: 500
                })
            );
            let cleared = request.prompt(true).unwrap();
            cleared
                .conversation
                .iter()
                .flat_map(|m| m.tool_calls.iter().flatten())
                .map(|call| call["function"]["arguments"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(arguments(true), ["{}", "{}", r#"{"q":"c"}"#]);
        assert_eq!(
            arguments(false),
            [r#"{"q":"a"}"#, r#"{"q":"b"}"#, r#"{"q":"c"}"#]
        );
        let wrong_unit = minimal(json!({"context_management": {"edits": [
            {"type": "clear_tool_uses_20250919", "clear_at_least": {"type": "tool_uses", "value": 1}}]}}));
        let error = request(wrong_unit).unwrap().clear_trigger().unwrap_err();
        assert!(error.to_string().contains("clear_at_least"), "{error}");
    }

    #[test]
    fn clear_thinking_keeps_the_latest_turns_thinking_for_the_template() {
        let turn = |n: usize| {
            vec![
                json!({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": format!("plan {n}"), "signature": "s"},
                    {"type": "redacted_thinking", "data": "x"},
                    {"type": "text", "text": format!("answer {n}")}]}),
                json!({"role": "user", "content": format!("next {n}")}),
            ]
        };
        let mut messages = vec![json!({"role": "user", "content": "go"})];
        for n in 0..3 {
            messages.extend(turn(n));
        }
        let reasoning = |edits: Value| -> Result<Vec<Option<String>>, ProtocolError> {
            let mut body = minimal(json!({"messages": messages}));
            if !edits.is_null() {
                body["context_management"] = json!({"edits": [edits]});
            }
            Ok(request(body)?
                .prompt(false)?
                .conversation
                .into_iter()
                .filter(|m| m.role == Role::Assistant)
                .map(|m| m.reasoning_content)
                .collect())
        };
        let plan = |n: usize| Some(format!("plan {n}"));
        // No edit: earlier thinking is not rendered.
        assert_eq!(reasoning(Value::Null).unwrap(), [None, None, None]);
        let edit = |keep: Value| {
            let mut edit = json!({"type": "clear_thinking_20251015"});
            if !keep.is_null() {
                edit["keep"] = keep;
            }
            edit
        };
        // Anthropic's default keeps the latest turn; "all" and N turns as asked.
        assert_eq!(reasoning(edit(Value::Null)).unwrap(), [None, None, plan(2)]);
        assert_eq!(
            reasoning(edit(json!("all"))).unwrap(),
            [plan(0), plan(1), plan(2)]
        );
        let two = json!({"type": "thinking_turns", "value": 2});
        assert_eq!(reasoning(edit(two)).unwrap(), [None, plan(1), plan(2)]);
        let none = json!({"type": "thinking_turns", "value": 0});
        assert_eq!(reasoning(edit(none)).unwrap(), [None, None, None]);
        for bad in [
            json!("some"),
            json!({"type": "tool_uses", "value": 1}),
            json!(3),
        ] {
            let error = reasoning(edit(bad)).unwrap_err();
            assert_eq!(error.param(), Some("context_management.edits[0].keep"));
        }
        // The template sees it as the assistant message's reasoning_content.
        let body = minimal(json!({"messages": messages,
            "context_management": {"edits": [edit(json!("all"))]}}));
        let rendered =
            serde_json::to_value(&request(body).unwrap().prompt(false).unwrap().conversation[1])
                .unwrap();
        assert_eq!(rendered["reasoning_content"], "plan 0");
        assert_eq!(rendered["content"], "answer 0");
    }

    #[test]
    fn errors_take_anthropics_types_and_statuses() {
        for (openai, status, kind) in [
            (
                ErrorResponse::invalid_request("x"),
                400,
                "invalid_request_error",
            ),
            (
                ErrorResponse::authentication("x"),
                401,
                "authentication_error",
            ),
            (ErrorResponse::model_not_found("x"), 404, "not_found_error"),
            (ErrorResponse::overloaded("x"), 529, "overloaded_error"),
            (ErrorResponse::internal("x"), 500, "api_error"),
        ] {
            let (got, body) = AnthropicError::from_openai(&openai);
            assert_eq!((got, body.error.kind.as_str()), (status, kind));
            assert_eq!(
                serde_json::to_value(&body).unwrap(),
                json!({"type": "error", "error": {"type": kind, "message": "x"}})
                    .as_object()
                    .map(|o| {
                        let mut o = o.clone();
                        if kind == "not_found_error" {
                            o["error"]["message"] = json!("The model `x` does not exist.");
                        }
                        Value::Object(o)
                    })
                    .unwrap()
            );
        }
    }

    #[test]
    fn events_serialize_with_their_type() {
        let event = StreamEvent::ContentBlockDelta {
            index: 1,
            delta: BlockDelta::InputJsonDelta {
                partial_json: "{}".into(),
            },
        };
        assert_eq!(event.name(), "content_block_delta");
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{}"}})
        );
        assert_eq!(
            serde_json::to_value(StreamEvent::MessageStop).unwrap(),
            json!({"type": "message_stop"})
        );
        assert_eq!(thinking_signature("a"), thinking_signature("a"));
        assert_ne!(thinking_signature("a"), thinking_signature("b"));
    }
}
