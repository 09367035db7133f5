//! gpt-oss's own chat template renders harmony through tokenmill's `ChatTemplate`: system
//! message (model identity, date, reasoning effort, channels), developer instructions with
//! the tools as a TypeScript-like `functions` namespace, a user turn, an assistant tool call
//! (its analysis kept, since no final answer follows it) and the tool's result.
//!
//! Fixture `tests/fixtures/chat_template_gpt_oss.jinja`: the template of openai/gpt-oss-120b
//! (the same text as gpt-oss-20b's), copied from llama.cpp's
//! `models/templates/openai-gpt-oss-120b.jinja` (llama-cpp-python 0.3.36's vendored copy).
//! The expected text below was written by reading the template (Jinja2 3.1.6, configured as
//! transformers configures it, renders the same).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use tokenmill_text::{strftime, ChatTemplate, RenderOptions};

fn template() -> ChatTemplate {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_template_gpt_oss.jinja"
    );
    ChatTemplate::new(std::fs::read_to_string(path).unwrap()).unwrap()
}

fn today() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    strftime("%Y-%m-%d", i64::try_from(now.as_secs()).unwrap())
}

fn options(kwargs: Value) -> RenderOptions {
    let tools = vec![json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
        },
    }})];
    let Value::Object(kwargs) = kwargs else {
        panic!("kwargs are an object")
    };
    RenderOptions {
        add_generation_prompt: true,
        tools: Some(tools),
        chat_template_kwargs: kwargs,
        ..RenderOptions::default()
    }
}

/// The conversation after the instructions. Tool-call arguments arrive as JSON text, as on
/// the wire; `ChatTemplate` hands them to the template as an object (vLLM does the same).
/// `thinking` is the template's name for an earlier turn's analysis; the chat front end fills
/// it from a request message's `reasoning` / `reasoning_content` (`ConversationMessage`).
fn turns() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "What is the weather in Paris?"}),
        json!({"role": "assistant", "content": null, "thinking": "Need the weather tool.",
               "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1",
               "content": "{\"temperature\": 18, \"sky\": \"clear\"}"}),
    ]
}

fn expected(identity: &str, effort: &str) -> String {
    let date = today();
    [
        "<|start|>system<|message|>",
        identity,
        "\nKnowledge cutoff: 2024-06\nCurrent date: ",
        &date,
        "\n\nReasoning: ",
        effort,
        "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\n",
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|>",
        "<|start|>developer<|message|># Instructions\n\nAnswer in one sentence.\n\n",
        "# Tools\n\n## functions\n\nnamespace functions {\n\n",
        "// Get the current weather for a city.\n",
        "type get_weather = (_: {\n",
        "// The city name.\n",
        "city: string,\n",
        "unit?: \"celsius\" | \"fahrenheit\", // default: celsius,\n",
        "}) => any;\n\n",
        "} // namespace functions<|end|>",
        "<|start|>user<|message|>What is the weather in Paris?<|end|>",
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
        "{\"city\": \"Paris\"}<|call|>",
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>",
        "\"{\\\"temperature\\\": 18, \\\"sky\\\": \\\"clear\\\"}\"<|end|>",
        "<|start|>assistant",
    ]
    .concat()
}

#[test]
fn gpt_oss_template_renders_harmony_with_tools_effort_and_a_tool_round() {
    let mut messages = vec![json!({"role": "developer", "content": "Answer in one sentence."})];
    messages.extend(turns());
    let kwargs = json!({
        "reasoning_effort": "high",
        "model_identity": "You are a weather assistant.",
    });
    let rendered = template().render(&messages, &options(kwargs)).unwrap();
    assert_eq!(rendered, expected("You are a weather assistant.", "high"));
}

#[test]
fn a_system_message_becomes_the_developer_instructions_and_effort_defaults_to_medium() {
    // OpenAI clients send the instructions as `system`; the template reads the first message
    // either way, and its own system message carries the identity and the effort.
    let mut messages = vec![json!({"role": "system", "content": "Answer in one sentence."})];
    messages.extend(turns());
    let rendered = template()
        .render(&messages, &options(Value::Object(Map::new())))
        .unwrap();
    assert_eq!(
        rendered,
        expected(
            "You are ChatGPT, a large language model trained by OpenAI.",
            "medium"
        )
    );
}
