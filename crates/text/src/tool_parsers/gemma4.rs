//! `gemma4`: Gemma 4 calls a tool as `<|tool_call>call:NAME{ARGS}<tool_call|>`, one block
//! per call, where ARGS are its chat template's own notation rather than JSON: bare keys,
//! strings between `<|"|>` quotes, nested `{...}` and `[...]`, bare numbers and
//! `true`/`false`/`null` (`format_argument` in the template). The arguments are converted to
//! JSON as they stream (keys and strings quoted and escaped); a bare word that is no JSON
//! literal becomes a string. The markers are special tokens, so the parser asks for them to
//! be kept ([`ToolParser::needs_special_tokens`]). Text outside the blocks is content; a
//! block that does not start `call:NAME{` is content too. Should the notation break inside
//! the arguments, the rest of the block is passed through as it came (the arguments are then
//! not JSON), whole or streamed alike.

use super::{
    drop_whitespace_before, partial_marker_len, push_arguments, push_content, ToolDelta, ToolParser,
};

const CALL_START: &str = "<|tool_call>";
const CALL_END: &str = "<tool_call|>";
const QUOTE: &str = "<|\"|>";
const CALL_PREFIX: &str = "call:";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// An object's key or its end.
    KeyOrEnd,
    /// A value (after `:` in an object, or in an array).
    Value,
    /// An array's first value or its end.
    ValueOrEnd,
    /// `,` or the container's end.
    Separator,
    /// The `:` after a quoted key.
    Colon,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Outside calls.
    Text,
    /// After `<|tool_call>`: `call:NAME{` being read.
    Header,
    /// Inside a call's arguments.
    Arguments {
        stack: Vec<Container>,
        expect: Expect,
    },
    /// In a string (a value, or a key when `key`).
    Str { key: bool },
    /// A bare key or word being read.
    Word { key: bool },
    /// The arguments broke: the block's rest passes through.
    Raw,
    /// The arguments closed: `<tool_call|>` comes next.
    Closing,
}

#[derive(Debug)]
pub struct Gemma4Parser {
    state: State,
    buffer: String,
    /// The open word, string or key's text.
    token: String,
    /// The stack under the open string or word.
    stack: Vec<Container>,
    calls: usize,
    /// After a call: whitespace before the next one is dropped.
    after_call: bool,
}

impl Default for Gemma4Parser {
    fn default() -> Self {
        Gemma4Parser {
            state: State::Text,
            buffer: String::new(),
            token: String::new(),
            stack: Vec::new(),
            calls: 0,
            after_call: false,
        }
    }
}

fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
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
    out.push('"');
}

/// A bare word as JSON: a number or literal as it is, anything else quoted.
fn push_word(out: &mut String, word: &str) {
    let word = word.trim();
    let literal = matches!(word, "true" | "false" | "null")
        || (word.parse::<f64>().is_ok_and(f64::is_finite)
            && word
                .chars()
                .all(|c| c.is_ascii_digit() || "+-.eE".contains(c)));
    if literal {
        out.push_str(word);
    } else {
        push_json_string(out, word);
    }
}

impl Gemma4Parser {
    fn index(&self) -> usize {
        self.calls.saturating_sub(1)
    }

    /// Runs the machine over the buffer; holds back what could still be a marker unless
    /// `finished`.
    fn run(&mut self, finished: bool, out: &mut Vec<ToolDelta>) {
        loop {
            let progressed = match self.state.clone() {
                State::Text => self.text(finished, out),
                State::Header => self.header(finished, out),
                State::Arguments { stack, expect } => self.arguments(stack, expect, finished, out),
                State::Str { key } => self.string(key, finished, out),
                State::Word { key } => self.word(key, finished, out),
                State::Raw => self.raw(finished, out),
                State::Closing => self.closing(finished),
            };
            if !progressed {
                return;
            }
        }
    }

    fn text(&mut self, finished: bool, out: &mut Vec<ToolDelta>) -> bool {
        if self.after_call {
            if !drop_whitespace_before(&mut self.buffer, CALL_START, finished) {
                return false;
            }
            self.after_call = false;
        }
        if let Some(at) = self.buffer.find(CALL_START) {
            push_content(out, &self.buffer[..at]);
            self.buffer.drain(..at + CALL_START.len());
            self.state = State::Header;
            return true;
        }
        let keep = if finished {
            0
        } else {
            partial_marker_len(&self.buffer, CALL_START)
        };
        let emit = self.buffer.len() - keep;
        push_content(out, &self.buffer[..emit]);
        self.buffer.drain(..emit);
        false
    }

