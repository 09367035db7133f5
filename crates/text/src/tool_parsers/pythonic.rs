//! `pythonic`: Llama 3.2 and Llama 4 (and others prompted so) answer a tool turn with a
//! Python list of calls, `[get_weather(city="Paris", days=3), get_time()]`. Keyword
//! arguments are Python literals; they are converted to JSON as they stream (strings
//! re-quoted, `True`/`False`/`None` to `true`/`false`/`null`, tuples to arrays). An output
//! that is not such a list is content, as in vLLM.

use super::{push_arguments, push_content, ToolDelta, ToolParser};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    List,
    Tuple,
    Dict,
}

/// A Python literal being converted to JSON.
#[derive(Debug, Default)]
struct LiteralConverter {
    stack: Vec<Container>,
    /// The open string's quote character.
    quote: Option<char>,
    /// A backslash escape being read (without the backslash).
    escape: Option<String>,
    /// A bare word (number or constant) being read.
    word: String,
}

/// What one input character did to a literal.
enum Converted {
    /// Part of the literal.
    Continue,
    /// The literal ended just before this character (a top-level `,` or `)`).
    Ended,
    /// Not a Python literal.
    Invalid,
}

fn push_json_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
        c => out.push(c),
    }
}

impl LiteralConverter {
    fn flush_word(&mut self, out: &mut String) -> bool {
        if self.word.is_empty() {
            return true;
        }
        let word = std::mem::take(&mut self.word);
        match word.as_str() {
            "True" => out.push_str("true"),
            "False" => out.push_str("false"),
            "None" => out.push_str("null"),
            number if number.parse::<f64>().is_ok() && !number.contains(['_', 'i', 'n']) => {
                out.push_str(number)
            }
            _ => return false,
        }
        true
    }

    fn push(&mut self, c: char, out: &mut String) -> Converted {
        if let Some(quote) = self.quote {
            if let Some(escape) = &mut self.escape {
                escape.push(c);
                let complete = match escape.as_bytes()[0] {
                    b'x' => escape.len() == 3,
                    b'u' => escape.len() == 5,
                    _ => true,
                };
                if complete {
                    let escape = self.escape.take().unwrap_or_default();
                    let decoded = match escape.as_bytes()[0] {
                        b'n' => Some('\n'),
                        b't' => Some('\t'),
                        b'r' => Some('\r'),
                        b'0' => Some('\0'),
                        b'x' | b'u' => u32::from_str_radix(&escape[1..], 16)
                            .ok()
                            .and_then(char::from_u32),
                        _ => escape.chars().next(),
                    };
                    push_json_char(out, decoded.unwrap_or('\u{fffd}'));
                }
            } else if c == '\\' {
                self.escape = Some(String::new());
            } else if c == quote {
                self.quote = None;
                out.push('"');
            } else {
                push_json_char(out, c);
            }
            return Converted::Continue;
        }
        if c.is_ascii_alphanumeric()
            || matches!(c, '.' | '_')
            || (matches!(c, '-' | '+') && (self.word.is_empty() || self.word.ends_with(['e', 'E'])))
        {
            self.word.push(c);
            return Converted::Continue;
        }
        if !self.flush_word(out) {
            return Converted::Invalid;
        }
        match c {
            '\'' | '"' => {
                self.quote = Some(c);
                out.push('"');
            }
            '[' => {
                self.stack.push(Container::List);
                out.push('[');
            }
            '(' => {
                self.stack.push(Container::Tuple);
                out.push('[');
            }
            '{' => {
                self.stack.push(Container::Dict);
                out.push('{');
            }
            ',' | ')' if self.stack.is_empty() => return Converted::Ended,
            ']' | ')' | '}' => {
                let expected = match c {
                    ']' => Container::List,
                    ')' => Container::Tuple,
                    _ => Container::Dict,
                };
                if self.stack.pop() != Some(expected) {
                    return Converted::Invalid;
                }
                out.push(if c == '}' { '}' } else { ']' });
            }
            ',' => out.push_str(", "),
            ':' if self.stack.last() == Some(&Container::Dict) => out.push_str(": "),
            c if c.is_whitespace() => {}
            _ => return Converted::Invalid,
        }
        Converted::Continue
    }

    /// Whether the literal so far is a complete value (closing it is allowed).
    fn at_top_level(&self) -> bool {
        self.stack.is_empty() && self.quote.is_none()
    }
}

#[derive(Debug, Default)]
enum State {
    /// Calls only if the output opens with `[` and a call.
    #[default]
    Start,
    /// Before a call's name (after `[` or `,`).
    Name,
    /// Before a keyword (after `(` or a value's `,`).
    Keyword,
    Value(LiteralConverter),
    /// After a call's `)`: `,` and another call, or `]`.
    AfterCall,
    Content,
}

/// The `pythonic` parser (see the module doc for the format).
#[derive(Debug, Default)]
pub struct PythonicParser {
    buffer: String,
    state: State,
    calls: usize,
    /// Whether the open call has had an argument (the next needs a `, `).
    has_argument: bool,
    /// Text consumed before the first call started, content if none does.
    held: String,
}

fn identifier_len(text: &str) -> usize {
    text.char_indices()
        .find(|&(i, c)| !(c.is_alphanumeric() || c == '_' || (i > 0 && c == '.')))
        .map_or(text.len(), |(i, _)| i)
}

