//! A reply's pieces (from [`crate::chat_output::ChoiceReader`]) as Anthropic content blocks:
//! the streamed `content_block_start` / `_delta` / `_stop` events and, from the same machine,
//! the blocks of the whole message, so a streamed reply and a non-streamed one agree.
//!
//! A `thinking` block closes with a `signature_delta`; a `tool_use` block's arguments are held
//! until the call is complete and sent as one `input_json_delta` whose `partial_json` is the
//! block's final `input` serialized, so the concatenation clients parse is exactly that
//! object (a model's raw argument text may be invalid JSON or spaced differently). Text that
//! is only whitespace between other blocks is not a block.

use serde_json::{Map, Value};
use tokenmill_protocol::{thinking_signature, BlockDelta, ResponseBlock, StreamEvent};

use crate::chat_output::Piece;

/// The block being written.
#[derive(Debug)]
enum OpenBlock {
    /// Text, started once something but whitespace arrived (`pending` holds what came before).
    Text {
        started: bool,
        pending: String,
    },
    Thinking,
    ToolUse {
        call: usize,
        arguments: String,
    },
}

/// Turns pieces into block events and keeps the finished blocks.
#[derive(Debug, Default)]
pub(crate) struct BlockWriter {
    open: Option<OpenBlock>,
    blocks: Vec<ResponseBlock>,
    /// `thinking.display: omitted`: thinking blocks carry no text (only a signature).
    omit_thinking: bool,
    /// The open thinking block's text (signed when it closes, shown or not).
    thinking: String,
}

impl BlockWriter {
    pub fn new(omit_thinking: bool) -> Self {
        BlockWriter {
            omit_thinking,
            ..BlockWriter::default()
        }
    }

    /// Whether a `tool_use` block was written (the stop reason becomes `tool_use`).
    pub fn called(&self) -> bool {
        self.blocks
            .iter()
            .any(|block| matches!(block, ResponseBlock::ToolUse { .. }))
            || matches!(self.open, Some(OpenBlock::ToolUse { .. }))
    }

    /// The events for `pieces`, in order.
    pub fn push(&mut self, pieces: Vec<Piece>) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(text) => self.text(text, &mut events),
                Piece::Reasoning(text) => {
                    if !matches!(self.open, Some(OpenBlock::Thinking)) {
                        self.close(&mut events);
                        self.start(
                            ResponseBlock::Thinking {
                                thinking: String::new(),
                                signature: String::new(),
                            },
                            OpenBlock::Thinking,
                            &mut events,
                        );
                    }
                    self.thinking.push_str(&text);
                    if self.omit_thinking {
                        continue;
                    }
                    if let Some(ResponseBlock::Thinking { thinking, .. }) = self.blocks.last_mut() {
                        thinking.push_str(&text);
                    }
                    events.push(self.delta(BlockDelta::ThinkingDelta { thinking: text }));
                }
                Piece::CallStart { index, id, name } => {
                    self.close(&mut events);
                    let id = match id.strip_prefix("call_") {
                        Some(rest) => format!("toolu_{rest}"),
                        None => id,
                    };
                    self.start(
                        ResponseBlock::ToolUse {
                            id,
                            name,
                            input: Value::Object(Map::new()),
                        },
                        OpenBlock::ToolUse {
                            call: index,
                            arguments: String::new(),
                        },
                        &mut events,
                    );
                }
                Piece::Arguments { index, fragment } => {
                    if let Some(OpenBlock::ToolUse { call, arguments }) = &mut self.open {
                        if *call == index {
                            arguments.push_str(&fragment);
                        }
                    }
                }
            }
        }
        events
    }

    /// Closes the open block (the reply ended).
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        self.close(&mut events);
        events
    }

    /// The finished blocks (after [`BlockWriter::finish`]).
    pub fn into_blocks(self) -> Vec<ResponseBlock> {
        self.blocks
    }

    fn index(&self) -> usize {
        self.blocks.len().saturating_sub(1)
    }

    fn delta(&self, delta: BlockDelta) -> StreamEvent {
        StreamEvent::ContentBlockDelta {
            index: self.index(),
            delta,
        }
    }

    fn start(&mut self, block: ResponseBlock, open: OpenBlock, events: &mut Vec<StreamEvent>) {
        self.blocks.push(block.clone());
        self.open = Some(open);
        events.push(StreamEvent::ContentBlockStart {
            index: self.index(),
            content_block: block,
        });
    }

    fn text(&mut self, text: String, events: &mut Vec<StreamEvent>) {
        if text.is_empty() {
            return;
        }
        if !matches!(self.open, Some(OpenBlock::Text { .. })) {
            self.close(events);
            self.open = Some(OpenBlock::Text {
                started: false,
                pending: String::new(),
            });
        }
        let Some(OpenBlock::Text { started, pending }) = &mut self.open else {
            return;
        };
        if !*started {
            pending.push_str(&text);
            if pending.trim().is_empty() {
                return;
            }
            let text = std::mem::take(pending);
            *started = true;
            self.start_text(events);
            self.append_text(text, events);
        } else {
            self.append_text(text, events);
        }
    }

    fn start_text(&mut self, events: &mut Vec<StreamEvent>) {
        let block = ResponseBlock::Text {
            text: String::new(),
        };
        self.blocks.push(block.clone());
        events.push(StreamEvent::ContentBlockStart {
            index: self.index(),
            content_block: block,
        });
    }

    fn append_text(&mut self, text: String, events: &mut Vec<StreamEvent>) {
        if let Some(ResponseBlock::Text { text: whole }) = self.blocks.last_mut() {
            whole.push_str(&text);
        }
        events.push(self.delta(BlockDelta::TextDelta { text }));
    }

    fn close(&mut self, events: &mut Vec<StreamEvent>) {
        let index = self.index();
        match self.open.take() {
            None | Some(OpenBlock::Text { started: false, .. }) => return,
            Some(OpenBlock::Text { started: true, .. }) => {}
            Some(OpenBlock::Thinking) => {
                let thinking = std::mem::take(&mut self.thinking);
                if let Some(ResponseBlock::Thinking { signature, .. }) = self.blocks.last_mut() {
                    *signature = thinking_signature(&thinking);
                    events.push(StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::SignatureDelta {
                            signature: signature.clone(),
                        },
                    });
                }
            }
            Some(OpenBlock::ToolUse { arguments, .. }) => {
                let input = tool_input(&arguments);
                let partial_json = input.to_string();
                if let Some(ResponseBlock::ToolUse { input: slot, .. }) = self.blocks.last_mut() {
                    *slot = input;
                }
                events.push(StreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::InputJsonDelta { partial_json },
                });
            }
        }
        events.push(StreamEvent::ContentBlockStop { index });
    }
}