    fn header(&mut self, finished: bool, out: &mut Vec<ToolDelta>) -> bool {
        let bad_prefix = !self.buffer.starts_with(CALL_PREFIX)
            && (finished || !CALL_PREFIX.starts_with(self.buffer.as_str()));
        let name_end = self.buffer.find('{');
        let name_broken = self
            .buffer
            .get(CALL_PREFIX.len()..name_end.unwrap_or(self.buffer.len()))
            .is_some_and(|name| name.contains(['<', '}', '\n']) || name.contains(CALL_END));
        if bad_prefix || name_broken || (finished && name_end.is_none()) {
            // Not a call: the marker and what followed are content.
            push_content(out, CALL_START);
            self.state = State::Text;
            return true;
        }
        let Some(open) = name_end else {
            return false;
        };
        let name = self.buffer[CALL_PREFIX.len()..open].trim().to_string();
        if name.is_empty() {
            push_content(out, CALL_START);
            self.state = State::Text;
            return true;
        }
        self.buffer.drain(..=open);
        out.push(ToolDelta::CallStart {
            index: self.calls,
            name,
        });
        self.calls += 1;
        push_arguments(out, self.index(), "{");
        self.state = State::Arguments {
            stack: vec![Container::Object],
            expect: Expect::KeyOrEnd,
        };
        true
    }

    /// Whether the buffer starts with the string quote; `None` while it may still.
    fn quote_ahead(&self, finished: bool) -> Option<bool> {
        if self.buffer.starts_with(QUOTE) {
            Some(true)
        } else if QUOTE.starts_with(self.buffer.as_str()) && !finished {
            None
        } else {
            Some(false)
        }
    }

    fn arguments(
        &mut self,
        mut stack: Vec<Container>,
        expect: Expect,
        finished: bool,
        out: &mut Vec<ToolDelta>,
    ) -> bool {
        let trimmed = self.buffer.trim_start().len();
        let skip = self.buffer.len() - trimmed;
        self.buffer.drain(..skip);
        let Some(c) = self.buffer.chars().next() else {
            if finished {
                self.state = State::Raw;
                return true;
            }
            return false;
        };
        let index = self.index();
        let top = stack.last().copied();
        let mut json = String::new();
        let next = match (expect, c) {
            (Expect::KeyOrEnd, '}') | (Expect::Separator, '}')
                if top == Some(Container::Object) =>
            {
                self.buffer.drain(..1);
                json.push('}');
                stack.pop();
                None
            }
            (Expect::ValueOrEnd, ']') | (Expect::Separator, ']')
                if top == Some(Container::Array) =>
            {
                self.buffer.drain(..1);
                json.push(']');
                stack.pop();
                None
            }
            (Expect::Colon, ':') => {
                self.buffer.drain(..1);
                json.push(':');
                Some(Expect::Value)
            }
            (Expect::Separator, ',') => {
                self.buffer.drain(..1);
                json.push(',');
                Some(if top == Some(Container::Object) {
                    Expect::KeyOrEnd
                } else {
                    Expect::Value
                })
            }
            (Expect::KeyOrEnd, _) => match self.quote_ahead(finished) {
                None => return false,
                Some(true) => {
                    self.buffer.drain(..QUOTE.len());
                    self.stack = stack;
                    self.state = State::Str { key: true };
                    return true;
                }
                Some(false) if c == ',' || c == ':' || c == ']' => {
                    self.state = State::Raw;
                    return true;
                }
                Some(false) => {
                    self.stack = stack;
                    self.state = State::Word { key: true };
                    return true;
                }
            },
            (Expect::Value | Expect::ValueOrEnd, '{') => {
                self.buffer.drain(..1);
                json.push('{');
                stack.push(Container::Object);
                Some(Expect::KeyOrEnd)
            }
            (Expect::Value | Expect::ValueOrEnd, '[') => {
                self.buffer.drain(..1);
                json.push('[');
                stack.push(Container::Array);
                Some(Expect::ValueOrEnd)
            }
            (Expect::Value | Expect::ValueOrEnd, _) => match self.quote_ahead(finished) {
                None => return false,
                Some(true) => {
                    self.buffer.drain(..QUOTE.len());
                    self.stack = stack;
                    self.state = State::Str { key: false };
                    return true;
                }
                Some(false) if ",}]:".contains(c) => {
                    self.state = State::Raw;
                    return true;
                }
                Some(false) => {
                    self.stack = stack;
                    self.state = State::Word { key: false };
                    return true;
                }
            },
            _ => {
                self.state = State::Raw;
                return true;
            }
        };
        push_arguments(out, index, &json);
        self.state = match next {
            Some(expect) => State::Arguments { stack, expect },
            None if stack.is_empty() => State::Closing,
            None => State::Arguments {
                stack,
                expect: Expect::Separator,
            },
        };
        true
    }

