//! Chat templates rendered by minijinja against Jinja2 configured as transformers'
//! apply_chat_template (fixture written by scripts/reference/make_tokenizer_fixture.py).

// Test helpers outside #[test] functions panic on broken fixtures by design.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{default_tokenizer, fixture};
use serde_json::Value;
use tokenmill_text::{ChatMessage, ChatTemplate, RenderOptions};

fn optional_list(value: &Value) -> Option<Vec<Value>> {
    value.as_array().cloned()
}

#[test]
fn rendering_matches_jinja2_for_every_fixture_case() {
    let fixture = fixture("chat_templates_smollm2.json");
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let source = fixture["templates"][name].as_str().unwrap();
        let template = ChatTemplate::new(source).unwrap();
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            continue_final_message: case["continue_final_message"].as_bool().unwrap(),
            bos_token: fixture["bos_token"].as_str().unwrap().to_string(),
            eos_token: fixture["eos_token"].as_str().unwrap().to_string(),
            tools: optional_list(&case["tools"]),
            documents: optional_list(&case["documents"]),
            chat_template_kwargs: case["chat_template_kwargs"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
        };
        let messages = case["messages"].as_array().unwrap();
        let expected = case["expected"].as_str().unwrap();
        match template.render(messages, &options) {
            Ok(rendered) if rendered == expected => {}
            Ok(rendered) => failures.push(format!(
                "{name}/{} gen={} cont={}:\n--- expected\n{expected}\n--- got\n{rendered}",
                case["conversation"], options.add_generation_prompt, options.continue_final_message
            )),
            Err(error) => failures.push(format!("{name}/{}: {error}", case["conversation"])),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn default_model_template_comes_from_gguf_and_renders_a_chat() {
    let tokenizer = default_tokenizer();
    let fixture = fixture("chat_templates_smollm2.json");
    assert_eq!(
        tokenizer.chat_template(),
        fixture["templates"]["smollm2"].as_str()
    );
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let mut options = RenderOptions::for_tokenizer(&tokenizer);
    options.add_generation_prompt = true;
    let messages = [ChatMessage::new("user", "Hello")];
    let prompt = template.render_messages(&messages, &options).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    );
    // The rendered special tokens encode to single ids.
    let ids = tokenizer.encode(&prompt, true).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
}
