//! `llama3_json`: Llama 3.1/3.2 answer a tool turn with JSON only,
//! `{"name": "f", "parameters": {...}}` (optionally after `<|python_tag|>`), several calls
//! separated by `;`. An output that does not start that way is content, as in vLLM.

use super::scan::{CallObject, CallStep};
use super::{push_content, ToolDelta, ToolParser};

const PYTHON_TAG: &str = "<|python_tag|>";
const ARGUMENT_KEYS: &[&str] = &["parameters", "arguments"];

#[derive(Debug, Default)]
enum State {
    /// Nothing decided yet: calls only if the output opens with `{`.
    #[default]
    Start,
    Call(CallObject),
    /// After a call: `;` and another call, or the end.
    Between,
    Content,
}

/// The `llama3_json` parser (see the module doc for the format).
#[derive(Debug, Default)]
pub struct Llama3JsonParser {
    buffer: String,
    state: State,
    calls: usize,
    /// The text consumed since the last call ended (content if no call follows).
    held: String,
}

impl Llama3JsonParser {
    fn run(&mut self, finished: bool, out: &mut Vec<ToolDelta>) {
        loop {
            match &mut self.state {
                State::Start | State::Between => {
                    let between = matches!(self.state, State::Between);
                    let trimmed = self.buffer.trim_start();
                    let rest = if between {
                        trimmed.strip_prefix(';').map(str::trim_start)
                    } else if let Some(after) = trimmed.strip_prefix(PYTHON_TAG) {
                        Some(after.trim_start())
                    } else if PYTHON_TAG.starts_with(trimmed) && !trimmed.is_empty() && !finished {
                        return;
                    } else {
                        Some(trimmed)
                    };
                    match rest {
                        Some("") if !finished => return,
                        Some("") if between => {
                            // Trailing whitespace or a lone `;` after the last call.
                            self.buffer.clear();
                            return;
                        }
                        None if between && trimmed.is_empty() => {
                            if finished {
                                self.buffer.clear();
                            }
                            return;
                        }
                        Some(rest) if rest.starts_with('{') => {
                            let used = self.buffer.len() - rest.len();
                            self.held.push_str(&self.buffer[..used]);
                            self.buffer.drain(..used);
                            self.state = State::Call(CallObject::new(self.calls, ARGUMENT_KEYS));
                        }
                        _ => self.state = State::Content,
                    }
                }
                State::Call(call) => match call.advance(&self.buffer, finished, out) {
                    CallStep::Pending(used) => {
                        self.buffer.drain(..used);
                        if call.started() {
                            self.held.clear();
                        }
                        return;
                    }
                    CallStep::Done(used) => {
                        self.buffer.drain(..used);
                        self.held.clear();
                        self.calls += 1;
                        self.state = State::Between;
                    }
                    CallStep::NotACall => self.state = State::Content,
                },
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

impl ToolParser for Llama3JsonParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run(true, out);
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
    use super::Llama3JsonParser;

    fn make() -> Box<dyn ToolParser> {
        Box::new(Llama3JsonParser::default())
    }

    #[test]
    fn single_and_python_tagged_calls() {
        for text in [
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\"}}",
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\"}}",
        ] {
            let parsed = parse_all_ways(make, text);
            assert_eq!(parsed.content, "");
            assert_call(&parsed.calls[0], "get_weather", json!({"city": "San Francisco"}));
        }
    }

    #[test]
    fn semicolon_separated_calls_and_nested_arguments() {
        let text = "{\"name\": \"a\", \"parameters\": {\"q\": \"x; y } z\", \"n\": [1, {\"m\": null}]}}; {\"name\": \"b\", \"arguments\": {\"u\": \"日本\"}}";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.calls.len(), 2);
        assert_call(
            &parsed.calls[0],
            "a",
            json!({"q": "x; y } z", "n": [1, {"m": null}]}),
        );
        assert_call(&parsed.calls[1], "b", json!({"u": "日本"}));
        assert_eq!(parsed.content, "");
    }

    #[test]
    fn prose_and_malformed_json_are_content() {
        for text in [
            "The weather is nice.",
            "{\"city\": \"Paris\"}",
            "{not json",
            "{\"name\": \"f\", \"parameters\": ",
        ] {
            let parsed = parse_all_ways(make, text);
            assert!(parsed.calls.is_empty(), "{text}: {parsed:?}");
            assert_eq!(parsed.content, text);
        }
    }
}
