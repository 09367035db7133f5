//! The pieces the JSON-based parsers share: finding where a JSON value ends in a stream,
//! decoding a streamed JSON string, and the `{"name": ..., "arguments": ...}` call object.

use super::{push_arguments, ToolDelta};

/// Finds the end of one JSON value fed piece by piece (structure only: strings, escapes and
/// nesting; the text itself is validated by whoever reads it).
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonValueScanner {
    started: bool,
    depth: usize,
    in_string: bool,
    escape: bool,
    primitive: bool,
}

impl JsonValueScanner {
    /// A scanner already inside an object or array (for the rest of one).
    pub(crate) fn inside_container() -> Self {
        JsonValueScanner {
            started: true,
            depth: 1,
            ..JsonValueScanner::default()
        }
    }

    /// Scans `text`; `Some(offset)` when the value ends there (the byte just past it; a
    /// number or literal ends at the first byte that cannot continue it), `None` when all of
    /// `text` belongs to it.
    pub(crate) fn feed(&mut self, text: &str) -> Option<usize> {
        for (offset, c) in text.char_indices() {
            if !self.started {
                self.started = true;
                match c {
                    '{' | '[' => self.depth = 1,
                    '"' => self.in_string = true,
                    _ => self.primitive = true,
                }
                continue;
            }
            if self.primitive {
                if !(c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-')) {
                    return Some(offset);
                }
                continue;
            }
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if c == '\\' {
                    self.escape = true;
                } else if c == '"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Some(offset + 1);
                    }
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(offset + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Whether the value so far is a bare number or literal (which the end of input ends).
    pub(crate) fn is_primitive(&self) -> bool {
        self.primitive
    }
}

/// Decodes the body of a JSON string streamed piece by piece (after its opening quote):
/// escapes split across pieces are held until complete, `\u` surrogate pairs joined.
#[derive(Debug, Clone, Default)]
pub struct JsonStringDecoder {
    pending: String,
    high_surrogate: Option<u16>,
    ended: bool,
}

impl JsonStringDecoder {
    /// Decodes `text`, appending to `out`; returns the byte offset just past the closing
    /// quote when the string ends in `text`.
    pub fn feed(&mut self, text: &str, out: &mut String) -> Option<usize> {
        if self.ended {
            return Some(0);
        }
        for (offset, c) in text.char_indices() {
            if self.pending.is_empty() {
                match c {
                    '"' => {
                        self.ended = true;
                        return Some(offset + 1);
                    }
                    '\\' => self.pending.push(c),
                    _ => out.push(c),
                }
                continue;
            }
            self.pending.push(c);
            let escape = self.pending.as_bytes()[1];
            if escape != b'u' {
                out.push(match escape {
                    b'n' => '\n',
                    b't' => '\t',
                    b'r' => '\r',
                    b'b' => '\u{8}',
                    b'f' => '\u{c}',
                    other => char::from(other),
                });
                self.pending.clear();
            } else if self.pending.len() == 6 {
                let unit = u16::from_str_radix(&self.pending[2..], 16).unwrap_or(0xfffd);
                self.pending.clear();
                match (self.high_surrogate.take(), unit) {
                    (None, 0xd800..=0xdbff) => self.high_surrogate = Some(unit),
                    (Some(high), 0xdc00..=0xdfff) => {
                        let code = 0x10000
                            + ((u32::from(high) - 0xd800) << 10)
                            + (u32::from(unit) - 0xdc00);
                        out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    }
                    (high, unit) => {
                        if high.is_some() {
                            out.push('\u{fffd}');
                        }
                        out.push(char::from_u32(u32::from(unit)).unwrap_or('\u{fffd}'));
                    }
                }
            }
        }
        None
    }
}

/// Whether a text starts with a sequence of literals (whitespace allowed around each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prefix {
    /// All matched, ending at this byte offset.
    Complete(usize),
    /// The text ends inside the sequence.
    NeedMore,
    Mismatch,
}

/// Matches `literals` in order at the start of `text`, skipping whitespace before each.
pub(crate) fn match_literals(text: &str, literals: &[&str]) -> Prefix {
    let mut cursor = Cursor { text, at: 0 };
    for literal in literals {
        match cursor.literal(literal) {
            Ok(true) => {}
            Ok(false) => return Prefix::NeedMore,
            Err(()) => return Prefix::Mismatch,
        }
    }
    Prefix::Complete(cursor.at)
}

/// Where a call object's header (`{"name": "...", "arguments": `) stands.
enum Header {
    /// Complete: the name and the bytes up to the arguments' first byte.
    Complete {
        name: String,
        consumed: usize,
    },
    NeedMore,
    Mismatch,
}

/// A cursor over a header's text.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn skip_ws(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// `Ok(true)` when `literal` is next (consumed), `Ok(false)` when the text ends inside
    /// it, `Err` when something else is next.
    fn literal(&mut self, literal: &str) -> Result<bool, ()> {
        self.skip_ws();
        let rest = &self.text[self.at..];
        if rest.starts_with(literal) {
            self.at += literal.len();
            Ok(true)
        } else if literal.starts_with(rest) {
            Ok(false)
        } else {
            Err(())
        }
    }

