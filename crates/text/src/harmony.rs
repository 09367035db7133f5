//! The harmony output format of gpt-oss, read from text: the one scanner behind the
//! `openai_gptoss` reasoning parser and the `openai` tool-call parser.
//!
//! A harmony output is a run of messages, each `header<|message|>body` closed by `<|end|>`,
//! `<|call|>` or `<|return|>`. The prompt ends with `<|start|>assistant`, so the first header
//! starts the output (`<|channel|>analysis` or ` to=functions.f<|channel|>commentary json`);
//! later ones open with `<|start|>assistant`. The header names the channel (`analysis`,
//! `commentary`, `final`) and may name a recipient (`to=functions.NAME`, before or after the
//! channel) and a content type (`json` or `<|constrain|>json`).
//!
//! Why not the `openai-harmony` crate: it parses token ids with its own o200k encoding (which
//! it loads, or downloads at run time, as a tiktoken vocabulary file), while tokenmill's
//! parsers read the detokenized text, one delta at a time, behind the same traits as every
//! other format (so `parse_complete` is the streaming machine fed everything). The markers
//! are special tokens with unique texts, so reading them from text loses nothing; the
//! parsers ask for them to be kept (`needs_special_tokens`).
//!
//! What each message becomes (vLLM's reading, `harmony_utils.py` and `serving_chat.py`):
//! a recipient `functions.NAME` makes a tool call whose arguments are the body verbatim
//! (whatever the channel); otherwise `analysis` is reasoning and every other channel
//! (`final`, a `commentary` preamble, an unknown or missing channel) is content.
//!
//! Malformed output never panics and loses no text:
//! - text outside any message (before a header, between messages) is content;
//! - a header that does not reach `<|message|>` (the output ends, a newline, more than
//!   [`MAX_HEADER_BYTES`], or a marker that cannot be in a header comes first) is content,
//!   verbatim, markers included, so a broken output stays visible;
//! - a body without its end marker ends at the next `<|start|>` or `<|channel|>`, or with
//!   the output (an output cut by `max_tokens`);
//! - `<|message|>` or `<|constrain|>` outside a header is text, as inside a body;
//! - stray end markers between messages, and `<|endoftext|>`, carry no text and are dropped.

/// The largest header read as one: gpt-oss writes a few dozen bytes (channel, recipient,
/// content type); anything longer is text that merely began like a header.
pub const MAX_HEADER_BYTES: usize = 256;

pub(crate) const START: &str = "<|start|>";
pub(crate) const CHANNEL: &str = "<|channel|>";
pub(crate) const MESSAGE: &str = "<|message|>";
pub(crate) const CONSTRAIN: &str = "<|constrain|>";
pub(crate) const END: &str = "<|end|>";
pub(crate) const CALL: &str = "<|call|>";
pub(crate) const RETURN: &str = "<|return|>";
/// gpt-oss's third end-of-sequence token; never part of a message.
const END_OF_TEXT: &str = "<|endoftext|>";

const MARKERS: [&str; 8] = [
    START,
    CHANNEL,
    MESSAGE,
    CONSTRAIN,
    END,
    CALL,
    RETURN,
    END_OF_TEXT,
];

/// How the header at the output's start may begin besides `<|channel|>` (the recipient
/// written before the channel).
const RECIPIENT_FIRST: [&str; 2] = ["to=", " to="];

/// What a message is, by its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MessageKind {
    /// `analysis` without a function recipient.
    Reasoning,
    /// `final`, a preamble, or anything else that is not a call.
    Content,
    /// A `functions.NAME` recipient.
    Call { name: String },
}

/// One step of a scanned output, in text order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HarmonyEvent {
    /// Text that is in no message (content by the fallbacks above).
    Loose(String),
    /// A header reached `<|message|>`: the message's kind and its text (the opening marker,
    /// if any, through `<|message|>`).
    Open { kind: MessageKind, raw: String },
    /// The next piece of the open message's body.
    Body(String),
    /// The open message ended: its end marker, or empty when it ended without one.
    Close { raw: String },
}

