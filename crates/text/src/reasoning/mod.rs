//! Reasoning parsers (`--reasoning-parser`, vLLM's names): split a reasoning model's output
//! into its reasoning (`message.reasoning`) and its answer (`message.content`).
//!
//! Like the tool parsers, each is one incremental machine: [`ReasoningParser::parse_complete`]
//! feeds it the whole text, so streamed and non-streamed outputs agree. Marker text is held
//! back only while it could still be a marker.

mod harmony;
mod markers;

pub use harmony::HarmonyReasoningParser;
pub use markers::MarkerReasoningParser;

/// One step of parsed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningDelta {
    Reasoning(String),
    Content(String),
}

/// An incremental reasoning parser (one per choice).
pub trait ReasoningParser: Send + std::fmt::Debug {
    /// Feeds the next piece of generated text; deltas are appended to `out`.
    fn parse_delta(&mut self, text: &str, out: &mut Vec<ReasoningDelta>);

    /// The output ended: releases anything held back.
    fn finish(&mut self, out: &mut Vec<ReasoningDelta>);

    /// Whether the markers are special tokens that detokenizing with `skip_special_tokens`
    /// would remove (the server keeps them for the request; the parser's output has none).
    fn needs_special_tokens(&self) -> bool {
        false
    }

    /// Splits a complete output into (reasoning, content); the streaming machine fed
    /// everything at once. Reasoning is `None` when there was none.
    fn parse_complete(&mut self, text: &str) -> (Option<String>, String) {
        let mut deltas = Vec::new();
        self.parse_delta(text, &mut deltas);
        self.finish(&mut deltas);
        let mut reasoning: Option<String> = None;
        let mut content = String::new();
        for delta in deltas {
            match delta {
                ReasoningDelta::Reasoning(text) => {
                    reasoning.get_or_insert_with(String::new).push_str(&text)
                }
                ReasoningDelta::Content(text) => content.push_str(&text),
            }
        }
        (reasoning, content)
    }
}

/// The `--reasoning-parser` names tokenmill implements.
pub const REASONING_PARSER_NAMES: [&str; 5] =
    ["deepseek_r1", "qwen3", "granite", "gemma4", "openai_gptoss"];

/// The markers a reasoning parser splits on, as a thinking budget needs them: the primary
/// start and end strings (tokenized by the server, counted between and forced by the
/// engine) and whether output without a start marker is reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningMarkers {
    pub start: &'static str,
    pub end: &'static str,
    pub reasoning_without_start: bool,
}

/// The markers of the parser vLLM calls `name`; `None` for `openai_gptoss` too, whose
/// reasoning ends with a message boundary (`<|end|>`, then a new header), not one marker.
pub fn reasoning_markers(name: &str) -> Option<ReasoningMarkers> {
    Some(
        match name {
            "deepseek_r1" => MarkerReasoningParser::deepseek_r1(),
            "qwen3" => MarkerReasoningParser::qwen3(),
            "granite" => MarkerReasoningParser::granite(),
            "gemma4" => MarkerReasoningParser::gemma4(),
            _ => return None,
        }
        .markers(),
    )
}

/// A fresh parser by vLLM's name.
pub fn reasoning_parser(name: &str) -> Option<Box<dyn ReasoningParser>> {
    if name == "openai_gptoss" {
        return Some(Box::new(HarmonyReasoningParser::default()));
    }
    Some(Box::new(match name {
        "deepseek_r1" => MarkerReasoningParser::deepseek_r1(),
        "qwen3" => MarkerReasoningParser::qwen3(),
        "granite" => MarkerReasoningParser::granite(),
        "gemma4" => MarkerReasoningParser::gemma4(),
        _ => return None,
    }))
}
