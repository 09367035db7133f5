//! A response's output read from the engine: the chat path's pieces (reasoning, text, calls;
//! `chat_output.rs`) become output items and the Responses stream events, in one machine, so
//! a streamed response's deltas concatenate to exactly the final object's output (a
//! non-streamed response runs the same machine and drops the events).
//!
//! A call's name is looked up in the request's [`ToolNames`]: a custom tool's call becomes a
//! `custom_tool_call` whose `input` is the `input` string of the arguments the model wrote.
//! Those arguments are JSON until the call ends, so the input is sent as one
//! `custom_tool_call_input.delta` when the call closes (then `.done`): the deltas still
//! concatenate to the item's input.

use std::future::Future;

use std::collections::HashMap;

use serde_json::{json, Value};
use tokenmill_engine::{FinishReason as EngineFinish, RequestEvent, RequestStream};
use tokenmill_protocol::{
    custom_input, encode_reasoning, item_id, CustomToolCallItem, FunctionCallItem,
    IncompleteDetails, ItemContent, ItemRole, MessageItem, ReasoningItem, ReasoningPart,
    ResponseContentPart, ResponseErrorBody, ResponseEvent, ResponseItem, ResponseObject,
    ResponseStatus, ResponseUsage, ToolNames,
};

use crate::chat_output::{ChoiceReader, Piece};
use crate::generation::chat_logprobs;
use crate::state::AppState;

/// Where a run's events go; `false` stops the run (the client is gone).
pub(crate) trait EventSink: Send {
    fn emit(&mut self, event: ResponseEvent) -> impl Future<Output = bool> + Send;
}

/// A non-streamed response: events are dropped.
pub(crate) struct NullSink;

impl EventSink for NullSink {
    async fn emit(&mut self, _event: ResponseEvent) -> bool {
        true
    }
}

/// The kind of the item being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Message,
    Reasoning,
    /// A call, with the parser's index of it.
    Call(usize),
}

/// Pieces in, output items and events out.
#[derive(Debug, Default)]
pub(crate) struct OutputBuilder {
    items: Vec<ResponseItem>,
    open: Option<Open>,
    /// The parser's call index → output index.
    calls: Vec<(usize, usize)>,
    /// The request's tool names (custom and namespaced tools).
    names: ToolNames,
    /// `include: ["reasoning.encrypted_content"]`.
    encrypted_reasoning: bool,
    /// A custom call's arguments as written so far, by output index.
    custom_arguments: HashMap<usize, String>,
}

fn text_part(text: &str, logprobs: Vec<Value>) -> ResponseContentPart {
    ResponseContentPart::OutputText {
        text: text.to_string(),
        annotations: Vec::new(),
        logprobs: Some(logprobs),
    }
}

fn part_value(part: &ResponseContentPart) -> Value {
    serde_json::to_value(part).unwrap_or(Value::Null)
}

impl OutputBuilder {
    pub fn new(names: ToolNames, encrypted_reasoning: bool) -> Self {
        OutputBuilder {
            names,
            encrypted_reasoning,
            ..OutputBuilder::default()
        }
    }

    pub fn into_items(self) -> Vec<ResponseItem> {
        self.items
    }

    fn open_index(&self) -> usize {
        self.items.len().saturating_sub(1)
    }

    fn open_id(&self) -> String {
        self.items
            .last()
            .and_then(ResponseItem::id)
            .unwrap_or_default()
            .to_string()
    }

