//! The five-step method of seed article 000: symptom, saturation, KV-cache health, sequence
//! lengths, deployment shape. Each step reads the window's measurements and gives a verdict
//! with its evidence; the derived facts are shared with the pathology detectors.

use crate::measure::WindowMetrics;
use crate::report::{Evidence, Step, StepReport, Symptom, Unit, Verdict};
use crate::thresholds::*;
use crate::window::Distribution;
use crate::TriageConfig;

/// How one latency compares with its objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LatencyStatus {
    NoData,
    Ok,
    /// p95 above the objective, median within: the tail misses it.
    Tail,
    /// The median misses the objective.
    Median,
}

impl LatencyStatus {
    fn of(distribution: Option<&Distribution>, target_seconds: f64) -> Self {
        let Some(distribution) = distribution.filter(|d| d.has_data()) else {
            return Self::NoData;
        };
        let over = |quantile: Option<f64>| quantile.is_some_and(|value| value > target_seconds);
        if over(distribution.p50) {
            Self::Median
        } else if over(distribution.p95) {
            Self::Tail
        } else {
            Self::Ok
        }
    }

    pub(crate) fn verdict(self) -> Verdict {
        match self {
            Self::NoData | Self::Ok => Verdict::Ok,
            Self::Tail => Verdict::Warning,
            Self::Median => Verdict::Problem,
        }
    }

    pub(crate) fn is_elevated(self) -> bool {
        matches!(self, Self::Tail | Self::Median)
    }
}

/// Facts derived once from the measurements and shared by steps, pathologies and advice.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    pub ttft_target: f64,
    pub itl_target: f64,
    pub ttft: LatencyStatus,
    pub itl: LatencyStatus,
    pub e2e: LatencyStatus,
    pub symptom: Symptom,
    pub traffic: bool,
    pub completed: f64,
    pub running_mean: Option<f64>,
    pub running_max: Option<f64>,
    pub waiting_max: f64,
    /// Requests waited at every sample of the window.
    pub sustained_queue: bool,
    pub kv_mean: Option<f64>,
    pub kv_max: Option<f64>,
    pub preemptions: f64,
    /// `Some(n)` when the running batch sat at `n` while requests waited, KV had room and
    /// nothing was preempted: then `n` is max_num_seqs.
    pub max_num_seqs_exact: Option<f64>,
    /// KV pool size in tokens over the tokens of a p95 request (prompt + output).
    pub concurrency_at_p95: Option<f64>,
    pub prompt_p95: Option<f64>,
    pub output_p95: Option<f64>,
}