#[derive(Debug, Default)]
enum State {
    /// Nothing read yet: the first header may start without a marker.
    #[default]
    Start,
    /// Between messages.
    Loose,
    Header {
        raw: String,
        has_channel: bool,
    },
    Body,
}

/// The incremental harmony scanner (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct HarmonyScanner {
    buffer: String,
    state: State,
}

impl HarmonyScanner {
    /// Feeds text; `finished` releases everything held back.
    pub(crate) fn push(&mut self, text: &str, finished: bool, out: &mut Vec<HarmonyEvent>) {
        self.buffer.push_str(text);
        loop {
            match &mut self.state {
                State::Start => {
                    if RECIPIENT_FIRST.iter().any(|p| self.buffer.starts_with(p)) {
                        self.state = State::Header {
                            raw: String::new(),
                            has_channel: false,
                        };
                        continue;
                    }
                    if !finished && RECIPIENT_FIRST.iter().any(|p| p.starts_with(&self.buffer)) {
                        return;
                    }
                    self.state = State::Loose;
                }
                State::Loose => {
                    let (at, marker) = find_marker(&self.buffer, finished);
                    push_loose(out, &self.buffer[..at]);
                    self.buffer.drain(..at);
                    let Some(marker) = marker else { return };
                    self.buffer.drain(..marker.len());
                    match marker {
                        START | CHANNEL => {
                            self.state = State::Header {
                                raw: marker.to_string(),
                                has_channel: marker == CHANNEL,
                            }
                        }
                        // Without a header these are text: a final answer's body can hold
                        // them, and the `openai` parser reads that body again.
                        MESSAGE | CONSTRAIN => push_loose(out, marker),
                        _ => {}
                    }
                }
                State::Header { raw, has_channel } => {
                    let (at, marker) = find_marker(&self.buffer, finished);
                    let text = &self.buffer[..at];
                    let cut = text
                        .char_indices()
                        .find(|&(i, c)| {
                            c == '\n' || raw.len() + i + c.len_utf8() > MAX_HEADER_BYTES
                        })
                        .map(|(i, _)| i);
                    if let Some(cut) = cut {
                        raw.push_str(&text[..cut]);
                        push_loose(out, raw);
                        self.buffer.drain(..cut);
                        self.state = State::Loose;
                        continue;
                    }
                    raw.push_str(text);
                    self.buffer.drain(..at);
                    match marker {
                        None => {
                            if finished {
                                push_loose(out, raw);
                                self.state = State::Loose;
                            }
                            return;
                        }
                        Some(MESSAGE) => {
                            raw.push_str(MESSAGE);
                            let raw = std::mem::take(raw);
                            self.buffer.drain(..MESSAGE.len());
                            out.push(HarmonyEvent::Open {
                                kind: message_kind(&raw),
                                raw,
                            });
                            self.state = State::Body;
                        }
                        Some(CHANNEL) if !*has_channel => {
                            raw.push_str(CHANNEL);
                            *has_channel = true;
                            self.buffer.drain(..CHANNEL.len());
                        }
                        Some(CONSTRAIN) => {
                            raw.push_str(CONSTRAIN);
                            self.buffer.drain(..CONSTRAIN.len());
                        }
                        // A marker no header holds: the header was not one; the marker is
                        // read again between messages.
                        Some(_) => {
                            push_loose(out, raw);
                            self.state = State::Loose;
                        }
                    }
                }
                State::Body => {
                    let (at, marker) = find_marker(&self.buffer, finished);
                    if at > 0 {
                        out.push(HarmonyEvent::Body(self.buffer[..at].to_string()));
                        self.buffer.drain(..at);
                    }
                    match marker {
                        None => {
                            if finished {
                                out.push(HarmonyEvent::Close { raw: String::new() });
                                self.state = State::Loose;
                            }
                            return;
                        }
                        Some(marker @ (END | CALL | RETURN | END_OF_TEXT)) => {
                            self.buffer.drain(..marker.len());
                            out.push(HarmonyEvent::Close {
                                raw: marker.to_string(),
                            });
                            self.state = State::Loose;
                        }
                        Some(START | CHANNEL) => {
                            out.push(HarmonyEvent::Close { raw: String::new() });
                            self.state = State::Loose;
                        }
                        Some(marker) => {
                            self.buffer.drain(..marker.len());
                            out.push(HarmonyEvent::Body(marker.to_string()));
                        }
                    }
                }
            }
        }
    }
}

