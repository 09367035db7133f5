//! Reasoning delimited by start and end markers: `<think>...</think>` (DeepSeek-R1, QwQ,
//! Qwen3) and Granite 3.2's `Here is my thought process: ... Here is my response:`.

use super::{ReasoningDelta, ReasoningMarkers, ReasoningParser};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start: a start marker may come.
    Start,
    Reasoning,
    Content,
}

/// A reasoning parser defined by its markers.
#[derive(Debug)]
pub struct MarkerReasoningParser {
    starts: &'static [&'static str],
    ends: &'static [&'static str],
    /// Output without a start marker is reasoning up to the end marker (DeepSeek-R1's
    /// template opens `<think>` in the prompt); otherwise it is all content (Qwen3 with
    /// thinking off, Granite without `thinking`).
    reasoning_without_start: bool,
    /// The markers are special tokens the detokenizer would skip (Gemma 4's).
    special_markers: bool,
    state: State,
    buffer: String,
}

/// Appends reasoning or content, merging with a preceding delta of the same kind.
pub(super) fn push(out: &mut Vec<ReasoningDelta>, reasoning: bool, text: &str) {
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), reasoning) {
        (Some(ReasoningDelta::Reasoning(last)), true)
        | (Some(ReasoningDelta::Content(last)), false) => last.push_str(text),
        _ => out.push(if reasoning {
            ReasoningDelta::Reasoning(text.to_string())
        } else {
            ReasoningDelta::Content(text.to_string())
        }),
    }
}

impl MarkerReasoningParser {
    fn new(
        starts: &'static [&'static str],
        ends: &'static [&'static str],
        reasoning_without_start: bool,
    ) -> Self {
        MarkerReasoningParser {
            starts,
            ends,
            reasoning_without_start,
            special_markers: false,
            state: State::Start,
            buffer: String::new(),
        }
    }

    /// `deepseek_r1`: reasoning up to `</think>` (a leading `<think>` dropped); no
    /// `</think>` at all means the whole output is reasoning, as in vLLM.
    pub fn deepseek_r1() -> Self {
        Self::new(&["<think>"], &["</think>"], true)
    }

    /// `qwen3`: reasoning only inside a `<think>...</think>` that opens the output.
    pub fn qwen3() -> Self {
        Self::new(&["<think>"], &["</think>"], false)
    }

    /// `gemma4`: Gemma 4 thinks in a `<|channel>thought\n...<channel|>` block that opens its
    /// turn (with thinking off its template writes an empty one into the prompt, so the
    /// output is all content).
    pub fn gemma4() -> Self {
        MarkerReasoningParser {
            special_markers: true,
            ..Self::new(&["<|channel>thought\n"], &["<channel|>"], false)
        }
    }

    /// `granite`: Granite 3.2 with `thinking: true` in `chat_template_kwargs`.
    pub fn granite() -> Self {
        Self::new(
            &["Here is my thought process:", "Here's my thought process:"],
            &["Here is my response:", "Here's my response:"],
            false,
        )
    }

    /// Its first start and end markers (the ones a thinking budget counts between and
    /// forces).
    pub fn markers(&self) -> ReasoningMarkers {
        ReasoningMarkers {
            start: self.starts.first().copied().unwrap_or_default(),
            end: self.ends.first().copied().unwrap_or_default(),
            reasoning_without_start: self.reasoning_without_start,
        }
    }

    fn run(&mut self, finished: bool, out: &mut Vec<ReasoningDelta>) {
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.buffer.trim_start();
                    if let Some(marker) = self.starts.iter().find(|m| trimmed.starts_with(**m)) {
                        let used = self.buffer.len() - trimmed.len() + marker.len();
                        self.buffer.drain(..used);
                        self.state = State::Reasoning;
                        continue;
                    }
                    let maybe_marker =
                        trimmed.is_empty() || self.starts.iter().any(|m| m.starts_with(trimmed));
                    if maybe_marker && !finished {
                        return;
                    }
                    self.state = if self.reasoning_without_start {
                        State::Reasoning
                    } else {
                        State::Content
                    };
                }
                State::Reasoning => {
                    let found = self
                        .ends
                        .iter()
                        .filter_map(|m| self.buffer.find(m).map(|at| (at, m.len())))
                        .min();
                    if let Some((at, len)) = found {
                        push(out, true, &self.buffer[..at]);
                        self.buffer.drain(..at + len);
                        self.state = State::Content;
                        continue;
                    }
                    let keep = if finished {
                        0
                    } else {
                        self.ends
                            .iter()
                            .map(|m| crate::tool_parsers::partial_marker_len(&self.buffer, m))
                            .max()
                            .unwrap_or(0)
                    };
                    let emit = self.buffer.len() - keep;
                    push(out, true, &self.buffer[..emit]);
                    self.buffer.drain(..emit);
                    return;
                }
                State::Content => {
                    push(out, false, &self.buffer);
                    self.buffer.clear();
                    return;
                }
            }
        }
    }
}

