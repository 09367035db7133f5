//! `openai_gptoss`: gpt-oss's harmony output (see [`crate::harmony`]) split into reasoning
//! (the `analysis` messages' bodies) and content (every other message).
//!
//! Final answers and preambles become their bodies. A tool call is not reasoning, so it is
//! content too, but as its harmony text (header, body and end marker as the model wrote them):
//! the `openai` tool-call parser reads the content next and needs the recipient. Without a
//! tool-call parser (no tools in the request, `tool_choice: none`) a call the model writes
//! anyway therefore stays in the content as that text, as a `<tool_call>` does for other
//! formats.

use super::markers::push;
use super::{ReasoningDelta, ReasoningParser};
use crate::harmony::{HarmonyEvent, HarmonyScanner, MessageKind};

/// The `openai_gptoss` reasoning parser.
#[derive(Debug, Default)]
pub struct HarmonyReasoningParser {
    scanner: HarmonyScanner,
    events: Vec<HarmonyEvent>,
    /// The open message's kind.
    open: Option<MessageKind>,
}

impl HarmonyReasoningParser {
    fn run(&mut self, text: &str, finished: bool, out: &mut Vec<ReasoningDelta>) {
        self.scanner.push(text, finished, &mut self.events);
        for event in self.events.drain(..) {
            match event {
                HarmonyEvent::Loose(text) => push(out, false, &text),
                HarmonyEvent::Open { kind, raw } => {
                    if matches!(kind, MessageKind::Call { .. }) {
                        push(out, false, &raw);
                    }
                    self.open = Some(kind);
                }
                HarmonyEvent::Body(text) => {
                    let reasoning = self.open == Some(MessageKind::Reasoning);
                    push(out, reasoning, &text);
                }
                HarmonyEvent::Close { raw } => {
                    if matches!(self.open, Some(MessageKind::Call { .. })) {
                        push(out, false, &raw);
                    }
                    self.open = None;
                }
            }
        }
    }
}

impl ReasoningParser for HarmonyReasoningParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ReasoningDelta>) {
        self.run(text, false, out);
    }

    fn finish(&mut self, out: &mut Vec<ReasoningDelta>) {
        self.run("", true, out);
    }

    fn needs_special_tokens(&self) -> bool {
        true
    }
}
