//! `tokenmill bench speed` as a user runs it: the binary on the default model with tiny
//! lengths prints the table and writes the JSON. No timing thresholds.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use common::{model_path, run_cli};

#[test]
fn bench_speed_prints_every_figure_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("speed.json");
    let model = model_path();
    let (ok, stdout, stderr) = run_cli(&[
        "bench",
        "speed",
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "2",
        "--prompt-len",
        "16",
        "--decode-len",
        "4",
        "--batch",
        "2",
        "--batch-prompt-len",
        "4",
        "--batch-decode-steps",
        "2",
        "--repeats",
        "1",
        "--probe-mib",
        "8",
        "--probe-seconds",
        "0.05",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "bench speed failed:\n{stdout}\n{stderr}");
    for label in [
        "| prefill tok/s (16) |",
        "| decode tok/s (ctx 0→4) |",
        "| decode tok/s (ctx 16→20) |",
        "| batched decode tok/s (2 seqs, ctx 4→6) |",
        "peak f32 FMA",
    ] {
        assert!(stdout.contains(label), "no {label:?} in:\n{stdout}");
    }
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in ["prefill", "decode", "decode_long", "batched"] {
        let tok_s = value["phases"][key]["tok_s"].as_f64().unwrap_or(0.0);
        assert!(tok_s > 0.0, "{key}: {value:#}");
    }
    // SmolLM2-135M's matmul parameters: 30 layers of 3.54 M plus the 28.3 M lm_head.
    assert_eq!(value["model_info"]["layer_params"], 106_168_320);
    assert_eq!(value["model_info"]["lm_head_params"], 28_311_552);
}
