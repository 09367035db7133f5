//! `--kv-cache-dtype`: vLLM's values are accepted, unsupported ones refused with a clear
//! message, and a narrower type multiplies the tokens a `--kv-cache-memory` budget holds;
//! `auto` stores f16 for a GGUF file.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::process::{Command, Output};

use common::model_path;

/// `tokenmill generate` on a one-token prompt with `--kv-cache-dtype dtype`.
fn generate(dtype: &str) -> Output {
    Command::new(common::binary())
        .args(["generate", "--model"])
        .arg(model_path())
        .args([
            "--kv-cache-memory",
            "64MiB",
            "--kv-cache-dtype",
            dtype,
            "--prompt",
            "Hello",
            "--max-tokens",
            "3",
            "--ignore-eos",
        ])
        .env("RUST_LOG", "info")
        .output()
        .unwrap()
}

/// The number in the `KV cache size: N tokens` start-up line.
fn kv_cache_tokens(stderr: &str) -> usize {
    let line = stderr
        .lines()
        .find_map(|l| Some(&l[l.find("KV cache size: ")? + "KV cache size: ".len()..]))
        .unwrap_or_else(|| panic!("no capacity line in:\n{stderr}"));
    line.trim_end_matches(" tokens")
        .replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("bad capacity line {line}"))
}

#[test]
fn narrower_kv_types_hold_more_tokens_in_the_same_budget() {
    let mut tokens = Vec::new();
    for (dtype, stored) in [
        ("float32", "f32"),
        // auto is the model dtype: f16 for a GGUF file, as llama.cpp stores it.
        ("auto", "f16"),
        ("float16", "f16"),
        ("bfloat16", "bf16"),
        ("fp8", "fp8_e4m3"),
        ("fp8_e5m2", "fp8_e5m2"),
    ] {
        let output = generate(dtype);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{dtype}:\n{stderr}");
        assert!(!output.stdout.is_empty(), "{dtype} generated nothing");
        assert!(
            stderr.contains(&format!("KV cache dtype: {dtype} (stored as {stored}")),
            "{dtype}:\n{stderr}"
        );
        tokens.push(kv_cache_tokens(&stderr));
    }
    // 64 MiB over 2 * 30 layers * 3 kv heads * 64 dims * 16 tokens per block.
    assert_eq!(tokens[0], 91 * 16);
    assert_eq!(tokens[1], 2 * tokens[0]);
    assert_eq!(tokens[2], 2 * tokens[0]);
    assert_eq!(tokens[3], 2 * tokens[0]);
    assert_eq!(tokens[4], 364 * 16);
    assert_eq!(tokens[5], tokens[4]);
}

#[test]
fn unsupported_and_unknown_kv_types_are_refused() {
    for (dtype, message) in [
        (
            "fp8_inc",
            "kv cache dtype 'fp8_inc' is not supported by this backend",
        ),
        (
            "fp8_ds_mla",
            "kv cache dtype 'fp8_ds_mla' is not supported by this backend",
        ),
        ("int4", "unknown kv cache dtype 'int4'"),
    ] {
        let output = generate(dtype);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{dtype} accepted");
        assert!(stderr.contains(message), "{dtype}:\n{stderr}");
        assert!(stderr.contains("--kv-cache-dtype"), "{dtype}:\n{stderr}");
    }
}

#[test]
fn serve_lists_the_flag_under_cache() {
    let output = Command::new(common::binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    let cache = help.find("Cache:").expect("a Cache heading");
    let flag = help
        .find("--kv-cache-dtype")
        .expect("the flag in serve --help");
    assert!(flag > cache, "{help}");
    assert!(help.contains("[default: auto]"), "{help}");
}
