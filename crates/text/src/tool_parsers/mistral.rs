//! `mistral`: Mistral models mark calls with the `[TOOL_CALLS]` special token, followed
//! either by a JSON array `[{"name": "f", "arguments": {...}}, ...]` (tokenizer v3) or, from
//! tokenizer v11 on, by `f[ARGS]{...}` per call (`[CALL_ID]id` may sit before `[ARGS]`).

use super::scan::{CallObject, CallStep, JsonValueScanner};
use super::{
    drop_whitespace_before, partial_marker_len, push_arguments, push_content, ToolDelta, ToolParser,
};

const MARKER: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

#[derive(Debug, Default)]
enum State {
    #[default]
    Content,
    /// Just after `[TOOL_CALLS]`: an array or a name follows.
    Marker,
    /// Inside the JSON array: an element next (`expect_call`), else `,` or `]`.
    Array {
        expect_call: bool,
    },
    ArrayCall(CallObject),
    /// v11: `name[ARGS]` (or `name[CALL_ID]id[ARGS]`).
    Named,
    /// v11: the arguments value.
    NamedArguments(JsonValueScanner),
}

/// The `mistral` parser (see the module doc for the formats).
#[derive(Debug, Default)]
pub struct MistralParser {
    buffer: String,
    state: State,
    calls: usize,
    /// Text consumed since the marker or the last call, content if no call follows.
    held: String,
    /// Whitespace after a call is dropped when another call (or the end) follows it.
    after_call: bool,
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

impl MistralParser {
    /// Moves the first `len` bytes of the buffer to the held text.
    fn hold(&mut self, len: usize) {
        self.held.push_str(&self.buffer[..len]);
        self.buffer.drain(..len);
    }

    /// What was held is not a call after all: content, and back to scanning for the marker.
    fn not_a_call(&mut self, out: &mut Vec<ToolDelta>) {
        push_content(out, &std::mem::take(&mut self.held));
        self.state = State::Content;
    }

