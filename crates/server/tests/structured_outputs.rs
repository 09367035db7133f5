//! Structured outputs through the HTTP API over the real default model: JSON schema
//! (`response_format`), JSON object, regex, choice, Lark and GBNF grammars, streaming, the
//! 400s for bad constraints, and batch invariance with constrained and free rows in one step.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::http::{Method, StatusCode};
use common::{error_param, json_request, sse_events, TestApp, MODEL_NAME};
use serde_json::{json, Value};

/// A greedy chat completion with `extra` fields: the content and the finish reason.
async fn chat(app: &TestApp, prompt: &str, extra: Value) -> (String, String) {
    let mut body = json!({
        "model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 160, "temperature": 0,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let (status, response) = app.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let choice = &response["choices"][0];
    (
        choice["message"]["content"].as_str().unwrap().to_string(),
        choice["finish_reason"].as_str().unwrap().to_string(),
    )
}

/// A greedy completion with `extra` fields: the text and the finish reason.
async fn complete(app: &TestApp, prompt: &str, extra: Value) -> (String, String) {
    let mut body = json!({
        "model": MODEL_NAME, "prompt": prompt, "max_tokens": 32, "temperature": 0,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let (status, response) = app.post_json("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let choice = &response["choices"][0];
    (
        choice["text"].as_str().unwrap().to_string(),
        choice["finish_reason"].as_str().unwrap().to_string(),
    )
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                     "minItems": 1, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "role", "tags", "address"],
        "additionalProperties": false
    })
}

/// `value` satisfies [`person_schema`] (checked by hand).
fn check_person(value: &Value) {
    let object = value.as_object().expect("an object");
    for key in ["name", "age", "role", "tags", "address"] {
        assert!(object.contains_key(key), "required {key}: {value}");
    }
    assert_eq!(object.len(), 5, "no additional properties: {value}");
    assert!(object["name"].as_str().unwrap().chars().count() <= 20);
    let age = object["age"].as_i64().expect("integer age");
    assert!((0..=150).contains(&age), "{value}");
    assert!(["admin", "user", "guest"].contains(&object["role"].as_str().unwrap()));
    let tags = object["tags"].as_array().unwrap();
    assert!((1..=3).contains(&tags.len()), "{value}");
    assert!(tags
        .iter()
        .all(|tag| tag.as_str().unwrap().chars().count() <= 10));
    let address = object["address"].as_object().unwrap();
    assert_eq!(address.len(), 1, "{value}");
    assert!(address["city"].is_string(), "{value}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_and_json_object_outputs_parse_and_validate() {
    let app = TestApp::start();
    let (content, finish) = chat(
        &app,
        "Describe a person called Ada who lives in London.",
        json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}}),
    )
    .await;
    assert_eq!(finish, "stop", "{content}");
    check_person(&serde_json::from_str(&content).expect("valid JSON"));

    // The same schema through vLLM's and the legacy spelling gives the same output.
    let (again, _) = chat(
        &app,
        "Describe a person called Ada who lives in London.",
        json!({"guided_json": person_schema()}),
    )
    .await;
    assert_eq!(again, content);

    let (content, finish) = chat(
        &app,
        "Reply with a JSON object whose only key \"answer\" holds the number 4.",
        json!({"response_format": {"type": "json_object"}}),
    )
    .await;
    assert_eq!(finish, "stop", "{content}");
    assert!(serde_json::from_str::<Value>(&content).unwrap().is_object());
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_choice_and_grammars_constrain_the_text() {
    let app = TestApp::start();
    let (text, finish) = complete(
        &app,
        "My phone number is",
        json!({"guided_regex": " [0-9]{3}-[0-9]{4}"}),
    )
    .await;
    assert_eq!(finish, "stop", "{text:?}");
    let digits: Vec<char> = text.chars().collect();
    assert_eq!(digits.len(), 9, "{text:?}");
    assert!(digits[0] == ' ' && digits[4] == '-', "{text:?}");
    assert!(digits[1..4]
        .iter()
        .chain(&digits[5..])
        .all(char::is_ascii_digit));

    let (content, finish) = chat(
        &app,
        "Is the sky blue? Answer yes or no.",
        json!({"structured_outputs": {"choice": ["yes", "no"]}}),
    )
    .await;
    assert_eq!(finish, "stop");
    assert!(content == "yes" || content == "no", "{content:?}");

    let lark = "start: \"The answer is \" NUMBER \".\"\nNUMBER: /[0-9]+/";
    let gbnf = "root ::= \"The answer is \" number \".\"\nnumber ::= [0-9]+";
    for grammar in [lark, gbnf] {
        let (content, finish) = chat(
            &app,
            "What is 2 + 2?",
            json!({"structured_outputs": {"grammar": grammar}}),
        )
        .await;
        assert_eq!(finish, "stop", "{grammar}: {content:?}");
        let number = content
            .strip_prefix("The answer is ")
            .and_then(|rest| rest.strip_suffix('.'))
            .unwrap_or_else(|| panic!("{grammar}: {content:?}"));
        assert!(
            !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()),
            "{content:?}"
        );
    }
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_choices_with_a_seed_all_match_and_repeat() {
    let app = TestApp::start();
    let body = json!({
        "model": MODEL_NAME, "prompt": "My favourite colour is", "max_tokens": 8,
        "temperature": 1.0, "n": 4, "seed": 7, "logprobs": 2,
        "structured_outputs": {"choice": [" red", " green", " blue"]},
    });
    let (status, first) = app.post_json("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let texts: Vec<&str> = first["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|choice| {
            assert_eq!(choice["finish_reason"], "stop", "{choice}");
            choice["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(texts.len(), 4);
    assert!(
        texts
            .iter()
            .all(|text| [" red", " green", " blue"].contains(text)),
        "{texts:?}"
    );
    let (_, second) = app.post_json("/v1/completions", &body).await;
    assert_eq!(first["choices"], second["choices"], "seeded choices repeat");
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_json_is_valid_json() {
    let app = TestApp::start();
    let body = json!({
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "A JSON object about dogs."}],
        "max_tokens": 160, "temperature": 0, "stream": true,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}},
    });
    let response = app
        .send(json_request(
            Method::POST,
            "/v1/chat/completions",
            &body,
            None,
        ))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut content = String::new();
    let mut finish = None;
    for event in sse_events(response).await {
        if event == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        if let Some(choice) = chunk["choices"].get(0) {
            content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_string());
            }
        }
    }
    assert_eq!(finish.as_deref(), Some("stop"), "{content}");
    check_person(&serde_json::from_str(&content).expect("valid JSON"));
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_are_400s_naming_the_field() {
    let app = TestApp::start();
    let messages = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "two"}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"guided_regex": "(unclosed"}), "guided_regex"),
        (
            json!({"structured_outputs": {"grammar": "start: missing_rule"}}),
            "structured_outputs.grammar",
        ),
        (
            json!({"structured_outputs": {"grammar": "root ::= \"unterminated"}}),
            "structured_outputs.grammar",
        ),
        (json!({"guided_choice": []}), "guided_choice"),
        (
            json!({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}),
            "guided_decoding_backend",
        ),
        (
            json!({"guided_regex": "a", "guided_json": {}}),
            "guided_regex",
        ),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": MODEL_NAME, "messages": messages, "max_tokens": 4});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        let (status, response) = app.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {response}");
        assert_eq!(error_param(&response), Some(param), "{extra}: {response}");
        let message = response["error"]["message"].as_str().unwrap();
        assert!(message.contains(param), "{extra}: {message}");
    }
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_and_free_rows_in_one_step_match_their_solo_outputs() {
    let app = TestApp::start();
    let prompt = "The capital of France is";
    let constrained = json!({"guided_regex": " [A-Z][a-z]+, [A-Z][a-z]+\\."});
    let free = json!({"ignore_eos": true});
    let constrained_alone = complete(&app, prompt, constrained.clone()).await;
    let free_alone = complete(&app, prompt, free.clone()).await;
    assert_eq!(constrained_alone.1, "stop", "{constrained_alone:?}");
    for _ in 0..2 {
        let (together_constrained, together_free) = tokio::join!(
            complete(&app, prompt, constrained.clone()),
            complete(&app, prompt, free.clone()),
        );
        assert_eq!(together_constrained, constrained_alone);
        assert_eq!(together_free, free_alone);
    }
    app.wait_idle().await;
}