impl Facts {
    pub(crate) fn derive(metrics: &WindowMetrics, config: &TriageConfig) -> Self {
        let ttft_target = config
            .slo_ttft
            .map_or(DEFAULT_TTFT_TARGET_SECONDS, |slo| slo.as_secs_f64());
        let itl_target = config
            .slo_itl
            .map_or(DEFAULT_ITL_TARGET_SECONDS, |slo| slo.as_secs_f64());
        let ttft = LatencyStatus::of(metrics.ttft.as_ref(), ttft_target);
        let itl = LatencyStatus::of(metrics.itl.as_ref(), itl_target);
        let e2e = LatencyStatus::of(metrics.e2e.as_ref(), DEFAULT_E2E_TARGET_SECONDS);
        let traffic = metrics.saw_traffic();
        let symptom = match (traffic, ttft.is_elevated(), itl.is_elevated()) {
            (false, _, _) => Symptom::NoTraffic,
            (true, true, true) => Symptom::TtftAndItl,
            (true, true, false) => Symptom::Ttft,
            (true, false, true) => Symptom::Itl,
            (true, false, false) if e2e.is_elevated() => Symptom::E2eOnly,
            (true, false, false) => Symptom::None,
        };
        let gauges = &metrics.gauges;
        let waiting = gauges.waiting.as_ref();
        let prompt_p95 = metrics.prompt_length.and_then(|d| d.p95);
        let output_p95 = metrics.output_length.and_then(|d| d.p95);
        let capacity = metrics
            .cache_config
            .as_ref()
            .and_then(|config| config.capacity_tokens);
        let concurrency_at_p95 = match (capacity, prompt_p95, output_p95) {
            (Some(capacity), Some(prompt), output) if prompt + output.unwrap_or(0.0) > 0.0 => {
                Some(capacity / (prompt + output.unwrap_or(0.0)))
            }
            _ => None,
        };
        Self {
            ttft_target,
            itl_target,
            ttft,
            itl,
            e2e,
            symptom,
            traffic,
            completed: metrics.completions.as_ref().map_or(0.0, |c| c.total),
            running_mean: gauges.running.as_ref().map(|r| r.mean),
            running_max: gauges.running.as_ref().map(|r| r.max),
            waiting_max: waiting.map_or(0.0, |w| w.max),
            sustained_queue: waiting.is_some_and(|w| w.min > SATURATION_WAITING),
            kv_mean: gauges.kv_usage.as_ref().map(|k| k.mean),
            kv_max: gauges.kv_usage.as_ref().map(|k| k.max),
            preemptions: metrics.preemptions.unwrap_or(0.0),
            max_num_seqs_exact: batch_cap(metrics),
            concurrency_at_p95,
            prompt_p95,
            output_p95,
        }
    }

    pub(crate) fn kv_headroom(&self) -> bool {
        self.kv_mean.is_some_and(|usage| usage < KV_PRESSURE_USAGE)
    }
}

/// The running count at which the batch stopped growing while requests waited although the KV
/// cache had room: the scheduler's max_num_seqs. A preemption in the window means the cache did
/// run out between the sampled gauges (the gauge is sampled, preemption is not), so the cap then
/// is memory, not max_num_seqs.
fn batch_cap(metrics: &WindowMetrics) -> Option<f64> {
    if metrics.preemptions.unwrap_or(0.0) > PREEMPTIONS_PROBLEM {
        return None;
    }
    let gauges = &metrics.gauges;
    let (running, waiting, usage) = (
        gauges.running.as_ref()?,
        gauges.waiting.as_ref()?,
        gauges.kv_usage.as_ref()?,
    );
    let aligned = running.samples.len() == waiting.samples.len()
        && running.samples.len() == usage.samples.len();
    if !aligned || running.max <= 0.0 {
        return None;
    }
    let capped = running
        .samples
        .iter()
        .zip(&waiting.samples)
        .zip(&usage.samples)
        .any(|((&running_now, &waiting_now), &usage_now)| {
            running_now == running.max && waiting_now > 0.0 && usage_now < KV_PRESSURE_USAGE
        });
    capped.then_some(running.max)
}

pub(crate) fn assess(metrics: &WindowMetrics, facts: &Facts) -> Vec<StepReport> {
    vec![
        symptom(metrics, facts),
        saturation(metrics, facts),
        kv_cache(metrics, facts),
        sequence_lengths(metrics, facts),
        deployment_shape(metrics, facts),
    ]
}

fn push_latency(evidence: &mut Vec<Evidence>, key: &str, label: &str, d: Option<&Distribution>) {
    let Some(d) = d.filter(|d| d.has_data()) else {
        return;
    };
    for (suffix, value) in [("p50", d.p50), ("p95", d.p95)] {
        if let Some(value) = value {
            evidence.push(Evidence::millis(
                &format!("{key}_{suffix}"),
                &format!("{label} {suffix}"),
                value,
            ));
        }
    }
}

