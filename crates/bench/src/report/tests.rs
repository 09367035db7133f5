use super::*;
use crate::metrics::Distribution;

fn distribution(mean_ms: f64, median_ms: f64, percentiles_ms: &[(f64, f64)]) -> Distribution {
    Distribution {
        mean_ms,
        median_ms,
        std_ms: 1.0,
        percentiles_ms: percentiles_ms.to_vec(),
    }
}

fn sample_metrics() -> BenchmarkMetrics {
    BenchmarkMetrics {
        completed: 998,
        failed: 2,
        total_input: 1_021_952,
        total_output: 127_744,
        request_throughput: 9.4757,
        request_goodput: 9.115,
        output_throughput: 1212.888,
        total_token_throughput: 10916.0,
        ttft: distribution(123.456, 110.5, &[(50.0, 110.5), (99.9, 402.33333)]),
        tpot: distribution(45.005, 44.994, &[(50.0, 44.994), (99.9, 61.0)]),
        itl: distribution(44.9, 43.21, &[(50.0, 43.21), (99.9, 120.125)]),
        e2el: distribution(5840.7, 5811.0, &[(50.0, 5811.0), (99.9, 7999.999)]),
        client_queue_time: Some(distribution(1.0, 1.0, &[(50.0, 1.0), (99.9, 2.0)])),
        e2el_including_client_queue: None,
        max_output_tokens_per_s: 1400.0,
        max_concurrent_requests: 8,
        actual_output_lens: vec![],
    }
}

// Produced by running the print statements of vLLM's benchmarks/serve.py in Python 3.11
// with the same numbers (lines keep Python's trailing padding).
const GOLDEN_FULL: &str = "\
============ Serving Benchmark Result ============
Successful requests:                     998       
Failed requests:                         2         
Maximum request concurrency:             8         
Request rate configured (RPS):           20.00     
Benchmark duration (s):                  105.32    
Total input tokens:                      1021952   
Total generated tokens:                  127744    
Request throughput (req/s):              9.48      
Request goodput (req/s):                 9.12      
Output token throughput (tok/s):         1212.89   
Peak output token throughput (tok/s):    1400.00   
Peak concurrent requests:                8.00      
Total token throughput (tok/s):          10916.00  
---------------Time to First Token----------------
Mean TTFT (ms):                          123.46    
Median TTFT (ms):                        110.50    
P50 TTFT (ms):                           110.50    
P99.9 TTFT (ms):                         402.33    
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          45.01     
Median TPOT (ms):                        44.99     
P50 TPOT (ms):                           44.99     
P99.9 TPOT (ms):                         61.00     
---------------Inter-token Latency----------------
Mean ITL (ms):                           44.90     
Median ITL (ms):                         43.21     
P50 ITL (ms):                            43.21     
P99.9 ITL (ms):                          120.12    
----------------End-to-end Latency----------------
Mean E2EL (ms):                          5840.70   
Median E2EL (ms):                        5811.00   
P50 E2EL (ms):                           5811.00   
P99.9 E2EL (ms):                         8000.00   
==================================================
";

#[test]
fn block_matches_vllm_golden_with_every_optional_line() {
    let metrics = sample_metrics();
    let selected = [
        PercentileMetric::E2el,
        PercentileMetric::Ttft,
        PercentileMetric::Itl,
        PercentileMetric::Tpot,
    ];
    let block = format_result_block(
        &metrics,
        BlockSettings {
            max_concurrency: Some(8),
            request_rate: 20.0,
            duration_s: 105.3212,
            goodput_enabled: true,
            percentile_metrics: &selected,
        },
    );
    for (line, (got, want)) in block.lines().zip(GOLDEN_FULL.lines()).enumerate() {
        assert_eq!(got, want, "line {line}");
    }
    assert_eq!(block, GOLDEN_FULL);
}

