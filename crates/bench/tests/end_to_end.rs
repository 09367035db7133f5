//! The benchmark client end to end against the protocol fixture in `fixture/` (a stand-in
//! that speaks the OpenAI streaming format, not a model server; live tokenmill-server runs
//! are separate tests).

// Test helpers outside #[test] functions may panic: a broken fixture must fail the test.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod fixture;

use std::collections::{HashMap, HashSet};

use clap::Parser;
use serde_json::Value;
use tokenmill_bench::{
    prefix_repetition, random_dataset, run, BenchServeArgs, PrefixRepetitionConfig,
    PromptTokenizer, RandomConfig, ServerAccess,
};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchServeArgs,
}

fn args(base_url: &str, extra: &[&str]) -> BenchServeArgs {
    let mut argv = vec!["bench", "--base-url", base_url, "--disable-tqdm"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).expect("arguments parse").args
}

fn recorded_bodies(fixture: &fixture::Fixture) -> Vec<Value> {
    fixture.recorded.lock().expect("lock").bodies.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_run_counts_tokens_and_sends_distinct_prompts() {
    let fixture = fixture::start(fixture::Faults::default()).await;
    let report = run(args(
        &fixture.base_url,
        &[
            "--num-prompts",
            "24",
            "--random-input-len",
            "48",
            "--random-output-len",
            "6",
            "--max-concurrency",
            "4",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--goodput",
            "ttft:60000",
            "--temperature",
            "0",
        ],
    ))
    .await
    .expect("benchmark runs");
    assert_eq!(report.model_id, "fixture-model");
    assert!(
        report.tokenizer_exact,
        "the fixture's /tokenize must be used: {}",
        report.tokenizer
    );
    let result = &report.results[0];
    let metrics = &result.metrics;
    assert_eq!((metrics.completed, metrics.failed), (24, 0));
    // The server adds BOS: 47 random tokens + 1 = the requested 48, as its usage reports.
    assert_eq!(metrics.total_input, 24 * 48);
    assert_eq!(metrics.total_output, 24 * 6);
    for outcome in &result.outcomes {
        assert_eq!(outcome.prompt_len, 48);
        assert_eq!(
            outcome.content_chunks, 6,
            "merged and split network writes still give one chunk per event"
        );
        assert_eq!(outcome.itl.len(), 5);
        assert!(outcome.ttft > 0.0 && outcome.latency >= outcome.ttft);
        assert_eq!(outcome.generated_text, "aaaaaa");
    }
    assert!(metrics.max_concurrent_requests <= 4);
    assert_eq!(
        metrics.request_goodput, metrics.request_throughput,
        "a one-minute TTFT SLO holds for all"
    );

    let bodies = recorded_bodies(&fixture);
    assert_eq!(bodies.len(), 24);
    let prompts: HashSet<&str> = bodies.iter().filter_map(|b| b["prompt"].as_str()).collect();
    assert_eq!(prompts.len(), 24, "every random prompt is distinct");
    // Not even their first 16 tokens (a KV block) coincide: no accidental prefix-cache hits.
    let heads: HashSet<&[u8]> = prompts.iter().map(|p| &p.as_bytes()[..16]).collect();
    assert_eq!(heads.len(), 24);
    for body in &bodies {
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["max_tokens"], 6);
        assert_eq!(
            body["ignore_eos"], true,
            "the random dataset runs to length, as in vLLM"
        );
        assert_eq!(body["temperature"], 0.0);
        assert_eq!(body["model"], "fixture-model");
    }

    let printed = &result.printed;
    assert!(printed.contains("Successful requests:                     24        \n"));
    assert!(printed.contains("Maximum request concurrency:             4         \n"));
    assert!(printed.contains("Request goodput (req/s):"));
    assert!(printed.contains("P50 E2EL (ms):"));
    assert!(printed.contains("P99 ITL (ms):"));
    assert_eq!(result.result["completed"], 24);
    assert_eq!(
        result.result["output_lens"].as_array().map(Vec::len),
        Some(24)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_and_shown() {
    let faults = fixture::Faults {
        http_500: vec![1],
        cut_stream: vec![3],
        error_event: vec![5],
    };
    let fixture = fixture::start(faults).await;
    // Concurrency 1 makes arrival order = request order, so the faults hit known requests.
    let report = run(args(
        &fixture.base_url,
        &[
            "--num-prompts",
            "8",
            "--random-input-len",
            "16",
            "--random-output-len",
            "8",
            "--max-concurrency",
            "1",
        ],
    ))
    .await
    .expect("benchmark runs");
    let result = &report.results[0];
    assert_eq!((result.metrics.completed, result.metrics.failed), (5, 3));
    let errors: Vec<&str> = result
        .outcomes
        .iter()
        .filter(|o| !o.success)
        .map(|o| o.error.as_str())
        .collect();
    assert!(
        errors[0].contains("HTTP 500") && errors[0].contains("induced failure"),
        "{}",
        errors[0]
    );
    assert!(errors[1].contains("without [DONE]"), "{}", errors[1]);
    assert!(
        errors[2].contains("engine failed mid-stream"),
        "{}",
        errors[2]
    );
    assert!(result.printed.starts_with(
        "Failed requests during benchmark run detected (capping to 10):\nError 0: HTTP 500"
    ));
    assert!(result
        .printed
        .contains("Failed requests:                         3         \n"));
    assert_eq!(
        result.result["errors"]
            .as_array()
            .map(|e| e.iter().filter(|m| m != &"").count()),
        Some(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_fails_requests_not_the_run() {
    // Bind then drop a listener: its port is closed, so every request gets a connection error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let base_url = format!("http://127.0.0.1:{port}");
    let report = run(args(
        &base_url,
        &[
            "--model",
            "m",
            "--num-prompts",
            "3",
            "--random-input-len",
            "8",
            "--random-output-len",
            "2",
        ],
    ))
    .await
    .expect("a dead server is measured, not an error");
    let result = &report.results[0];
    assert!(
        !report.tokenizer_exact,
        "no /tokenize: the approximate fallback is used"
    );
    assert_eq!((result.metrics.completed, result.metrics.failed), (0, 3));
    assert!(
        result.outcomes[0].error.contains("connection error"),
        "{}",
        result.outcomes[0].error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_sweep_writes_results_summary_and_plots() {
    let fixture = fixture::start(fixture::Faults::default()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_text = dir.path().to_str().expect("utf-8 temp path").to_string();
    let report = run(args(
        &fixture.base_url,
        &[
            "--endpoint",
            "/v1/chat/completions",
            "--num-prompts",
            "6",
            "--random-input-len",
            "24",
            "--random-output-len",
            "4",
            "--sweep-concurrency",
            "1,2,3",
            "--save-result",
            "--result-dir",
            &dir_text,
            "--result-filename",
            "chat.json",
            "--num-warmups",
            "2",
        ],
    ))
    .await
    .expect("sweep runs");
    assert_eq!(report.results.len(), 3);
    for (result, concurrency) in report.results.iter().zip([1, 2, 3]) {
        assert_eq!(result.point.max_concurrency, Some(concurrency));
        assert_eq!((result.metrics.completed, result.metrics.failed), (6, 0));
        // The role-only first chunk is not content: 4 content chunks, 3 gaps.
        assert!(result
            .outcomes
            .iter()
            .all(|o| o.content_chunks == 4 && o.itl.len() == 3));
        let saved = result.saved_to.as_ref().expect("saved");
        assert!(saved.ends_with(format!("chat-concurrency{concurrency}.json")));
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(saved).expect("result file"))
                .expect("json");
        assert_eq!(json["max_concurrency"], concurrency);
        assert_eq!(json["itls"].as_array().map(Vec::len), Some(6));
    }
    // 2 warm-ups per point + 6 requests per point, and no prompt is reused across points.
    let bodies = recorded_bodies(&fixture);
    assert_eq!(bodies.len(), 3 * (2 + 6));
    let measured: HashSet<String> = bodies
        .iter()
        .map(|b| b["messages"][0]["content"].to_string())
        .collect();
    assert_eq!(
        measured.len(),
        18,
        "3 × 6 distinct prompts (warm-ups repeat each point's first)"
    );
    assert!(bodies.iter().all(|b| b["max_completion_tokens"] == 4));
    let names: HashSet<String> = report
        .sweep_files
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(String::from))
        .collect();
    for expected in [
        "sweep-concurrency-summary.csv",
        "sweep-concurrency-summary.json",
        "sweep-concurrency-output_throughput.png",
        "sweep-concurrency-output_throughput.svg",
        "sweep-concurrency-ttft.svg",
        "sweep-concurrency-itl.png",
        "sweep-concurrency-throughput_vs_latency.png",
    ] {
        assert!(
            names.contains(expected),
            "missing {expected} in {names:?} (plots need a TrueType font, e.g. fonts-dejavu-core)"
        );
    }
    let csv =
        std::fs::read_to_string(dir.path().join("sweep-concurrency-summary.csv")).expect("csv");
    assert_eq!(csv.lines().count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_have_exact_lengths_and_prefix_repetition_shares_prefixes() {
    let fixture = fixture::start(fixture::Faults::default()).await;
    let tokenizer = PromptTokenizer::from_server(ServerAccess {
        http: reqwest::Client::new(),
        base_url: fixture.base_url.clone(),
        model: "fixture-model".into(),
        api_key: None,
    })
    .await;
    assert!(tokenizer.is_exact());
    assert_eq!(tokenizer.num_special_tokens(), 1);

    let random = random_dataset(
        &tokenizer,
        &RandomConfig {
            num_requests: 40,
            input_len: 20,
            output_len: 10,
            range_ratio: 0.5,
            prefix_len: 5,
            seed: 3,
        },
    )
    .await
    .expect("random dataset");
    let mut prefixes = HashSet::new();
    for request in &random {
        let tokens = tokenizer.encode(&request.prompt).await.expect("encode");
        assert_eq!(
            tokens.len() + 1,
            request.prompt_len,
            "prompt_len is exact (plus BOS)"
        );
        // 5 prefix tokens + [⌊19·0.5⌋, ⌈19·1.5⌉] random ones; outputs in [5, 15].
        assert!((5 + 9..=5 + 29).contains(&tokens.len()), "{}", tokens.len());
        assert!((5..=15).contains(&request.output_len));
        prefixes.insert(tokens[..5].to_vec());
    }
    assert_eq!(prefixes.len(), 1, "--random-prefix-len shares one prefix");
    let distinct: HashSet<&str> = random.iter().map(|r| r.prompt.as_str()).collect();
    assert_eq!(distinct.len(), 40);
    let again = random_dataset(
        &tokenizer,
        &RandomConfig {
            num_requests: 40,
            input_len: 20,
            output_len: 10,
            range_ratio: 0.5,
            prefix_len: 5,
            seed: 3,
        },
    )
    .await
    .expect("random dataset");
    assert_eq!(random, again, "same seed, same prompts");

    let config = PrefixRepetitionConfig {
        num_requests: 12,
        prefix_len: 16,
        suffix_len: 8,
        num_prefixes: 3,
        output_len: 7,
        seed: 0,
    };
    let repeated = prefix_repetition(&tokenizer, &config)
        .await
        .expect("prefix_repetition dataset");
    assert_eq!(repeated.len(), 12);
    let mut groups: HashMap<Vec<u32>, usize> = HashMap::new();
    for request in &repeated {
        let tokens = tokenizer.encode(&request.prompt).await.expect("encode");
        assert_eq!(tokens.len(), 24);
        assert_eq!(request.prompt_len, 25);
        assert_eq!(request.output_len, 7);
        *groups.entry(tokens[..16].to_vec()).or_default() += 1;
    }
    assert_eq!(groups.len(), 3, "three shared prefixes");
    assert!(groups.values().all(|&count| count == 4), "{groups:?}");
    let suffixes: HashSet<&str> = repeated.iter().map(|r| &r.prompt[16..]).collect();
    assert_eq!(suffixes.len(), 12, "suffixes are distinct");
}
