//! A chat choice's generated text read through the reasoning parser and then the tool-call
//! parser (calls are parsed from the content part only), as pieces that become a response
//! message or streamed deltas. A non-streamed choice is the same machine fed its whole text,
//! so both forms agree.

use tokenmill_protocol::{
    tool_call_id, ChatDelta, DeltaFunctionCall, DeltaToolCall, ToolCall, ToolOutput, ToolPlan,
};
use tokenmill_text::tool_parsers::{tool_parser, ToolDelta, ToolParser};
use tokenmill_text::{reasoning_parser, ReasoningDelta, ReasoningParser};

/// How a request's choices are read, decided once per request.
#[derive(Debug, Clone)]
pub struct OutputReading {
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<String>,
    /// `include_reasoning` (default true).
    pub include_reasoning: bool,
    /// The tool-call parser the plan calls for.
    pub tool_parser: Option<String>,
    /// `parallel_tool_calls`: false keeps only the first call.
    pub parallel_tool_calls: bool,
    /// The request's tools (a parser may type arguments by their schemas).
    pub tools: Vec<serde_json::Value>,
}

impl OutputReading {
    /// A constrained envelope leaves no room for reasoning (the grammar starts at the first
    /// token), so no reasoning parser reads it: `deepseek_r1` would take it all as reasoning.
    pub fn new(plan: &ToolPlan, reasoning_parser: Option<&str>, include_reasoning: bool) -> Self {
        let constrained = matches!(plan.output, ToolOutput::Envelope { .. });
        let reasoning_parser = reasoning_parser.filter(|_| !constrained);
        let tool_parser = match &plan.output {
            ToolOutput::Text => None,
            ToolOutput::Parser(name) => Some(name.clone()),
            ToolOutput::Envelope { .. } => Some("generic".to_string()),
        };
        OutputReading {
            reasoning_parser: reasoning_parser.map(str::to_string),
            include_reasoning,
            tool_parser,
            parallel_tool_calls: plan.parallel_tool_calls,
            tools: plan
                .tools
                .iter()
                .filter_map(|tool| serde_json::to_value(tool).ok())
                .collect(),
        }
    }

    /// Whether tool calls are written under the JSON-envelope constraint (a forced call, or
    /// the `generic` parser, which `plan_tools` always gives an envelope), so a tool's
    /// argument schema holds.
    pub fn constrains_tool_calls(&self) -> bool {
        self.tool_parser.as_deref() == Some("generic")
    }

    /// Whether any parser reads the output (otherwise text passes through untouched).
    pub fn is_plain(&self) -> bool {
        self.reasoning_parser.is_none() && self.tool_parser.is_none()
    }

    /// Whether the reasoning or tool parser's markers are special tokens (they must not be
    /// skipped when detokenizing; the parsers leave none in what they return).
    pub fn needs_special_tokens(&self) -> bool {
        let reasoning = self
            .reasoning_parser
            .as_deref()
            .and_then(reasoning_parser)
            .is_some_and(|parser| parser.needs_special_tokens());
        let tools = self
            .tool_parser
            .as_deref()
            .and_then(|name| tool_parser(name, &self.tools))
            .is_some_and(|parser| parser.needs_special_tokens());
        reasoning || tools
    }

    /// A fresh reader for one choice.
    pub fn choice(&self) -> ChoiceReader {
        ChoiceReader {
            reasoning: self.reasoning_parser.as_deref().and_then(reasoning_parser),
            include_reasoning: self.include_reasoning,
            tools: self
                .tool_parser
                .as_deref()
                .and_then(|name| tool_parser(name, &self.tools)),
            parallel_tool_calls: self.parallel_tool_calls,
            ids: Vec::new(),
            reasoning_deltas: Vec::new(),
            tool_deltas: Vec::new(),
        }
    }
}

/// One piece of a choice's output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    Arguments {
        index: usize,
        fragment: String,
    },
}

/// One choice's parsers and the ids of its calls.
#[derive(Debug)]
pub struct ChoiceReader {
    reasoning: Option<Box<dyn ReasoningParser>>,
    include_reasoning: bool,
    tools: Option<Box<dyn ToolParser>>,
    parallel_tool_calls: bool,
    ids: Vec<String>,
    reasoning_deltas: Vec<ReasoningDelta>,
    tool_deltas: Vec<ToolDelta>,
}

