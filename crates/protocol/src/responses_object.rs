//! The Responses API's response object (as OpenAI returns it: the echoed settings, output
//! items, usage) and its stream events, each with a `sequence_number`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::responses::{Item, ResponsesRequest};

/// Where a response stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Cancelled,
    Failed,
}

impl ResponseStatus {
    /// Whether the response is done (no more output comes).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Queued | Self::InProgress)
    }
}

/// `error` of a failed response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseErrorBody {
    pub code: String,
    pub message: String,
}

/// `incomplete_details`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens` (the budget ran out).
    pub reason: String,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

impl ResponseUsage {
    pub fn new(input: u32, cached: u32, output: u32, reasoning: u32) -> Self {
        ResponseUsage {
            input_tokens: input,
            input_tokens_details: InputTokensDetails {
                cached_tokens: cached,
            },
            output_tokens: output,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning,
            },
            total_tokens: input.saturating_add(output),
        }
    }
}

/// The response object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: String,
    pub created_at: u64,
    pub status: ResponseStatus,
    pub background: bool,
    pub error: Option<ResponseErrorBody>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub max_tool_calls: Option<u32>,
    pub metadata: Map<String, Value>,
    pub model: String,
    pub output: Vec<Item>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Value,
    pub service_tier: String,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_logprobs: i64,
    pub top_p: Option<f64>,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
}

impl ResponseObject {
    /// A response to `request` before any output, echoing its settings.
    pub fn new(
        id: String,
        created_at: u64,
        model: String,
        request: &ResponsesRequest,
        store: bool,
    ) -> Self {
        let format = request
            .text
            .as_ref()
            .and_then(|t| t.format.as_ref())
            .and_then(|f| serde_json::to_value(f).ok())
            .unwrap_or_else(|| serde_json::json!({"type": "text"}));
        ResponseObject {
            id,
            object: "response".into(),
            created_at,
            status: if request.is_background() {
                ResponseStatus::Queued
            } else {
                ResponseStatus::InProgress
            },
            background: request.is_background(),
            error: None,
            incomplete_details: None,
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens,
            max_tool_calls: None,
            metadata: request.metadata.clone().unwrap_or_default(),
            model,
            output: Vec::new(),
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            previous_response_id: request.previous_response_id.clone(),
            reasoning: serde_json::json!({
                "effort": request.reasoning.as_ref().and_then(|r| r.effort.clone()),
                "summary": request.reasoning.as_ref().and_then(|r| r.summary.clone()),
            }),
            service_tier: "default".into(),
            store,
            temperature: request.temperature,
            text: serde_json::json!({"format": format, "verbosity": "medium"}),
            tool_choice: request
                .tool_choice
                .clone()
                .unwrap_or_else(|| Value::String("auto".into())),
            tools: request.tools.clone().unwrap_or_default(),
            top_logprobs: request.top_logprobs.unwrap_or(0),
            top_p: request.top_p,
            truncation: request
                .truncation
                .clone()
                .unwrap_or_else(|| "disabled".into()),
            usage: None,
            user: request.user.clone(),
            prompt_cache_key: request.prompt_cache_key.clone(),
        }
    }
}

/// A streamed event's body (`type` is the event name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ResponseEvent {
    #[serde(rename = "response.created")]
    Created { response: Box<ResponseObject> },
    #[serde(rename = "response.queued")]
    Queued { response: Box<ResponseObject> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Box<ResponseObject> },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded { output_index: usize, item: Item },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone { output_index: usize, item: Item },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: Value,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: Value,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.custom_tool_call_input.delta")]
    CustomToolCallInputDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.custom_tool_call_input.done")]
    CustomToolCallInputDone {
        item_id: String,
        output_index: usize,
        input: String,
    },
    #[serde(rename = "response.completed")]
    Completed { response: Box<ResponseObject> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Box<ResponseObject> },
    #[serde(rename = "response.failed")]
    Failed { response: Box<ResponseObject> },
    #[serde(rename = "error")]
    Error {
        code: Option<String>,
        message: String,
        param: Option<String>,
    },
}

impl ResponseEvent {
    /// The event's name (its `type`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::Queued { .. } => "response.queued",
            Self::InProgress { .. } => "response.in_progress",
            Self::OutputItemAdded { .. } => "response.output_item.added",
            Self::OutputItemDone { .. } => "response.output_item.done",
            Self::ContentPartAdded { .. } => "response.content_part.added",
            Self::ContentPartDone { .. } => "response.content_part.done",
            Self::OutputTextDelta { .. } => "response.output_text.delta",
            Self::OutputTextDone { .. } => "response.output_text.done",
            Self::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            Self::ReasoningTextDone { .. } => "response.reasoning_text.done",
            Self::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::CustomToolCallInputDelta { .. } => "response.custom_tool_call_input.delta",
            Self::CustomToolCallInputDone { .. } => "response.custom_tool_call_input.done",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
            Self::Failed { .. } => "response.failed",
            Self::Error { .. } => "error",
        }
    }

    /// The final event of a finished response.
    pub fn terminal(response: ResponseObject) -> Self {
        let response = Box::new(response);
        match response.status {
            ResponseStatus::Incomplete => Self::Incomplete { response },
            ResponseStatus::Failed | ResponseStatus::Cancelled => Self::Failed { response },
            _ => Self::Completed { response },
        }
    }
}

/// An event with its place in the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequencedEvent {
    #[serde(flatten)]
    pub event: ResponseEvent,
    pub sequence_number: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_serialize_with_their_type_and_sequence_number() {
        let event = SequencedEvent {
            event: ResponseEvent::OutputTextDelta {
                item_id: "msg_1".into(),
                output_index: 0,
                content_index: 0,
                delta: "Hi".into(),
                logprobs: vec![],
            },
            sequence_number: 4,
        };
        let value = serde_json::to_value(&event).unwrap();
        assert_eq!(
            value,
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                   "content_index": 0, "delta": "Hi", "logprobs": [], "sequence_number": 4})
        );
        assert_eq!(event.event.name(), "response.output_text.delta");
        let back: SequencedEvent = serde_json::from_value(value).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn a_response_echoes_its_request() {
        let request: ResponsesRequest = serde_json::from_value(json!({
            "input": "x", "instructions": "be kind", "metadata": {"k": "v"}, "background": true,
            "tool_choice": "required", "temperature": 0.5,
        }))
        .unwrap();
        let response = ResponseObject::new("resp_1".into(), 3, "m".into(), &request, true);
        let value = serde_json::to_value(&response).unwrap();
        assert_eq!(value["status"], "queued");
        assert_eq!(value["instructions"], "be kind");
        assert_eq!(value["metadata"]["k"], "v");
        assert_eq!(value["tool_choice"], "required");
        assert_eq!(value["text"]["format"]["type"], "text");
        assert_eq!(value["object"], "response");
        let back: ResponseObject = serde_json::from_value(value).unwrap();
        assert_eq!(back, response);
    }
}
