//! gpt-oss's harmony markers are special tokens: detokenized with `skip_special_tokens` (the
//! default) they vanish and the channels can no longer be told apart, so the harmony parsers
//! ask for them to be kept (`needs_special_tokens`), and return text without them.
//!
//! The o200k harmony vocabulary is not in the test assets; the default model's tokenizer,
//! exported as an HF directory with the seven markers added as special tokens (as gpt-oss's
//! `tokenizer.json` declares them), stands in for it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::default_tokenizer;
use tokenmill_text::tool_parsers::{tool_parser, ParsedToolOutput};
use tokenmill_text::{
    reasoning_parser, DecodeOptions, IncrementalDetokenizer, ReasoningDelta, Tokenizer,
};

const MARKERS: [&str; 8] = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|endoftext|>",
];

fn harmony_tokenizer() -> Tokenizer {
    let dir = tempfile::tempdir().unwrap();
    let base = default_tokenizer();
    base.write_hf_dir(dir.path(), None).unwrap();
    let path = dir.path().join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let added = json["added_tokens"].as_array_mut().unwrap();
    for (i, marker) in MARKERS.iter().enumerate() {
        added.push(serde_json::json!({
            "id": base.vocab_size() + i, "content": marker, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true,
        }));
    }
    std::fs::write(&path, json.to_string()).unwrap();
    Tokenizer::from_hf_dir(dir.path()).unwrap()
}

/// Detokenizes `ids` one at a time, as the engine's output processor does.
fn detokenize(tokenizer: &Arc<Tokenizer>, prompt: &[u32], ids: &[u32], skip: bool) -> Vec<String> {
    let options = DecodeOptions {
        skip_special_tokens: skip,
        ..DecodeOptions::default()
    };
    let mut detokenizer = IncrementalDetokenizer::new(Arc::clone(tokenizer), prompt, options);
    let mut pieces: Vec<String> = ids
        .iter()
        .map(|&id| detokenizer.push(id).unwrap())
        .collect();
    pieces.push(detokenizer.finish().unwrap());
    pieces
}

#[test]
fn harmony_markers_reach_the_parsers_only_when_special_tokens_are_kept() {
    let tokenizer = Arc::new(harmony_tokenizer());
    let prompt = tokenizer
        .encode(
            "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant",
            false,
        )
        .unwrap();
    let output = "<|channel|>analysis<|message|>User asks weather. Need tool.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
    let ids = tokenizer.encode(output, false).unwrap();
    let channel = tokenizer.token_to_id("<|channel|>").unwrap();
    assert!(ids.contains(&channel) && tokenizer.is_special(channel));

    // Skipped, the structure is gone: nothing marks where the reasoning ends.
    let skipped: String = detokenize(&tokenizer, &prompt, &ids, true).concat();
    assert_eq!(
        skipped,
        "analysisUser asks weather. Need tool.assistantcommentaryChecking.assistantcommentary to=functions.get_weather json{\"city\":\"Paris\"}"
    );

    // Kept (what the server asks for when a parser needs them), token by token.
    let pieces = detokenize(&tokenizer, &prompt, &ids, false);
    assert_eq!(pieces.concat(), output);
    let mut reasoning = reasoning_parser("openai_gptoss").unwrap();
    let mut tools = tool_parser("openai", &[]).unwrap();
    assert!(reasoning.needs_special_tokens() && tools.needs_special_tokens());
    let (mut reasoning_text, mut reasoning_deltas, mut tool_deltas) =
        (String::new(), Vec::new(), Vec::new());
    for (i, piece) in pieces.iter().enumerate() {
        reasoning_deltas.clear();
        reasoning.parse_delta(piece, &mut reasoning_deltas);
        if i + 1 == pieces.len() {
            reasoning.finish(&mut reasoning_deltas);
        }
        for delta in &reasoning_deltas {
            match delta {
                ReasoningDelta::Reasoning(text) => reasoning_text.push_str(text),
                ReasoningDelta::Content(text) => tools.parse_delta(text, &mut tool_deltas),
            }
        }
    }
    tools.finish(&mut tool_deltas);
    let parsed = ParsedToolOutput::from_deltas(&tool_deltas);
    assert_eq!(reasoning_text, "User asks weather. Need tool.");
    assert_eq!(parsed.content, "Checking.");
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(parsed.calls[0].name, "get_weather");
    assert_eq!(parsed.calls[0].arguments, "{\"city\":\"Paris\"}");
    assert!(!reasoning_text.contains("<|") && !parsed.content.contains("<|"));
}