    /// After a value or key: the state the stack under it continues in.
    fn after_token(&mut self, key: bool) {
        let stack = std::mem::take(&mut self.stack);
        self.state = State::Arguments {
            stack,
            expect: if key {
                Expect::Value
            } else {
                Expect::Separator
            },
        };
    }

    fn string(&mut self, key: bool, finished: bool, out: &mut Vec<ToolDelta>) -> bool {
        let Some(at) = self.buffer.find(QUOTE) else {
            if finished {
                self.state = State::Raw;
                self.buffer.insert_str(0, &std::mem::take(&mut self.token));
                self.buffer.insert_str(0, QUOTE);
                return true;
            }
            let keep = partial_marker_len(&self.buffer, QUOTE);
            let take = self.buffer.len() - keep;
            self.token.extend(self.buffer.drain(..take));
            return false;
        };
        self.token.extend(self.buffer.drain(..at));
        self.buffer.drain(..QUOTE.len());
        let mut json = String::new();
        push_json_string(&mut json, &std::mem::take(&mut self.token));
        push_arguments(out, self.index(), &json);
        // A quoted key still needs its `:`.
        let stack = std::mem::take(&mut self.stack);
        self.state = State::Arguments {
            stack,
            expect: if key {
                Expect::Colon
            } else {
                Expect::Separator
            },
        };
        true
    }

    fn word(&mut self, key: bool, finished: bool, out: &mut Vec<ToolDelta>) -> bool {
        let stops: &[char] = if key {
            &[':', '}', ',']
        } else {
            &[',', '}', ']']
        };
        let end = self
            .buffer
            .find(stops)
            .or(self.buffer.find(CALL_END).filter(|_| !key));
        let Some(end) = end else {
            if finished {
                self.buffer.insert_str(0, &std::mem::take(&mut self.token));
                self.state = State::Raw;
                return true;
            }
            let keep = partial_marker_len(&self.buffer, CALL_END);
            let take = self.buffer.len() - keep;
            self.token.extend(self.buffer.drain(..take));
            return false;
        };
        self.token.extend(self.buffer.drain(..end));
        let token = std::mem::take(&mut self.token);
        let mut json = String::new();
        if key {
            if !self.buffer.starts_with(':') || token.trim().is_empty() {
                self.buffer.insert_str(0, &token);
                self.state = State::Raw;
                return true;
            }
            self.buffer.drain(..1);
            push_json_string(&mut json, token.trim());
            json.push(':');
        } else {
            push_word(&mut json, &token);
        }
        push_arguments(out, self.index(), &json);
        self.after_token(key);
        true
    }

    /// The broken rest of a block: passed through up to its end marker.
    fn raw(&mut self, finished: bool, out: &mut Vec<ToolDelta>) -> bool {
        let index = self.index();
        if let Some(at) = self.buffer.find(CALL_END) {
            push_arguments(out, index, &self.buffer[..at]);
            self.buffer.drain(..at + CALL_END.len());
            self.end_call();
            return true;
        }
        let keep = if finished {
            0
        } else {
            partial_marker_len(&self.buffer, CALL_END)
        };
        let emit = self.buffer.len() - keep;
        push_arguments(out, index, &self.buffer[..emit]);
        self.buffer.drain(..emit);
        false
    }

