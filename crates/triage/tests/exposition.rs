//! The parser and the window math on a realistic excerpt of a vLLM server's `/metrics`
//! (prometheus_client output: GC and process families, the FastAPI instrumentator's HTTP
//! metrics, `_created` gauges, `cache_config_info` with Python-style label values).

use std::time::Duration;

use tokenmill_triage::exposition::MetricType;
use tokenmill_triage::window::{counter_increase, HistogramWindow};
use tokenmill_triage::{Scrape, SeriesFilter, WindowMetrics};

const VLLM_EXCERPT_BEFORE: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 15832.0
python_gc_objects_collected_total{generation="1"} 1455.0
python_gc_objects_collected_total{generation="2"} 391.0
# HELP python_gc_collections_total Number of times this generation was collected
# TYPE python_gc_collections_total counter
python_gc_collections_total{generation="0"} 1243.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 2.392064e+09
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76378e+09
# HELP http_request_duration_highr_seconds Latency with many buckets but no API specific labels.
# TYPE http_request_duration_highr_seconds histogram
http_request_duration_highr_seconds_bucket{le="0.01"} 3.0
http_request_duration_highr_seconds_bucket{le="+Inf"} 9.0
http_request_duration_highr_seconds_count 9.0
http_request_duration_highr_seconds_sum 21.5
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.0123
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1000.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.7637800512e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-0.6B"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="Qwen/Qwen3-0.6B"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="Qwen/Qwen3-0.6B"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.06",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.41
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="1724",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0
"#;

/// The same server 20 s later: 10 more requests, their TTFTs in (0.04, 0.06] (4) and
/// (0.06, 0.08] (6); one more preemption; a label value with escapes on a foreign metric.
fn after_excerpt() -> String {
    VLLM_EXCERPT_BEFORE
        .replace(
            "vllm:num_preemptions_total{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 2.0",
            "vllm:num_preemptions_total{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 3.0",
        )
        .replace(
            "finished_reason=\"stop\",model_name=\"Qwen/Qwen3-0.6B\"} 10.0",
            "finished_reason=\"stop\",model_name=\"Qwen/Qwen3-0.6B\"} 20.0",
        )
        .replace("le=\"0.06\",model_name=\"Qwen/Qwen3-0.6B\"} 12.0", "le=\"0.06\",model_name=\"Qwen/Qwen3-0.6B\"} 16.0")
        .replace("le=\"0.08\",model_name=\"Qwen/Qwen3-0.6B\"} 12.0", "le=\"0.08\",model_name=\"Qwen/Qwen3-0.6B\"} 22.0")
        .replace("le=\"0.1\",model_name=\"Qwen/Qwen3-0.6B\"} 12.0", "le=\"0.1\",model_name=\"Qwen/Qwen3-0.6B\"} 22.0")
        .replace("le=\"0.25\",model_name=\"Qwen/Qwen3-0.6B\"} 12.0", "le=\"0.25\",model_name=\"Qwen/Qwen3-0.6B\"} 22.0")
        .replace("le=\"+Inf\",model_name=\"Qwen/Qwen3-0.6B\"} 12.0", "le=\"+Inf\",model_name=\"Qwen/Qwen3-0.6B\"} 22.0")
        .replace(
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 12.0",
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 22.0",
        )
        .replace(
            "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 0.41",
            "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"Qwen/Qwen3-0.6B\"} 1.01",
        )
        + "# TYPE custom_info gauge\ncustom_info{note=\"say \\\"hi\\\"\\nbye\",path=\"C:\\\\x\"} 1\n"
}

