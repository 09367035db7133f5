//! The server's start-up and periodic log lines have vLLM's shapes, read from a live server's
//! captured log.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers

mod common;

use std::time::{Duration, Instant};

use common::{run_cli, Server};

/// Strips the tracing prefix (time, level, target) and ANSI colours, leaving the message.
fn message(line: &str) -> String {
    let mut plain = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    match plain.find(": ") {
        Some(at) => plain[at + 2..].to_string(),
        None => plain,
    }
}

#[test]
fn startup_capacity_and_periodic_stats_lines_match_vllm() {
    let server = Server::start(&[
        "--kv-cache-memory",
        "64MiB",
        "--max-model-len",
        "1024",
        "--log-stats-interval",
        "1",
    ]);
    let (ok, stdout, stderr) = run_cli(&[
        "bench",
        "serve",
        "--base-url",
        &server.base_url,
        "--model",
        "tm-test",
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "24",
        "--num-prompts",
        "6",
        "--max-concurrency",
        "3",
        "--disable-tqdm",
    ]);
    assert!(ok, "{stdout}\n{stderr}");

    let deadline = Instant::now() + Duration::from_secs(10);
    let stats_line = loop {
        let lines: Vec<String> = server.log_lines().iter().map(|l| message(l)).collect();
        let found = lines
            .iter()
            .rev()
            .find(|l| {
                l.starts_with("Engine 000: Avg prompt throughput:")
                    && !l.contains("Avg generation throughput: 0.0 tokens/s")
            })
            .cloned();
        if let Some(line) = found {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no busy stats line in:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(stats_line.starts_with("Engine 000: "), "{stats_line}");
    let shape = regex_like(&stats_line);
    assert_eq!(
        shape,
        "Engine N: Avg prompt throughput: N tokens/s, Avg generation throughput: N tokens/s, \
         Running: N reqs, Waiting: N reqs, KV cache usage: N%, Prefix cache hit rate: N%",
        "{stats_line}"
    );

    let lines: Vec<String> = server.log_lines().iter().map(|l| message(l)).collect();
    let find = |prefix: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' line in:\n{}", lines.join("\n")))
            .clone()
    };
    assert_eq!(
        regex_like(&find("Available KV cache memory:")),
        "Available KV cache memory: N GiB"
    );
    assert_eq!(
        regex_like(&find("KV cache size:")),
        "KV cache size: N tokens"
    );
    assert_eq!(
        find("Maximum concurrency for"),
        format!("Maximum concurrency for 1,024 tokens per request: {}x", {
            let tokens: f64 = regex_number(&find("KV cache size:"));
            format!("{:.2}", tokens / 1024.0)
        })
    );
}

/// Replaces every number (digits, with `.` or `,` between digits) by `N`.
fn regex_like(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            while i < chars.len()
                && (chars[i].is_ascii_digit()
                    || ((chars[i] == '.' || chars[i] == ',')
                        && chars.get(i + 1).is_some_and(char::is_ascii_digit)))
            {
                i += 1;
            }
            out.push('N');
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn regex_number(line: &str) -> f64 {
    let digits: String = line.chars().filter(char::is_ascii_digit).collect();
    digits.parse().unwrap()
}
