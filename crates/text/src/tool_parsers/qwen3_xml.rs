//! `qwen3_xml`: Qwen3-Coder writes calls as XML-ish blocks,
//! `<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>`.
//! Parameter values are raw text; each becomes JSON by the type its tool's schema gives the
//! parameter (a string streams as it comes; numbers, booleans, objects and arrays are
//! converted once complete; an unknown parameter is JSON if it parses, else a string).

use serde_json::Value;

use super::{
    drop_whitespace_before, partial_marker_len, push_arguments, push_content, ToolDelta, ToolParser,
};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

#[derive(Debug, Default)]
enum State {
    #[default]
    Content,
    /// After `<tool_call>`: `<function=NAME>` next.
    Function,
    /// Inside a function: a parameter, or `</function>`.
    Parameters,
    /// A parameter's value; `string` values stream.
    Value { string: bool, started: bool },
    /// After `</function>`: `</tool_call>`.
    CallEnd,
}

/// The `qwen3_xml` parser (see the module doc for the format).
#[derive(Debug, Default)]
pub struct Qwen3XmlParser {
    /// Each tool's name and parameter schemas (`properties`).
    tools: Vec<(String, Value)>,
    buffer: String,
    state: State,
    calls: usize,
    /// The open call's name and whether it has a parameter yet.
    function: String,
    has_parameter: bool,
    /// The open parameter's name.
    function_parameter: String,
    after_call: bool,
}

impl Qwen3XmlParser {
    /// A parser that types values by these OpenAI-shaped `tools`.
    pub fn new(tools: &[Value]) -> Self {
        let tools = tools
            .iter()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                let name = function.get("name")?.as_str()?.to_string();
                let properties = function
                    .pointer("/parameters/properties")
                    .cloned()
                    .unwrap_or(Value::Null);
                Some((name, properties))
            })
            .collect();
        Qwen3XmlParser {
            tools,
            ..Qwen3XmlParser::default()
        }
    }

    /// The schema type of the open call's parameter (`None`: unknown).
    fn parameter_type(&self, parameter: &str) -> Option<&str> {
        let (_, properties) = self.tools.iter().find(|(name, _)| *name == self.function)?;
        properties.get(parameter)?.get("type")?.as_str()
    }

    /// `<tag=NAME>` at the start of the (whitespace-trimmed) buffer: `Ok(Some(name))` and the
    /// bytes used, `Ok(None)` while undecided, `Err` when something else is there.
    fn tag(&self, tag: &str, finished: bool) -> Result<Option<(String, usize)>, ()> {
        let trimmed = self.buffer.trim_start();
        let whitespace = self.buffer.len() - trimmed.len();
        if let Some(rest) = trimmed.strip_prefix(tag) {
            return match rest.find('>') {
                Some(end) if !rest[..end].contains(['<', '\n']) => Ok(Some((
                    rest[..end].trim().to_string(),
                    whitespace + tag.len() + end + 1,
                ))),
                Some(_) => Err(()),
                None if finished || rest.contains(['<', '\n']) => Err(()),
                None => Ok(None),
            };
        }
        if !finished && tag.starts_with(trimmed) {
            return Ok(None);
        }
        Err(())
    }

    fn convert(&self, parameter: &str, raw: &str) -> String {
        let parsed = serde_json::from_str::<Value>(raw.trim());
        match (self.parameter_type(parameter), parsed) {
            (Some("integer" | "number" | "boolean" | "object" | "array" | "null"), Ok(value)) => {
                value.to_string()
            }
            (Some("boolean"), Err(_)) => (raw.trim().eq_ignore_ascii_case("true")).to_string(),
            (None, Ok(value)) => value.to_string(),
            _ => Value::from(raw).to_string(),
        }
    }

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
                        self.state = State::Function;
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
                State::Function => match self.tag(FUNCTION, finished) {
                    Ok(Some((name, used))) => {
                        self.buffer.drain(..used);
                        out.push(ToolDelta::CallStart {
                            index: self.calls,
                            name: name.clone(),
                        });
                        push_arguments(out, self.calls, "{");
                        self.function = name;
                        self.has_parameter = false;
                        self.state = State::Parameters;
                    }
                    Ok(None) => return,
                    Err(()) => {
                        push_content(out, START);
                        self.state = State::Content;
                    }
                },
                State::Parameters => {
                    let trimmed = self.buffer.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(FUNCTION_END) {
                        let used = self.buffer.len() - rest.len();
                        self.buffer.drain(..used);
                        self.close_call(out, State::CallEnd);
                        continue;
                    }
                    if !finished && FUNCTION_END.starts_with(trimmed) && !trimmed.is_empty() {
                        return;
                    }
                    match self.tag(PARAMETER, finished) {
                        Ok(Some((name, used))) => {
                            self.buffer.drain(..used);
                            let separator = if self.has_parameter { ", " } else { "" };
                            let key = Value::from(name.as_str()).to_string();
                            push_arguments(out, self.calls, &format!("{separator}{key}: "));
                            self.has_parameter = true;
                            let string = self.parameter_type(&name) == Some("string");
                            if string {
                                push_arguments(out, self.calls, "\"");
                            }
                            self.function_parameter = name;
                            self.state = State::Value {
                                string,
                                started: false,
                            };
                        }
                        Ok(None) => return,
                        Err(()) => self.close_call(out, State::Content),
                    }
                }
                State::Value { string, started } => {
                    let string = *string;
                    if !*started {
                        if self.buffer.is_empty() && !finished {
                            return;
                        }
                        if self.buffer.starts_with('\n') {
                            self.buffer.drain(..1);
                        }
                        *started = true;
                    }
                    let end = self.buffer.find(PARAMETER_END);
                    let (value_len, used) = match end {
                        Some(at) => (
                            at - usize::from(self.buffer[..at].ends_with('\n')),
                            at + PARAMETER_END.len(),
                        ),
                        None if finished => (self.buffer.len(), self.buffer.len()),
                        None if string => {
                            let keep =
                                partial_marker_len(&self.buffer, &format!("\n{PARAMETER_END}"))
                                    .max(partial_marker_len(&self.buffer, PARAMETER_END));
                            let emit = self.buffer.len() - keep;
                            let escaped = Value::from(&self.buffer[..emit]).to_string();
                            push_arguments(out, self.calls, &escaped[1..escaped.len() - 1]);
                            self.buffer.drain(..emit);
                            return;
                        }
                        None => return,
                    };
                    let raw = self.buffer[..value_len].to_string();
                    if string {
                        let escaped = Value::from(raw.as_str()).to_string();
                        push_arguments(
                            out,
                            self.calls,
                            &format!("{}\"", &escaped[1..escaped.len() - 1]),
                        );
                    } else {
                        let json = self.convert(&self.function_parameter, &raw);
                        push_arguments(out, self.calls, &json);
                    }
                    self.buffer.drain(..used);
                    self.state = State::Parameters;
                    if end.is_none() {
                        self.close_call(out, State::Content);
                        return;
                    }
                }
                State::CallEnd => {
                    let trimmed = self.buffer.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(END) {
                        let used = self.buffer.len() - rest.len();
                        self.buffer.drain(..used);
                    } else if !finished && END.starts_with(trimmed) {
                        return;
                    }
                    self.after_call = true;
                    self.state = State::Content;
                }
            }
        }
    }

    fn close_call(&mut self, out: &mut Vec<ToolDelta>, next: State) {
        push_arguments(out, self.calls, "}");
        self.calls += 1;
        self.state = next;
    }
}

