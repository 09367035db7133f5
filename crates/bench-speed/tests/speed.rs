//! `tokenmill bench speed` end to end on a random-weight tiny model written by the test: every
//! figure is measured and the JSON carries every field with positive numbers. No timing
//! thresholds: the figures depend on the machine.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;

use clap::Parser;
use serde_json::Value;
use tokenmill_bench_speed::{run_speed, BenchSpeedArgs};
use tokenmill_gguf::{GgufWriter, MetadataValue};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchSpeedArgs,
}

const VOCAB: usize = 96;
const HIDDEN: usize = 32;
const INTERMEDIATE: usize = 64;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;

/// A Llama-shaped GGUF with random f32 weights and an untied output head.
fn write_tiny_gguf(path: &Path) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut values = |len: usize, scale: f32| -> Vec<f32> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    let (h, i) = (HIDDEN as u64, INTERMEDIATE as u64);
    let (q, kv) = ((HEADS * HEAD_DIM) as u64, (KV_HEADS * HEAD_DIM) as u64);
    let u32v = |v: usize| MetadataValue::U32(v as u32);
    let mut writer = GgufWriter::new();
    writer
        .add_metadata(
            "general.architecture",
            MetadataValue::String("llama".into()),
        )
        .add_metadata("llama.block_count", u32v(LAYERS))
        .add_metadata("llama.context_length", u32v(256))
        .add_metadata("llama.embedding_length", u32v(HIDDEN))
        .add_metadata("llama.feed_forward_length", u32v(INTERMEDIATE))
        .add_metadata("llama.attention.head_count", u32v(HEADS))
        .add_metadata("llama.attention.head_count_kv", u32v(KV_HEADS))
        .add_metadata("llama.rope.freq_base", MetadataValue::F32(10_000.0))
        .add_metadata(
            "llama.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-5),
        )
        .add_metadata("llama.vocab_size", u32v(VOCAB));
    let ones = vec![1.0f32; HIDDEN];
    writer.add_f32_tensor(
        "token_embd.weight",
        &[h, VOCAB as u64],
        &values(VOCAB * HIDDEN, 1.0),
    );
    writer.add_f32_tensor("output_norm.weight", &[h], &ones);
    writer.add_f32_tensor(
        "output.weight",
        &[h, VOCAB as u64],
        &values(VOCAB * HIDDEN, 0.5),
    );
    for layer in 0..LAYERS {
        let name = |short: &str| format!("blk.{layer}.{short}");
        writer
            .add_f32_tensor(&name("attn_norm.weight"), &[h], &ones)
            .add_f32_tensor(
                &name("attn_q.weight"),
                &[h, q],
                &values((h * q) as usize, 0.4),
            )
            .add_f32_tensor(
                &name("attn_k.weight"),
                &[h, kv],
                &values((h * kv) as usize, 0.4),
            )
            .add_f32_tensor(
                &name("attn_v.weight"),
                &[h, kv],
                &values((h * kv) as usize, 0.4),
            )
            .add_f32_tensor(
                &name("attn_output.weight"),
                &[q, h],
                &values((q * h) as usize, 0.3),
            )
            .add_f32_tensor(&name("ffn_norm.weight"), &[h], &ones)
            .add_f32_tensor(
                &name("ffn_gate.weight"),
                &[h, i],
                &values((h * i) as usize, 0.3),
            )
            .add_f32_tensor(
                &name("ffn_up.weight"),
                &[h, i],
                &values((h * i) as usize, 0.3),
            )
            .add_f32_tensor(
                &name("ffn_down.weight"),
                &[i, h],
                &values((i * h) as usize, 0.3),
            );
    }
    writer.write_to(path).expect("tiny GGUF written");
}

fn args(extra: &[&str]) -> BenchSpeedArgs {
    let mut argv = vec!["speed"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).expect("arguments parse").args
}