/// A whole choice, split.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceMessage {
    pub reasoning: Option<String>,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl ChoiceReader {
    /// Whether a call has started in this choice (its finish reason becomes `tool_calls`).
    pub fn called(&self) -> bool {
        !self.ids.is_empty()
    }

    /// Reads the next piece of text (`finished`: the choice ended, release what is held).
    pub fn push(&mut self, text: &str, finished: bool) -> Vec<Piece> {
        self.reasoning_deltas.clear();
        match &mut self.reasoning {
            Some(parser) => {
                parser.parse_delta(text, &mut self.reasoning_deltas);
                if finished {
                    parser.finish(&mut self.reasoning_deltas);
                }
            }
            None => self
                .reasoning_deltas
                .push(ReasoningDelta::Content(text.to_string())),
        }
        let mut pieces = Vec::new();
        let reasoning_deltas = std::mem::take(&mut self.reasoning_deltas);
        for delta in &reasoning_deltas {
            match delta {
                ReasoningDelta::Reasoning(text) => {
                    if self.include_reasoning && !text.is_empty() {
                        pieces.push(Piece::Reasoning(text.clone()));
                    }
                }
                ReasoningDelta::Content(text) => match &mut self.tools {
                    Some(parser) => parser.parse_delta(text, &mut self.tool_deltas),
                    None if text.is_empty() => {}
                    None => pieces.push(Piece::Content(text.clone())),
                },
            }
        }
        self.reasoning_deltas = reasoning_deltas;
        if finished {
            if let Some(parser) = &mut self.tools {
                parser.finish(&mut self.tool_deltas);
            }
        }
        let tool_deltas = std::mem::take(&mut self.tool_deltas);
        for delta in &tool_deltas {
            match delta {
                ToolDelta::Content(text) => pieces.push(Piece::Content(text.clone())),
                ToolDelta::CallStart { index, .. } | ToolDelta::Arguments { index, .. }
                    if *index > 0 && !self.parallel_tool_calls => {}
                ToolDelta::CallStart { index, name } => {
                    let id = tool_call_id();
                    self.ids.push(id.clone());
                    pieces.push(Piece::CallStart {
                        index: *index,
                        id,
                        name: name.clone(),
                    });
                }
                ToolDelta::Arguments { index, fragment } => pieces.push(Piece::Arguments {
                    index: *index,
                    fragment: fragment.clone(),
                }),
            }
        }
        self.tool_deltas = tool_deltas;
        self.tool_deltas.clear();
        pieces
    }

    /// Reads a whole choice at once.
    pub fn complete(&mut self, text: &str) -> ChoiceMessage {
        let mut message = ChoiceMessage::default();
        for piece in self.push(text, true) {
            match piece {
                Piece::Reasoning(text) => message
                    .reasoning
                    .get_or_insert_with(String::new)
                    .push_str(&text),
                Piece::Content(text) => message.content.push_str(&text),
                Piece::CallStart { id, name, .. } => message.tool_calls.push(ToolCall {
                    id,
                    ..ToolCall::function(name, String::new())
                }),
                Piece::Arguments { index, fragment } => {
                    if let Some(call) = message.tool_calls.get_mut(index) {
                        call.function.arguments.push_str(&fragment);
                    }
                }
            }
        }
        message
    }
}

