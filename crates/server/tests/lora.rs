//! LoRA serving in process: adapters from start-up and loaded at runtime are listed in
//! `/v1/models` (vLLM's `root`/`parent`), chosen by `model`, and counted in
//! `vllm:lora_requests_info`; unknown names are 404s, bad adapters 400s that leave the loaded
//! ones alone; the runtime routes exist only when allowed and sit behind the API key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use axum::http::{Method, StatusCode};
use common::{assert_error_body, error_param, json_request, text_of, TestApp, MODEL_NAME};
use serde_json::{json, Value};
use tokenmill_engine::{LoraConfig, LoraModule};
use tokenmill_models::{
    read_model_config, write_random_peft_adapter, LoraTarget, ModelSource, RandomLoraSpec,
};

const KEY: &str = "lora-key";
/// The one answer to a runtime load of a path that holds no servable adapter.
const UNREADABLE: &str = "is not a readable LoRA adapter";

fn write_adapter(dir: &Path, name: &str, rank: usize, seed: u64) -> PathBuf {
    let model = read_model_config(&ModelSource::from_path(common::model_path())).unwrap();
    let path = dir.join(name);
    let spec = RandomLoraSpec {
        rank,
        alpha: 2.0 * rank as f32,
        targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down],
        seed,
        a_scale: 0.25,
        b_scale: 0.25,
    };
    write_random_peft_adapter(&path, &model, &spec).unwrap();
    path
}

fn app(dir: &Path, runtime: bool) -> TestApp {
    let sql = write_adapter(dir, "sql", 8, 1);
    TestApp::with_engine_config(
        |engine| {
            engine.lora = Some(LoraConfig {
                max_loras: 2,
                max_lora_rank: 16,
                max_cpu_loras: None,
                modules: vec![LoraModule {
                    name: "sql".into(),
                    path: sql,
                    base_model_name: None,
                }],
                allowed_roots: Vec::new(),
            });
        },
        |server| {
            server.allow_runtime_lora_updating = runtime;
            server.api_key = Some(KEY.into());
        },
    )
}

async fn post(app: &TestApp, path: &str, body: &Value) -> (StatusCode, String) {
    text_of(
        app.send(json_request(Method::POST, path, body, Some(KEY)))
            .await,
    )
    .await
}

