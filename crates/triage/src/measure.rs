//! From scrapes to numbers: everything the diagnosis reads, measured once over the window.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

use crate::exposition::Scrape;
use crate::window::{
    counter_increase, counter_increase_where, gauge_mean, gauge_sum, Distribution, GaugeStats,
    HistogramWindow, SeriesFilter,
};

/// vLLM metric names (vllm-compat.md). Older vLLM releases used the `gpu_` spellings and
/// `time_per_output_token_seconds` for ITL; those are read as fallbacks.
pub mod names {
    pub const RUNNING: &str = "vllm:num_requests_running";
    pub const WAITING: &str = "vllm:num_requests_waiting";
    pub const KV_USAGE: &[&str] = &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"];
    pub const CACHE_CONFIG: &str = "vllm:cache_config_info";
    pub const PREFIX_QUERIES: &[&str] =
        &["vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"];
    pub const PREFIX_HITS: &[&str] = &["vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"];
    pub const PREEMPTIONS: &str = "vllm:num_preemptions";
    pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens";
    pub const GENERATION_TOKENS: &str = "vllm:generation_tokens";
    pub const REQUEST_SUCCESS: &str = "vllm:request_success";
    pub const TTFT: &str = "vllm:time_to_first_token_seconds";
    pub const ITL: &[&str] = &[
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ];
    pub const E2E: &str = "vllm:e2e_request_latency_seconds";
    pub const QUEUE_TIME: &str = "vllm:request_queue_time_seconds";
    pub const PREFILL_TIME: &str = "vllm:request_prefill_time_seconds";
    pub const DECODE_TIME: &str = "vllm:request_decode_time_seconds";
    pub const PROMPT_LENGTH: &str = "vllm:request_prompt_tokens";
    pub const OUTPUT_LENGTH: &str = "vllm:request_generation_tokens";
    pub const SPEC_DRAFTS: &str = "vllm:spec_decode_num_drafts";
    pub const SPEC_DRAFT_TOKENS: &str = "vllm:spec_decode_num_draft_tokens";
    pub const SPEC_ACCEPTED_TOKENS: &str = "vllm:spec_decode_num_accepted_tokens";
}

/// The KV-cache configuration from `vllm:cache_config_info`'s labels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CacheConfig {
    pub block_size: Option<f64>,
    pub num_gpu_blocks: Option<f64>,
    pub enable_prefix_caching: Option<bool>,
    pub cache_dtype: Option<String>,
    /// `num_gpu_blocks × block_size`: how many tokens the KV pool holds.
    pub capacity_tokens: Option<f64>,
}

/// Gauge statistics of the three scheduler gauges, read from the same samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GaugeWindow {
    pub running: Option<GaugeStats>,
    pub waiting: Option<GaugeStats>,
    /// KV-cache usage as a fraction 0..1.
    pub kv_usage: Option<GaugeStats>,
}

/// Request completions in the window by `finished_reason`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Completions {
    pub total: f64,
    pub stop: f64,
    pub length: f64,
    pub abort: f64,
    pub error: f64,
}

/// Everything measured over the window. Latencies are in seconds, lengths in tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowMetrics {
    pub window_seconds: f64,
    pub gauge_sample_count: usize,
    pub model_names: Vec<String>,
    pub engines: usize,
    pub completions: Option<Completions>,
    pub requests_per_second: Option<f64>,
    pub prompt_tokens_per_second: Option<f64>,
    pub generation_tokens_per_second: Option<f64>,
    pub ttft: Option<Distribution>,
    pub itl: Option<Distribution>,
    pub e2e: Option<Distribution>,
    pub queue_time: Option<Distribution>,
    pub prefill_time: Option<Distribution>,
    pub decode_time: Option<Distribution>,
    pub prompt_length: Option<Distribution>,
    pub output_length: Option<Distribution>,
    /// vLLM's token-length buckets stop at max_model_len, so their largest bound is a lower
    /// bound for it.
    pub max_model_len_at_least: Option<f64>,
    pub gauges: GaugeWindow,
    pub preemptions: Option<f64>,
    pub preemptions_per_second: Option<f64>,
    pub prefix_cache_queries: Option<f64>,
    pub prefix_cache_hits: Option<f64>,
    pub prefix_cache_hit_rate: Option<f64>,
    pub cache_config: Option<CacheConfig>,
    /// Speculative decoding in the window (absent when the server does not speculate).
    pub spec_decode: Option<SpecDecodeWindow>,
}