    /// One step's pieces; `logprobs` (the step's tokens, only with plain output) go with its
    /// text.
    pub fn push(&mut self, pieces: Vec<Piece>, mut logprobs: Vec<Value>) -> Vec<ResponseEvent> {
        let mut events = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => {
                    self.ensure(Open::Reasoning, &mut events);
                    if let Some(ResponseItem::Reasoning(item)) = self.items.last_mut() {
                        if let Some(part) = item.content.as_mut().and_then(|c| c.first_mut()) {
                            part.text.push_str(&text);
                        }
                    }
                    events.push(ResponseEvent::ReasoningTextDelta {
                        item_id: self.open_id(),
                        output_index: self.open_index(),
                        content_index: 0,
                        delta: text,
                    });
                }
                Piece::Content(text) => {
                    self.ensure(Open::Message, &mut events);
                    let step_logprobs = std::mem::take(&mut logprobs);
                    if let Some(ResponseItem::Message(item)) = self.items.last_mut() {
                        if let ItemContent::Parts(parts) = &mut item.content {
                            if let Some(ResponseContentPart::OutputText {
                                text: whole,
                                logprobs: Some(all),
                                ..
                            }) = parts.first_mut()
                            {
                                whole.push_str(&text);
                                all.extend(step_logprobs.iter().cloned());
                            }
                        }
                    }
                    events.push(ResponseEvent::OutputTextDelta {
                        item_id: self.open_id(),
                        output_index: self.open_index(),
                        content_index: 0,
                        delta: text,
                        logprobs: step_logprobs,
                    });
                }
                Piece::CallStart { index, id, name } => {
                    self.close(&mut events);
                    let target = self.names.target(&name);
                    self.items.push(if target.custom {
                        ResponseItem::CustomToolCall(CustomToolCallItem {
                            id: Some(item_id("ctc_")),
                            call_id: id,
                            name: target.name,
                            input: String::new(),
                            namespace: target.namespace,
                            status: None,
                        })
                    } else {
                        ResponseItem::FunctionCall(FunctionCallItem {
                            id: Some(item_id("fc_")),
                            call_id: id,
                            name: target.name,
                            arguments: String::new(),
                            namespace: target.namespace,
                            status: Some("in_progress".into()),
                        })
                    });
                    self.open = Some(Open::Call(index));
                    self.calls.push((index, self.open_index()));
                    events.push(ResponseEvent::OutputItemAdded {
                        output_index: self.open_index(),
                        item: self.items[self.open_index()].clone(),
                    });
                }
                Piece::Arguments { index, fragment } => {
                    let Some(&(_, output_index)) = self.calls.iter().find(|(i, _)| *i == index)
                    else {
                        continue;
                    };
                    match self.items.get_mut(output_index) {
                        Some(ResponseItem::FunctionCall(call)) => {
                            call.arguments.push_str(&fragment);
                            events.push(ResponseEvent::FunctionCallArgumentsDelta {
                                item_id: call.id.clone().unwrap_or_default(),
                                output_index,
                                delta: fragment,
                            });
                        }
                        Some(ResponseItem::CustomToolCall(_)) => self
                            .custom_arguments
                            .entry(output_index)
                            .or_default()
                            .push_str(&fragment),
                        _ => {}
                    }
                }
            }
        }
        events
    }

    /// Opens an item of `kind` unless one is open.
    fn ensure(&mut self, kind: Open, events: &mut Vec<ResponseEvent>) {
        if self.open == Some(kind) {
            return;
        }
        self.close(events);
        let (item, part) = match kind {
            Open::Message => {
                let part = text_part("", Vec::new());
                (
                    ResponseItem::Message(MessageItem {
                        id: Some(item_id("msg_")),
                        role: ItemRole::Assistant,
                        content: ItemContent::Parts(Vec::new()),
                        status: Some("in_progress".into()),
                    }),
                    part_value(&part),
                )
            }
            _ => (
                ResponseItem::Reasoning(ReasoningItem {
                    id: Some(item_id("rs_")),
                    summary: Vec::new(),
                    content: Some(Vec::new()),
                    encrypted_content: None,
                    status: None,
                }),
                json!({"type": "reasoning_text", "text": ""}),
            ),
        };
        self.items.push(item);
        self.open = Some(kind);
        let output_index = self.open_index();
        events.push(ResponseEvent::OutputItemAdded {
            output_index,
            item: self.items[output_index].clone(),
        });
        // The part is added after the item was announced empty.
        match self.items.last_mut() {
            Some(ResponseItem::Message(item)) => {
                item.content = ItemContent::Parts(vec![text_part("", Vec::new())])
            }
            Some(ResponseItem::Reasoning(item)) => {
                item.content = Some(vec![ReasoningPart {
                    part_type: "reasoning_text".into(),
                    text: String::new(),
                }])
            }
            _ => {}
        }
        events.push(ResponseEvent::ContentPartAdded {
            item_id: self.open_id(),
            output_index,
            content_index: 0,
            part,
        });
    }

    /// Closes the open item: its `.done` events.
    fn close(&mut self, events: &mut Vec<ResponseEvent>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let output_index = self.open_index();
        let item_id = self.open_id();
        let Some(item) = self.items.last_mut() else {
            return;
        };
        match (open, item) {
            (Open::Message, ResponseItem::Message(message)) => {
                message.status = Some("completed".into());
                if let ItemContent::Parts(parts) = &message.content {
                    if let Some(part @ ResponseContentPart::OutputText { text, logprobs, .. }) =
                        parts.first()
                    {
                        events.push(ResponseEvent::OutputTextDone {
                            item_id: item_id.clone(),
                            output_index,
                            content_index: 0,
                            text: text.clone(),
                            logprobs: logprobs.clone().unwrap_or_default(),
                        });
                        events.push(ResponseEvent::ContentPartDone {
                            item_id,
                            output_index,
                            content_index: 0,
                            part: part_value(part),
                        });
                    }
                }
            }
            (Open::Reasoning, ResponseItem::Reasoning(reasoning)) => {
                if self.encrypted_reasoning {
                    let text: String = reasoning
                        .content
                        .iter()
                        .flatten()
                        .map(|part| part.text.as_str())
                        .collect();
                    reasoning.encrypted_content = Some(encode_reasoning(&text));
                }
                if let Some(part) = reasoning.content.as_ref().and_then(|c| c.first()) {
                    events.push(ResponseEvent::ReasoningTextDone {
                        item_id: item_id.clone(),
                        output_index,
                        content_index: 0,
                        text: part.text.clone(),
                    });
                    events.push(ResponseEvent::ContentPartDone {
                        item_id,
                        output_index,
                        content_index: 0,
                        part: json!({"type": "reasoning_text", "text": part.text}),
                    });
                }
            }
            (Open::Call(_), ResponseItem::FunctionCall(call)) => {
                call.status = Some("completed".into());
                events.push(ResponseEvent::FunctionCallArgumentsDone {
                    item_id,
                    output_index,
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                });
            }
            (Open::Call(_), ResponseItem::CustomToolCall(call)) => {
                let arguments = self
                    .custom_arguments
                    .remove(&output_index)
                    .unwrap_or_default();
                call.input = custom_input(&arguments);
                if !call.input.is_empty() {
                    events.push(ResponseEvent::CustomToolCallInputDelta {
                        item_id: item_id.clone(),
                        output_index,
                        delta: call.input.clone(),
                    });
                }
                events.push(ResponseEvent::CustomToolCallInputDone {
                    item_id,
                    output_index,
                    input: call.input.clone(),
                });
            }
            _ => return,
        }
        events.push(ResponseEvent::OutputItemDone {
            output_index,
            item: self.items[output_index].clone(),
        });
    }

    /// Closes what is open.
    pub fn finish(&mut self) -> Vec<ResponseEvent> {
        let mut events = Vec::new();
        self.close(&mut events);
        events
    }
}