async fn post_json(app: &TestApp, path: &str, body: &Value) -> (StatusCode, Value) {
    let (status, text) = post(app, path, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn completion(app: &TestApp, model: &str) -> (StatusCode, Value) {
    let body = json!({"model": model, "prompt": "The capital of France is", "max_tokens": 8,
                      "temperature": 0});
    post_json(app, "/v1/completions", &body).await
}

async fn models(app: &TestApp) -> Vec<Value> {
    let request = json_request(Method::GET, "/v1/models", &json!({}), Some(KEY));
    let (_, text) = text_of(app.send(request).await).await;
    let list: Value = serde_json::from_str(&text).unwrap();
    list["data"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_adapters_are_listed_chosen_by_model_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path(), false);
    let cards = models(&app).await;
    let sql = cards.iter().find(|c| c["id"] == "sql").expect("sql listed");
    assert_eq!(sql["parent"], MODEL_NAME);
    assert_eq!(
        sql["root"],
        dir.path().join("sql").display().to_string().as_str()
    );
    assert!(cards
        .iter()
        .any(|c| c["id"] == MODEL_NAME && c["parent"].is_null()));

    let (status, base) = completion(&app, MODEL_NAME).await;
    assert_eq!(status, StatusCode::OK, "{base}");
    let (status, adapted) = completion(&app, "sql").await;
    assert_eq!(status, StatusCode::OK, "{adapted}");
    assert_eq!(adapted["model"], "sql");
    assert_ne!(
        adapted["choices"][0]["text"], base["choices"][0]["text"],
        "the adapter changed nothing"
    );
    let chat = json!({"model": "sql", "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 4});
    let (status, body) = post_json(&app, "/v1/chat/completions", &chat).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "sql");

    let (status, body) = completion(&app, "no-such-adapter").await;
    assert_error_body(status, &body, StatusCode::NOT_FOUND, "unknown model");
    assert_eq!(error_param(&body), Some("model"));

    app.wait_idle().await;
    let metrics = {
        let request = json_request(Method::GET, "/metrics", &json!({}), None);
        text_of(app.send(request).await).await.1
    };
    let line = metrics
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .unwrap_or_else(|| panic!("no lora gauge in {metrics}"));
    assert!(line.contains("max_lora=\"2\""), "{line}");
    // Not routed while runtime updating is off.
    let (status, _) = post(&app, "/v1/load_lora_adapter", &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_load_and_unload_at_runtime_and_bad_ones_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path(), true);
    let chat = write_adapter(dir.path(), "chat", 4, 2);
    let load = |name: &str, path: &Path| json!({"lora_name": name, "lora_path": path});

    // Behind the API key.
    let unauthenticated = json_request(
        Method::POST,
        "/v1/load_lora_adapter",
        &load("chat", &chat),
        None,
    );
    assert_eq!(
        app.send(unauthenticated).await.status(),
        StatusCode::UNAUTHORIZED
    );

    let (status, text) = post(&app, "/v1/load_lora_adapter", &load("chat", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text, "Success: LoRA adapter 'chat' added successfully.");
    assert!(models(&app).await.iter().any(|c| c["id"] == "chat"));
    let (status, body) = completion(&app, "chat").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let too_big = write_adapter(dir.path(), "big", 32, 3);
    let corrupt = write_adapter(dir.path(), "corrupt", 2, 4);
    std::fs::write(corrupt.join("adapter_model.safetensors"), b"garbage").unwrap();
    let cases = [
        (load("chat", &chat), "already been loaded"),
        (load("big", &too_big), "rank 32"),
        (load("gone", &dir.path().join("gone")), UNREADABLE),
        (load("corrupt", &corrupt), UNREADABLE),
        (json!({"lora_name": "x"}), "must be provided"),
    ];
    for (body, expected) in cases {
        let (status, error) = post_json(&app, "/v1/load_lora_adapter", &body).await;
        assert_error_body(status, &error, StatusCode::BAD_REQUEST, expected);
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message}");
    }
    let names: Vec<Value> = models(&app).await.iter().map(|c| c["id"].clone()).collect();
    assert_eq!(
        names,
        vec![
            json!(MODEL_NAME),
            json!("tm-alias"),
            json!("chat"),
            json!("sql")
        ]
    );

    let (status, text) = post(
        &app,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "chat"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text, "Success: LoRA adapter 'chat' removed successfully.");
    let (status, body) = post_json(
        &app,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "chat"}),
    )
    .await;
    assert_error_body(status, &body, StatusCode::NOT_FOUND, "unload twice");
    let (status, body) = completion(&app, "chat").await;
    assert_error_body(status, &body, StatusCode::NOT_FOUND, "unloaded adapter");
    let (status, body) = post_json(
        &app,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "sql", "lora_int_id": 1}),
    )
    .await;
    assert_error_body(status, &body, StatusCode::BAD_REQUEST, "lora_int_id");
    assert_eq!(error_param(&body), Some("lora_int_id"));
    let (status, _) = completion(&app, "sql").await;
    assert_eq!(status, StatusCode::OK);
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_the_runtime_routes_only_when_they_are_served() {
    for runtime in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path(), runtime);
        let request = json_request(Method::GET, "/openapi.json", &json!({}), Some(KEY));
        let (status, text) = text_of(app.send(request).await).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let spec: Value = serde_json::from_str(&text).unwrap();
        for (path, required) in [
            ("/v1/load_lora_adapter", json!(["lora_name", "lora_path"])),
            ("/v1/unload_lora_adapter", json!(["lora_name"])),
        ] {
            let operation = &spec["paths"][path]["post"];
            assert_eq!(operation.is_object(), runtime, "{path}, runtime {runtime}");
            if runtime {
                let schema = &operation["requestBody"]["content"]["application/json"]["schema"];
                assert_eq!(schema["required"], required, "{path}");
                assert!(
                    operation["responses"]["401"].is_object(),
                    "{path}: behind the key"
                );
            }
        }
    }
}

/// A runtime load reads only under the allowed roots (here: the directory of the
/// `--lora-modules` entry) and only regular files; a path outside them, a symlink out of them,
/// a missing path, a FIFO and a file that is no adapter all get the same answer, with no file
/// bytes in it, and the FIFO's answer comes at once (it is never opened).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_loads_read_only_regular_files_under_the_allowed_roots() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let app = app(dir.path(), true);
    let load = |name: &str, path: &Path| json!({"lora_name": name, "lora_path": path});

    let stray = write_adapter(outside.path(), "stray", 4, 5);
    let secret = outside.path().join("secret.gguf");
    std::fs::write(&secret, b"root:x:0:0").unwrap();
    let linked = dir.path().join("linked");
    std::os::unix::fs::symlink(&stray, &linked).unwrap();
    let fifo = dir.path().join("fifo.gguf");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, b"root:x:0:0").unwrap();

    for path in [
        stray.clone(),
        secret,
        linked,
        fifo,
        not_gguf,
        outside.path().join("missing"),
        dir.path().join("missing"),
        PathBuf::from("/etc/passwd"),
    ] {
        let started = std::time::Instant::now();
        let (status, error) = post_json(&app, "/v1/load_lora_adapter", &load("x", &path)).await;
        assert_error_body(status, &error, StatusCode::BAD_REQUEST, "refused path");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(UNREADABLE), "{message}");
        assert!(!message.contains("magic"), "{message}");
        assert!(!message.contains("exist"), "{message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
    assert!(!models(&app).await.iter().any(|c| c["id"] == "x"));

    // Inside the root a real adapter still loads.
    let chat = write_adapter(dir.path(), "chat", 4, 2);
    let (status, text) = post(&app, "/v1/load_lora_adapter", &load("chat", &chat)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    app.wait_idle().await;
}
