//! Pathology detectors (seed article 002's catalogue, with 000's split of high TTFT into
//! queueing vs long prefills). Each detector reads the measurements and the shared facts and
//! returns a finding with its evidence, or nothing.

use crate::measure::WindowMetrics;
use crate::report::{Evidence, Pathology, PathologyFinding, Unit, Verdict};
use crate::steps::{Facts, LatencyStatus};
use crate::thresholds::*;

pub(crate) fn detect(metrics: &WindowMetrics, facts: &Facts) -> Vec<PathologyFinding> {
    [
        kv_cache_thrashing(metrics, facts),
        prefill_starvation(metrics, facts),
        under_utilisation(metrics, facts),
        block_leak(metrics, facts),
        prefix_cache_misses(metrics, facts),
        poor_spec_acceptance(metrics),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn finding(
    pathology: Pathology,
    severity: Verdict,
    summary: String,
    evidence: Vec<Evidence>,
) -> PathologyFinding {
    PathologyFinding {
        pathology,
        title: pathology.title().to_owned(),
        severity,
        summary,
        evidence,
    }
}

fn kv_evidence(facts: &Facts) -> Vec<Evidence> {
    let mut evidence = Vec::new();
    if let Some(mean) = facts.kv_mean {
        evidence.push(Evidence::percent("kv_usage_mean", "KV usage mean", mean));
    }
    if let Some(max) = facts.kv_max {
        evidence.push(Evidence::percent("kv_usage_max", "KV usage max", max));
    }
    evidence
}

/// 002 pathology 1: more active sequences than the KV cache holds, so the scheduler preempts
/// and later recomputes them. Signature: high usage and a climbing preemption counter.
fn kv_cache_thrashing(metrics: &WindowMetrics, facts: &Facts) -> Option<PathologyFinding> {
    let high_usage = facts.kv_max.is_some_and(|max| max >= KV_PRESSURE_USAGE);
    if facts.preemptions <= PREEMPTIONS_PROBLEM || !high_usage {
        return None;
    }
    let mut evidence = kv_evidence(facts);
    evidence.push(Evidence::new(
        "preemptions",
        "preemptions",
        facts.preemptions,
        Unit::Count,
    ));
    if let Some(rate) = metrics.preemptions_per_second {
        evidence.push(Evidence::new(
            "preemptions_per_second",
            "preemption rate",
            rate,
            Unit::PerSecond,
        ));
    }
    if let Some(running) = facts.running_max {
        evidence.push(Evidence::new(
            "running_max",
            "running max",
            running,
            Unit::Requests,
        ));
    }
    Some(finding(
        Pathology::KvCacheThrashing,
        Verdict::Problem,
        "the scheduler admits more sequences than the KV cache holds and preempts them to make room"
            .to_owned(),
        evidence,
    ))
}

/// 002 pathology 2 and 000 step 2: TTFT high with ITL normal. With requests waiting the TTFT
/// is queueing time; with nothing waiting it is the prefill itself (long prompts).
fn prefill_starvation(metrics: &WindowMetrics, facts: &Facts) -> Option<PathologyFinding> {
    let decode_normal = matches!(facts.itl, LatencyStatus::Ok | LatencyStatus::NoData);
    if !facts.ttft.is_elevated() || !decode_normal {
        return None;
    }
    let mut evidence = Vec::new();
    if let Some(ttft) = metrics.ttft {
        if let Some(p95) = ttft.p95 {
            evidence.push(Evidence::millis("ttft_p95", "TTFT p95", p95));
        }
    }
    if let Some(p50) = metrics.itl.and_then(|itl| itl.p50) {
        evidence.push(Evidence::millis("itl_p50", "ITL p50", p50));
    }
    evidence.push(Evidence::new(
        "waiting_max",
        "waiting max",
        facts.waiting_max,
        Unit::Requests,
    ));
    let queue_mean = metrics.queue_time.and_then(|d| d.mean);
    let prefill_mean = metrics.prefill_time.and_then(|d| d.mean);
    if let Some(queue) = queue_mean {
        evidence.push(Evidence::millis(
            "queue_time_mean",
            "queue time mean",
            queue,
        ));
    }
    if let Some(prefill) = prefill_mean {
        evidence.push(Evidence::millis(
            "prefill_time_mean",
            "prefill time mean",
            prefill,
        ));
    }
    if let Some(p95) = facts.prompt_p95 {
        evidence.push(Evidence::new(
            "prompt_tokens_p95",
            "ISL p95",
            p95,
            Unit::Tokens,
        ));
    }
    // The queue/prefill histograms split TTFT directly; the waiting gauge is the article's test.
    let queue_dominates = matches!(
        (queue_mean, prefill_mean),
        (Some(queue), Some(prefill)) if queue > prefill
    );
    let severity = facts.ttft.verdict();
    if facts.sustained_queue || (facts.waiting_max > 0.0 && queue_dominates) {
        Some(finding(
            Pathology::PrefillQueueing,
            severity,
            "TTFT is high with ITL normal while requests wait: the first token waits in the queue"
                .to_owned(),
            evidence,
        ))
    } else {
        Some(finding(
            Pathology::LongPrefills,
            severity,
            "TTFT is high with ITL normal and no queue: the prefill itself is slow (long prompts, compute-bound)"
                .to_owned(),
            evidence,
        ))
    }
}

/// 002 pathology 3: the batch stays small with no queue and memory mostly idle while latency
/// is fine: capacity is paid for and not used.
fn under_utilisation(metrics: &WindowMetrics, facts: &Facts) -> Option<PathologyFinding> {
    let running = facts.running_mean?;
    let kv_max = facts.kv_max?;
    let latency_fine = !facts.ttft.is_elevated() && !facts.itl.is_elevated();
    if !facts.traffic
        || facts.completed <= 0.0
        || facts.waiting_max > 0.0
        || running >= UNDERUSED_RUNNING
        || kv_max >= UNDERUSED_KV_USAGE
        || !latency_fine
    {
        return None;
    }
    let mut evidence = vec![
        Evidence::new("running_mean", "running mean", running, Unit::Requests),
        Evidence::new(
            "waiting_max",
            "waiting max",
            facts.waiting_max,
            Unit::Requests,
        ),
        Evidence::percent("kv_usage_max", "KV usage max", kv_max),
    ];
    if let Some(rate) = metrics.requests_per_second {
        evidence.push(Evidence::new(
            "requests_per_second",
            "throughput",
            rate,
            Unit::RequestsPerSecond,
        ));
    }
    Some(finding(
        Pathology::UnderUtilisation,
        Verdict::Warning,
        "small batches, no queue and mostly idle KV memory: the server could take far more load"
            .to_owned(),
        evidence,
    ))
}

/// 002 pathology 4: KV blocks that no request holds. Either usage stays above zero while
/// nothing runs or waits, or usage climbs steadily at constant load while the batch turns over
/// (so the growth cannot be the same requests' contexts getting longer).
fn block_leak(metrics: &WindowMetrics, facts: &Facts) -> Option<PathologyFinding> {
    let gauges = &metrics.gauges;
    let (running, waiting, usage) = (
        gauges.running.as_ref()?,
        gauges.waiting.as_ref()?,
        gauges.kv_usage.as_ref()?,
    );
    let idle = running.max == 0.0 && waiting.max == 0.0;
    // One block of tolerance: a pool that reserves a block (vLLM's null block) must not read
    // as leaking.
    let one_block = metrics
        .cache_config
        .as_ref()
        .and_then(|config| config.num_gpu_blocks)
        .filter(|blocks| *blocks > 0.0)
        .map_or(0.0, |blocks| 1.0 / blocks);
    if idle && usage.min > LEAK_IDLE_USAGE.max(one_block) {
        return Some(finding(
            Pathology::BlockLeak,
            Verdict::Problem,
            "KV blocks stay allocated while no request runs or waits".to_owned(),
            vec![
                Evidence::percent("kv_usage_min", "KV usage min", usage.min),
                Evidence::new("running_max", "running max", running.max, Unit::Requests),
                Evidence::new("waiting_max", "waiting max", waiting.max, Unit::Requests),
            ],
        ));
    }
    let rise = usage.last - usage.first;
    // Constant load: the running count moves by at most one request or 10% of its mean.
    let constant_load = running.max - running.min <= (0.1 * running.mean).max(1.0);
    // Turned over: at least as many requests finished as the batch holds.
    let turned_over = facts.completed >= running.mean.max(1.0);
    let steady_rise =
        usage.samples.len() >= 3 && usage.is_non_decreasing() && rise >= LEAK_MIN_RISE;
    if !steady_rise
        || !constant_load
        || !turned_over
        || waiting.max > 0.0
        || facts.preemptions > 0.0
    {
        return None;
    }
    Some(finding(
        Pathology::BlockLeak,
        Verdict::Warning,
        "KV usage climbs steadily at constant load while requests complete: blocks are not freed"
            .to_owned(),
        vec![
            Evidence::percent("kv_usage_first", "KV usage at start", usage.first),
            Evidence::percent("kv_usage_last", "KV usage at end", usage.last),
            Evidence::new(
                "kv_usage_slope",
                "KV usage slope",
                usage.slope_per_second * 100.0 * 60.0,
                Unit::PercentPointsPerMinute,
            ),
            Evidence::new("running_mean", "running mean", running.mean, Unit::Requests),
            Evidence::new(
                "requests_completed",
                "completed",
                facts.completed,
                Unit::Requests,
            ),
        ],
    ))
}

/// 002 pathology 5: prefix caching on, hit rate near zero, with prompts long enough to share
/// whole blocks.
fn prefix_cache_misses(metrics: &WindowMetrics, facts: &Facts) -> Option<PathologyFinding> {
    let config = metrics.cache_config.as_ref()?;
    let hit_rate = metrics.prefix_cache_hit_rate?;
    let block_size = config.block_size.unwrap_or(16.0);
    let prompt_p50 = metrics.prompt_length.and_then(|d| d.p50)?;
    let cacheable = prompt_p50 >= PREFIX_MIN_PROMPT_BLOCKS * block_size;
    if config.enable_prefix_caching != Some(true) || hit_rate >= PREFIX_MISS_HIT_RATE || !cacheable
    {
        return None;
    }
    let mut evidence = vec![
        Evidence::percent("prefix_cache_hit_rate", "prefix hit rate", hit_rate),
        Evidence::new("prompt_tokens_p50", "ISL p50", prompt_p50, Unit::Tokens),
    ];
    if let Some(queries) = metrics.prefix_cache_queries {
        evidence.push(Evidence::new(
            "prefix_cache_queries",
            "queried",
            queries,
            Unit::Tokens,
        ));
    }
    if let Some(ttft) = metrics.ttft.and_then(|d| d.p95) {
        evidence.push(Evidence::millis("ttft_p95", "TTFT p95", ttft));
    }
    let severity = if facts.ttft.is_elevated() {
        Verdict::Warning.max(facts.ttft.verdict())
    } else {
        Verdict::Warning
    };
    Some(finding(
        Pathology::PrefixCacheMisses,
        severity,
        "prefix caching is on but prompts share almost no cached blocks".to_owned(),
        evidence,
    ))
}

/// Speculative decoding whose drafts are mostly rejected: every verification computes rows
/// that are thrown away, and the skip rule backs requests off only one at a time, so below
/// [`SPEC_POOR_ACCEPTANCE`] over at least [`SPEC_MIN_DRAFT_TOKENS`] drafted tokens the workload
/// is not one speculation helps (open-ended text rather than input-grounded edits or quotes).
fn poor_spec_acceptance(metrics: &WindowMetrics) -> Option<PathologyFinding> {
    let spec = metrics.spec_decode?;
    let rate = spec.acceptance_rate?;
    if spec.draft_tokens < SPEC_MIN_DRAFT_TOKENS || rate >= SPEC_POOR_ACCEPTANCE {
        return None;
    }
    let mut evidence = vec![
        Evidence::percent("spec_acceptance_rate", "draft acceptance rate", rate),
        Evidence::new(
            "spec_draft_tokens",
            "drafted",
            spec.draft_tokens,
            Unit::Tokens,
        ),
    ];
    if let Some(length) = spec.mean_acceptance_length {
        evidence.push(Evidence::new(
            "spec_mean_acceptance_length",
            "mean acceptance length",
            length,
            Unit::Tokens,
        ));
    }
    Some(finding(
        Pathology::PoorSpecAcceptance,
        Verdict::Warning,
        "speculative decoding is on but most draft tokens are rejected".to_owned(),
        evidence,
    ))
}