/// Drafts verified in the window (vLLM's `spec_decode_*` counters).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpecDecodeWindow {
    pub drafts: f64,
    pub draft_tokens: f64,
    pub accepted_tokens: f64,
    /// Accepted over drafted tokens; `None` without drafts.
    pub acceptance_rate: Option<f64>,
    /// vLLM's mean acceptance length: 1 + accepted tokens per draft.
    pub mean_acceptance_length: Option<f64>,
}

impl SpecDecodeWindow {
    fn between(before: &Scrape, after: &Scrape, filter: &SeriesFilter) -> Option<Self> {
        let counter = |name| counter_increase(before, after, name, filter);
        let drafts = counter(names::SPEC_DRAFTS)?;
        let draft_tokens = counter(names::SPEC_DRAFT_TOKENS)?;
        let accepted_tokens = counter(names::SPEC_ACCEPTED_TOKENS)?;
        Some(Self {
            drafts,
            draft_tokens,
            accepted_tokens,
            acceptance_rate: (draft_tokens > 0.0).then(|| accepted_tokens / draft_tokens),
            mean_acceptance_length: (drafts > 0.0).then(|| 1.0 + accepted_tokens / drafts),
        })
    }
}

impl WindowMetrics {
    /// Measures the window `before → after` with `gauge_samples` taken in between (in order).
    pub fn measure(
        before: &Scrape,
        after: &Scrape,
        gauge_samples: &[Scrape],
        elapsed: Duration,
        filter: &SeriesFilter,
    ) -> Self {
        let window_seconds = elapsed.as_secs_f64();
        let per_second = |value: Option<f64>| {
            value.and_then(|value| (window_seconds > 0.0).then(|| value / window_seconds))
        };
        let all_samples: Vec<&Scrape> = std::iter::once(before)
            .chain(gauge_samples.iter())
            .chain(std::iter::once(after))
            .collect();

        let completions = completions(before, after, filter);
        let distribution = |name: &str| {
            HistogramWindow::between(before, after, name, filter).map(|h| Distribution::of(&h))
        };
        let first_distribution = |names: &[&str]| names.iter().find_map(|name| distribution(name));
        let prompt_histogram =
            HistogramWindow::between(before, after, names::PROMPT_LENGTH, filter);
        let max_model_len_at_least = prompt_histogram
            .as_ref()
            .and_then(HistogramWindow::largest_finite_bound);

        let preemptions = counter_increase(before, after, names::PREEMPTIONS, filter);
        let prefix_cache_queries = first_counter(before, after, names::PREFIX_QUERIES, filter);
        let prefix_cache_hits = first_counter(before, after, names::PREFIX_HITS, filter);
        let prefix_cache_hit_rate = match (prefix_cache_hits, prefix_cache_queries) {
            (Some(hits), Some(queries)) if queries > 0.0 => Some(hits / queries),
            _ => None,
        };

        let gauge_series = |read: &dyn Fn(&Scrape) -> Option<f64>| {
            let values: Vec<f64> = all_samples
                .iter()
                .filter_map(|scrape| read(scrape))
                .collect();
            GaugeStats::of(values, window_seconds)
        };
        let gauges = GaugeWindow {
            running: gauge_series(&|scrape| gauge_sum(scrape, names::RUNNING, filter)),
            waiting: gauge_series(&|scrape| gauge_sum(scrape, names::WAITING, filter)),
            kv_usage: gauge_series(&|scrape| {
                names::KV_USAGE
                    .iter()
                    .find_map(|name| gauge_mean(scrape, name, filter))
            }),
        };

        Self {
            window_seconds,
            gauge_sample_count: all_samples.len(),
            model_names: model_names(after),
            engines: engine_count(after, filter),
            requests_per_second: per_second(completions.as_ref().map(|c| c.total)),
            completions,
            prompt_tokens_per_second: per_second(counter_increase(
                before,
                after,
                names::PROMPT_TOKENS,
                filter,
            )),
            generation_tokens_per_second: per_second(counter_increase(
                before,
                after,
                names::GENERATION_TOKENS,
                filter,
            )),
            ttft: distribution(names::TTFT),
            itl: first_distribution(names::ITL),
            e2e: distribution(names::E2E),
            queue_time: distribution(names::QUEUE_TIME),
            prefill_time: distribution(names::PREFILL_TIME),
            decode_time: distribution(names::DECODE_TIME),
            prompt_length: prompt_histogram.as_ref().map(Distribution::of),
            output_length: distribution(names::OUTPUT_LENGTH),
            max_model_len_at_least,
            gauges,
            preemptions_per_second: per_second(preemptions),
            preemptions,
            prefix_cache_queries,
            prefix_cache_hits,
            prefix_cache_hit_rate,
            cache_config: cache_config(after, filter),
            spec_decode: SpecDecodeWindow::between(before, after, filter),
        }
    }

