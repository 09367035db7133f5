//! `openai`: tool calls in gpt-oss's harmony output (see [`crate::harmony`]). A message with
//! the recipient `functions.NAME` is a call of `NAME` whose arguments are its body, verbatim
//! (vLLM re-serializes JSON bodies in its non-streamed path; here streamed and whole
//! arguments are the same text). `final` and other non-analysis messages are content, as is
//! text in no message, so the parser also reads the `openai_gptoss` reasoning parser's
//! content (plain text with calls in their harmony text).
//!
//! `analysis` messages reach this parser only when no reasoning parser runs; like vLLM's
//! `openai` parser it drops them rather than show the model's chain of thought as the answer
//! (serve with `--reasoning-parser openai_gptoss` to get it as `reasoning_content`).

use super::{push_arguments, push_content, ToolDelta, ToolParser};
use crate::harmony::{HarmonyEvent, HarmonyScanner, MessageKind};

/// The `openai` tool-call parser.
#[derive(Debug, Default)]
pub struct OpenAiParser {
    scanner: HarmonyScanner,
    events: Vec<HarmonyEvent>,
    open: Option<MessageKind>,
    calls: usize,
}

impl OpenAiParser {
    fn run(&mut self, text: &str, finished: bool, out: &mut Vec<ToolDelta>) {
        self.scanner.push(text, finished, &mut self.events);
        for event in self.events.drain(..) {
            match event {
                HarmonyEvent::Loose(text) => push_content(out, &text),
                HarmonyEvent::Open { kind, .. } => {
                    if let MessageKind::Call { name } = &kind {
                        out.push(ToolDelta::CallStart {
                            index: self.calls,
                            name: name.clone(),
                        });
                        self.calls += 1;
                    }
                    self.open = Some(kind);
                }
                HarmonyEvent::Body(text) => match &self.open {
                    Some(MessageKind::Call { .. }) => push_arguments(out, self.calls - 1, &text),
                    Some(MessageKind::Reasoning) => {}
                    Some(MessageKind::Content) | None => push_content(out, &text),
                },
                HarmonyEvent::Close { .. } => self.open = None,
            }
        }
    }
}

impl ToolParser for OpenAiParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.run(text, false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run("", true, out);
    }

    fn needs_special_tokens(&self) -> bool {
        true
    }
}