fn symptom(metrics: &WindowMetrics, facts: &Facts) -> StepReport {
    let mut evidence = Vec::new();
    push_latency(&mut evidence, "ttft", "TTFT", metrics.ttft.as_ref());
    if facts.ttft != LatencyStatus::NoData {
        evidence.push(Evidence::millis(
            "ttft_target",
            "TTFT target",
            facts.ttft_target,
        ));
    }
    push_latency(&mut evidence, "itl", "ITL", metrics.itl.as_ref());
    if facts.itl != LatencyStatus::NoData {
        evidence.push(Evidence::millis(
            "itl_target",
            "ITL target",
            facts.itl_target,
        ));
    }
    if let Some(e2e) = metrics.e2e.filter(|d| d.has_data()) {
        if let Some(p50) = e2e.p50 {
            evidence.push(Evidence::new("e2e_p50", "E2E p50", p50, Unit::Seconds));
        }
        if let Some(p95) = e2e.p95 {
            evidence.push(Evidence::new("e2e_p95", "E2E p95", p95, Unit::Seconds));
        }
    }
    if let Some(completions) = &metrics.completions {
        evidence.push(Evidence::new(
            "requests_completed",
            "completed",
            completions.total,
            Unit::Requests,
        ));
    }
    let summary = match facts.symptom {
        Symptom::NoTraffic => "no requests in the window: nothing to diagnose in latency",
        Symptom::None => "latencies within their targets",
        Symptom::Ttft => "TTFT is the symptom, ITL normal: time goes before the first token (queueing or prefill)",
        Symptom::Itl => "ITL is the symptom, TTFT normal: decode is slow (batch size, bandwidth, prefill interference)",
        Symptom::TtftAndItl => "TTFT and ITL both miss their targets: the server is overloaded end to end",
        Symptom::E2eOnly => "TTFT and ITL fine but end-to-end latency long: long outputs",
    };
    StepReport {
        step: Step::Symptom,
        verdict: facts
            .ttft
            .verdict()
            .max(facts.itl.verdict())
            .max(facts.e2e.verdict()),
        summary: summary.to_owned(),
        evidence,
    }
}

fn saturation(metrics: &WindowMetrics, facts: &Facts) -> StepReport {
    let gauges = &metrics.gauges;
    let mut evidence = Vec::new();
    if let Some(running) = &gauges.running {
        evidence.push(Evidence::new(
            "running_mean",
            "running mean",
            running.mean,
            Unit::Requests,
        ));
        evidence.push(Evidence::new(
            "running_max",
            "running max",
            running.max,
            Unit::Requests,
        ));
    }
    if let Some(waiting) = &gauges.waiting {
        evidence.push(Evidence::new(
            "waiting_min",
            "waiting min",
            waiting.min,
            Unit::Requests,
        ));
        evidence.push(Evidence::new(
            "waiting_max",
            "waiting max",
            waiting.max,
            Unit::Requests,
        ));
    }
    // The mean is exact (sum / count); a quantile of the queue-time histogram is not, since
    // its first bucket ends at 300 ms.
    if let Some(mean) = metrics
        .queue_time
        .filter(|d| d.has_data())
        .and_then(|d| d.mean)
    {
        evidence.push(Evidence::millis("queue_time_mean", "queue time mean", mean));
    }
    if let Some(rate) = metrics.requests_per_second {
        evidence.push(Evidence::new(
            "requests_per_second",
            "throughput",
            rate,
            Unit::RequestsPerSecond,
        ));
    }
    if let Some(rate) = metrics.generation_tokens_per_second {
        evidence.push(Evidence::new(
            "generation_tokens_per_second",
            "generation",
            rate,
            Unit::TokensPerSecond,
        ));
    }
    let (verdict, mut summary) = if gauges.waiting.is_none() {
        (
            Verdict::Ok,
            "no num_requests_waiting gauge exposed".to_owned(),
        )
    } else if facts.sustained_queue {
        (
            Verdict::Problem,
            "saturated: requests waited at every sample".to_owned(),
        )
    } else if facts.waiting_max > 0.0 {
        (
            Verdict::Warning,
            "transient queueing: requests waited at some samples".to_owned(),
        )
    } else {
        (Verdict::Ok, "not saturated: no request waited".to_owned())
    };
    if let Some(cap) = facts.max_num_seqs_exact {
        summary.push_str(&format!(
            "; the batch is pinned at {} running while KV has room (max_num_seqs)",
            crate::report::format_number(cap)
        ));
    }
    StepReport {
        step: Step::Saturation,
        verdict,
        summary,
        evidence,
    }
}

