//! Encodes a scrape after a known sequence of record calls and checks exact values, buckets,
//! label sets and names against the vLLM compatibility table.

#![allow(clippy::expect_used, clippy::panic)] // test helpers outside #[test] functions

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{config, record_known_workload, Scrape, MODEL_NAME};
use tokenmill_metrics::buckets::{
    one_two_five_buckets, INTER_TOKEN_LATENCY_SECONDS, ITERATION_TOKENS, REQUEST_LATENCY_SECONDS,
    REQUEST_PARAMS_N, TIME_TO_FIRST_TOKEN_SECONDS,
};
use tokenmill_metrics::EngineMetrics;

const ENGINE: [(&str, &str); 2] = [("model_name", MODEL_NAME), ("engine", "0")];

fn scrape_after_known_workload() -> Scrape {
    let metrics = EngineMetrics::new(config());
    record_known_workload(&metrics);
    Scrape::parse(&metrics.encode().expect("encode"))
}

fn with_engine<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    ENGINE
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect()
}

#[test]
fn gauges_read_the_last_step() {
    let scrape = scrape_after_known_workload();
    // The last step of the workload is idle, so everything reads zero as at idle.
    assert_eq!(scrape.value("vllm:num_requests_running", &ENGINE), 0.0);
    assert_eq!(scrape.value("vllm:num_requests_waiting", &ENGINE), 0.0);
    assert_eq!(scrape.value("vllm:kv_cache_usage_perc", &ENGINE), 0.0);

    let metrics = EngineMetrics::new(config());
    metrics.record_step(&tokenmill_metrics::StepMetrics {
        num_running: 7,
        num_waiting: 51,
        kv_cache_usage: 0.96875,
        ..Default::default()
    });
    let busy = Scrape::parse(&metrics.encode().expect("encode"));
    assert_eq!(busy.value("vllm:num_requests_running", &ENGINE), 7.0);
    assert_eq!(busy.value("vllm:num_requests_waiting", &ENGINE), 51.0);
    assert_eq!(busy.value("vllm:kv_cache_usage_perc", &ENGINE), 0.96875);
}

#[test]
fn counters_sum_the_step_deltas() {
    let scrape = scrape_after_known_workload();
    assert_eq!(
        scrape.value("vllm:prefix_cache_queries_total", &ENGINE),
        50.0
    );
    assert_eq!(scrape.value("vllm:prefix_cache_hits_total", &ENGINE), 16.0);
    assert_eq!(scrape.value("vllm:num_preemptions_total", &ENGINE), 1.0);
    assert_eq!(scrape.value("vllm:prompt_tokens_total", &ENGINE), 34.0);
    assert_eq!(scrape.value("vllm:generation_tokens_total", &ENGINE), 5.0);
}

#[test]
fn request_success_counts_each_finish_reason() {
    let scrape = scrape_after_known_workload();
    for (reason, expected) in [
        ("stop", 2.0),
        ("length", 1.0),
        ("abort", 1.0),
        ("error", 0.0),
    ] {
        assert_eq!(
            scrape.value(
                "vllm:request_success_total",
                &with_engine(&[("finished_reason", reason)])
            ),
            expected,
            "finished_reason={reason}"
        );
    }
    let series = scrape
        .samples
        .iter()
        .filter(|sample| sample.name == "vllm:request_success_total")
        .count();
    assert_eq!(series, 4);
}

#[test]
fn every_reason_series_exists_before_any_request_finishes() {
    let metrics = EngineMetrics::new(config());
    let scrape = Scrape::parse(&metrics.encode().expect("encode"));
    for reason in ["stop", "length", "abort", "error"] {
        assert_eq!(
            scrape.value(
                "vllm:request_success_total",
                &with_engine(&[("finished_reason", reason)])
            ),
            0.0
        );
    }
    assert_eq!(scrape.value("vllm:prompt_tokens_total", &ENGINE), 0.0);
    assert_eq!(
        scrape.value("vllm:time_to_first_token_seconds_count", &ENGINE),
        0.0
    );
}

#[test]
fn cache_config_info_carries_the_cache_configuration() {
    let scrape = scrape_after_known_workload();
    let info: Vec<_> = scrape
        .samples
        .iter()
        .filter(|sample| sample.name == "vllm:cache_config_info")
        .collect();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].value, 1.0);
    let expected: BTreeMap<String, String> = [
        ("model_name", MODEL_NAME),
        ("engine", "0"),
        ("block_size", "16"),
        ("cache_dtype", "auto"),
        ("enable_prefix_caching", "True"),
        ("num_gpu_blocks", "64"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    assert_eq!(info[0].labels, expected);
}

fn le_values(scrape: &Scrape, histogram: &str) -> Vec<f64> {
    scrape
        .buckets(histogram)
        .iter()
        .map(|(le, _)| {
            if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("numeric le")
            }
        })
        .collect()
}