/// A call's `input`: its arguments as an object. Arguments that are not a JSON object (a
/// model that broke off mid-call) are kept whole under `arguments`, so nothing is lost.
fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => {
            tracing::warn!("a tool call's arguments are not a JSON object: {arguments:?}");
            let mut wrapped = Map::new();
            wrapped.insert("arguments".into(), Value::String(arguments.to_string()));
            Value::Object(wrapped)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat_output::OutputReading;

    fn reading(reasoning: Option<&str>, tools: Option<&str>) -> OutputReading {
        OutputReading {
            reasoning_parser: reasoning.map(str::to_string),
            include_reasoning: true,
            tool_parser: tools.map(str::to_string),
            parallel_tool_calls: true,
            tools: Vec::new(),
        }
    }

    /// The blocks rebuilt from streamed events the way the SDK does it (partial_json
    /// concatenated and parsed at the block's stop), checked against the one-piece read.
    fn streamed_matches_whole(reading: &OutputReading, text: &str) -> Vec<ResponseBlock> {
        let mut whole = BlockWriter::default();
        whole.push(reading.choice().push(text, true));
        whole.finish();
        let whole = whole.into_blocks();

        let mut reader = reading.choice();
        let mut writer = BlockWriter::default();
        let mut events = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for (i, c) in chars.iter().enumerate() {
            events.extend(writer.push(reader.push(&c.to_string(), i + 1 == chars.len())));
        }
        events.extend(writer.finish());
        let mut rebuilt: Vec<ResponseBlock> = Vec::new();
        let mut json_parts: Vec<String> = Vec::new();
        let mut open: Option<usize> = None;
        for event in events {
            match event {
                StreamEvent::ContentBlockStart {
                    index,
                    content_block,
                } => {
                    assert_eq!(open, None, "a block starts while {open:?} is open");
                    assert_eq!(index, rebuilt.len());
                    rebuilt.push(content_block);
                    json_parts.push(String::new());
                    open = Some(index);
                }
                StreamEvent::ContentBlockDelta { index, delta } => {
                    assert_eq!(open, Some(index));
                    match (&mut rebuilt[index], delta) {
                        (ResponseBlock::Text { text }, BlockDelta::TextDelta { text: more }) => {
                            text.push_str(&more)
                        }
                        (
                            ResponseBlock::Thinking { thinking, .. },
                            BlockDelta::ThinkingDelta { thinking: more },
                        ) => thinking.push_str(&more),
                        (
                            ResponseBlock::Thinking { signature, .. },
                            BlockDelta::SignatureDelta { signature: more },
                        ) => signature.push_str(&more),
                        (
                            ResponseBlock::ToolUse { .. },
                            BlockDelta::InputJsonDelta { partial_json },
                        ) => json_parts[index].push_str(&partial_json),
                        (block, delta) => panic!("{delta:?} does not belong to {block:?}"),
                    }
                }
                StreamEvent::ContentBlockStop { index } => {
                    assert_eq!(open, Some(index));
                    if let ResponseBlock::ToolUse { input, .. } = &mut rebuilt[index] {
                        *input = serde_json::from_str(&json_parts[index]).unwrap();
                    }
                    open = None;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(open, None);
        // Ids are random per reader: compare the rest.
        let strip = |blocks: &[ResponseBlock]| -> Vec<Value> {
            blocks
                .iter()
                .map(|b| {
                    let mut v = serde_json::to_value(b).unwrap();
                    if let Some(id) = v.get("id").and_then(Value::as_str) {
                        assert!(id.starts_with("toolu_"), "{id}");
                        v["id"] = json!("toolu");
                    }
                    v
                })
                .collect()
        };
        assert_eq!(strip(&rebuilt), strip(&whole));
        // The concatenated partial_json is exactly the final input, byte for byte.
        for (block, parts) in whole.iter().zip(&json_parts) {
            if let ResponseBlock::ToolUse { input, .. } = block {
                assert_eq!(parts, &input.to_string());
            }
        }
        whole
    }

    #[test]
    fn thinking_text_and_calls_become_blocks() {
        let text = "<think>Paris, so call.</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\",  \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let blocks = streamed_matches_whole(&reading(Some("qwen3"), Some("hermes")), text);
        let kinds: Vec<&str> = blocks
            .iter()
            .map(|b| match b {
                ResponseBlock::Text { .. } => "text",
                ResponseBlock::Thinking { .. } => "thinking",
                ResponseBlock::ToolUse { .. } => "tool_use",
            })
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"]);
        let ResponseBlock::Thinking {
            thinking,
            signature,
        } = &blocks[0]
        else {
            panic!()
        };
        assert_eq!(thinking, "Paris, so call.");
        assert_eq!(signature, &thinking_signature(thinking));
        let ResponseBlock::ToolUse { name, input, .. } = &blocks[2] else {
            panic!()
        };
        assert_eq!(name, "get_weather");
        assert_eq!(input, &json!({"city": "Paris", "unit": "c"}));
        assert_eq!(
            blocks[3],
            ResponseBlock::ToolUse {
                id: match &blocks[3] {
                    ResponseBlock::ToolUse { id, .. } => id.clone(),
                    _ => String::new(),
                },
                name: "get_time".into(),
                input: json!({})
            }
        );
    }

    #[test]
    fn omitted_thinking_keeps_its_block_and_signature_only() {
        let text = "<think>secret plan</think>Answer.";
        let reading = reading(Some("qwen3"), None);
        let mut shown = BlockWriter::new(false);
        shown.push(reading.choice().push(text, true));
        shown.finish();
        let mut omitted = BlockWriter::new(true);
        let events = omitted.push(reading.choice().push(text, true));
        assert!(!events.iter().any(|e| matches!(
            e,
            StreamEvent::ContentBlockDelta {
                delta: BlockDelta::ThinkingDelta { .. },
                ..
            }
        )));
        omitted.finish();
        let (shown, omitted) = (shown.into_blocks(), omitted.into_blocks());
        assert_eq!(
            omitted[0],
            ResponseBlock::Thinking {
                thinking: String::new(),
                signature: thinking_signature("secret plan")
            }
        );
        assert_eq!(shown[1], omitted[1]);
    }

    #[test]
    fn plain_text_is_one_block_and_whitespace_alone_none() {
        let blocks = streamed_matches_whole(&reading(None, None), "Hello, world.\n");
        assert_eq!(
            blocks,
            [ResponseBlock::Text {
                text: "Hello, world.\n".into()
            }]
        );
        assert!(streamed_matches_whole(&reading(None, None), " \n ").is_empty());
        let mut writer = BlockWriter::default();
        assert!(writer.finish().is_empty());
    }

    #[test]
    fn arguments_that_are_not_an_object_are_kept() {
        assert_eq!(tool_input("  "), json!({}));
        assert_eq!(tool_input("{\"a\": [1]}"), json!({"a": [1]}));
        assert_eq!(tool_input("{\"a\": "), json!({"arguments": "{\"a\": "}));
    }
}