#[test]
fn families_types_and_help_are_read() {
    let scrape = Scrape::parse(VLLM_EXCERPT_BEFORE).unwrap();
    let gc = scrape.family("python_gc_objects_collected_total").unwrap();
    assert_eq!(gc.kind, MetricType::Counter);
    assert_eq!(gc.samples.len(), 3);
    let ttft = scrape.family("vllm:time_to_first_token_seconds").unwrap();
    assert_eq!(ttft.kind, MetricType::Histogram);
    assert_eq!(
        ttft.help.as_deref(),
        Some("Histogram of time to first token in seconds.")
    );
    assert_eq!(ttft.samples.len(), 12, "10 buckets + count + sum");
    let created = scrape.family("vllm:prompt_tokens_created").unwrap();
    assert_eq!(created.kind, MetricType::Gauge);
    assert_eq!(created.samples[0].value, 1.7637800512e9);
    let info = scrape
        .samples_named("vllm:cache_config_info")
        .next()
        .unwrap();
    assert_eq!(info.labels.get("num_gpu_blocks"), Some("1724"));
    assert_eq!(info.labels.get("enable_prefix_caching"), Some("True"));
    assert_eq!(
        scrape
            .samples_named("process_resident_memory_bytes")
            .next()
            .unwrap()
            .value,
        2.392064e9
    );
}

#[test]
fn escaped_label_values_in_a_real_dump() {
    let scrape = Scrape::parse(&after_excerpt()).unwrap();
    let info = scrape.samples_named("custom_info").next().unwrap();
    assert_eq!(info.labels.get("note"), Some("say \"hi\"\nbye"));
    assert_eq!(info.labels.get("path"), Some("C:\\x"));
}

#[test]
fn window_quantiles_match_hand_computation() {
    let before = Scrape::parse(VLLM_EXCERPT_BEFORE).unwrap();
    let after = Scrape::parse(&after_excerpt()).unwrap();
    let filter = SeriesFilter::default();
    let ttft =
        HistogramWindow::between(&before, &after, "vllm:time_to_first_token_seconds", &filter)
            .unwrap();
    assert_eq!(ttft.count, 10.0);
    assert!(
        (ttft.mean().unwrap() - 0.06).abs() < 1e-12,
        "(1.01 - 0.41) / 10"
    );
    // Window buckets: 4 in (0.04, 0.06], 6 in (0.06, 0.08].
    // p50: rank 5 → second bucket, 0.06 + 0.02 × (5 − 4)/6.
    assert!((ttft.quantile(0.5).unwrap() - (0.06 + 0.02 / 6.0)).abs() < 1e-12);
    // p25: rank 2.5 → first bucket, 0.04 + 0.02 × 2.5/4.
    assert!((ttft.quantile(0.25).unwrap() - 0.0525).abs() < 1e-12);
    // p99: rank 9.9 → 0.06 + 0.02 × 5.9/6.
    assert!((ttft.quantile(0.99).unwrap() - (0.06 + 0.02 * 5.9 / 6.0)).abs() < 1e-12);

    assert_eq!(
        counter_increase(&before, &after, "vllm:num_preemptions", &filter),
        Some(1.0)
    );
    assert_eq!(
        counter_increase(&before, &after, "vllm:request_success", &filter),
        Some(10.0)
    );
}

#[test]
fn window_metrics_from_the_excerpt() {
    let before = Scrape::parse(VLLM_EXCERPT_BEFORE).unwrap();
    let after = Scrape::parse(&after_excerpt()).unwrap();
    let metrics = WindowMetrics::measure(
        &before,
        &after,
        &[],
        Duration::from_secs(20),
        &SeriesFilter::default(),
    );
    assert_eq!(metrics.model_names, vec!["Qwen/Qwen3-0.6B".to_owned()]);
    assert_eq!(metrics.engines, 1);
    assert_eq!(metrics.requests_per_second, Some(0.5));
    assert_eq!(metrics.preemptions_per_second, Some(0.05));
    let completions = metrics.completions.unwrap();
    assert_eq!((completions.stop, completions.length), (10.0, 0.0));
    let cache = metrics.cache_config.unwrap();
    assert_eq!(cache.capacity_tokens, Some(1724.0 * 16.0));
    assert_eq!(cache.cache_dtype.as_deref(), Some("auto"));
    // Missing families stay absent instead of reading as zero.
    assert_eq!(metrics.prefix_cache_hit_rate, None);
    assert!(metrics.itl.is_none());
}
