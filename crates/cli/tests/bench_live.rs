//! `tokenmill bench serve` against a live tokenmill server.

mod common;

use common::{block_value, run_cli, Server};

#[test]
fn the_result_block_agrees_with_the_servers_metrics_and_the_saved_records() {
    let server = Server::start(&["--kv-cache-memory", "256MiB"]);
    let before = server.get("/metrics");
    let dir = tempfile::tempdir().unwrap();
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
        "32",
        "--random-output-len",
        "8",
        "--num-prompts",
        "20",
        "--max-concurrency",
        "4",
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        dir.path().to_str().unwrap(),
        "--result-filename",
        "run.json",
        "--disable-tqdm",
    ]);
    assert!(ok, "bench failed:\n{stdout}\n{stderr}");
    let after = server.get("/metrics");
    let delta =
        |name: &str| common::metric_value(&after, name) - common::metric_value(&before, name);

    assert_eq!(block_value(&stdout, "Successful requests:"), 20.0);
    assert_eq!(block_value(&stdout, "Failed requests:"), 0.0);
    assert_eq!(delta("vllm:request_success_total"), 20.0);
    assert_eq!(
        block_value(&stdout, "Total input tokens:"),
        delta("vllm:prompt_tokens_total")
    );
    assert_eq!(
        block_value(&stdout, "Total generated tokens:"),
        delta("vllm:generation_tokens_total")
    );
    assert_eq!(block_value(&stdout, "Total generated tokens:"), 160.0);

    // Percentiles in the summary agree with a reference computation on the saved records.
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
            .unwrap();
    let mut ttfts: Vec<f64> = saved["ttfts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() * 1e3)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let median = (ttfts[9] + ttfts[10]) / 2.0;
    let reported = saved["median_ttft_ms"].as_f64().unwrap();
    assert!(
        (median - reported).abs() < 1e-6 * median.max(1.0),
        "median {median} vs {reported}"
    );
    assert!((block_value(&stdout, "Median TTFT (ms):") - reported).abs() < 0.01);
}

#[test]
fn requests_fail_when_the_server_dies_mid_run() {
    let mut server = Server::start(&["--kv-cache-memory", "256MiB"]);
    let url = server.base_url.clone();
    let bench = std::thread::spawn(move || {
        run_cli(&[
            "bench",
            "serve",
            "--base-url",
            &url,
            "--model",
            "tm-test",
            "--dataset-name",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            "200",
            "--num-prompts",
            "12",
            "--max-concurrency",
            "4",
            "--disable-tqdm",
        ])
    });
    std::thread::sleep(std::time::Duration::from_secs(4));
    server.kill();
    let (_, stdout, stderr) = bench.join().unwrap();
    assert!(
        block_value(&stdout, "Failed requests:") > 0.0,
        "{stdout}\n{stderr}"
    );
}

#[test]
fn the_json_datasets_constrain_every_request_and_every_output_validates() {
    let server = Server::start(&["--kv-cache-memory", "256MiB"]);
    for (endpoint, dataset) in [
        ("/v1/completions", "json"),
        ("/v1/chat/completions", "json-unique"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (ok, stdout, stderr) = run_cli(&[
            "bench",
            "serve",
            "--base-url",
            &server.base_url,
            "--endpoint",
            endpoint,
            "--model",
            "tm-test",
            "--dataset-name",
            dataset,
            "--num-prompts",
            "8",
            "--max-concurrency",
            "4",
            "--temperature",
            "0",
            "--save-result",
            "--result-dir",
            dir.path().to_str().unwrap(),
            "--result-filename",
            "run.json",
            "--disable-tqdm",
        ]);
        assert!(ok, "bench failed:\n{stdout}\n{stderr}");
        assert_eq!(block_value(&stdout, "Failed requests:"), 0.0, "{stdout}");
        assert_eq!(
            block_value(&stdout, "Constrained requests:"),
            8.0,
            "{stdout}"
        );
        assert_eq!(
            block_value(&stdout, "Outputs valid against schema:"),
            8.0,
            "{stdout}"
        );
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap())
                .unwrap();
        assert_eq!(saved["correct_rate(%)"], 100.0);
        // Every output is a JSON object (the server constrained it; the bench validated it).
        for text in saved["generated_texts"].as_array().unwrap() {
            let value: serde_json::Value =
                serde_json::from_str(text.as_str().unwrap().trim()).unwrap();
            assert!(value.is_object(), "{value}");
        }
    }
}