fn kv_cache(metrics: &WindowMetrics, facts: &Facts) -> StepReport {
    let mut evidence = Vec::new();
    if let Some(usage) = &metrics.gauges.kv_usage {
        evidence.push(Evidence::percent(
            "kv_usage_mean",
            "KV usage mean",
            usage.mean,
        ));
        evidence.push(Evidence::percent("kv_usage_max", "KV usage max", usage.max));
    }
    if let Some(preemptions) = metrics.preemptions {
        evidence.push(Evidence::new(
            "preemptions",
            "preemptions",
            preemptions,
            Unit::Count,
        ));
    }
    if let Some(rate) = metrics.preemptions_per_second.filter(|rate| *rate > 0.0) {
        evidence.push(Evidence::new(
            "preemptions_per_second",
            "preemption rate",
            rate,
            Unit::PerSecond,
        ));
    }
    if let Some(capacity) = metrics
        .cache_config
        .as_ref()
        .and_then(|c| c.capacity_tokens)
    {
        evidence.push(Evidence::new(
            "kv_capacity_tokens",
            "KV capacity",
            capacity,
            Unit::Tokens,
        ));
    }
    if let Some(concurrency) = facts.concurrency_at_p95 {
        evidence.push(Evidence::new(
            "concurrency_at_p95_request",
            "fits p95 requests",
            concurrency,
            Unit::Times,
        ));
    }
    if let Some(rate) = metrics.prefix_cache_hit_rate {
        evidence.push(Evidence::percent(
            "prefix_cache_hit_rate",
            "prefix hit rate",
            rate,
        ));
    }
    let kv_mean = facts.kv_mean.unwrap_or(0.0);
    let (verdict, summary) = if facts.preemptions > PREEMPTIONS_PROBLEM {
        (
            Verdict::Problem,
            "requests were preempted: the KV cache ran out of blocks".to_owned(),
        )
    } else if kv_mean >= KV_CRITICAL_USAGE {
        (
            Verdict::Problem,
            "KV cache nearly full throughout the window".to_owned(),
        )
    } else if kv_mean >= KV_PRESSURE_USAGE {
        (
            Verdict::Warning,
            "KV-cache pressure: usage at or above 90% on average".to_owned(),
        )
    } else if facts
        .concurrency_at_p95
        .is_some_and(|concurrency| concurrency < MIN_CONCURRENCY_AT_P95)
    {
        (
            Verdict::Warning,
            "KV pool holds fewer than two p95-sized requests".to_owned(),
        )
    } else if metrics.gauges.kv_usage.is_none() {
        (Verdict::Ok, "no KV usage gauge exposed".to_owned())
    } else {
        (
            Verdict::Ok,
            "KV cache healthy: below 90% and no preemptions".to_owned(),
        )
    };
    StepReport {
        step: Step::KvCache,
        verdict,
        summary,
        evidence,
    }
}