fn push_loose(out: &mut Vec<HarmonyEvent>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(HarmonyEvent::Loose(previous)) = out.last_mut() {
        previous.push_str(text);
    } else {
        out.push(HarmonyEvent::Loose(text.to_string()));
    }
}

/// The first marker in `buffer` and where it starts; without one, how much of `buffer` is
/// text for sure (the rest could still become a marker, unless `finished`).
fn find_marker(buffer: &str, finished: bool) -> (usize, Option<&'static str>) {
    let mut from = 0;
    while let Some(offset) = buffer[from..].find('<') {
        let at = from + offset;
        let rest = &buffer[at..];
        if let Some(marker) = MARKERS.iter().find(|m| rest.starts_with(**m)) {
            return (at, Some(marker));
        }
        if !finished && MARKERS.iter().any(|m| m.starts_with(rest)) {
            return (at, None);
        }
        from = at + 1;
    }
    (buffer.len(), None)
}

/// The word at the start of `text` (after spaces), up to a space or a marker.
fn word(text: &str) -> &str {
    let text = text.trim_start();
    let end = text
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(text.len());
    &text[..end]
}

/// The recipient a header names (`to=...` at the start of a word), if any.
fn recipient(header: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(offset) = header[from..].find("to=") {
        let at = from + offset;
        let before = header[..at].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || c == '>') {
            return Some(word(&header[at + "to=".len()..]));
        }
        from = at + "to=".len();
    }
    None
}