/// What a run needs besides its engine stream.
pub(crate) struct RunSetup {
    pub state: AppState,
    pub response: ResponseObject,
    pub reader: ChoiceReader,
    pub prompt_tokens: u32,
    /// `top_logprobs` when logprobs go into the text parts.
    pub logprobs: Option<usize>,
    /// The request's tool names (custom and namespaced tools).
    pub tool_names: ToolNames,
    /// `include: ["reasoning.encrypted_content"]`.
    pub encrypted_reasoning: bool,
}

/// Why a run ended without a response.
pub(crate) enum RunEnd {
    /// The response, finished (completed, incomplete, cancelled or failed).
    Finished(Box<ResponseObject>),
    /// The sink refused an event (the client is gone); the engine request is dropped.
    Gone,
}

/// Runs a response to its end: `created`, `in_progress`, the output events, then the
/// terminal event. `cancelled()` tells an abort that a cancel asked for from one that a
/// drain caused.
pub(crate) async fn drive<S: EventSink>(
    setup: RunSetup,
    mut stream: RequestStream,
    sink: &mut S,
    cancelled: impl Fn() -> bool + Send,
) -> RunEnd {
    let RunSetup {
        state,
        mut response,
        mut reader,
        prompt_tokens,
        logprobs,
        tool_names,
        encrypted_reasoning,
    } = setup;
    if !sink
        .emit(ResponseEvent::Created {
            response: Box::new(response.clone()),
        })
        .await
    {
        return RunEnd::Gone;
    }
    response.status = ResponseStatus::InProgress;
    if !sink
        .emit(ResponseEvent::InProgress {
            response: Box::new(response.clone()),
        })
        .await
    {
        return RunEnd::Gone;
    }
    let mut builder = OutputBuilder::new(tool_names, encrypted_reasoning);
    let (mut output_tokens, mut cached_tokens, mut reasoning_tokens) = (0u32, 0u32, 0u32);
    let mut finish = None;
    let mut failure = None;
    while let Some(event) = stream.recv().await {
        let output = match event {
            RequestEvent::Output(output) => output,
            RequestEvent::Rejected(message) => {
                failure = Some(("invalid_request".to_string(), message));
                break;
            }
            RequestEvent::Error(message) => {
                tracing::error!("response {} failed: {message}", response.id);
                failure = Some((
                    "server_error".to_string(),
                    "The engine failed this request.".to_string(),
                ));
                break;
            }
            RequestEvent::Failed(failure_info) => {
                failure = Some((
                    "server_error".to_string(),
                    failure_info.message().to_string(),
                ));
                break;
            }
        };
        let tokens = output.new_token_ids.len() as u32;
        output_tokens += tokens;
        cached_tokens = cached_tokens.max(output.num_cached_tokens as u32);
        let finished = output.finish_reason.is_some();
        let step_logprobs = match logprobs {
            Some(k) => chat_logprobs(state.token_names(), &output.logprobs, k)
                .content
                .unwrap_or_default()
                .into_iter()
                .filter_map(|entry| serde_json::to_value(&entry).ok())
                .collect(),
            None => Vec::new(),
        };
        let pieces = reader.push(&output.new_text, finished);
        let reasoning_only = !pieces.is_empty()
            && pieces
                .iter()
                .all(|piece| matches!(piece, Piece::Reasoning(_)));
        if reasoning_only {
            reasoning_tokens += tokens;
        }
        for event in builder.push(pieces, step_logprobs) {
            if !sink.emit(event).await {
                return RunEnd::Gone;
            }
        }
        if let Some(reason) = output.finish_reason {
            finish = Some(reason);
        }
    }
    for event in builder.finish() {
        if !sink.emit(event).await {
            return RunEnd::Gone;
        }
    }
    response.output = builder.into_items();
    response.usage = Some(ResponseUsage::new(
        prompt_tokens,
        cached_tokens,
        output_tokens,
        reasoning_tokens,
    ));
    match (finish, failure) {
        (_, Some((code, message))) => {
            response.status = ResponseStatus::Failed;
            let _ = sink
                .emit(ResponseEvent::Error {
                    code: Some(code.clone()),
                    message: message.clone(),
                    param: None,
                })
                .await;
            response.error = Some(ResponseErrorBody { code, message });
        }
        (Some(EngineFinish::Stop), None) => response.status = ResponseStatus::Completed,
        (Some(EngineFinish::Length), None) => {
            response.status = ResponseStatus::Incomplete;
            response.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens".into(),
            });
        }
        (Some(EngineFinish::Abort), None) if cancelled() => {
            response.status = ResponseStatus::Cancelled
        }
        (Some(EngineFinish::Abort) | None, None) => {
            response.status = ResponseStatus::Failed;
            response.error = Some(ResponseErrorBody {
                code: "server_error".into(),
                message: "The request was aborted before it finished (the server is shutting \
                          down)."
                    .into(),
            });
        }
    }
    if !sink.emit(ResponseEvent::terminal(response.clone())).await {
        return RunEnd::Gone;
    }
    RunEnd::Finished(Box::new(response))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(events: &[ResponseEvent]) -> (String, Vec<&'static str>) {
        let mut text = String::new();
        let mut names = Vec::new();
        for event in events {
            names.push(event.name());
            if let ResponseEvent::OutputTextDelta { delta, .. } = event {
                text.push_str(delta);
            }
        }
        (text, names)
    }

    #[test]
    fn items_open_and_close_in_order_and_deltas_make_the_output() {
        let mut builder = OutputBuilder::default();
        let mut events = builder.push(
            vec![
                Piece::Reasoning("think".into()),
                Piece::Content("Hel".into()),
            ],
            vec![],
        );
        events.extend(builder.push(vec![Piece::Content("lo".into())], vec![]));
        events.extend(builder.push(
            vec![
                Piece::CallStart {
                    index: 0,
                    id: "call_1".into(),
                    name: "f".into(),
                },
                Piece::Arguments {
                    index: 0,
                    fragment: "{\"a\":".into(),
                },
                Piece::Arguments {
                    index: 0,
                    fragment: "1}".into(),
                },
            ],
            vec![],
        ));
        events.extend(builder.finish());
        let (text, names) = texts(&events);
        assert_eq!(text, "Hello");
        assert_eq!(
            names,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let items = builder.into_items();
        assert_eq!(items.len(), 3);
        let value = serde_json::to_value(&items).unwrap();
        assert_eq!(value[0]["content"][0]["text"], "think");
        assert_eq!(value[1]["content"][0]["text"], "Hello");
        assert_eq!(value[1]["status"], "completed");
        assert_eq!(value[2]["arguments"], "{\"a\":1}");
        assert_eq!(value[2]["call_id"], "call_1");
        // Every `.done` item equals what its deltas built.
        if let ResponseEvent::OutputItemDone { item, .. } = &events[12] {
            assert_eq!(serde_json::to_value(item).unwrap(), value[1]);
        } else {
            panic!("expected output_item.done");
        }
    }
}
