//! A model that ships no chat template (a base model such as Gemma 3 270M): chat requests get
//! vLLM's 400 naming `messages` unless `--chat-template` or the request supplies a template;
//! completions work either way. The model is the default one with its template removed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use common::{assert_error_body, error_param, model_path, TestApp, MODEL_NAME};
use serde_json::json;
use tokenmill_gguf::{GgufFile, GgufWriter};
use tokenmill_models::ModelSource;

/// The default model's GGUF without `tokenizer.chat_template`, written once per name.
fn base_model(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let file = GgufFile::open(&model_path()).unwrap();
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata() {
        if key != "tokenizer.chat_template" {
            writer.add_metadata(key, value.clone());
        }
    }
    for info in file.tensors() {
        let data = file.tensor_data(info).unwrap().to_vec();
        writer.add_tensor(&info.name, &info.dims, info.ggml_type, data);
    }
    writer.write_to(&path).unwrap();
    path
}

fn start(model: &Path, chat_template: Option<&str>) -> TestApp {
    TestApp::with_engine_config(
        |engine| {
            engine.model = ModelSource::from_path(model.to_path_buf());
            engine.chat_template = chat_template.map(str::to_string);
        },
        // The test below brings its own template.
        |config| config.trust_request_chat_template = true,
    )
}

fn chat(extra: serde_json::Value) -> serde_json::Value {
    let mut body = json!({
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_without_a_template_is_a_400_and_completions_still_work() {
    let model = base_model("no-template.gguf");
    let app = start(&model, None);
    let (status, body) = app
        .post_json("/v1/chat/completions", &chat(json!({})))
        .await;
    assert_error_body(
        status,
        &body,
        StatusCode::BAD_REQUEST,
        "chat without a template",
    );
    assert_eq!(error_param(&body), Some("messages"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("default chat template is no longer allowed")
            && message.contains("--chat-template"),
        "{message}"
    );
    // The request's own template is honoured.
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    let (status, body) = app
        .post_json(
            "/v1/chat/completions",
            &chat(json!({"chat_template": template})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = app
        .post_json(
            "/v1/completions",
            &json!({"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The server is still up.
    let (status, _) = app.get("/health").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_flag_supplies_the_missing_template() {
    let model = base_model("no-template-flag.gguf");
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    let app = start(&model, Some(template));
    let (status, body) = app
        .post_json("/v1/chat/completions", &chat(json!({})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
