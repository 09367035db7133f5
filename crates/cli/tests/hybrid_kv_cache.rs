//! `--disable-hybrid-kv-cache-manager` (vLLM's flag) on Gemma 3 270M: by default its 15
//! sliding-window layers (window 512) and 3 global ones get KV cache groups whose sliding
//! groups hold a window's blocks only, so the same `--kv-cache-memory` fits clearly more
//! max-length requests at once; with the flag every layer keeps every block. Skipped without
//! the Gemma file (`scripts/fetch-gemma3.sh`, or `$TOKENMILL_GEMMA3_MODEL`).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

/// `tokenmill generate` of a few tokens; returns (stdout, stderr).
fn generate(model: &Path, extra: &[&str]) -> (String, String) {
    let output = Command::new(common::binary())
        .args(["generate", "--model"])
        .arg(model)
        .args([
            "--kv-cache-memory",
            "64MiB",
            "--max-model-len",
            "2048",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--temperature",
            "0",
        ])
        .args(extra)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{extra:?}:\n{stderr}");
    (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
}

/// The factor of the `Maximum concurrency for N tokens per request: X.XXx` line.
fn max_concurrency(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("Maximum concurrency for 2,048 tokens per request: "))
        .unwrap_or_else(|| panic!("no concurrency line in:\n{stderr}"));
    let factor = &line[line.rfind(": ").unwrap() + 2..];
    factor.trim().trim_end_matches('x').parse().unwrap()
}

#[test]
fn the_flag_keeps_every_block_and_the_default_fits_more_long_requests() {
    let test = "the_flag_keeps_every_block_and_the_default_fits_more_long_requests";
    let Some(model) = tokenmill_test_assets::GEMMA3_270M.or_skip(test) else {
        return;
    };
    let (hybrid_out, hybrid) = generate(&model, &[]);
    let (disabled_out, disabled) = generate(&model, &["--disable-hybrid-kv-cache-manager"]);
    assert!(
        hybrid.contains("hybrid KV cache manager: 6 KV cache groups"),
        "{hybrid}"
    );
    assert!(
        disabled.contains("the hybrid KV cache manager is disabled"),
        "{disabled}"
    );
    // 64 MiB of f16 blocks: 18 layers * 2 * 16 tokens * 256 dims * 2 bytes = 288 KiB a block
    // without groups (227 blocks, 1.77 requests of 2,048 tokens: 128 blocks each); with them
    // a block is 3 layers (1,365 blocks) and a request holds 128 full-group blocks plus
    // 5 * 65 sliding ones (window 512, 512-token steps): 3.01 requests.
    let (with_groups, without) = (max_concurrency(&hybrid), max_concurrency(&disabled));
    assert_eq!(without, 1.77);
    assert_eq!(with_groups, 3.01);
    // The same greedy text either way.
    assert_eq!(hybrid_out, disabled_out);
}