fn positive(value: &Value, path: &str) -> f64 {
    let number = value
        .pointer(path)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing or not a number in {value:#}"));
    assert!(number.is_finite() && number > 0.0, "{path} = {number}");
    number
}

#[test]
fn every_figure_is_measured_and_written_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_gguf(&model);
    let json = dir.path().join("speed.json");
    let report = run_speed(&args(&[
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "2",
        "--prompt-len",
        "24",
        "--decode-len",
        "6",
        "--batch",
        "3",
        "--batch-prompt-len",
        "5",
        "--batch-decode-steps",
        "4",
        "--repeats",
        "2",
        "--probe-mib",
        "4",
        "--probe-seconds",
        "0.02",
        "--json",
        json.to_str().unwrap(),
    ]))
    .expect("bench speed runs");
    assert_eq!(report.phases.len(), 4);

    let value: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(value["engine"], "tokenmill");
    assert_eq!(value["threads"], 2);
    for path in [
        "/machine/peak_gflops",
        "/machine/peak_read_gbs",
        "/model_info/layer_params",
        "/model_info/lm_head_params",
        "/model_info/weight_bytes",
        "/model_info/decode_weight_bytes",
    ] {
        positive(&value, path);
    }
    // The untied embedding table is not read in full by a decode step.
    assert!(
        value["model_info"]["decode_weight_bytes"].as_u64()
            < value["model_info"]["weight_bytes"].as_u64()
    );
    let phases = value["phases"].as_object().expect("phases is an object");
    let keys: Vec<&str> = phases.keys().map(String::as_str).collect();
    assert_eq!(keys, ["prefill", "decode", "decode_long", "batched"]);
    let expected = [
        ("prefill", 1, 1, 24, 0, 24, "prefill tok/s (24)"),
        ("decode", 1, 6, 6, 0, 6, "decode tok/s (ctx 0→6)"),
        ("decode_long", 1, 6, 6, 24, 30, "decode tok/s (ctx 24→30)"),
        (
            "batched",
            3,
            4,
            12,
            5,
            9,
            "batched decode tok/s (3 seqs, ctx 5→9)",
        ),
    ];
    for (key, sequences, steps, tokens, start, end, label) in expected {
        let phase = &phases[key];
        assert_eq!(phase["label"], label);
        assert_eq!(phase["sequences"], sequences, "{key}");
        assert_eq!(phase["steps"], steps, "{key}");
        assert_eq!(phase["tokens"], tokens, "{key}");
        assert_eq!(phase["context_start"], start, "{key}");
        assert_eq!(phase["context_end"], end, "{key}");
        assert_eq!(phase["runs_s"].as_array().map(Vec::len), Some(2), "{key}");
        for field in [
            "seconds",
            "tok_s",
            "ms_per_step",
            "matmul_gflop",
            "attention_gflop",
            "gflops",
            "pct_peak_gflops",
            "weight_gbs",
            "pct_peak_read_gbs",
        ] {
            positive(phase, &format!("/{field}"));
        }
        let tok_s = positive(phase, "/tok_s");
        let seconds = positive(phase, "/seconds");
        assert!((tok_s * seconds - tokens as f64).abs() < 1e-6 * tokens as f64);
    }
}

