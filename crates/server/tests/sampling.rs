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