fn with_infinity(bounds: &[f64]) -> Vec<f64> {
    bounds
        .iter()
        .copied()
        .chain(std::iter::once(f64::INFINITY))
        .collect()
}

#[test]
fn histogram_buckets_are_exactly_vllms() {
    let scrape = scrape_after_known_workload();
    let token_buckets = one_two_five_buckets(2048);
    assert_eq!(
        token_buckets,
        vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
    );
    let expected: [(&str, &[f64]); 13] = [
        ("vllm:request_prompt_tokens", &token_buckets),
        ("vllm:request_generation_tokens", &token_buckets),
        ("vllm:request_params_max_tokens", &token_buckets),
        ("vllm:request_params_n", REQUEST_PARAMS_N),
        ("vllm:iteration_tokens_total", ITERATION_TOKENS),
        (
            "vllm:time_to_first_token_seconds",
            TIME_TO_FIRST_TOKEN_SECONDS,
        ),
        (
            "vllm:inter_token_latency_seconds",
            INTER_TOKEN_LATENCY_SECONDS,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            INTER_TOKEN_LATENCY_SECONDS,
        ),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_SECONDS),
        ("vllm:request_queue_time_seconds", REQUEST_LATENCY_SECONDS),
        (
            "vllm:request_inference_time_seconds",
            REQUEST_LATENCY_SECONDS,
        ),
        ("vllm:request_prefill_time_seconds", REQUEST_LATENCY_SECONDS),
        ("vllm:request_decode_time_seconds", REQUEST_LATENCY_SECONDS),
    ];
    for (histogram, bounds) in expected {
        assert_eq!(
            le_values(&scrape, histogram),
            with_infinity(bounds),
            "{histogram}"
        );
    }
    // Spot-check the contract's literal lists, independent of the crate's constants.
    assert_eq!(
        le_values(&scrape, "vllm:time_to_first_token_seconds"),
        with_infinity(&[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0
        ])
    );
    assert_eq!(
        le_values(&scrape, "vllm:e2e_request_latency_seconds"),
        with_infinity(&[
            0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0
        ])
    );
}

fn cumulative_at(scrape: &Scrape, histogram: &str, le: f64) -> f64 {
    let bounds = le_values(scrape, histogram);
    let buckets = scrape.buckets(histogram);
    let index = bounds
        .iter()
        .position(|bound| *bound == le)
        .unwrap_or_else(|| panic!("{histogram} has no bucket le={le}"));
    buckets[index].1
}