/// The streamed deltas of one step's pieces: reasoning under both names, content, a call's
/// start (`id`, `type`, `name`, empty `arguments`) and then its argument fragments alone.
pub(crate) fn deltas(pieces: Vec<Piece>) -> Vec<ChatDelta> {
    let mut deltas: Vec<ChatDelta> = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Reasoning(text) => match deltas.last_mut() {
                Some(last) if last.reasoning.is_some() => {
                    last.reasoning
                        .get_or_insert_with(String::new)
                        .push_str(&text);
                    last.reasoning_content
                        .get_or_insert_with(String::new)
                        .push_str(&text);
                }
                _ => deltas.push(ChatDelta {
                    reasoning: Some(text.clone()),
                    reasoning_content: Some(text),
                    ..ChatDelta::default()
                }),
            },
            Piece::Content(text) => match deltas.last_mut() {
                Some(last) if last.content.is_some() => {
                    last.content.get_or_insert_with(String::new).push_str(&text)
                }
                _ => deltas.push(ChatDelta {
                    content: Some(text),
                    ..ChatDelta::default()
                }),
            },
            Piece::CallStart { index, id, name } => deltas.push(ChatDelta {
                tool_calls: Some(vec![DeltaToolCall {
                    index: index as u32,
                    id: Some(id),
                    call_type: Some("function".into()),
                    function: DeltaFunctionCall {
                        name: Some(name),
                        arguments: Some(String::new()),
                    },
                }]),
                ..ChatDelta::default()
            }),
            Piece::Arguments { index, fragment } => {
                let open = deltas.last_mut().and_then(|last| {
                    let calls = last.tool_calls.as_mut()?;
                    let call = calls.last_mut()?;
                    (call.index as usize == index && call.id.is_none()).then_some(call)
                });
                match open {
                    Some(call) => call
                        .function
                        .arguments
                        .get_or_insert_with(String::new)
                        .push_str(&fragment),
                    None => deltas.push(ChatDelta {
                        tool_calls: Some(vec![DeltaToolCall {
                            index: index as u32,
                            function: DeltaFunctionCall {
                                name: None,
                                arguments: Some(fragment),
                            },
                            ..DeltaToolCall::default()
                        }]),
                        ..ChatDelta::default()
                    }),
                }
            }
        }
    }
    deltas
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(reasoning: Option<&str>, tools: Option<&str>, parallel: bool) -> OutputReading {
        OutputReading {
            reasoning_parser: reasoning.map(str::to_string),
            include_reasoning: true,
            tool_parser: tools.map(str::to_string),
            parallel_tool_calls: parallel,
            tools: Vec::new(),
        }
    }

    /// Streams `text` char by char through deltas and checks them against the complete read:
    /// each call's first delta has index, id, type and name, later ones only arguments, and
    /// the concatenations equal the complete message.
    fn stream_matches_complete(reading: &OutputReading, text: &str) -> ChoiceMessage {
        let complete = reading.choice().complete(text);
        let mut reader = reading.choice();
        let chars: Vec<char> = text.chars().collect();
        let mut all = Vec::new();
        for (i, c) in chars.iter().enumerate() {
            all.extend(deltas(reader.push(&c.to_string(), i + 1 == chars.len())));
        }
        let mut streamed = ChoiceMessage::default();
        for delta in all {
            if let Some(text) = delta.reasoning {
                assert_eq!(delta.reasoning_content.as_deref(), Some(text.as_str()));
                streamed
                    .reasoning
                    .get_or_insert_with(String::new)
                    .push_str(&text);
            }
            if let Some(text) = delta.content {
                streamed.content.push_str(&text);
            }
            for call in delta.tool_calls.unwrap_or_default() {
                match call.id {
                    Some(id) => {
                        assert_eq!(call.index as usize, streamed.tool_calls.len());
                        assert_eq!(call.call_type.as_deref(), Some("function"));
                        let name = call
                            .function
                            .name
                            .expect("a first delta names the function");
                        streamed.tool_calls.push(ToolCall {
                            id,
                            ..ToolCall::function(name, call.function.arguments.unwrap_or_default())
                        });
                    }
                    None => {
                        assert!(call.function.name.is_none() && call.call_type.is_none());
                        let target = &mut streamed.tool_calls[call.index as usize];
                        target
                            .function
                            .arguments
                            .push_str(&call.function.arguments.unwrap());
                    }
                }
            }
        }
        assert_eq!(streamed.reasoning, complete.reasoning);
        assert_eq!(streamed.content, complete.content);
        let names = |m: &ChoiceMessage| -> Vec<(String, String)> {
            m.tool_calls
                .iter()
                .map(|c| (c.function.name.clone(), c.function.arguments.clone()))
                .collect()
        };
        assert_eq!(names(&streamed), names(&complete));
        complete
    }

    #[test]
    fn reasoning_then_calls_from_the_content_only() {
        let reading = reading(Some("qwen3"), Some("hermes"), true);
        let text = "<think>I should call <tool_call>{\"name\": \"no\"}</tool_call> maybe.</think>\n\nOK.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"é}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
        let message = stream_matches_complete(&reading, text);
        assert_eq!(
            message.reasoning.as_deref(),
            Some("I should call <tool_call>{\"name\": \"no\"}</tool_call> maybe.")
        );
        assert_eq!(message.content, "\n\nOK.\n");
        assert_eq!(message.tool_calls.len(), 2);
        assert!(message.tool_calls.iter().all(|c| c.id.starts_with("call_")));
        assert_ne!(message.tool_calls[0].id, message.tool_calls[1].id);
    }

    /// gpt-oss served as vLLM serves it (`--reasoning-parser openai_gptoss
    /// --tool-call-parser openai`): the markers must reach the parsers (special tokens kept),
    /// and what comes back holds none of them.
    #[test]
    fn harmony_channels_become_reasoning_content_and_calls() {
        let both = reading(Some("openai_gptoss"), Some("openai"), true);
        assert!(both.needs_special_tokens());
        assert!(reading(Some("openai_gptoss"), None, true).needs_special_tokens());
        assert!(reading(None, Some("openai"), true).needs_special_tokens());
        assert!(!reading(Some("qwen3"), Some("hermes"), true).needs_special_tokens());
        let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let message = stream_matches_complete(&both, text);
        assert_eq!(message.reasoning.as_deref(), Some("Need the weather."));
        assert_eq!(message.content, "Checking.");
        assert_eq!(message.tool_calls.len(), 1);
        assert_eq!(message.tool_calls[0].function.name, "get_weather");
        assert_eq!(
            message.tool_calls[0].function.arguments,
            "{\"city\":\"Paris\"}"
        );
        let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>";
        let message = stream_matches_complete(&reading(Some("openai_gptoss"), None, true), answer);
        assert_eq!(
            (message.reasoning.as_deref(), message.content.as_str()),
            (Some("Easy."), "4")
        );
    }

    #[test]
    fn parallel_off_keeps_the_first_call_and_reasoning_can_be_dropped() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
        let message = stream_matches_complete(&reading(None, Some("hermes"), false), text);
        assert_eq!(message.tool_calls.len(), 1);
        let mut hidden = reading(Some("deepseek_r1"), None, true);
        hidden.include_reasoning = false;
        let message = stream_matches_complete(&hidden, "secret</think>shown");
        assert_eq!(
            (message.reasoning, message.content.as_str()),
            (None, "shown")
        );
    }
}
