//! Tool-call parsers: a model's generated text → content and tool calls, with vLLM's parser
//! names (`--tool-call-parser`).
//!
//! Every parser is one incremental state machine behind [`ToolParser`]: `parse_delta` takes
//! the next piece of generated text and emits [`ToolDelta`]s, `finish` flushes what it held
//! back, and [`ToolParser::parse_complete`] is the same machine fed the whole text at once,
//! so a streamed response and a non-streamed one cannot disagree (vLLM's most reported
//! tool-call bugs come from its two separate code paths). Text is held back only while it
//! could still be the start of a call marker. A call is announced ([`ToolDelta::CallStart`])
//! once its name is known and its arguments begin; the arguments then stream verbatim, so
//! the concatenated fragments are exactly the final arguments. Text that cannot be a call
//! before that point stays content.

mod gemma4;
mod generic;
mod hermes;
mod llama3_json;
mod mistral;
mod openai;
mod pythonic;
mod qwen3_xml;
mod scan;

pub use gemma4::Gemma4Parser;
pub use generic::GenericParser;
pub use hermes::HermesParser;
pub use llama3_json::Llama3JsonParser;
pub use mistral::MistralParser;
pub use openai::OpenAiParser;
pub use pythonic::PythonicParser;
pub use qwen3_xml::Qwen3XmlParser;
pub use scan::JsonStringDecoder;

/// One step of parsed output, in text order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolDelta {
    /// Plain assistant text.
    Content(String),
    /// A new call: its index in the turn (0, 1, ...) and function name.
    CallStart { index: usize, name: String },
    /// The next piece of call `index`'s arguments (JSON text).
    Arguments { index: usize, fragment: String },
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    /// JSON text, as the model wrote it (pythonic calls converted to JSON).
    pub arguments: String,
}

/// A whole output, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedToolOutput {
    /// Text outside calls (empty when there was none).
    pub content: String,
    pub calls: Vec<ParsedToolCall>,
}

impl ParsedToolOutput {
    /// Assembles deltas (streamed or not) into the output they describe.
    pub fn from_deltas(deltas: &[ToolDelta]) -> ParsedToolOutput {
        let mut output = ParsedToolOutput::default();
        for delta in deltas {
            output.push(delta);
        }
        output
    }

    /// Adds one delta.
    pub fn push(&mut self, delta: &ToolDelta) {
        match delta {
            ToolDelta::Content(text) => self.content.push_str(text),
            ToolDelta::CallStart { name, .. } => self.calls.push(ParsedToolCall {
                name: name.clone(),
                arguments: String::new(),
            }),
            ToolDelta::Arguments { index, fragment } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.arguments.push_str(fragment);
                }
            }
        }
    }
}

/// An incremental tool-call parser (one per choice; not reusable across outputs).
pub trait ToolParser: Send + std::fmt::Debug {
    /// Feeds the next piece of generated text; deltas are appended to `out`.
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ToolDelta>);

    /// The output ended: releases anything held back.
    fn finish(&mut self, out: &mut Vec<ToolDelta>);

    /// Whether the call markers are special tokens that detokenizing with
    /// `skip_special_tokens` would remove (vLLM turns skipping off for such parsers).
    fn needs_special_tokens(&self) -> bool {
        false
    }

    /// Parses a complete output: the streaming machine fed everything at once.
    fn parse_complete(&mut self, text: &str) -> ParsedToolOutput {
        let mut deltas = Vec::new();
        self.parse_delta(text, &mut deltas);
        self.finish(&mut deltas);
        ParsedToolOutput::from_deltas(&deltas)
    }
}

/// The `--tool-call-parser` names tokenmill implements.
pub const TOOL_PARSER_NAMES: [&str; 8] = [
    "hermes",
    "gemma4",
    "llama3_json",
    "mistral",
    "openai",
    "pythonic",
    "qwen3_xml",
    "generic",
];

/// A fresh parser by vLLM's name (`generic` is tokenmill's: see [`GenericParser`]). `tools`
/// are the request's (OpenAI-shaped) tools; `qwen3_xml` types parameter values by them.
pub fn tool_parser(name: &str, tools: &[serde_json::Value]) -> Option<Box<dyn ToolParser>> {
    Some(match name {
        "qwen3_xml" => Box::new(Qwen3XmlParser::new(tools)),
        "hermes" => Box::new(HermesParser::default()),
        "gemma4" => Box::new(Gemma4Parser::default()),
        "llama3_json" => Box::new(Llama3JsonParser::default()),
        "mistral" => Box::new(MistralParser::default()),
        "openai" => Box::new(OpenAiParser::default()),
        "pythonic" => Box::new(PythonicParser::default()),
        "generic" => Box::new(GenericParser::default()),
        _ => return None,
    })
}

/// The longest suffix of `text` that is a proper prefix of `marker` (held back in case the
/// marker continues in the next delta); its byte length.
pub(crate) fn partial_marker_len(text: &str, marker: &str) -> usize {
    let max = marker.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&len| {
            text.is_char_boundary(text.len() - len) && marker.starts_with(&text[text.len() - len..])
        })
        .unwrap_or(0)
}

/// After a call: whitespace up to the next call's `marker` (or the end) is not content.
/// Drops it where that is decided; `false` while it is not (wait for more text).
pub(crate) fn drop_whitespace_before(buffer: &mut String, marker: &str, finished: bool) -> bool {
    let trimmed = buffer.trim_start();
    let undecided =
        trimmed.is_empty() || (marker.starts_with(trimmed) && trimmed.len() < marker.len());
    if undecided && !finished {
        return false;
    }
    if trimmed.is_empty() || trimmed.starts_with(marker) {
        let whitespace = buffer.len() - trimmed.len();
        buffer.drain(..whitespace);
    }
    true
}