    /// A JSON string (decoded); `Ok(None)` when it is not finished yet.
    fn string(&mut self) -> Result<Option<String>, ()> {
        self.skip_ws();
        let rest = &self.text[self.at..];
        if rest.is_empty() {
            return Ok(None);
        }
        if !rest.starts_with('"') {
            return Err(());
        }
        let mut scanner = JsonValueScanner::default();
        match scanner.feed(rest) {
            Some(end) => {
                let value = serde_json::from_str(&rest[..end]).map_err(|_| ())?;
                self.at += end;
                Ok(Some(value))
            }
            None => Ok(None),
        }
    }
}

fn parse_header(text: &str, argument_keys: &[&str]) -> Header {
    let mut cursor = Cursor { text, at: 0 };
    let result = (|| -> Result<Option<(String, usize)>, ()> {
        if !cursor.literal("{")? || !cursor.literal("\"name\"")? || !cursor.literal(":")? {
            return Ok(None);
        }
        let Some(name) = cursor.string()? else {
            return Ok(None);
        };
        if !cursor.literal(",")? {
            return Ok(None);
        }
        let saved = cursor.at;
        let mut any_partial = false;
        let mut matched = false;
        for key in argument_keys {
            cursor.at = saved;
            match cursor.literal(&format!("\"{key}\"")) {
                Ok(true) => {
                    matched = true;
                    break;
                }
                Ok(false) => any_partial = true,
                Err(()) => {}
            }
        }
        if !matched {
            return if any_partial { Ok(None) } else { Err(()) };
        }
        if !cursor.literal(":")? {
            return Ok(None);
        }
        cursor.skip_ws();
        if cursor.at == text.len() {
            return Ok(None);
        }
        Ok(Some((name, cursor.at)))
    })();
    match result {
        Ok(Some((name, consumed))) => Header::Complete { name, consumed },
        Ok(None) => Header::NeedMore,
        Err(()) => Header::Mismatch,
    }
}

/// What [`CallObject::advance`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallStep {
    /// Consumed this many bytes; the object continues.
    Pending(usize),
    /// The object ended after this many bytes.
    Done(usize),
    /// The text is not a call object; nothing was consumed or emitted.
    NotACall,
}

#[derive(Debug, Clone)]
enum CallState {
    Header,
    Arguments(JsonValueScanner),
    Tail(JsonValueScanner),
    Done,
}

/// A `{"name": "...", "arguments": {...}}` object (the argument key is per format), streamed:
/// the call starts when the name and the first byte of the arguments are in; the arguments
/// follow verbatim; further keys are skipped. An object with its keys in another order is
/// held until it is complete and then parsed whole.
#[derive(Debug, Clone)]
pub(crate) struct CallObject {
    index: usize,
    argument_keys: &'static [&'static str],
    state: CallState,
}