    /// Whether the window saw any request activity at all.
    pub fn saw_traffic(&self) -> bool {
        let completed = self.completions.as_ref().is_some_and(|c| c.total > 0.0);
        let running = self.gauges.running.as_ref().is_some_and(|r| r.max > 0.0);
        let waiting = self.gauges.waiting.as_ref().is_some_and(|w| w.max > 0.0);
        completed || running || waiting
    }
}

fn first_counter(
    before: &Scrape,
    after: &Scrape,
    names: &[&str],
    filter: &SeriesFilter,
) -> Option<f64> {
    names
        .iter()
        .find_map(|name| counter_increase(before, after, name, filter))
}

fn completions(before: &Scrape, after: &Scrape, filter: &SeriesFilter) -> Option<Completions> {
    let by_reason = |reason: &'static str| {
        counter_increase_where(before, after, names::REQUEST_SUCCESS, filter, |labels| {
            labels.get("finished_reason") == Some(reason)
        })
        .unwrap_or(0.0)
    };
    Some(Completions {
        total: counter_increase(before, after, names::REQUEST_SUCCESS, filter)?,
        stop: by_reason("stop"),
        length: by_reason("length"),
        abort: by_reason("abort"),
        error: by_reason("error"),
    })
}

fn cache_config(scrape: &Scrape, filter: &SeriesFilter) -> Option<CacheConfig> {
    let sample = scrape.samples_named(names::CACHE_CONFIG).find(|sample| {
        filter.matches(&sample.labels) || sample.labels.get("model_name").is_none()
    })?;
    let number = |label: &str| {
        sample
            .labels
            .get(label)
            .and_then(|text| text.parse::<f64>().ok())
            .filter(|value| value.is_finite())
    };
    let block_size = number("block_size");
    let num_gpu_blocks = number("num_gpu_blocks");
    let enable_prefix_caching = sample.labels.get("enable_prefix_caching").and_then(|text| {
        match text.to_ascii_lowercase().as_str() {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        }
    });
    Some(CacheConfig {
        block_size,
        num_gpu_blocks,
        enable_prefix_caching,
        cache_dtype: sample.labels.get("cache_dtype").map(str::to_owned),
        capacity_tokens: block_size
            .zip(num_gpu_blocks)
            .map(|(size, blocks)| size * blocks),
    })
}

fn model_names(scrape: &Scrape) -> Vec<String> {
    let models: BTreeSet<&str> = scrape
        .families()
        .iter()
        .filter(|family| family.name.starts_with("vllm:"))
        .flat_map(|family| &family.samples)
        .filter_map(|sample| sample.labels.get("model_name"))
        .collect();
    models.into_iter().map(str::to_owned).collect()
}

fn engine_count(scrape: &Scrape, filter: &SeriesFilter) -> usize {
    let engines: BTreeSet<&str> = scrape
        .samples_named(names::RUNNING)
        .filter(|sample| filter.matches(&sample.labels))
        .map(|sample| sample.labels.get("engine").unwrap_or("0"))
        .collect();
    engines.len()
}
