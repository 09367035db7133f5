//! `hermes`: Hermes 2 Pro, Qwen2.5 and Qwen3 write each call as
//! `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, after optional text.

use super::scan::{CallObject, CallStep};
use super::{drop_whitespace_before, partial_marker_len, push_content, ToolDelta, ToolParser};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

#[derive(Debug, Default)]
enum State {
    #[default]
    Content,
    Call(CallObject),
    /// After a call's object: its `</tool_call>`, then whitespace up to the next call.
    AfterCall,
}

/// The `hermes` parser (see the module doc for the format).
#[derive(Debug, Default)]
pub struct HermesParser {
    buffer: String,
    state: State,
    calls: usize,
    /// Whitespace after a call is dropped when another call (or the end) follows it.
    after_call: bool,
}

impl HermesParser {
    fn run(&mut self, finished: bool, out: &mut Vec<ToolDelta>) {
        loop {
            match &mut self.state {
                State::Content => {
                    if self.after_call {
                        if !drop_whitespace_before(&mut self.buffer, START, finished) {
                            return;
                        }
                        self.after_call = false;
                    }
                    if let Some(at) = self.buffer.find(START) {
                        push_content(out, &self.buffer[..at]);
                        self.buffer.drain(..at + START.len());
                        self.state = State::Call(CallObject::new(self.calls, &["arguments"]));
                        continue;
                    }
                    let keep = if finished {
                        0
                    } else {
                        partial_marker_len(&self.buffer, START)
                    };
                    let emit = self.buffer.len() - keep;
                    push_content(out, &self.buffer[..emit]);
                    self.buffer.drain(..emit);
                    return;
                }
                State::Call(call) => match call.advance(&self.buffer, finished, out) {
                    CallStep::Pending(used) => {
                        self.buffer.drain(..used);
                        return;
                    }
                    CallStep::Done(used) => {
                        self.buffer.drain(..used);
                        self.calls += 1;
                        self.state = State::AfterCall;
                    }
                    CallStep::NotACall => {
                        push_content(out, START);
                        self.state = State::Content;
                    }
                },
                State::AfterCall => {
                    let trimmed = self.buffer.trim_start();
                    if trimmed.starts_with(END) {
                        let used = self.buffer.len() - trimmed.len() + END.len();
                        self.buffer.drain(..used);
                    } else if END.starts_with(trimmed) && !finished {
                        return;
                    }
                    self.after_call = true;
                    self.state = State::Content;
                }
            }
        }
    }
}

impl ToolParser for HermesParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run(true, out);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_call, parse_all_ways};
    use super::super::ToolParser;
    use super::HermesParser;

    fn make() -> Box<dyn ToolParser> {
        Box::new(HermesParser::default())
    }

    #[test]
    fn qwen_single_call_with_leading_text() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "Let me check.\n");
        assert_eq!(parsed.calls.len(), 1);
        assert_call(
            &parsed.calls[0],
            "get_weather",
            json!({"city": "Paris", "unit": "celsius"}),
        );
        assert_eq!(
            parsed.calls[0].arguments,
            "{\"city\": \"Paris\", \"unit\": \"celsius\"}"
        );
    }

    #[test]
    fn parallel_calls_get_consecutive_indices() {
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "");
        assert_call(&parsed.calls[0], "a", json!({"x": 1}));
        assert_call(&parsed.calls[1], "b", json!({}));
    }

    #[test]
    fn nested_json_and_tricky_strings() {
        let arguments = json!({
            "query": {"filter": {"tags": ["a", "b"], "range": [1, {"lt": 5}]}},
            "code": "fn f() { return \"}\"; } </tool_call> <tool_call>",
            "note": "naïve café — 東京 🚀",
            "escaped": "line\nnext\t\"quoted\" \\ \u{1}"
        });
        let text = format!(
            "<tool_call>\n{{\"name\": \"search\", \"arguments\": {}}}\n</tool_call>",
            serde_json::to_string(&arguments).unwrap()
        );
        let parsed = parse_all_ways(make, &text);
        assert_eq!(parsed.calls.len(), 1);
        assert_call(&parsed.calls[0], "search", arguments);
        assert_eq!(parsed.content, "");
    }

    #[test]
    fn other_key_order_is_parsed_whole() {
        let text = "<tool_call>{\"arguments\": {\"q\": \"}\"}, \"name\": \"find\"}</tool_call>";
        let parsed = parse_all_ways(make, text);
        assert_call(&parsed.calls[0], "find", json!({"q": "}"}));
    }

    #[test]
    fn malformed_calls_fall_back_to_content() {
        for text in [
            "<tool_call>not json</tool_call> done",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"argu",
            "plain <tool_ text < with <tool_calls> look-alikes",
        ] {
            let parsed = parse_all_ways(make, text);
            assert!(parsed.calls.is_empty(), "{text}: {parsed:?}");
            assert_eq!(parsed.content, text);
        }
    }

    #[test]
    fn text_between_and_after_calls_stays_content() {
        let text = "A<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> then B";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "A then B");
        assert_eq!(parsed.calls.len(), 1);
    }
}