impl CallObject {
    pub(crate) fn new(index: usize, argument_keys: &'static [&'static str]) -> Self {
        CallObject {
            index,
            argument_keys,
            state: CallState::Header,
        }
    }

    /// Whether the call was announced (its start emitted).
    pub(crate) fn started(&self) -> bool {
        !matches!(self.state, CallState::Header)
    }

    /// Advances over `text` (the unconsumed input); `finished` when no more will come.
    pub(crate) fn advance(
        &mut self,
        text: &str,
        finished: bool,
        out: &mut Vec<ToolDelta>,
    ) -> CallStep {
        let mut consumed = 0;
        loop {
            let rest = &text[consumed..];
            match &mut self.state {
                CallState::Header => match parse_header(rest, self.argument_keys) {
                    Header::Complete {
                        name,
                        consumed: used,
                    } => {
                        out.push(ToolDelta::CallStart {
                            index: self.index,
                            name,
                        });
                        consumed += used;
                        self.state = CallState::Arguments(JsonValueScanner::default());
                    }
                    Header::NeedMore if !finished => return CallStep::Pending(consumed),
                    Header::NeedMore | Header::Mismatch => {
                        return self.whole_object(rest, finished, out)
                    }
                },
                CallState::Arguments(scanner) => match scanner.feed(rest) {
                    Some(end) => {
                        push_arguments(out, self.index, &rest[..end]);
                        consumed += end;
                        self.state = CallState::Tail(JsonValueScanner::inside_container());
                    }
                    None => {
                        push_arguments(out, self.index, rest);
                        consumed += rest.len();
                        if finished && scanner.is_primitive() {
                            self.state = CallState::Tail(JsonValueScanner::inside_container());
                        }
                        return if finished {
                            CallStep::Done(consumed)
                        } else {
                            CallStep::Pending(consumed)
                        };
                    }
                },
                CallState::Tail(scanner) => {
                    return match scanner.feed(rest) {
                        Some(end) => {
                            self.state = CallState::Done;
                            CallStep::Done(consumed + end)
                        }
                        None if finished => CallStep::Done(consumed + rest.len()),
                        None => CallStep::Pending(consumed + rest.len()),
                    };
                }
                CallState::Done => return CallStep::Done(consumed),
            }
        }
    }

    /// An object whose header did not match: once complete, a call if it is a JSON object
    /// with a string `name` and an argument key; otherwise not a call.
    fn whole_object(&mut self, text: &str, finished: bool, out: &mut Vec<ToolDelta>) -> CallStep {
        if !text.trim_start().starts_with('{') {
            return if text.trim().is_empty() && !finished {
                CallStep::Pending(0)
            } else {
                CallStep::NotACall
            };
        }
        let start = text.len() - text.trim_start().len();
        let mut scanner = JsonValueScanner::default();
        let Some(end) = scanner.feed(&text[start..]).map(|end| start + end) else {
            return if finished {
                CallStep::NotACall
            } else {
                CallStep::Pending(0)
            };
        };
        let Ok(serde_json::Value::Object(object)) = serde_json::from_str(&text[..end]) else {
            return CallStep::NotACall;
        };
        let name = object.get("name").and_then(serde_json::Value::as_str);
        let arguments = self.argument_keys.iter().find_map(|key| object.get(*key));
        match (name, arguments) {
            (Some(name), Some(arguments)) => {
                out.push(ToolDelta::CallStart {
                    index: self.index,
                    name: name.to_string(),
                });
                push_arguments(out, self.index, &arguments.to_string());
                self.state = CallState::Done;
                CallStep::Done(end)
            }
            _ => CallStep::NotACall,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanner_finds_value_ends() {
        let mut scanner = JsonValueScanner::default();
        assert_eq!(scanner.feed(r#"{"a": "}\"", "b": [1, {"#), None);
        assert_eq!(scanner.feed(r#"}]} tail"#), Some(3));
        let mut number = JsonValueScanner::default();
        assert_eq!(number.feed("12.5e3}"), Some(6));
        let mut string = JsonValueScanner::default();
        assert_eq!(string.feed(r#""x\\" y"#), Some(5));
    }

    #[test]
    fn string_decoder_joins_split_escapes() {
        let mut decoder = JsonStringDecoder::default();
        let mut out = String::new();
        let text = r#"a\n\"b\u00e9\ud83d\ude00 ok" rest"#;
        let mut end = None;
        for (offset, c) in text.char_indices() {
            if let Some(at) = decoder.feed(&text[offset..offset + c.len_utf8()], &mut out) {
                end = Some(offset + at);
                break;
            }
        }
        assert_eq!(out, "a\n\"bé😀 ok");
        assert_eq!(end, Some(text.find(" rest").unwrap()));
    }
}
