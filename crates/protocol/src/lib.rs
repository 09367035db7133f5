//! tokenmill-protocol: the OpenAI/vLLM wire format and its validation.
//!
//! This is the only crate that knows what OpenAI clients, vLLM's benchmark, GuideLLM and
//! lm-eval put on the wire (architecture invariant 2). The server maps HTTP onto these types;
//! the engine only ever sees the plain, checked [`SamplingOptions`].
//!
//! # Key types
//!
//! - Requests: [`CompletionRequest`] (prompt as [`PromptInput`]), [`ChatCompletionRequest`]
//!   (messages as [`ChatMessage`] with string or text-part content), [`TokenizeRequest`],
//!   [`DetokenizeRequest`]. Unknown fields are ignored; every optional field accepts `null`.
//! - Responses: [`CompletionResponse`] / [`CompletionStreamChunk`] (legacy
//!   [`CompletionLogprobs`]), [`ChatCompletionResponse`] / [`ChatCompletionChunk`], [`Usage`],
//!   [`ModelList`], [`TokenizeResponse`], [`DetokenizeResponse`], [`ErrorResponse`].
//! - Validation: [`ValidationLimits`] in, [`ValidatedSampling`] ([`SamplingOptions`] +
//!   [`OutputOptions`]) out, or a [`ProtocolError`] naming the offending `param` (a 400).
//! - Structured outputs: `response_format`, `structured_outputs` and the legacy `guided_*`
//!   fields ([`GuidedDecodingParams`]) checked into one [`StructuredOutputRequest`].
//! - Pooling routes (`pooling.rs`): [`EmbeddingRequest`] (`/v1/embeddings`, `/pooling`),
//!   [`ScoreRequest`], [`RerankRequest`], [`ClassifyRequest`] and their responses; vectors
//!   as floats or base64 ([`WireVector`]); [`truncation_limit`] and [`input_too_long`] are
//!   vLLM's 400s.
//! - Anthropic's Messages API (`anthropic.rs`): [`MessagesRequest`] and
//!   [`CountTokensRequest`] (strict: unknown fields are a 400 naming them), checked into a
//!   [`MessagesPrompt`] of chat messages; [`MessageResponse`], [`StreamEvent`] and
//!   [`AnthropicError`].
//! - OpenAI's Responses API (`responses.rs`, `responses_object.rs`, `responses_tools.rs`):
//!   [`ResponsesRequest`] (strict) with its input [`ResponseItem`]s, checked into the chat
//!   path's conversation ([`items_conversation`]) and tools ([`ResponsesTools`]: function,
//!   custom and namespace tools as chat functions, [`ToolNames`] to read calls back);
//!   [`ResponseObject`] and the
//!   stream's [`SequencedEvent`]s.
//! - [`openapi_json`]: the OpenAPI 3.1 document of the served routes.
//!
//! # Usage (server side)
//!
//! ```
//! use tokenmill_protocol::{parse_json, CompletionRequest, ErrorResponse, ValidationLimits};
//!
//! let limits = ValidationLimits::new(2048, 49152);
//! let body = br#"{"model": "m", "prompt": "Hello", "max_tokens": 8, "top_k": 40}"#;
//! let request: CompletionRequest = parse_json(body).unwrap();
//! let validated = request.validate(&limits).unwrap();
//! let prompts = request.prompts(&limits).unwrap();
//! // ... tokenize prompts[0], then check the context budget:
//! let max_tokens = validated.resolve_max_tokens(5, &limits).unwrap();
//! assert_eq!((max_tokens, validated.sampling.top_k), (8, Some(40)));
//!
//! let bad: CompletionRequest = parse_json(br#"{"prompt": "x", "top_p": 0}"#).unwrap();
//! let error = ErrorResponse::from(bad.validate(&limits).unwrap_err());
//! assert_eq!((error.status(), error.error.param.as_deref()), (400, Some("top_p")));
//! ```
//!
//! - Tools: `tools`, `tool_choice`, `parallel_tool_calls` checked into a [`ToolPlan`] (which
//!   prompt, which grammar, which parser); response [`ToolCall`]s and streamed
//!   [`DeltaToolCall`]s.
//!
//! Not implemented yet (accepted on the wire, documented in the OpenAPI document):
//! `best_of` must equal `n`; beam search is a 400.