/// What the message with this header (through `<|message|>`) is.
fn message_kind(header: &str) -> MessageKind {
    let function = recipient(header)
        .and_then(|to| to.strip_prefix("functions."))
        .filter(|name| !name.is_empty());
    if let Some(name) = function {
        return MessageKind::Call {
            name: name.to_string(),
        };
    }
    let channel = header
        .find(CHANNEL)
        .map(|at| word(&header[at + CHANNEL.len()..]));
    if channel == Some("analysis") {
        MessageKind::Reasoning
    } else {
        MessageKind::Content
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasoning::{reasoning_parser, ReasoningDelta};
    use crate::tool_parsers::test_support::parse_all_ways;
    use crate::tool_parsers::{tool_parser, ParsedToolCall, ParsedToolOutput, ToolParser};

    /// A choice read as the server reads it (`chat_output.rs`): `openai_gptoss`, then the
    /// `openai` tool parser on its content.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Reading {
        reasoning: Option<String>,
        content: String,
        calls: Vec<ParsedToolCall>,
    }

    fn read(pieces: &[&str]) -> Reading {
        let mut reasoning = reasoning_parser("openai_gptoss").unwrap();
        let mut tools = tool_parser("openai", &[]).unwrap();
        assert!(reasoning.needs_special_tokens() && tools.needs_special_tokens());
        let mut reading = Reading::default();
        let mut reasoning_deltas = Vec::new();
        let mut tool_deltas = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            reasoning_deltas.clear();
            reasoning.parse_delta(piece, &mut reasoning_deltas);
            if last {
                reasoning.finish(&mut reasoning_deltas);
            }
            for delta in &reasoning_deltas {
                match delta {
                    ReasoningDelta::Reasoning(text) => reading
                        .reasoning
                        .get_or_insert_with(String::new)
                        .push_str(text),
                    ReasoningDelta::Content(text) => tools.parse_delta(text, &mut tool_deltas),
                }
            }
            if last {
                tools.finish(&mut tool_deltas);
            }
        }
        let parsed = ParsedToolOutput::from_deltas(&tool_deltas);
        reading.content = parsed.content;
        reading.calls = parsed.calls;
        reading
    }

    fn openai() -> Box<dyn ToolParser> {
        tool_parser("openai", &[]).unwrap()
    }

    /// Reads `text` whole, char by char, and split in two at every char boundary, through
    /// both parsers composed and through each alone; every way must agree with the whole
    /// read. Returns the composed reading and the tool parser's own.
    fn read_all_ways(text: &str) -> (Reading, ParsedToolOutput) {
        let whole = read(&[text]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(read(&chars), whole, "char by char");
        let reasoning_whole = reasoning_parser("openai_gptoss")
            .unwrap()
            .parse_complete(text);
        let tools_whole = openai().parse_complete(text);
        for (at, _) in text.char_indices().skip(1) {
            let (head, tail) = text.split_at(at);
            assert_eq!(
                read(&[head, tail]),
                whole,
                "split at {at}: {head:?} | {tail:?}"
            );
            let mut parser = reasoning_parser("openai_gptoss").unwrap();
            let mut deltas = Vec::new();
            parser.parse_delta(head, &mut deltas);
            parser.parse_delta(tail, &mut deltas);
            parser.finish(&mut deltas);
            let mut split = (None::<String>, String::new());
            for delta in deltas {
                match delta {
                    ReasoningDelta::Reasoning(t) => {
                        split.0.get_or_insert_with(String::new).push_str(&t)
                    }
                    ReasoningDelta::Content(t) => split.1.push_str(&t),
                }
            }
            assert_eq!(split, reasoning_whole, "reasoning parser split at {at}");
            let mut parser = openai();
            let mut deltas = Vec::new();
            parser.parse_delta(head, &mut deltas);
            parser.parse_delta(tail, &mut deltas);
            parser.finish(&mut deltas);
            assert_eq!(
                ParsedToolOutput::from_deltas(&deltas),
                tools_whole,
                "tool parser split at {at}"
            );
        }
        assert_eq!(parse_all_ways(openai, text), tools_whole);
        // Both ways of serving find the same calls.
        assert_eq!(tools_whole.calls, whole.calls);
        (whole, tools_whole)
    }

    fn call(name: &str, arguments: &str) -> ParsedToolCall {
        ParsedToolCall {
            name: name.to_string(),
            arguments: arguments.to_string(),
        }
    }

    fn no_markers(reading: &Reading) {
        let texts = [reading.reasoning.as_deref().unwrap_or(""), &reading.content];
        assert!(
            texts.iter().all(|t| !t.contains("<|")),
            "markers left in {reading:?}"
        );
    }

    #[test]
    fn reasoning_then_final() {
        for text in [
            "<|channel|>analysis<|message|>User asks 2+2. Simple arithmetic.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>",
            // The usual output: `<|return|>` ends generation and is not detokenized.
            "<|channel|>analysis<|message|>User asks 2+2. Simple arithmetic.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 4.",
        ] {
            let (reading, tools) = read_all_ways(text);
            assert_eq!(
                reading,
                Reading {
                    reasoning: Some("User asks 2+2. Simple arithmetic.".into()),
                    content: "The answer is 4.".into(),
                    calls: vec![],
                }
            );
            no_markers(&reading);
            // The tool parser alone drops the analysis, as vLLM's `openai` parser does.
            assert_eq!(tools.content, "The answer is 4.");
        }
    }

    #[test]
    fn reasoning_then_one_tool_call() {
        let text = "<|channel|>analysis<|message|>User asks weather in Paris. Need to call get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"unit\":\"celsius\"}<|call|>";
        let (reading, tools) = read_all_ways(text);
        assert_eq!(
            reading,
            Reading {
                reasoning: Some("User asks weather in Paris. Need to call get_weather.".into()),
                content: String::new(),
                calls: vec![call(
                    "get_weather",
                    "{\"city\":\"Paris\",\"unit\":\"celsius\"}"
                )],
            }
        );
        assert_eq!(tools.content, "");
    }

    #[test]
    fn two_tool_calls_in_a_row_with_the_recipient_before_the_channel() {
        let text = "<|channel|>analysis<|message|>Need weather and time.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Tokyo\"}<|call|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"timezone\": \"Asia/Tokyo\"}<|call|>";
        let (reading, _) = read_all_ways(text);
        assert_eq!(reading.reasoning.as_deref(), Some("Need weather and time."));
        assert_eq!(reading.content, "");
        assert_eq!(
            reading.calls,
            vec![
                call("get_weather", "{\"city\": \"Tokyo\"}"),
                call("get_time", "{\"timezone\": \"Asia/Tokyo\"}"),
            ]
        );
        // The first header of an output can name the recipient first (the prompt ended with
        // `<|start|>assistant`).
        let text =
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\"}";
        let (reading, _) = read_all_ways(text);
        assert_eq!(reading.reasoning, None);
        assert_eq!(reading.content, "");
        assert_eq!(
            reading.calls,
            vec![call("get_weather", "{\"city\":\"Oslo\"}")]
        );
    }

    #[test]
    fn a_commentary_preamble_is_content() {
        let text = "<|channel|>analysis<|message|>Tell the user, then call.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check the weather in Paris.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let (reading, tools) = read_all_ways(text);
        assert_eq!(
            reading,
            Reading {
                reasoning: Some("Tell the user, then call.".into()),
                content: "Let me check the weather in Paris.".into(),
                calls: vec![call("get_weather", "{\"city\":\"Paris\"}")],
            }
        );
        no_markers(&reading);
        assert_eq!(tools.content, "Let me check the weather in Paris.");
    }

    #[test]
    fn a_final_without_analysis() {
        let (reading, _) = read_all_ways("<|channel|>final<|message|>Hello! How can I help?");
        assert_eq!(
            reading,
            Reading {
                reasoning: None,
                content: "Hello! How can I help?".into(),
                calls: vec![],
            }
        );
    }

    #[test]
    fn malformed_output_falls_back_to_content_and_loses_no_text() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            // An unknown channel is content.
            ("<|channel|>summary<|message|>Short.<|end|>", None, "Short."),
            // Cut by max_tokens inside a message, or inside a header.
            ("<|channel|>analysis<|message|>Thinking about", Some("Thinking about"), ""),
            ("<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin", Some("Done."), "<|start|>assistant<|channel|>fin"),
            // A body left open ends at the next header.
            ("<|channel|>analysis<|message|>hmm<|start|>assistant<|channel|>final<|message|>Done.", Some("hmm"), "Done."),
            ("<|channel|>analysis<|message|>a<|channel|>final<|message|>b", Some("a"), "b"),
            // No harmony at all, or a header broken by a newline or a second channel.
            ("Just text, <| not a marker |>.", None, "Just text, <| not a marker |>."),
            ("<|channel|>final\nHello", None, "<|channel|>final\nHello"),
            ("<|channel|>final<|channel|>final<|message|>x", None, "<|channel|>finalx"),
            // Text between messages, stray end markers and `<|endoftext|>`.
            ("<|end|>between<|start|>assistant<|channel|>final<|message|>ok<|endoftext|>", None, "betweenok"),
            // Markers that mean nothing in a body are its text.
            ("<|channel|>final<|message|>a<|message|>b<|constrain|>c", None, "a<|message|>b<|constrain|>c"),
            // A message with no header is text.
            ("<|message|>bare<|end|>", None, "<|message|>bare"),
            ("", None, ""),
        ];
        for &(text, reasoning, content) in cases {
            let (reading, _) = read_all_ways(text);
            assert_eq!(reading.reasoning.as_deref(), reasoning, "{text:?}");
            assert_eq!(reading.content, content, "{text:?}");
            assert!(reading.calls.is_empty(), "{text:?}");
        }
        // A header longer than any real one is text.
        let long = format!("to={}", "x".repeat(MAX_HEADER_BYTES + 10));
        let (reading, _) = read_all_ways(&long);
        assert_eq!(reading.content, long);
        // An unterminated call keeps the arguments written so far.
        let (reading, _) = read_all_ways(
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Par",
        );
        assert_eq!(reading.calls, vec![call("get_weather", "{\"city\":\"Par")]);
    }

    /// Random texts stitched from harmony's pieces: the composed read agrees whole, char by
    /// char and split in two anywhere.
    #[test]
    fn random_harmony_texts_read_the_same_however_split() {
        const PIECES: &[&str] = &[
            "<|start|>",
            "assistant",
            "<|channel|>",
            "<|message|>",
            "<|constrain|>",
            "<|end|>",
            "<|call|>",
            "<|return|>",
            "<|endoftext|>",
            "<|",
            "|>",
            "<",
            "analysis",
            "final",
            "commentary",
            " to=functions.f",
            "to=",
            " json",
            "{\"a\": 1}",
            "\n",
            " ",
            "é",
            "text",
        ];
        let mut state = 0x51afd7ed558ccd_u64;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize % bound
        };
        for _ in 0..300 {
            let len = 1 + next(16);
            let text: String = (0..len).map(|_| PIECES[next(PIECES.len())]).collect();
            let whole = read(&[&text]);
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(read(&chars), whole, "{text:?} char by char");
            for (at, _) in text.char_indices() {
                let (head, tail) = text.split_at(at);
                assert_eq!(read(&[head, tail]), whole, "{text:?} split at {at}");
            }
        }
    }

    #[test]
    fn parser_names_resolve() {
        assert!(crate::REASONING_PARSER_NAMES.contains(&"openai_gptoss"));
        assert!(crate::tool_parsers::TOOL_PARSER_NAMES.contains(&"openai"));
        assert!(reasoning_parser("openai_gptoss").is_some());
        assert!(tool_parser("openai", &[]).is_some());
        assert_eq!(crate::reasoning_markers("openai_gptoss"), None);
    }

    fn kind(header: &str) -> MessageKind {
        message_kind(header)
    }

    #[test]
    fn headers_name_channel_and_recipient_in_either_order() {
        let call = MessageKind::Call {
            name: "get_weather".into(),
        };
        assert_eq!(
            kind("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"),
            call
        );
        assert_eq!(
            kind(" to=functions.get_weather<|channel|>commentary json<|message|>"),
            call
        );
        assert_eq!(
            kind("<|start|>assistant to=functions.get_weather<|channel|>commentary<|message|>"),
            call
        );
        assert_eq!(
            kind("<|channel|>analysis<|message|>"),
            MessageKind::Reasoning
        );
        assert_eq!(
            kind("<|start|>assistant<|channel|>final<|message|>"),
            MessageKind::Content
        );
        assert_eq!(
            kind("<|channel|>commentary<|message|>"),
            MessageKind::Content
        );
        // A built-in tool (not served here) or a reply to the assistant is not a call.
        assert_eq!(
            kind("<|channel|>analysis to=python code<|message|>"),
            MessageKind::Reasoning
        );
        assert_eq!(
            kind("<|start|>functions.f to=assistant<|channel|>commentary<|message|>"),
            MessageKind::Content
        );
        assert_eq!(
            kind("<|channel|>commentary to=functions.<|message|>"),
            MessageKind::Content
        );
        assert_eq!(
            kind("<|channel|>analysisfoo<|message|>"),
            MessageKind::Content
        );
    }

    #[test]
    fn markers_are_held_only_while_they_could_continue() {
        assert_eq!(find_marker("abc<|cha", false), (3, None));
        assert_eq!(find_marker("abc<|cha", true), (8, None));
        assert_eq!(find_marker("a<b<|end|>", false), (3, Some(END)));
        assert_eq!(find_marker("a<|x|>", false), (6, None));
        assert_eq!(find_marker("東<", false), ("東".len(), None));
    }
}