/// Appends `text` as content, merging with a preceding content delta.
pub(crate) fn push_content(out: &mut Vec<ToolDelta>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolDelta::Content(previous)) = out.last_mut() {
        previous.push_str(text);
    } else {
        out.push(ToolDelta::Content(text.to_string()));
    }
}

/// Appends an argument fragment, merging with a preceding fragment of the same call.
pub(crate) fn push_arguments(out: &mut Vec<ToolDelta>, index: usize, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolDelta::Arguments {
        index: last,
        fragment,
    }) = out.last_mut()
    {
        if *last == index {
            fragment.push_str(text);
            return;
        }
    }
    out.push(ToolDelta::Arguments {
        index,
        fragment: text.to_string(),
    });
}

#[cfg(test)]
pub(crate) mod test_support {
    //! The checks every parser's fixtures go through.

    use super::*;

    /// Splits `text` into pieces of 1..=max chars with a fixed LCG (deterministic "tokens").
    fn chunks(text: &str, max: usize, seed: u64) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut state = seed;
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < chars.len() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = 1 + (state >> 33) as usize % max;
            let end = (start + len).min(chars.len());
            pieces.push(chars[start..end].iter().collect());
            start = end;
        }
        pieces
    }

    /// Parses `text` whole, char by char and in random pieces; asserts all three agree, that
    /// each call's first delta is its start and later ones only its argument fragments, that
    /// indices count up from 0, and returns the parse.
    pub(crate) fn parse_all_ways(
        make: fn() -> Box<dyn ToolParser>,
        text: &str,
    ) -> ParsedToolOutput {
        let complete = make().parse_complete(text);
        let mut splits: Vec<Vec<String>> = vec![text.chars().map(String::from).collect()];
        for seed in 1..6 {
            splits.push(chunks(text, 7, seed));
        }
        for pieces in splits {
            let mut parser = make();
            let mut deltas = Vec::new();
            for piece in &pieces {
                parser.parse_delta(piece, &mut deltas);
            }
            parser.finish(&mut deltas);
            let mut started = 0usize;
            for delta in &deltas {
                match delta {
                    ToolDelta::CallStart { index, .. } => {
                        assert_eq!(*index, started, "indices count up: {deltas:?}");
                        started += 1;
                    }
                    ToolDelta::Arguments { index, .. } => {
                        assert!(
                            *index + 1 == started,
                            "fragment of the open call: {deltas:?}"
                        )
                    }
                    ToolDelta::Content(_) => {}
                }
            }
            assert_eq!(
                ParsedToolOutput::from_deltas(&deltas),
                complete,
                "streamed in {pieces:?}"
            );
        }
        complete
    }

    /// A call with arguments given as a JSON value (compared as JSON, not text).
    pub(crate) fn assert_call(call: &ParsedToolCall, name: &str, arguments: serde_json::Value) {
        assert_eq!(call.name, name);
        let parsed: serde_json::Value = serde_json::from_str(&call.arguments)
            .unwrap_or_else(|e| panic!("arguments {:?} are not JSON: {e}", call.arguments));
        assert_eq!(parsed, arguments);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::parse_all_ways;
    use super::*;

    /// Random texts stitched from the formats' markers and JSON/Python fragments: whatever
    /// the text, every parser reads it the same whole, char by char and in random pieces.
    #[test]
    fn streamed_and_complete_parses_agree_on_random_texts() {
        const PIECES: &[&str] = &[
            "<|tool_call>",
            "<tool_call|>",
            "<|\"|>",
            "call:f{",
            "a:",
            "<tool_call>",
            "</tool_call>",
            "[TOOL_CALLS]",
            "[ARGS]",
            "<|python_tag|>",
            "<function=f>",
            "<|channel|>",
            "<|message|>",
            "<|start|>assistant",
            "<|end|>",
            "<|call|>",
            "<|constrain|>",
            "analysis",
            "final",
            " to=functions.f",
            "<parameter=x>",
            "</parameter>",
            "</function>",
            "{",
            "}",
            "[",
            "]",
            "(",
            ")",
            "\"",
            "\\",
            ",",
            ";",
            ":",
            "=",
            " ",
            "\n",
            "\"name\"",
            "\"arguments\"",
            "\"parameters\"",
            "\"tool_calls\"",
            "\"response\"",
            "f",
            "get(",
            "x=",
            "1",
            "true",
            "'s'",
            "é",
            "東京",
            "text ",
        ];
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize % bound
        };
        let makers: [fn() -> Box<dyn ToolParser>; 8] = [
            || tool_parser("hermes", &[]).unwrap(),
            || tool_parser("gemma4", &[]).unwrap(),
            || tool_parser("llama3_json", &[]).unwrap(),
            || tool_parser("mistral", &[]).unwrap(),
            || tool_parser("openai", &[]).unwrap(),
            || tool_parser("pythonic", &[]).unwrap(),
            || tool_parser("qwen3_xml", &[]).unwrap(),
            || tool_parser("generic", &[]).unwrap(),
        ];
        for _ in 0..1000 {
            let len = 1 + next(24);
            let text: String = (0..len).map(|_| PIECES[next(PIECES.len())]).collect();
            for make in makers {
                parse_all_ways(make, &text);
            }
        }
    }
}