    fn run(&mut self, finished: bool, out: &mut Vec<ToolDelta>) {
        loop {
            match &mut self.state {
                State::Content => {
                    if self.after_call {
                        if !drop_whitespace_before(&mut self.buffer, MARKER, finished) {
                            return;
                        }
                        self.after_call = false;
                    }
                    if let Some(at) = self.buffer.find(MARKER) {
                        push_content(out, &self.buffer[..at]);
                        self.buffer.drain(..at);
                        self.hold(MARKER.len());
                        self.state = State::Marker;
                        continue;
                    }
                    let keep = if finished {
                        0
                    } else {
                        partial_marker_len(&self.buffer, MARKER)
                    };
                    let emit = self.buffer.len() - keep;
                    push_content(out, &self.buffer[..emit]);
                    self.buffer.drain(..emit);
                    return;
                }
                State::Marker => {
                    let trimmed = self.buffer.trim_start();
                    if trimmed.is_empty() && !finished {
                        return;
                    }
                    let whitespace = self.buffer.len() - trimmed.len();
                    if trimmed.starts_with('[') {
                        self.hold(whitespace + 1);
                        self.state = State::Array { expect_call: true };
                    } else if trimmed.is_empty() {
                        self.not_a_call(out);
                    } else {
                        self.hold(whitespace);
                        self.state = State::Named;
                    }
                }
                State::Array { expect_call } => {
                    let expect_call = *expect_call;
                    let trimmed = self.buffer.trim_start();
                    let whitespace = self.buffer.len() - trimmed.len();
                    match trimmed.chars().next() {
                        None if !finished => return,
                        Some('{') if expect_call => {
                            self.hold(whitespace);
                            self.state =
                                State::ArrayCall(CallObject::new(self.calls, &["arguments"]));
                        }
                        Some(',') if !expect_call => {
                            self.hold(whitespace + 1);
                            self.state = State::Array { expect_call: true };
                        }
                        Some(']') if !expect_call || self.held.len() > MARKER.len() + 1 => {
                            self.buffer.drain(..whitespace + 1);
                            self.held.clear();
                            self.state = State::Content;
                        }
                        _ => self.not_a_call(out),
                    }
                }
                State::ArrayCall(call) => match call.advance(&self.buffer, finished, out) {
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
                        self.state = State::Array { expect_call: false };
                    }
                    CallStep::NotACall => self.not_a_call(out),
                },
                State::Named => {
                    let name_len: usize = self
                        .buffer
                        .chars()
                        .take_while(|&c| is_name_char(c))
                        .map(char::len_utf8)
                        .sum();
                    let rest = &self.buffer[name_len..];
                    let args_end = if let Some(after) = rest.strip_prefix(CALL_ID) {
                        after
                            .find(ARGS)
                            .map(|at| name_len + CALL_ID.len() + at + ARGS.len())
                    } else if rest.starts_with(ARGS) {
                        Some(name_len + ARGS.len())
                    } else {
                        None
                    };
                    let waiting = rest.is_empty()
                        || rest.starts_with(CALL_ID)
                        || ARGS.starts_with(rest)
                        || CALL_ID.starts_with(rest);
                    // The arguments' first byte decides where they start (whitespace first).
                    if let Some(end) = args_end {
                        if self.buffer[end..].trim_start().is_empty() && !finished {
                            return;
                        }
                    }
                    match args_end {
                        Some(end) if name_len > 0 => {
                            out.push(ToolDelta::CallStart {
                                index: self.calls,
                                name: self.buffer[..name_len].to_string(),
                            });
                            let after = &self.buffer[end..];
                            let whitespace = after.len() - after.trim_start().len();
                            self.buffer.drain(..end + whitespace);
                            self.held.clear();
                            self.state = State::NamedArguments(JsonValueScanner::default());
                        }
                        None if waiting && !finished => return,
                        _ => self.not_a_call(out),
                    }
                }
                State::NamedArguments(scanner) => {
                    if self.buffer.is_empty() && !finished {
                        return;
                    }
                    let end = scanner.feed(&self.buffer);
                    let used = end.unwrap_or(self.buffer.len());
                    push_arguments(out, self.calls, &self.buffer[..used]);
                    self.buffer.drain(..used);
                    if end.is_none() && !finished {
                        return;
                    }
                    self.calls += 1;
                    self.after_call = true;
                    self.state = State::Content;
                }
            }
        }
    }
}

impl ToolParser for MistralParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run(true, out);
        push_content(out, &std::mem::take(&mut self.held));
    }

    fn needs_special_tokens(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_call, parse_all_ways};
    use super::super::ToolParser;
    use super::MistralParser;

    fn make() -> Box<dyn ToolParser> {
        Box::new(MistralParser::default())
    }

    #[test]
    fn json_array_form_with_parallel_calls() {
        let text = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\", \"fmt\": \"]}\"}}]";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "");
        assert_call(&parsed.calls[0], "get_weather", json!({"city": "Paris"}));
        assert_call(
            &parsed.calls[1],
            "get_time",
            json!({"tz": "Europe/Paris", "fmt": "]}"}),
        );
    }

    #[test]
    fn v11_named_form() {
        let text = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Zürich\", \"days\": [1, 2]}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "");
        assert_call(
            &parsed.calls[0],
            "get_weather",
            json!({"city": "Zürich", "days": [1, 2]}),
        );
        assert_call(&parsed.calls[1], "get_time", json!({}));
    }

    #[test]
    fn text_before_the_marker_and_malformed_calls() {
        let parsed = parse_all_ways(
            make,
            "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",
        );
        assert_eq!(parsed.content, "Sure. ");
        assert_eq!(parsed.calls.len(), 1);
        for text in [
            "[TOOL_CALLS] nonsense here",
            "[TOOL_CALLS][\"just a string\"]",
            "[TOOL_CALLS][{\"name\": \"f\"}]",
            "[TOOL_CALLS]",
            "a [TOOL_ b",
        ] {
            let parsed = parse_all_ways(make, text);
            assert!(parsed.calls.is_empty(), "{text}: {parsed:?}");
            assert_eq!(parsed.content, text);
        }
    }
}