impl ToolParser for Qwen3XmlParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run(true, out);
        if matches!(self.state, State::Parameters) {
            self.close_call(out, State::Content);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_call, parse_all_ways};
    use super::super::ToolParser;
    use super::Qwen3XmlParser;

    fn make() -> Box<dyn ToolParser> {
        let tools = [
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "filters": {"type": "object"}}}}}),
        ];
        Box::new(Qwen3XmlParser::new(&tools))
    }

    #[test]
    fn typed_parameters_and_parallel_calls() {
        let text = "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, \"CA\" <b> 東京\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=filters>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=other>\n<parameter=q>\n{\"x\": 1}\n</parameter>\n<parameter=s>\nplain\n</parameter>\n</function>\n</tool_call>";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "I'll check.\n");
        assert_eq!(parsed.calls.len(), 2);
        assert_call(
            &parsed.calls[0],
            "get_weather",
            json!({"city": "San Francisco, \"CA\" <b> 東京", "days": 3, "metric": true, "filters": {"a": [1, 2]}}),
        );
        assert_call(
            &parsed.calls[1],
            "other",
            json!({"q": {"x": 1}, "s": "plain"}),
        );
    }

    #[test]
    fn malformed_blocks_are_content() {
        for text in [
            "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
            "<tool_call><function",
            "a <tool_ b",
        ] {
            let parsed = parse_all_ways(make, text);
            assert!(parsed.calls.is_empty(), "{text}: {parsed:?}");
            assert_eq!(parsed.content, text);
        }
    }
}