impl PythonicParser {
    fn run(&mut self, finished: bool, out: &mut Vec<ToolDelta>) {
        loop {
            let trimmed = self.buffer.trim_start();
            let whitespace = self.buffer.len() - trimmed.len();
            match &mut self.state {
                State::Start => match trimmed.chars().next() {
                    None if !finished => return,
                    Some('[') => {
                        self.held.push_str(&self.buffer[..whitespace + 1]);
                        self.buffer.drain(..whitespace + 1);
                        self.state = State::Name;
                    }
                    _ => self.state = State::Content,
                },
                State::Name => {
                    let name_len = identifier_len(trimmed);
                    let after = trimmed[name_len..].trim_start();
                    if name_len > 0 && after.starts_with('(') {
                        let name = trimmed[..name_len].to_string();
                        let used = self.buffer.len() - after.len() + 1;
                        self.buffer.drain(..used);
                        self.held.clear();
                        out.push(ToolDelta::CallStart {
                            index: self.calls,
                            name,
                        });
                        push_arguments(out, self.calls, "{");
                        self.has_argument = false;
                        self.state = State::Keyword;
                    } else if after.is_empty() && !finished {
                        return;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Keyword => {
                    if trimmed.starts_with(')') {
                        self.buffer.drain(..whitespace + 1);
                        self.end_call(out);
                        continue;
                    }
                    let name_len = identifier_len(trimmed);
                    let after = trimmed[name_len..].trim_start();
                    if name_len > 0 && after.starts_with('=') {
                        let separator = if self.has_argument { ", " } else { "" };
                        let key = serde_json::Value::from(&trimmed[..name_len]).to_string();
                        push_arguments(out, self.calls, &format!("{separator}{key}: "));
                        let used = self.buffer.len() - after.len() + 1;
                        self.buffer.drain(..used);
                        self.has_argument = true;
                        self.state = State::Value(LiteralConverter::default());
                    } else if after.is_empty() && !finished {
                        return;
                    } else {
                        self.broken_call(out);
                    }
                }
                State::Value(converter) => {
                    let mut json = String::new();
                    let mut ended = None;
                    let mut invalid = false;
                    for (offset, c) in self.buffer.char_indices() {
                        match converter.push(c, &mut json) {
                            Converted::Continue => {}
                            Converted::Ended => {
                                ended = Some(offset);
                                break;
                            }
                            Converted::Invalid => {
                                invalid = true;
                                ended = Some(offset);
                                break;
                            }
                        }
                    }
                    push_arguments(out, self.calls, &json);
                    let used = ended.unwrap_or(self.buffer.len());
                    self.buffer.drain(..used);
                    if invalid || (finished && ended.is_none()) {
                        if finished && ended.is_none() && converter.at_top_level() {
                            let mut rest = String::new();
                            converter.flush_word(&mut rest);
                            push_arguments(out, self.calls, &rest);
                        }
                        self.broken_call(out);
                        continue;
                    }
                    let Some(_) = ended else { return };
                    if self.buffer.starts_with(',') {
                        self.buffer.drain(..1);
                        self.state = State::Keyword;
                    } else {
                        self.buffer.drain(..1);
                        self.end_call(out);
                    }
                }
                State::AfterCall => match trimmed.chars().next() {
                    None if !finished => return,
                    None => return,
                    Some(',') => {
                        self.buffer.drain(..whitespace + 1);
                        self.state = State::Name;
                    }
                    Some(']') => {
                        self.buffer.drain(..whitespace + 1);
                        self.state = State::Content;
                    }
                    _ => self.state = State::Content,
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

    fn end_call(&mut self, out: &mut Vec<ToolDelta>) {
        push_arguments(out, self.calls, "}");
        self.calls += 1;
        self.state = State::AfterCall;
    }

    /// A call that broke off (a positional argument, a bad literal, the end of the output):
    /// its arguments are closed where they stand and the rest is content.
    fn broken_call(&mut self, out: &mut Vec<ToolDelta>) {
        push_arguments(out, self.calls, "}");
        self.calls += 1;
        self.state = State::Content;
    }
}

impl ToolParser for PythonicParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run(true, out);
        push_content(out, &std::mem::take(&mut self.held));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_call, parse_all_ways};
    use super::super::ToolParser;
    use super::PythonicParser;

    fn make() -> Box<dyn ToolParser> {
        Box::new(PythonicParser::default())
    }

    #[test]
    fn parallel_calls_with_python_literals() {
        let text = r#"[get_weather(city="San Francisco", metric=True, days=3), search(q='it\'s "quoted" ) ]', filters={'tags': ['a', "b"], 'limit': None, 'range': (1, 2.5)}), noop()]"#;
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "");
        assert_eq!(parsed.calls.len(), 3);
        assert_call(
            &parsed.calls[0],
            "get_weather",
            json!({"city": "San Francisco", "metric": true, "days": 3}),
        );
        assert_call(
            &parsed.calls[1],
            "search",
            json!({"q": "it's \"quoted\" ) ]", "filters": {"tags": ["a", "b"], "limit": null, "range": [1, 2.5]}}),
        );
        assert_call(&parsed.calls[2], "noop", json!({}));
    }

    #[test]
    fn unicode_and_escapes() {
        let text = "[translate(text='naïve\\ncafé 東京 🚀', to=\"x\\u00e9\\x41\")]";
        let parsed = parse_all_ways(make, text);
        assert_call(
            &parsed.calls[0],
            "translate",
            json!({"text": "naïve\ncafé 東京 🚀", "to": "xéA"}),
        );
    }

    #[test]
    fn prose_is_content() {
        for text in ["The answer is 4.", "[1, 2, 3]", "[citation needed]", "  "] {
            let parsed = parse_all_ways(make, text);
            assert!(parsed.calls.is_empty(), "{text}: {parsed:?}");
            assert_eq!(parsed.content, text);
        }
    }
}