#[test]
fn default_block_has_no_optional_lines() {
    let metrics = sample_metrics();
    let selected = [
        PercentileMetric::Ttft,
        PercentileMetric::Tpot,
        PercentileMetric::Itl,
    ];
    let block = format_result_block(
        &metrics,
        BlockSettings {
            max_concurrency: None,
            request_rate: f64::INFINITY,
            duration_s: 105.3212,
            goodput_enabled: false,
            percentile_metrics: &selected,
        },
    );
    assert!(!block.contains("Maximum request concurrency"));
    assert!(!block.contains("Request rate configured"));
    assert!(!block.contains("goodput"));
    assert!(!block.contains("End-to-end"));
    // client_queue_time has data but was not selected.
    assert!(!block.contains("Client"));
    assert_eq!(block.lines().count(), 27);
    assert!(block.starts_with("============ Serving Benchmark Result ============\n"));
    assert!(block.ends_with("==================================================\n"));
}

#[test]
fn result_json_uses_vllm_keys() {
    let metrics = sample_metrics();
    let selected = [PercentileMetric::Ttft, PercentileMetric::ClientQueueTime];
    let header = ResultHeader {
        date: "20261122-035300".into(),
        label: None,
        model_id: "org/model".into(),
        tokenizer_id: "server".into(),
        num_prompts: 1000,
        request_rate: f64::INFINITY,
        burstiness: 1.0,
        max_concurrency: Some(8),
    };
    let outcomes = vec![RequestOutcome {
        success: true,
        prompt_len: 3,
        ttft: 0.1,
        itl: vec![0.01],
        latency: 0.11,
        ..Default::default()
    }];
    let settings = BlockSettings {
        max_concurrency: Some(8),
        request_rate: f64::INFINITY,
        duration_s: 2.0,
        goodput_enabled: false,
        percentile_metrics: &selected,
    };
    let value = result_json(&header, &metrics, &outcomes, settings);
    for key in [
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p50_ttft_ms",
        "p99.9_ttft_ms",
        "mean_client_queue_time_ms",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "errors",
        "max_concurrent_requests",
    ] {
        assert!(value.get(key).is_some(), "missing {key}");
    }
    assert!(
        value.get("mean_tpot_ms").is_none(),
        "unselected metrics are not saved"
    );
    assert_eq!(value["request_rate"], "inf");
    assert_eq!(value["request_goodput"], Value::Null);
    assert_eq!(value["itls"], json!([[0.01]]));
}

#[test]
fn names_and_numbers_follow_python() {
    assert_eq!(python_float(f64::INFINITY), "inf");
    assert_eq!(python_float(20.0), "20.0");
    assert_eq!(python_float(0.25), "0.25");
    assert_eq!(percentile_word(99.0), "99");
    assert_eq!(percentile_word(99.9), "99.9");
    assert_eq!(
        result_file_name(
            None,
            f64::INFINITY,
            Some(4),
            "HuggingFaceTB/SmolLM2-135M",
            "20261122-035300"
        ),
        "openai-infqps-concurrency4-SmolLM2-135M-20261122-035300.json"
    );
    assert_eq!(
        result_file_name(Some("tm"), 2.5, None, "m", "d"),
        "tm-2.5qps-m-d.json"
    );
    assert_eq!(timestamp_from_unix(0), "19700101-000000");
    assert_eq!(timestamp_from_unix(1_795_233_180), "20261121-035300");
    assert_eq!(timestamp_from_unix(951_825_600), "20000229-120000");
}

#[test]
fn failures_are_listed_up_to_ten() {
    let outcomes: Vec<RequestOutcome> = (0..12)
        .map(|i| RequestOutcome {
            success: false,
            error: format!("HTTP 503 #{i}"),
            ..Default::default()
        })
        .collect();
    let text = format_failures(&outcomes);
    assert!(text.starts_with("Failed requests during benchmark run detected (capping to 10):\n"));
    assert!(text.contains("Error 0: HTTP 503 #0\n"));
    assert!(text.contains("Error 9: HTTP 503 #9\n"));
    assert!(!text.contains("#10"));
    assert_eq!(
        format_failures(&[RequestOutcome {
            success: true,
            ..Default::default()
        }]),
        ""
    );
}