#[test]
fn histograms_count_every_observation_in_the_right_bucket() {
    let scrape = scrape_after_known_workload();
    let count = |name: &str| scrape.value(&format!("{name}_count"), &ENGINE);
    let sum = |name: &str| scrape.value(&format!("{name}_sum"), &ENGINE);

    // TTFT 0.03, 0.3, 3.0.
    let ttft = "vllm:time_to_first_token_seconds";
    assert_eq!(count(ttft), 3.0);
    assert!((sum(ttft) - 3.33).abs() < 1e-9);
    assert_eq!(cumulative_at(&scrape, ttft, 0.02), 0.0);
    assert_eq!(cumulative_at(&scrape, ttft, 0.04), 1.0);
    assert_eq!(cumulative_at(&scrape, ttft, 0.25), 1.0);
    assert_eq!(cumulative_at(&scrape, ttft, 0.5), 2.0);
    assert_eq!(cumulative_at(&scrape, ttft, 2.5), 2.0);
    assert_eq!(cumulative_at(&scrape, ttft, 5.0), 3.0);
    assert_eq!(cumulative_at(&scrape, ttft, f64::INFINITY), 3.0);

    // ITL 0.02, 0.02, 0.3: a value equal to a bound counts in that bucket.
    let itl = "vllm:inter_token_latency_seconds";
    assert_eq!(count(itl), 3.0);
    assert_eq!(cumulative_at(&scrape, itl, 0.01), 0.0);
    assert_eq!(cumulative_at(&scrape, itl, 0.025), 2.0);
    assert_eq!(cumulative_at(&scrape, itl, 0.2), 2.0);
    assert_eq!(cumulative_at(&scrape, itl, 0.3), 3.0);

    // Iteration tokens 26 and 13; the idle step is not an iteration.
    let iteration = "vllm:iteration_tokens_total";
    assert_eq!(count(iteration), 2.0);
    assert_eq!(sum(iteration), 39.0);
    assert_eq!(cumulative_at(&scrape, iteration, 8.0), 0.0);
    assert_eq!(cumulative_at(&scrape, iteration, 16.0), 1.0);
    assert_eq!(cumulative_at(&scrape, iteration, 32.0), 2.0);

    // Per-request token counts: prompts 12, 300, 12, 10; generations 5, 1, 16, 0.
    let prompt = "vllm:request_prompt_tokens";
    assert_eq!(count(prompt), 4.0);
    assert_eq!(sum(prompt), 334.0);
    assert_eq!(cumulative_at(&scrape, prompt, 10.0), 1.0);
    assert_eq!(cumulative_at(&scrape, prompt, 20.0), 3.0);
    assert_eq!(cumulative_at(&scrape, prompt, 200.0), 3.0);
    assert_eq!(cumulative_at(&scrape, prompt, 500.0), 4.0);
    let generation = "vllm:request_generation_tokens";
    assert_eq!(count(generation), 4.0);
    assert_eq!(sum(generation), 22.0);
    assert_eq!(cumulative_at(&scrape, generation, 1.0), 2.0);
    assert_eq!(cumulative_at(&scrape, generation, 5.0), 3.0);
    assert_eq!(cumulative_at(&scrape, generation, 20.0), 4.0);

    // max_tokens is observed only when the request set it; n always.
    let max_tokens = "vllm:request_params_max_tokens";
    assert_eq!(count(max_tokens), 3.0);
    assert_eq!(sum(max_tokens), 48.0);
    assert_eq!(cumulative_at(&scrape, max_tokens, 10.0), 0.0);
    assert_eq!(cumulative_at(&scrape, max_tokens, 20.0), 3.0);
    let n = "vllm:request_params_n";
    assert_eq!(count(n), 4.0);
    assert_eq!(cumulative_at(&scrape, n, 1.0), 3.0);
    assert_eq!(cumulative_at(&scrape, n, 2.0), 3.0);
    assert_eq!(cumulative_at(&scrape, n, 5.0), 4.0);

    // TPOT only for requests that have one.
    let tpot = "vllm:request_time_per_output_token_seconds";
    assert_eq!(count(tpot), 3.0);
    assert_eq!(cumulative_at(&scrape, tpot, 0.025), 0.0);
    assert_eq!(cumulative_at(&scrape, tpot, 0.05), 3.0);

    // Phase times: e2e 1.2 x3 and 9.0; the others identical for all four requests.
    let e2e = "vllm:e2e_request_latency_seconds";
    assert_eq!(count(e2e), 4.0);
    assert!((sum(e2e) - 12.6).abs() < 1e-9);
    assert_eq!(cumulative_at(&scrape, e2e, 1.0), 0.0);
    assert_eq!(cumulative_at(&scrape, e2e, 1.5), 3.0);
    assert_eq!(cumulative_at(&scrape, e2e, 5.0), 3.0);
    assert_eq!(cumulative_at(&scrape, e2e, 10.0), 4.0);
    for (histogram, value) in [
        ("vllm:request_queue_time_seconds", 0.2),
        ("vllm:request_prefill_time_seconds", 0.4),
        ("vllm:request_decode_time_seconds", 0.6),
        ("vllm:request_inference_time_seconds", 1.0),
    ] {
        assert_eq!(count(histogram), 4.0, "{histogram}");
        assert!((sum(histogram) - 4.0 * value).abs() < 1e-9, "{histogram}");
        let first_bucket_holding_value = REQUEST_LATENCY_SECONDS
            .iter()
            .copied()
            .find(|bound| *bound >= value)
            .expect("value below the largest bucket");
        assert_eq!(
            cumulative_at(&scrape, histogram, first_bucket_holding_value),
            4.0
        );
        assert_eq!(
            cumulative_at(&scrape, histogram, 0.3),
            if value <= 0.3 { 4.0 } else { 0.0 }
        );
    }
}

