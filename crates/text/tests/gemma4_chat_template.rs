//! Gemma 4's real chat template (google/gemma-4-31B-it's, as llama.cpp ships it) rendered by
//! minijinja against transformers' own renderer (fixture written by
//! scripts/reference/make_gemma4_template_fixture.py): a system prompt, tool declarations in
//! the template's notation, a tool call with its reasoning and its result, thinking on and
//! off. What Gemma 4 answers in that notation is read back by the `gemma4` tool parser.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::fixture;
use tokenmill_text::tool_parsers::{tool_parser, ParsedToolOutput, ToolDelta};
use tokenmill_text::{ChatTemplate, RenderOptions};

#[test]
fn gemma4_template_renders_as_transformers_renders_it() {
    let fixture = fixture("chat_templates_gemma4.json");
    let template = ChatTemplate::new(fixture["template"].as_str().unwrap()).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8);
    for case in cases {
        let options = RenderOptions {
            add_generation_prompt: true,
            continue_final_message: false,
            bos_token: fixture["bos_token"].as_str().unwrap().to_string(),
            eos_token: fixture["eos_token"].as_str().unwrap().to_string(),
            tools: case["tools"].as_array().cloned(),
            documents: None,
            chat_template_kwargs: case["chat_template_kwargs"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
        };
        let rendered = template
            .render(case["messages"].as_array().unwrap(), &options)
            .unwrap();
        assert_eq!(
            rendered,
            case["expected"].as_str().unwrap(),
            "{} {}",
            case["conversation"],
            case["chat_template_kwargs"]
        );
    }
}

/// The call the template renders for the tool round trip, fed back as model output, parses
/// into the arguments it was rendered from.
#[test]
fn gemma4_parser_reads_back_the_templates_call() {
    let fixture = fixture("chat_templates_gemma4.json");
    let case = &fixture["cases"].as_array().unwrap()[4];
    let rendered = case["expected"].as_str().unwrap();
    let start = rendered.find("<|tool_call>").unwrap();
    let end = rendered.find("<tool_call|>").unwrap() + "<tool_call|>".len();
    let mut parser = tool_parser("gemma4", &[]).unwrap();
    assert!(parser.needs_special_tokens());
    let mut deltas = Vec::new();
    for c in rendered[start..end].chars() {
        parser.parse_delta(&c.to_string(), &mut deltas);
    }
    parser.finish(&mut deltas);
    assert!(matches!(deltas.first(), Some(ToolDelta::CallStart { .. })));
    let parsed = ParsedToolOutput::from_deltas(&deltas);
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(parsed.calls[0].name, "get_weather");
    let arguments: serde_json::Value = serde_json::from_str(&parsed.calls[0].arguments).unwrap();
    let sent = &case["messages"][2]["tool_calls"][0]["function"]["arguments"];
    assert_eq!(&arguments, sent);
}
