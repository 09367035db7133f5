//! vLLM's printed result block (same labels, order and `{:<40} {:<10}` widths) and its
//! result JSON (same key names).

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::args::PercentileMetric;
use crate::client::RequestOutcome;
use crate::metrics::{BenchmarkMetrics, Distribution};

/// Python's `str(float)`: "inf", "20.0", "0.25".
pub fn python_float(value: f64) -> String {
    if value.is_nan() {
        "nan".into()
    } else if value.is_infinite() {
        if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if value.fract() == 0.0 && value.abs() < 1e16 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

/// "99" for 99.0, "99.9" for 99.9: vLLM's `p_word`.
pub fn percentile_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// The settings the printed block depends on besides the metrics.
#[derive(Debug, Clone, Copy)]
pub struct BlockSettings<'a> {
    pub max_concurrency: Option<usize>,
    pub request_rate: f64,
    pub duration_s: f64,
    pub goodput_enabled: bool,
    pub percentile_metrics: &'a [PercentileMetric],
}

/// A metric's section title, its name in labels, and its distribution when it has one.
fn metric_sections(
    metrics: &BenchmarkMetrics,
) -> [(
    PercentileMetric,
    &'static str,
    &'static str,
    Option<&Distribution>,
); 6] {
    [
        (
            PercentileMetric::Ttft,
            "TTFT",
            "Time to First Token",
            Some(&metrics.ttft),
        ),
        (
            PercentileMetric::Tpot,
            "TPOT",
            "Time per Output Token (excl. 1st token)",
            Some(&metrics.tpot),
        ),
        (
            PercentileMetric::Itl,
            "ITL",
            "Inter-token Latency",
            Some(&metrics.itl),
        ),
        (
            PercentileMetric::E2el,
            "E2EL",
            "End-to-end Latency",
            Some(&metrics.e2el),
        ),
        (
            PercentileMetric::ClientQueueTime,
            "Client Queue Time",
            "Client-side Queueing",
            metrics.client_queue_time.as_ref(),
        ),
        (
            PercentileMetric::E2elIncludingClientQueue,
            "E2EL incl. Client Queue",
            "Queue-inclusive End-to-end Latency",
            metrics.e2el_including_client_queue.as_ref(),
        ),
    ]
}

fn value_line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {value:<10}");
}

fn float_line(out: &mut String, label: &str, value: f64) {
    let _ = writeln!(out, "{label:<40} {value:<10.2}");
}

/// The result block exactly as `vllm bench serve` prints it (trailing padding included).
pub fn format_result_block(metrics: &BenchmarkMetrics, settings: BlockSettings<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:=^50}", " Serving Benchmark Result ");
    value_line(&mut out, "Successful requests:", metrics.completed);
    value_line(&mut out, "Failed requests:", metrics.failed);
    if let Some(limit) = settings.max_concurrency {
        value_line(&mut out, "Maximum request concurrency:", limit);
    }
    if settings.request_rate.is_finite() {
        float_line(
            &mut out,
            "Request rate configured (RPS):",
            settings.request_rate,
        );
    }
    float_line(&mut out, "Benchmark duration (s):", settings.duration_s);
    value_line(&mut out, "Total input tokens:", metrics.total_input);
    value_line(&mut out, "Total generated tokens:", metrics.total_output);
    float_line(
        &mut out,
        "Request throughput (req/s):",
        metrics.request_throughput,
    );
    if settings.goodput_enabled {
        float_line(
            &mut out,
            "Request goodput (req/s):",
            metrics.request_goodput,
        );
    }
    float_line(
        &mut out,
        "Output token throughput (tok/s):",
        metrics.output_throughput,
    );
    float_line(
        &mut out,
        "Peak output token throughput (tok/s):",
        metrics.max_output_tokens_per_s,
    );
    float_line(
        &mut out,
        "Peak concurrent requests:",
        metrics.max_concurrent_requests as f64,
    );
    float_line(
        &mut out,
        "Total token throughput (tok/s):",
        metrics.total_token_throughput,
    );
    for (metric, name, header, distribution) in metric_sections(metrics) {
        let Some(distribution) = distribution else {
            continue;
        };
        if !settings.percentile_metrics.contains(&metric) {
            continue;
        }
        let _ = writeln!(out, "{header:-^50}");
        float_line(
            &mut out,
            &format!("Mean {name} (ms):"),
            distribution.mean_ms,
        );
        float_line(
            &mut out,
            &format!("Median {name} (ms):"),
            distribution.median_ms,
        );
        for &(p, value) in &distribution.percentiles_ms {
            float_line(
                &mut out,
                &format!("P{} {name} (ms):", percentile_word(p)),
                value,
            );
        }
    }
    let _ = writeln!(out, "{}", "=".repeat(50));
    out
}

/// vLLM's failure listing, printed before the block: at most ten errors.
pub fn format_failures(outcomes: &[RequestOutcome]) -> String {
    let failed: Vec<&RequestOutcome> = outcomes.iter().filter(|o| !o.success).collect();
    if failed.is_empty() {
        return String::new();
    }
    let mut out = String::from("Failed requests during benchmark run detected (capping to 10):\n");
    for (index, outcome) in failed.iter().take(10).enumerate() {
        let _ = writeln!(out, "Error {index}: {}", outcome.error);
    }
    out
}