#[test]
fn http_metrics_use_the_instrumentator_names_and_labels() {
    let scrape = scrape_after_known_workload();
    let completions_ok = [
        ("handler", "/v1/completions"),
        ("method", "POST"),
        ("status", "2xx"),
    ];
    assert_eq!(scrape.value("http_requests_total", &completions_ok), 2.0);
    let chat_bad_request = [
        ("handler", "/v1/chat/completions"),
        ("method", "POST"),
        ("status", "4xx"),
    ];
    assert_eq!(scrape.value("http_requests_total", &chat_bad_request), 1.0);

    let completions = [("handler", "/v1/completions"), ("method", "POST")];
    assert_eq!(
        scrape.value("http_request_duration_seconds_count", &completions),
        2.0
    );
    let completion_buckets: Vec<(String, f64)> = scrape
        .samples
        .iter()
        .filter(|sample| {
            sample.name == "http_request_duration_seconds_bucket"
                && sample.labels.get("handler").map(String::as_str) == Some("/v1/completions")
        })
        .map(|sample| (sample.labels["le"].clone(), sample.value))
        .collect();
    // Durations 0.3 and 2.0 against buckets 0.1, 0.5, 1.
    let bucket_values: Vec<f64> = completion_buckets.iter().map(|(_, value)| *value).collect();
    assert_eq!(bucket_values, vec![0.0, 1.0, 1.0, 2.0]);
    assert_eq!(
        completion_buckets.last().map(|(le, _)| le.as_str()),
        Some("+Inf")
    );
    assert_eq!(
        scrape.value("http_request_duration_highr_seconds_count", &[]),
        3.0
    );

    for sample in scrape
        .samples
        .iter()
        .filter(|s| s.name.starts_with("http_"))
    {
        assert!(
            !sample.labels.contains_key("model_name") && !sample.labels.contains_key("engine"),
            "HTTP metrics carry no engine labels, as in vLLM: {sample:?}"
        );
    }
}

#[test]
fn every_engine_sample_carries_model_name_and_engine() {
    let scrape = scrape_after_known_workload();
    let engine_samples: Vec<_> = scrape
        .samples
        .iter()
        .filter(|sample| sample.name.starts_with("vllm:"))
        .collect();
    assert!(!engine_samples.is_empty());
    for sample in engine_samples {
        assert_eq!(
            sample.labels.get("model_name").map(String::as_str),
            Some(MODEL_NAME),
            "{sample:?}"
        );
        assert_eq!(
            sample.labels.get("engine").map(String::as_str),
            Some("0"),
            "{sample:?}"
        );
    }
}

#[test]
fn metric_families_match_the_compatibility_table() {
    let scrape = scrape_after_known_workload();
    let expected: BTreeMap<&str, &str> = [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:cache_config_info", "gauge"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:request_success_total", "counter"),
        ("vllm:request_prompt_tokens", "histogram"),
        ("vllm:request_generation_tokens", "histogram"),
        ("vllm:request_params_max_tokens", "histogram"),
        ("vllm:request_params_n", "histogram"),
        ("vllm:iteration_tokens_total", "histogram"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:request_time_per_output_token_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_inference_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
        ("tokenmill_kv_events_dropped_total", "counter"),
        ("tokenmill_responses_store_evictions_total", "counter"),
        ("http_requests_total", "counter"),
        ("http_request_duration_seconds", "histogram"),
        ("http_request_duration_highr_seconds", "histogram"),
    ]
    .into_iter()
    .collect();
    let declared: BTreeMap<&str, &str> = scrape
        .types
        .iter()
        .map(|(name, kind)| (name.as_str(), kind.as_str()))
        .collect();
    assert_eq!(declared, expected);
    for name in expected.keys() {
        assert!(scrape.helps.contains_key(*name), "{name} has help text");
    }

    // Each sample belongs to a declared family: gauges and counters by name, histograms by
    // their three suffixes.
    let mut undeclared = BTreeSet::new();
    for sample in &scrape.samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                sample
                    .name
                    .strip_suffix(suffix)
                    .filter(|base| expected.get(base) == Some(&"histogram"))
            })
            .unwrap_or(&sample.name);
        if !expected.contains_key(family) {
            undeclared.insert(sample.name.clone());
        }
    }
    assert!(
        undeclared.is_empty(),
        "samples outside any family: {undeclared:?}"
    );
}

#[test]
fn openmetrics_output_is_the_unconverted_crate_format() {
    let metrics = EngineMetrics::new(config());
    record_known_workload(&metrics);
    let openmetrics = metrics.encode_openmetrics().expect("encode");
    assert!(openmetrics.ends_with("# EOF\n"));
    assert!(openmetrics.contains("# TYPE vllm:prompt_tokens counter\n"));
    assert!(openmetrics.contains(&format!(
        "vllm:prompt_tokens_total{{model_name=\"{MODEL_NAME}\",engine=\"0\"}} 34\n"
    )));
    let classic = metrics.encode().expect("encode");
    assert!(!classic.contains("# EOF"));
    assert!(classic.contains("# TYPE vllm:prompt_tokens_total counter\n"));
}

#[test]
fn model_names_with_quotes_are_escaped() {
    let metrics = EngineMetrics::new(tokenmill_metrics::MetricsConfig {
        model_name: "org/model \"v2\"".to_string(),
        ..config()
    });
    let scrape = Scrape::parse(&metrics.encode().expect("encode"));
    assert_eq!(
        scrape.value(
            "vllm:num_requests_running",
            &[("model_name", "org/model \"v2\""), ("engine", "0")]
        ),
        0.0
    );
}