    fn closing(&mut self, finished: bool) -> bool {
        let trimmed = self.buffer.trim_start();
        if trimmed.starts_with(CALL_END) {
            let skip = self.buffer.len() - trimmed.len() + CALL_END.len();
            self.buffer.drain(..skip);
            self.end_call();
            return true;
        }
        if (trimmed.is_empty() || CALL_END.starts_with(trimmed)) && !finished {
            return false;
        }
        // The block never closed: what follows the arguments is content.
        self.end_call();
        true
    }

    fn end_call(&mut self) {
        self.state = State::Text;
        self.after_call = true;
    }
}

impl ToolParser for Gemma4Parser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ToolDelta>) {
        self.run(true, out);
        if !self.token.is_empty() {
            let index = self.index();
            push_arguments(out, index, &std::mem::take(&mut self.token));
        }
        if !self.buffer.is_empty() {
            match self.state {
                State::Text | State::Header => push_content(out, &self.buffer),
                _ => push_arguments(out, self.index(), &self.buffer),
            }
            self.buffer.clear();
        }
    }

    fn needs_special_tokens(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_call, parse_all_ways};
    use super::*;
    use serde_json::json;

    fn make() -> Box<dyn ToolParser> {
        Box::new(Gemma4Parser::default())
    }

    #[test]
    fn a_call_in_the_templates_notation_becomes_json() {
        let text = r#"<|tool_call>call:get_weather{location:<|"|>Paris, "FR"<|"|>,days:3,metric:true}<tool_call|>"#;
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "");
        assert_eq!(parsed.calls.len(), 1);
        assert_call(
            &parsed.calls[0],
            "get_weather",
            json!({"location": "Paris, \"FR\"", "days": 3, "metric": true}),
        );
    }

    #[test]
    fn nested_objects_arrays_and_two_calls_after_content() {
        let text = "Let me check.<|tool_call>call:search{query:<|\"|>a\nb<|\"|>,filters:{tags:[<|\"|>x<|\"|>,<|\"|>y<|\"|>],limit:-2.5e1,none:null}}<tool_call|>\n<|tool_call>call:now{}<tool_call|>";
        let parsed = parse_all_ways(make, text);
        assert_eq!(parsed.content, "Let me check.");
        assert_eq!(parsed.calls.len(), 2);
        assert_call(
            &parsed.calls[0],
            "search",
            json!({"query": "a\nb", "filters": {"tags": ["x", "y"], "limit": -25.0, "none": null}}),
        );
        assert_call(&parsed.calls[1], "now", json!({}));
    }

    #[test]
    fn quoted_keys_and_bare_words_are_read_too() {
        let text = r#"<|tool_call>call:f{<|"|>mode<|"|>:fast,level:high}<tool_call|>"#;
        let parsed = parse_all_ways(make, text);
        assert_call(
            &parsed.calls[0],
            "f",
            json!({"mode": "fast", "level": "high"}),
        );
    }

    #[test]
    fn text_without_calls_and_a_block_that_is_no_call_are_content() {
        let parsed = parse_all_ways(make, "Paris is the capital <of> France.");
        assert_eq!(parsed.content, "Paris is the capital <of> France.");
        assert!(parsed.calls.is_empty());
        let parsed = parse_all_ways(make, "x <|tool_call>hello there");
        assert_eq!(parsed.content, "x <|tool_call>hello there");
        assert!(parsed.calls.is_empty());
    }

    #[test]
    fn broken_arguments_pass_through_and_an_unclosed_call_still_ends() {
        let parsed = parse_all_ways(make, "<|tool_call>call:f{a:1,,b}<tool_call|>after");
        assert_eq!(parsed.calls.len(), 1);
        assert_eq!(parsed.calls[0].arguments, "{\"a\":1,,b}");
        assert_eq!(parsed.content, "after");
        let parsed = parse_all_ways(make, "<|tool_call>call:f{a:<|\"|>open");
        assert_eq!(parsed.calls.len(), 1);
        assert!(parsed.calls[0].arguments.starts_with('{'));
        let parsed = parse_all_ways(make, "<|tool_call>call:g{x:2}");
        assert_call(&parsed.calls[0], "g", json!({"x": 2}));
    }
}