mod anthropic;
mod chat;
mod common;
mod completion;
mod error;
mod lora;
mod models;
mod openapi;
mod pooling;
mod responses;
mod responses_object;
mod responses_openapi;
mod responses_tools;
mod sampling;
mod structured;
mod tools;

pub use anthropic::{
    anthropic_request_id, applied_edits, check_context, message_id, parse_anthropic,
    thinking_signature, tool_use_id, AnthropicError, AnthropicErrorBody, AnthropicStopReason,
    BlockDelta, ClearRule, CountTokensRequest, MessageDelta, MessageResponse, MessagesPrompt,
    MessagesRequest, MessagesUsage, ResponseBlock, StreamEvent, OVERLOADED_STATUS,
};
pub use chat::{
    conversation, set_reasoning_effort, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
    ChatCompletionRequest, ChatCompletionResponse, ChatDelta, ChatLogprobToken, ChatLogprobs,
    ChatMessage, ChatResponseMessage, ChatTemplateOptions, ChatTopLogprob, ContentPart,
    ConversationMessage, MessageContent, Role, REASONING_EFFORTS,
};
pub use common::{
    chat_completion_id, completion_id, random_hex_id, wire_logprob, FinishReason,
    PromptTokensDetails, ResponseFormat, ResponseFormatKind, StopInput, StopReason, StreamOptions,
    TopLogprobMap, Usage,
};
pub use completion::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    CompletionStreamChoice, CompletionStreamChunk, Prompt, PromptInput, PromptLogprob,
    PromptLogprobs,
};
pub use error::{parse_json, parse_json_noting_ignored, ErrorBody, ErrorResponse, ProtocolError};
pub use lora::{LoadLoraAdapterRequest, UnloadLoraAdapterRequest};
pub use models::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeChatRequest,
    TokenizeCompletionRequest, TokenizeInput, TokenizeRequest, TokenizeResponse, VersionResponse,
};
pub use openapi::{apply_openapi_limits, apply_openapi_model_names, openapi_json};
pub use pooling::{
    input_too_long, truncation_limit, ClassifyData, ClassifyRequest, ClassifyResponse,
    EmbeddingData, EmbeddingRequest, EmbeddingResponse, EncodingFormat, PoolingUsage,
    RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankUsage, ScoreData,
    ScoreInput, ScoreRequest, ScoreResponse, WireVector,
};
pub use responses::{
    decode_reasoning, encode_reasoning, item_id, items_conversation, response_id,
    ContentPart as ResponseContentPart, CustomToolCallItem, CustomToolCallOutputItem,
    FunctionCallItem, FunctionCallOutputItem, Item as ResponseItem, ItemContent, ItemRole,
    MessageItem, ReasoningItem, ReasoningPart, ResponseInput, ResponsesRequest, TextFormat,
    HOSTED_TOOL_TYPES, INCLUDE_ENCRYPTED_REASONING, INCLUDE_LOGPROBS,
};
pub use responses_object::{
    IncompleteDetails, ResponseErrorBody, ResponseEvent, ResponseObject, ResponseStatus,
    ResponseUsage, SequencedEvent,
};
pub use responses_tools::{
    custom_arguments, custom_input, model_tool_name, ResponsesTools, ToolNames, ToolTarget,
    CUSTOM_INPUT_ARGUMENT,
};
pub use sampling::{
    OutputOptions, SamplingDefaults, SamplingOptions, ThinkingTokenBudget, ValidatedSampling,
    ValidationLimits, COMPLETION_DEFAULT_MAX_TOKENS, DEFAULT_MAX_LOGPROBS, DEFAULT_MAX_N,
    DEFAULT_MAX_PROMPTS, GREEDY_TEMPERATURE_EPSILON, MAX_CACHE_SALT_LEN,
};
pub use structured::{
    GuidedDecodingParams, StructuredConstraint, StructuredOutputRequest, StructuredOutputsParams,
};
pub use tools::{
    envelope_schema, parse_tool_choice, parse_tools, plan_tools, prepare_tool_history,
    tool_call_id, tool_system_prompt, ChatTool, DeltaFunctionCall, DeltaToolCall, FunctionCall,
    FunctionDefinition, ToolCall, ToolChoice, ToolOutput, ToolPlan, ToolSettings,
    AUTO_TOOL_CHOICE_DISABLED,
};
