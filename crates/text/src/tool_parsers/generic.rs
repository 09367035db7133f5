//! `generic` (tokenmill's name; llama.cpp's generic mode): for a model whose chat template
//! knows nothing of tools, the server describes the tools in a system prompt and constrains
//! the answer to one JSON object, either `{"tool_calls": [{"name": "f", "arguments": {...}},
//! ...]}` or `{"response": "text"}`. The response string is decoded and streamed as content.

use super::scan::{match_literals, CallObject, CallStep, JsonStringDecoder, Prefix};
use super::{push_content, ToolDelta, ToolParser};

const CALLS: &[&str] = &["{", "\"tool_calls\"", ":", "["];
const RESPONSE: &[&str] = &["{", "\"response\"", ":", "\""];

#[derive(Debug, Default)]
enum State {
    #[default]
    Start,
    Calls {
        expect_call: bool,
    },
    Call(CallObject),
    Response(JsonStringDecoder),
    /// The object's closing brace and anything after it.
    End,
    /// Not the envelope: the text is content as it stands.
    Content,
    /// The envelope broke off after a call: the rest is dropped.
    Discard,
}

/// The `generic` parser (see the module doc for the format).
#[derive(Debug, Default)]
pub struct GenericParser {
    buffer: String,
    state: State,
    calls: usize,
    /// Envelope text consumed since the last call, content if no call follows.
    held: String,
}

impl GenericParser {
    /// The envelope broke off (the output was cut at `max_tokens`): before any call it is
    /// content as written; after a call, the cut remainder of the JSON is not prose and is
    /// dropped.
    fn broken_envelope(&mut self) {
        if self.calls == 0 {
            self.state = State::Content;
        } else {
            self.held.clear();
            self.state = State::Discard;
        }
    }

    fn hold(&mut self, len: usize) {
        self.held.push_str(&self.buffer[..len]);
        self.buffer.drain(..len);
    }

    fn run(&mut self, finished: bool, out: &mut Vec<ToolDelta>) {
        loop {
            match &mut self.state {
                State::Start => {
                    match (
                        match_literals(&self.buffer, CALLS),
                        match_literals(&self.buffer, RESPONSE),
                    ) {
                        (Prefix::Complete(end), _) => {
                            self.hold(end);
                            self.state = State::Calls { expect_call: true };
                        }
                        (_, Prefix::Complete(end)) => {
                            self.buffer.drain(..end);
                            self.state = State::Response(JsonStringDecoder::default());
                        }
                        (Prefix::NeedMore, _) | (_, Prefix::NeedMore) if !finished => return,
                        _ => self.state = State::Content,
                    }
                }
                State::Calls { expect_call } => {
                    let expect_call = *expect_call;
                    let trimmed = self.buffer.trim_start();
                    let whitespace = self.buffer.len() - trimmed.len();
                    match trimmed.chars().next() {
                        None if !finished => return,
                        None if self.calls == 0 => self.state = State::Content,
                        None => {
                            self.held.clear();
                            self.state = State::End;
                        }
                        Some('{') if expect_call => {
                            self.hold(whitespace);
                            self.state = State::Call(CallObject::new(self.calls, &["arguments"]));
                        }
                        Some(',') if !expect_call => {
                            self.hold(whitespace + 1);
                            self.state = State::Calls { expect_call: true };
                        }
                        Some(']') if !expect_call => {
                            self.buffer.drain(..whitespace + 1);
                            self.held.clear();
                            self.state = State::End;
                        }
                        _ => self.broken_envelope(),
                    }
                }
                State::Call(call) => match call.advance(&self.buffer, finished, out) {
                    CallStep::Pending(used) => {
                        if call.started() {
                            self.held.clear();
                        }
                        self.buffer.drain(..used);
                        return;
                    }
                    CallStep::Done(used) => {
                        self.buffer.drain(..used);
                        self.held.clear();
                        self.calls += 1;
                        self.state = State::Calls { expect_call: false };
                    }
                    CallStep::NotACall => self.broken_envelope(),
                },
                State::Response(decoder) => {
                    let mut text = String::new();
                    let end = decoder.feed(&self.buffer, &mut text);
                    push_content(out, &text);
                    match end {
                        Some(end) => {
                            self.buffer.drain(..end);
                            self.state = State::End;
                        }
                        None => {
                            self.buffer.clear();
                            return;
                        }
                    }
                }
                State::End => {
                    let trimmed = self.buffer.trim_start();
                    if trimmed.is_empty() {
                        if finished {
                            self.buffer.clear();
                        }
                        return;
                    }
                    let rest = trimmed.strip_prefix('}').unwrap_or(trimmed).trim_start();
                    if rest.is_empty() && !finished {
                        return;
                    }
                    let rest = rest.to_string();
                    self.buffer.clear();
                    push_content(out, &rest);
                    return;
                }
                State::Discard => {
                    self.buffer.clear();
                    return;
                }
                State::Content => {
                    push_content(out, &std::mem::take(&mut self.held));
                    push_content(out, &self.buffer);
                    self.buffer.clear();
                    return;
                }
            }
        }
    }
}

impl ToolParser for GenericParser {
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
    use super::GenericParser;

    fn make() -> Box<dyn ToolParser> {
        Box::new(GenericParser::default())
    }

    #[test]
    fn calls_envelope() {
        let text = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris \"}]\""}}, {"name": "noop", "arguments": {}}]}"#;
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "");
        assert_call(
            &parsed.calls[0],
            "get_weather",
            json!({"city": "Paris \"}]\""}),
        );
        assert_call(&parsed.calls[1], "noop", json!({}));
    }

    #[test]
    fn response_envelope_streams_decoded_text() {
        let text =
            r#"{"response": "Hello, \"world\"!\nUnicode: \u00e9 \ud83d\ude00 東京 {not a call}"}"#;
        let parsed = parse_all_ways(make, text);
        assert!(parsed.calls.is_empty());
        assert_eq!(
            parsed.content,
            "Hello, \"world\"!\nUnicode: é 😀 東京 {not a call}"
        );
    }

    #[test]
    fn a_cut_off_envelope_keeps_its_complete_calls() {
        for text in [
            r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "argu"#,
            r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, 5, 6]} tail"#,
        ] {
            let parsed = parse_all_ways(make, text);
            assert_eq!(parsed.content, "");
            assert_eq!(parsed.calls.len(), 1);
            assert_call(&parsed.calls[0], "a", json!({"x": 1}));
        }
    }

    #[test]
    fn anything_else_is_content() {
        for text in [
            "Just text.",
            "{\"other\": 1}",
            "{\"tool_calls\": [\"x\"]}",
            "{\"tool_calls\": [{\"nme\": 1}]}",
        ] {
            let parsed = parse_all_ways(make, text);
            assert!(parsed.calls.is_empty(), "{text}");
            assert_eq!(parsed.content, text);
        }
    }
}