#[test]
fn only_selects_figures_and_bad_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_gguf(&model);
    let common = [
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "1",
        "--prompt-len",
        "8",
        "--decode-len",
        "3",
        "--batch",
        "2",
        "--batch-prompt-len",
        "3",
        "--batch-decode-steps",
        "2",
        "--repeats",
        "1",
        "--probe-mib",
        "1",
        "--probe-seconds",
        "0.01",
    ];
    let with = |extra: &[&str]| {
        let mut all = common.to_vec();
        all.extend_from_slice(extra);
        args(&all)
    };
    let report = run_speed(&with(&["--only", "decode"])).expect("decode only");
    let keys: Vec<String> = report.phases.iter().map(|p| p.phase.key()).collect();
    assert_eq!(keys, ["decode", "decode_long"]);
    let report = run_speed(&with(&["--only", "prefill,batched"])).expect("two figures");
    let keys: Vec<String> = report.phases.iter().map(|p| p.phase.key()).collect();
    assert_eq!(keys, ["prefill", "batched"]);
    let report = run_speed(&with(&["--only", "batched", "--only", "prefill"])).expect("repeated");
    assert_eq!(report.phases.len(), 2);

    let zeroed: [fn(&mut BenchSpeedArgs); 3] = [
        |a| a.repeats = 0,
        |a| a.decode_len = 0,
        |a| a.threads = Some(0),
    ];
    for zero in zeroed {
        let mut bad = with(&[]);
        zero(&mut bad);
        let error = run_speed(&bad).expect_err("refused");
        assert!(error.to_string().contains("must be at least 1"), "{error}");
    }
    let missing = run_speed(&args(&["--model", "/nonexistent/model.gguf"]));
    assert!(missing.is_err());
}

#[test]
fn verify_figures_time_each_row_count_against_one_row_at_a_fixed_context() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    write_tiny_gguf(&model);
    let json = dir.path().join("verify.json");
    let report = run_speed(&args(&[
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "2",
        "--prompt-len",
        "20",
        "--decode-len",
        "3",
        "--repeats",
        "2",
        "--probe-mib",
        "1",
        "--probe-seconds",
        "0.01",
        "--only",
        "verify",
        "--verify-rows",
        "5,2,5",
        "--json",
        json.to_str().unwrap(),
    ]))
    .expect("verify figures run");
    // The one-row base is added, duplicates dropped, the counts ascending.
    let keys: Vec<String> = report.phases.iter().map(|p| p.phase.key()).collect();
    assert_eq!(keys, ["verify_1", "verify_2", "verify_5"]);
    let value: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        value["settings"]["verify_rows"],
        serde_json::json!([1, 2, 5])
    );
    for rows in [1u64, 2, 5] {
        let phase = &value["phases"][format!("verify_{rows}")];
        assert_eq!(
            phase["label"],
            format!("verify {rows} rows/step tok/s (ctx 20)")
        );
        assert_eq!(phase["sequences"], 1);
        assert_eq!(phase["steps"], 3);
        assert_eq!(phase["tokens"], 3 * rows);
        // Every step rewrites positions 20..20 + rows: the context does not grow.
        assert_eq!(phase["context_start"], 20);
        assert_eq!(phase["context_end"], 20 + rows);
        assert_eq!(phase["runs_s"].as_array().map(Vec::len), Some(2));
        let ms = positive(phase, "/ms_per_step");
        let base = positive(&value, "/phases/verify_1/ms_per_step");
        let ratio = positive(phase, "/vs_one_row");
        assert!((ratio - ms / base).abs() < 1e-9 * ratio, "{phase:#}");
        positive(phase, "/attention_gflop");
    }
    assert_eq!(value["phases"]["verify_1"]["vs_one_row"], 1.0);
    // Not measured unless asked for by name.
    let plain = run_speed(&args(&[
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "1",
        "--prompt-len",
        "8",
        "--decode-len",
        "2",
        "--batch",
        "2",
        "--batch-prompt-len",
        "3",
        "--batch-decode-steps",
        "2",
        "--repeats",
        "1",
        "--probe-mib",
        "1",
        "--probe-seconds",
        "0.01",
    ]))
    .expect("default figures run");
    assert!(plain
        .phases
        .iter()
        .all(|p| !matches!(p.phase, tokenmill_bench_speed::Phase::Verify(_))));
    let zero = args(&[
        "--model",
        model.to_str().unwrap(),
        "--only",
        "verify",
        "--verify-rows",
        "0,2",
    ]);
    let error = run_speed(&zero).expect_err("zero rows refused");
    assert!(
        error
            .to_string()
            .contains("--verify-rows must be at least 1"),
        "{error}"
    );
}
