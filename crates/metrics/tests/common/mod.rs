//! Shared helpers for the integration tests: a small parser of the Prometheus text format and
//! the workload every scrape test records.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use tokenmill_metrics::{
    EngineMetrics, FinishedReason, FinishedRequestMetrics, MetricsConfig, StepMetrics,
};

pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape: samples in order, and `# TYPE` declarations by family name.
#[derive(Debug, Default)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    pub types: BTreeMap<String, String>,
    pub helps: BTreeMap<String, String>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE line has a type");
                scrape.types.insert(name.to_string(), kind.to_string());
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP line has text");
                scrape.helps.insert(name.to_string(), help.to_string());
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                scrape.samples.push(parse_sample(line));
            }
        }
        scrape
    }

    /// Sample names present in the scrape (`..._bucket`, `..._total`, plain gauges).
    pub fn sample_names(&self) -> BTreeSet<String> {
        self.samples
            .iter()
            .map(|sample| sample.name.clone())
            .collect()
    }

    /// The value of the one sample with this name whose labels include `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|sample| sample.name == name && has_labels(sample, labels))
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "expected exactly one sample {name} with {labels:?}, found {matching:?}"
        );
        matching[0].value
    }

    /// `(le, cumulative count)` of a histogram's buckets for the engine labels.
    pub fn buckets(&self, histogram: &str) -> Vec<(String, f64)> {
        let bucket_name = format!("{histogram}_bucket");
        self.samples
            .iter()
            .filter(|sample| sample.name == bucket_name)
            .map(|sample| (sample.labels["le"].clone(), sample.value))
            .collect()
    }
}

fn has_labels(sample: &Sample, labels: &[(&str, &str)]) -> bool {
    labels
        .iter()
        .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(*value))
}

fn parse_sample(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').expect("sample has a value");
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}")),
    };
    let (name, labels) = match series.split_once('{') {
        None => (series.to_string(), BTreeMap::new()),
        Some((name, rest)) => {
            let body = rest.strip_suffix('}').expect("label set closes");
            (name.to_string(), parse_labels(body))
        }
    };
    Sample {
        name,
        labels,
        value,
    }
}

fn parse_labels(body: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "label value is quoted in {body}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => panic!("dangling escape in {body}"),
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.insert(key.trim().to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

pub fn config() -> MetricsConfig {
    MetricsConfig {
        model_name: MODEL_NAME.to_string(),
        max_model_len: 2048,
        block_size: 16,
        num_blocks: 64,
        enable_prefix_caching: true,
        cache_dtype: "auto".to_string(),
    }
}

pub fn finished(reason: FinishedReason, prompt: u64, generated: u64) -> FinishedRequestMetrics {
    FinishedRequestMetrics {
        finish_reason: reason,
        num_prompt_tokens: prompt,
        num_generation_tokens: generated,
        max_tokens_param: Some(16),
        n_param: 1,
        e2e_latency: 1.2,
        queue_time: 0.2,
        prefill_time: 0.4,
        decode_time: 0.6,
        inference_time: 1.0,
        mean_time_per_output_token: Some(0.04),
    }
}

/// A known workload: three steps, four finished requests (stop, stop, length, abort), and
/// three HTTP requests.
pub fn record_known_workload(metrics: &EngineMetrics) {
    metrics.record_step(&StepMetrics {
        num_running: 2,
        num_waiting: 3,
        kv_cache_usage: 0.5,
        prefix_cache_queries: 40,
        prefix_cache_hits: 16,
        num_preemptions: 0,
        prompt_tokens: 24,
        generation_tokens: 2,
        iteration_tokens: 26,
        time_to_first_tokens: vec![0.03, 0.3],
        inter_token_latencies: vec![],
        ..StepMetrics::default()
    });
    metrics.record_step(&StepMetrics {
        num_running: 3,
        num_waiting: 1,
        kv_cache_usage: 0.75,
        prefix_cache_queries: 10,
        prefix_cache_hits: 0,
        num_preemptions: 1,
        prompt_tokens: 10,
        generation_tokens: 3,
        iteration_tokens: 13,
        time_to_first_tokens: vec![3.0],
        inter_token_latencies: vec![0.02, 0.02, 0.3],
        ..StepMetrics::default()
    });
    // An idle step: gauges drop to zero and nothing is observed.
    metrics.record_step(&StepMetrics::default());

    metrics.record_finished(&finished(FinishedReason::Stop, 12, 5));
    metrics.record_finished(&finished(FinishedReason::Stop, 300, 1));
    metrics.record_finished(&FinishedRequestMetrics {
        max_tokens_param: None,
        n_param: 3,
        mean_time_per_output_token: None,
        ..finished(FinishedReason::Length, 12, 16)
    });
    metrics.record_finished(&FinishedRequestMetrics {
        e2e_latency: 9.0,
        ..finished(FinishedReason::Abort, 10, 0)
    });

    metrics.record_http("/v1/completions", "POST", 200, 0.3);
    metrics.record_http("/v1/completions", "POST", 200, 2.0);
    metrics.record_http("/v1/chat/completions", "POST", 400, 0.01);
}

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root exists")
}

/// The promtool binary: `TOKENMILL_PROMTOOL`, else `<repo>/.cache/tools/bin/promtool`.
/// Panics with install instructions when neither exists: these tests must not skip.
pub fn promtool() -> PathBuf {
    let path = std::env::var_os("TOKENMILL_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/tools/bin/promtool"));
    assert!(
        path.is_file(),
        "promtool not found at {}: run scripts/install-promtool.sh (or set TOKENMILL_PROMTOOL)",
        path.display()
    );
    path
}
