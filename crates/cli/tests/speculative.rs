//! `--speculative-config` on `generate` and `serve`: greedy output identical with and without
//! it, unsupported methods refused by name, and a live server logging vLLM's `SpecDecoding
//! metrics` line and serving the `vllm:spec_decode_*` counters.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{model_path, Server};

const PROMPT: &str = "def area(width, height):\n    return width * height\n\n\
    def area(width, height):\n    return width * height\n\n\
    def area(width, height):\n";

/// `generate --input` of one greedy prompt with `extra` flags: its output token ids, or the
/// process's stderr when it fails.
fn generate(extra: &[&str]) -> Result<Vec<u64>, String> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("prompts.jsonl");
    let output = dir.path().join("out.jsonl");
    let line = serde_json::json!({"prompt": PROMPT, "max_tokens": 32, "temperature": 0.0, "ignore_eos": true});
    std::fs::write(&input, format!("{line}\n")).unwrap();
    let result = Command::new(common::binary())
        .args(["generate", "--model"])
        .arg(model_path())
        .args(["--kv-cache-memory", "64MiB"])
        .args(extra)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    if !result.status.success() {
        return Err(String::from_utf8_lossy(&result.stderr).into_owned());
    }
    let text = std::fs::read_to_string(&output).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    Ok(line["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap())
        .collect())
}

#[test]
fn generate_gives_the_same_greedy_tokens_and_refuses_unknown_methods() {
    let plain = generate(&[]).unwrap();
    assert_eq!(plain.len(), 32);
    for config in [
        r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2}"#,
        r#"{"method": "suffix", "num_speculative_tokens": 8}"#,
    ] {
        assert_eq!(
            generate(&["--speculative-config", config]).unwrap(),
            plain,
            "{config}"
        );
    }
    let refused = generate(&[
        "--speculative-config",
        r#"{"method": "eagle", "model": "eagle-head", "num_speculative_tokens": 3}"#,
    ])
    .unwrap_err();
    assert!(
        refused.contains("`eagle`") && refused.contains("ngram, suffix, draft_model"),
        "{refused}"
    );
}

/// POST a JSON body, return the response body (HTTP/1.1, `Connection: close`).
fn post(base_url: &str, path: &str, body: &serde_json::Value) -> String {
    let host = base_url.trim_start_matches("http://");
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_speculates_and_reports_it_as_vllm_does() {
    let server = Server::start(&[
        "--kv-cache-memory",
        "64MiB",
        "--max-model-len",
        "1024",
        "--log-stats-interval",
        "1",
        "--speculative-config",
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2}"#,
    ]);
    let request = serde_json::json!({
        "model": "tm-test", "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": true
    });
    let response = post(&server.base_url, "/v1/completions", &request);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(server.metric("vllm:spec_decode_num_drafts_total") > 0.0);
    let accepted = server.metric("vllm:spec_decode_num_accepted_tokens_total");
    assert!(accepted > 0.0);
    assert_eq!(
        server.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total"),
        accepted,
        "per-position counts sum to the accepted tokens"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = server.log_lines();
        if let Some(line) = lines
            .iter()
            .find(|l| l.contains("SpecDecoding metrics: Mean acceptance length: "))
        {
            for part in [
                "Accepted throughput: ",
                "Drafted throughput: ",
                "Per-position acceptance rate: ",
                "Avg Draft acceptance rate: ",
            ] {
                assert!(line.contains(part), "{line}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no SpecDecoding line in:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
