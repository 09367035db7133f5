//! Sampling parameters that act on the logits, through the HTTP API over the real default
//! model: `bad_words` (one- and multi-token) and `allowed_token_ids`.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use axum::http::StatusCode;
use common::{TestApp, MODEL_NAME};
use serde_json::{json, Value};

/// A greedy completion of `prompt` with `extra` fields: its text and token ids.
async fn complete(app: &TestApp, prompt: &str, extra: Value) -> (String, Vec<u32>) {
    let mut body = json!({
        "model": MODEL_NAME, "prompt": prompt, "max_tokens": 16, "temperature": 0,
        "ignore_eos": true, "return_token_ids": true,
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let (status, response) = app.post_json("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let choice = &response["choices"][0];
    let ids = choice["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect();
    (choice["text"].as_str().unwrap().to_string(), ids)
}

fn tokenizer(app: &TestApp) -> &tokenmill_text::Tokenizer {
    &app.engine.as_ref().unwrap().model().tokenizer
}

fn contains(haystack: &[u32], needle: &[u32]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_ban_one_and_multi_token_words() {
    let app = TestApp::start();

    // One token: " Paris" is the greedy continuation; banning "Paris" bans it (and "Paris").
    let prompt = "The capital of France is";
    let (text, ids) = complete(&app, prompt, json!({})).await;
    let paris = tokenizer(&app).encode(" Paris", false).unwrap();
    assert_eq!(paris.len(), 1);
    assert!(text.starts_with(" Paris") && ids[0] == paris[0], "{text:?}");
    let (banned_text, banned_ids) = complete(&app, prompt, json!({"bad_words": ["Paris"]})).await;
    assert!(!banned_ids.contains(&paris[0]), "{banned_text:?}");
    assert!(!banned_text.contains("Paris"), "{banned_text:?}");

    // Two tokens: " small" " town"; "small town" bans " town" only right after " small".
    let prompt = "Once upon a time, there was a";
    let (text, ids) = complete(&app, prompt, json!({})).await;
    let small_town = tokenizer(&app).encode(" small town", false).unwrap();
    assert_eq!(small_town.len(), 2);
    assert!(
        tokenizer(&app)
            .bad_words_token_ids(&["small town".to_string()])
            .unwrap()
            .contains(&small_town),
        "the spaced variant is one of the banned sequences"
    );
    assert_eq!(&ids[..2], &small_town[..], "{text:?}");
    let (banned_text, banned_ids) =
        complete(&app, prompt, json!({"bad_words": ["small town"]})).await;
    // " small" alone is still allowed: only the word's last token after its prefix is banned.
    assert_eq!(banned_ids[0], small_town[0], "{banned_text:?}");
    assert!(!contains(&banned_ids, &small_town), "{banned_text:?}");
    assert!(!banned_text.contains("small town"), "{banned_text:?}");
    app.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_token_ids_restrict_every_output_token() {
    let app = TestApp::start();
    let prompt = "My favourite colour is";
    let allowed: Vec<u32> = [" Paris", ".", " green"]
        .iter()
        .flat_map(|word| tokenizer(&app).encode(word, false).unwrap())
        .collect();
    let (text, ids) = complete(&app, prompt, json!({})).await;
    assert!(!allowed.contains(&ids[0]), "{text:?}");
    let (text, ids) = complete(&app, prompt, json!({"allowed_token_ids": allowed})).await;
    assert_eq!(ids.len(), 16, "{text:?}");
    assert!(
        ids.iter().all(|id| allowed.contains(id)),
        "{text:?}: {ids:?}"
    );
    app.wait_idle().await;
}

/// `thinking_token_budget` (vLLM's name; Anthropic's `thinking.budget_tokens` maps to it): with
/// the `deepseek_r1` reasoning parser the output is reasoning until `</think>`, which the model
/// never writes by itself here; the budget forces the marker after exactly that many tokens
/// and the rest is the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_forces_the_reasoning_end_marker() {
    let app = TestApp::with_config(|config| config.reasoning_parser = Some("deepseek_r1".into()));
    let end = tokenizer(&app).encode("</think>", false).unwrap();
    let prompt = "The capital of France is";

    // Negative control: without a budget the marker does not appear.
    let (_, free) = complete(&app, prompt, json!({"max_tokens": 24})).await;
    assert!(!contains(&free, &end), "{free:?}");

    for budget in [0usize, 5] {
        let (_, ids) = complete(
            &app,
            prompt,
            json!({"max_tokens": 24, "thinking_token_budget": budget}),
        )
        .await;
        assert_eq!(ids[..budget], free[..budget], "budget {budget}");
        assert_eq!(
            ids[budget..budget + end.len()],
            end[..],
            "budget {budget}: {ids:?}"
        );
        assert!(!contains(&ids[budget + end.len()..], &end), "{ids:?}");
    }

    // Chat: the reasoning parser splits at the forced marker.
    let (status, response) = app
        .post_json(
            "/v1/chat/completions",
            &json!({"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, "ignore_eos": true,
                    "thinking_token_budget": 3,
                    "messages": [{"role": "user", "content": "Name a colour."}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let message = &response["choices"][0]["message"];
    let reasoning = message["reasoning"].as_str().unwrap();
    let reasoning_tokens = tokenizer(&app).encode(reasoning, false).unwrap();
    assert!(
        (1..=3).contains(&reasoning_tokens.len()),
        "{reasoning:?} {response}"
    );
    assert!(
        !message["content"].as_str().unwrap_or("").is_empty(),
        "{response}"
    );
    assert_eq!(app.wait_idle().await.kv_cache_usage, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_without_a_reasoning_parser_is_refused() {
    // Anthropic's smallest budget is 1024 tokens, below max_tokens: a longer context.
    let app = TestApp::with_engine_config(
        |engine| {
            engine.max_model_len = Some(1536);
            engine.kv_cache = tokenmill_engine::KvCacheSizing::Bytes(128 << 20);
        },
        |_| {},
    );
    for (path, body) in [
        (
            "/v1/completions",
            json!({"model": MODEL_NAME, "prompt": "Hi", "thinking_token_budget": 8}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL_NAME, "thinking_token_budget": 8,
                   "messages": [{"role": "user", "content": "Hi"}]}),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL_NAME, "prompt": "Hi", "thinking_token_budget": -1}),
        ),
    ] {
        let (status, response) = app.post_json(path, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {response}");
        assert_eq!(
            common::error_param(&response),
            Some("thinking_token_budget"),
            "{response}"
        );
    }
    let (status, response) = app
        .post_json(
            "/v1/messages",
            &json!({"model": MODEL_NAME, "max_tokens": 1100,
                    "thinking": {"type": "enabled", "budget_tokens": 1024},
                    "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{response}");
    assert_eq!(response["type"], "error", "{response}");
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("thinking.budget_tokens"),
        "{response}"
    );
}