impl ReasoningParser for MarkerReasoningParser {
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ReasoningDelta>) {
        self.buffer.push_str(text);
        self.run(false, out);
    }

    fn finish(&mut self, out: &mut Vec<ReasoningDelta>) {
        self.run(true, out);
    }

    fn needs_special_tokens(&self) -> bool {
        self.special_markers
    }
}

#[cfg(test)]
mod tests {
    use super::super::{reasoning_parser, ReasoningDelta};

    /// Whole, char by char and in pieces of three: the same split every time.
    fn split_all_ways(name: &str, text: &str) -> (Option<String>, String) {
        let complete = reasoning_parser(name).unwrap().parse_complete(text);
        let chars: Vec<char> = text.chars().collect();
        for size in [1, 2, 3, 5] {
            let mut parser = reasoning_parser(name).unwrap();
            let mut deltas = Vec::new();
            for piece in chars.chunks(size) {
                parser.parse_delta(&piece.iter().collect::<String>(), &mut deltas);
            }
            parser.finish(&mut deltas);
            let mut reasoning: Option<String> = None;
            let mut content = String::new();
            let mut seen_content = false;
            for delta in deltas {
                match delta {
                    ReasoningDelta::Reasoning(text) => {
                        assert!(!seen_content, "reasoning after content in {text:?}");
                        reasoning.get_or_insert_with(String::new).push_str(&text)
                    }
                    ReasoningDelta::Content(text) => {
                        seen_content = true;
                        content.push_str(&text)
                    }
                }
            }
            assert_eq!((reasoning, content), complete, "pieces of {size}");
        }
        complete
    }

    #[test]
    fn deepseek_r1_with_and_without_the_opening_tag() {
        let expected = (
            Some("Let me think: 2+2=4.\n".to_string()),
            "\n\nThe answer is 4.".to_string(),
        );
        assert_eq!(
            split_all_ways(
                "deepseek_r1",
                "<think>Let me think: 2+2=4.\n</think>\n\nThe answer is 4."
            ),
            expected
        );
        assert_eq!(
            split_all_ways(
                "deepseek_r1",
                "Let me think: 2+2=4.\n</think>\n\nThe answer is 4."
            ),
            expected
        );
        // Cut off while thinking: all of it is reasoning.
        assert_eq!(
            split_all_ways("deepseek_r1", "<think>Hmm, </thi"),
            (Some("Hmm, </thi".into()), String::new())
        );
    }

    #[test]
    fn qwen3_reasons_only_inside_an_opening_think() {
        assert_eq!(
            split_all_ways("qwen3", "<think>\nUnicode: 東京 🚀 <b>\n</think>\n\nDone."),
            (Some("\nUnicode: 東京 🚀 <b>\n".into()), "\n\nDone.".into())
        );
        assert_eq!(
            split_all_ways("qwen3", "No thinking here </think>."),
            (None, "No thinking here </think>.".into())
        );
        assert_eq!(split_all_ways("qwen3", "<thin"), (None, "<thin".into()));
    }

    #[test]
    fn granite_markers() {
        assert_eq!(
            split_all_ways(
                "granite",
                "Here's my thought process:\nAdd them.\nHere is my response:\n4"
            ),
            (Some("\nAdd them.\n".into()), "\n4".into())
        );
        assert_eq!(
            split_all_ways("granite", "Just 4."),
            (None, "Just 4.".into())
        );
    }

    #[test]
    fn gemma4_thinks_in_its_thought_channel() {
        assert_eq!(
            split_all_ways(
                "gemma4",
                "<|channel>thought\nThe user wants 2+2.<channel|>The answer is 4."
            ),
            (
                Some("The user wants 2+2.".into()),
                "The answer is 4.".into()
            )
        );
        assert_eq!(
            split_all_ways("gemma4", "The answer is 4."),
            (None, "The answer is 4.".into())
        );
        // Its markers are special tokens: the server keeps them for this parser.
        assert!(reasoning_parser("gemma4").unwrap().needs_special_tokens());
        assert!(!reasoning_parser("qwen3").unwrap().needs_special_tokens());
    }

    #[test]
    fn random_texts_split_the_same_streamed_and_whole() {
        const PIECES: &[&str] = &[
            "<|channel>thought\n",
            "<channel|>",
            "<|chan",
            "<think>",
            "</think>",
            "<thi",
            "</",
            "Here is my thought process:",
            "Here's my response:",
            "Here",
            "a",
            " ",
            "\n",
            "東",
        ];
        let mut state = 0x2545f4914f6cdd1du64;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize % bound
        };
        for _ in 0..500 {
            let len = 1 + next(12);
            let text: String = (0..len).map(|_| PIECES[next(PIECES.len())]).collect();
            for name in super::super::REASONING_PARSER_NAMES {
                split_all_ways(name, &text);
            }
        }
    }
}