/// Run-level facts recorded in the result JSON.
#[derive(Debug, Clone)]
pub struct ResultHeader {
    pub date: String,
    pub label: Option<String>,
    pub model_id: String,
    pub tokenizer_id: String,
    pub num_prompts: usize,
    pub request_rate: f64,
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
}

fn rate_value(rate: f64) -> Value {
    if rate.is_finite() {
        json!(rate)
    } else {
        json!("inf")
    }
}

/// The result JSON with vLLM's keys: summary, selected metric statistics, and every
/// per-request record.
pub fn result_json(
    header: &ResultHeader,
    metrics: &BenchmarkMetrics,
    outcomes: &[RequestOutcome],
    settings: BlockSettings<'_>,
) -> Value {
    let mut map = Map::new();
    let mut put = |key: &str, value: Value| {
        map.insert(key.to_string(), value);
    };
    put("date", json!(header.date));
    put("endpoint_type", json!("openai"));
    put("backend", json!("openai"));
    put("label", json!(header.label));
    put("model_id", json!(header.model_id));
    put("tokenizer_id", json!(header.tokenizer_id));
    put("num_prompts", json!(header.num_prompts));
    put("request_rate", rate_value(header.request_rate));
    put("burstiness", json!(header.burstiness));
    put("max_concurrency", json!(header.max_concurrency));
    put("duration", json!(settings.duration_s));
    put("completed", json!(metrics.completed));
    put("failed", json!(metrics.failed));
    put("total_input_tokens", json!(metrics.total_input));
    put("total_output_tokens", json!(metrics.total_output));
    put("request_throughput", json!(metrics.request_throughput));
    put(
        "request_goodput",
        if settings.goodput_enabled {
            json!(metrics.request_goodput)
        } else {
            Value::Null
        },
    );
    put("output_throughput", json!(metrics.output_throughput));
    put(
        "total_token_throughput",
        json!(metrics.total_token_throughput),
    );
    put(
        "input_lens",
        json!(outcomes.iter().map(|o| o.prompt_len).collect::<Vec<_>>()),
    );
    put("output_lens", json!(metrics.actual_output_lens));
    put(
        "ttfts",
        json!(outcomes.iter().map(|o| o.ttft).collect::<Vec<_>>()),
    );
    put(
        "itls",
        json!(outcomes.iter().map(|o| o.itl.clone()).collect::<Vec<_>>()),
    );
    put(
        "latencies",
        json!(outcomes.iter().map(|o| o.latency).collect::<Vec<_>>()),
    );
    put(
        "start_times",
        json!(outcomes.iter().map(|o| o.start_time).collect::<Vec<_>>()),
    );
    put(
        "queue_times",
        json!(outcomes
            .iter()
            .map(|o| o.client_queue_time)
            .collect::<Vec<_>>()),
    );
    put(
        "generated_texts",
        json!(outcomes
            .iter()
            .map(|o| o.generated_text.clone())
            .collect::<Vec<_>>()),
    );
    put(
        "errors",
        json!(outcomes.iter().map(|o| o.error.clone()).collect::<Vec<_>>()),
    );
    put(
        "max_output_tokens_per_s",
        json!(metrics.max_output_tokens_per_s),
    );
    put(
        "max_concurrent_requests",
        json!(metrics.max_concurrent_requests),
    );
    for (metric, _, _, distribution) in metric_sections(metrics) {
        let Some(distribution) = distribution else {
            continue;
        };
        if !settings.percentile_metrics.contains(&metric) {
            continue;
        }
        let key = metric.key();
        put(&format!("mean_{key}_ms"), json!(distribution.mean_ms));
        put(&format!("median_{key}_ms"), json!(distribution.median_ms));
        put(&format!("std_{key}_ms"), json!(distribution.std_ms));
        for &(p, value) in &distribution.percentiles_ms {
            put(&format!("p{}_{key}_ms", percentile_word(p)), json!(value));
        }
    }
    Value::Object(map)
}

/// vLLM's default result file name: `{label}-{rate}qps[-concurrency{c}]-{model}-{date}.json`.
pub fn result_file_name(
    label: Option<&str>,
    request_rate: f64,
    max_concurrency: Option<usize>,
    model_id: &str,
    date: &str,
) -> String {
    let label = label.unwrap_or("openai");
    let concurrency = max_concurrency
        .map(|c| format!("-concurrency{c}"))
        .unwrap_or_default();
    let base_model_id = model_id.rsplit('/').next().unwrap_or(model_id);
    format!(
        "{label}-{}qps{concurrency}-{base_model_id}-{date}.json",
        python_float(request_rate)
    )
}

/// The current UTC time as `%Y%m%d-%H%M%S`.
pub fn timestamp_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    timestamp_from_unix(seconds)
}

/// `%Y%m%d-%H%M%S` of a Unix time (UTC), by the days-from-civil inverse.
pub fn timestamp_from_unix(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        of_day / 3600,
        (of_day % 3600) / 60,
        of_day % 60
    )
}

#[cfg(test)]
mod tests;