fn sequence_lengths(metrics: &WindowMetrics, facts: &Facts) -> StepReport {
    let mut evidence = Vec::new();
    for (key, label, distribution) in [
        ("prompt_tokens", "ISL", metrics.prompt_length),
        ("output_tokens", "OSL", metrics.output_length),
    ] {
        let Some(distribution) = distribution.filter(|d| d.has_data()) else {
            continue;
        };
        let quantiles = [
            ("mean", distribution.mean),
            ("p50", distribution.p50),
            ("p95", distribution.p95),
        ];
        for (suffix, value) in quantiles {
            if let Some(value) = value {
                evidence.push(Evidence::new(
                    &format!("{key}_{suffix}"),
                    &format!("{label} {suffix}"),
                    value,
                    Unit::Tokens,
                ));
            }
        }
    }
    let length_share = metrics
        .completions
        .as_ref()
        .filter(|c| c.total > 0.0)
        .map(|c| c.length / c.total);
    if let Some(share) = length_share {
        evidence.push(Evidence::percent(
            "finished_by_length",
            "finished by length",
            share,
        ));
    }
    let long_prompts = facts.prompt_p95.is_some_and(|p95| p95 > LONG_PROMPT_TOKENS);
    let long_outputs = facts.output_p95.is_some_and(|p95| p95 > LONG_OUTPUT_TOKENS);
    let mut notes = Vec::new();
    let mut verdict = Verdict::Ok;
    if long_prompts && facts.ttft.is_elevated() {
        verdict = Verdict::Warning;
        notes.push("long prompts (p95 over 1,000 tokens) explain part of the TTFT");
    }
    if long_outputs && facts.e2e.is_elevated() {
        verdict = Verdict::Warning;
        notes.push("long outputs (p95 over 1,000 tokens) explain the E2E latency");
    }
    if length_share.is_some_and(|share| share > TRUNCATED_OUTPUT_SHARE) {
        notes.push("most requests stop at max_tokens");
    }
    let summary = if evidence.is_empty() {
        "no completed requests to measure".to_owned()
    } else if notes.is_empty() {
        "request lengths do not explain the latency".to_owned()
    } else {
        notes.join("; ")
    };
    StepReport {
        step: Step::SequenceLengths,
        verdict,
        summary,
        evidence,
    }
}

fn deployment_shape(metrics: &WindowMetrics, facts: &Facts) -> StepReport {
    let mut evidence = vec![Evidence::new(
        "engines",
        "engines",
        metrics.engines as f64,
        Unit::Count,
    )];
    let mut parts = Vec::new();
    if let Some(config) = &metrics.cache_config {
        parts.push(match config.enable_prefix_caching {
            Some(true) => "prefix caching on".to_owned(),
            Some(false) => "prefix caching off".to_owned(),
            None => "prefix caching unknown".to_owned(),
        });
        if let Some(dtype) = &config.cache_dtype {
            parts.push(format!("KV dtype {dtype}"));
        }
        if let Some(blocks) = config.num_gpu_blocks {
            evidence.push(Evidence::new(
                "num_gpu_blocks",
                "KV blocks",
                blocks,
                Unit::Blocks,
            ));
        }
        if let Some(size) = config.block_size {
            evidence.push(Evidence::new(
                "block_size",
                "block size",
                size,
                Unit::Tokens,
            ));
        }
    } else {
        parts.push("cache_config_info not exposed".to_owned());
    }
    match (facts.max_num_seqs_exact, facts.running_max) {
        (Some(cap), _) => {
            evidence.push(Evidence::new(
                "max_num_seqs",
                "max_num_seqs ≈",
                cap,
                Unit::Count,
            ));
            parts.push("max_num_seqs inferred from the pinned batch".to_owned());
        }
        (None, Some(running)) if running > 0.0 => {
            evidence.push(Evidence::new(
                "max_num_seqs_at_least",
                "max_num_seqs ≥",
                running,
                Unit::Count,
            ));
        }
        _ => {}
    }
    if let Some(length) = metrics.max_model_len_at_least {
        evidence.push(Evidence::new(
            "max_model_len_at_least",
            "max_model_len ≥",
            length,
            Unit::Tokens,
        ));
    }
    // No cap is inferred from a window with preemptions (see `batch_cap`).
    let capped_with_room = facts.max_num_seqs_exact.is_some() && facts.kv_headroom();
    let verdict = if capped_with_room {
        parts.push("max_num_seqs, not KV memory, limits the batch".to_owned());
        Verdict::Warning
    } else {
        Verdict::Ok
    };
    StepReport {
        step: Step::DeploymentShape,
        verdict,
        summary: parts.join(", "),
        evidence,
    }
}
