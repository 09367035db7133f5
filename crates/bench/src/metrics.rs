//! Turning per-request records into vLLM's summary numbers: percentiles with numpy's default
//! (linear) interpolation, TPOT, goodput, peak throughput and peak concurrency.

use crate::args::GoodputSlo;
use crate::client::RequestOutcome;

/// numpy.percentile(values, p) with the default "linear" method; 0.0 for no values, as vLLM
/// computes `np.percentile(values or 0, p)`.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile_of_sorted(&sorted, p)
}

fn percentile_of_sorted(sorted: &[f64], p: f64) -> f64 {
    let Some(&first) = sorted.first() else {
        return 0.0;
    };
    let rank = (sorted.len() - 1) as f64 * (p / 100.0);
    let below = rank.floor();
    let lower_index = below as usize;
    if lower_index + 1 >= sorted.len() {
        return sorted.last().copied().unwrap_or(first);
    }
    let fraction = rank - below;
    let (low, high) = (sorted[lower_index], sorted[lower_index + 1]);
    // numpy's _lerp: interpolate from the nearer end so results are monotone and exact at 1.
    let diff = high - low;
    if fraction >= 0.5 {
        high - diff * (1.0 - fraction)
    } else {
        low + diff * fraction
    }
}

/// numpy.mean; 0.0 for no values.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// numpy.std (population, ddof = 0); 0.0 for no values.
pub fn std_dev(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let center = mean(values);
    let variance = values
        .iter()
        .map(|v| (v - center) * (v - center))
        .sum::<f64>()
        / values.len() as f64;
    variance.sqrt()
}

/// Summary of one latency metric, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    pub mean_ms: f64,
    pub median_ms: f64,
    pub std_ms: f64,
    /// (percentile, value in ms) for each selected percentile.
    pub percentiles_ms: Vec<(f64, f64)>,
}

impl Distribution {
    /// Summarizes values given in seconds.
    pub fn from_seconds(values: &[f64], percentiles: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Distribution {
            mean_ms: mean(values) * 1000.0,
            median_ms: percentile_of_sorted(&sorted, 50.0) * 1000.0,
            std_ms: std_dev(values) * 1000.0,
            percentiles_ms: percentiles
                .iter()
                .map(|&p| (p, percentile_of_sorted(&sorted, p) * 1000.0))
                .collect(),
        }
    }

    /// The value at percentile `p` if it was selected.
    pub fn at(&self, p: f64) -> Option<f64> {
        self.percentiles_ms
            .iter()
            .find(|(q, _)| (q - p).abs() < 1e-9)
            .map(|&(_, v)| v)
    }
}

/// What vLLM's `calculate_metrics` returns for a generation benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchmarkMetrics {
    pub completed: usize,
    pub failed: usize,
    pub total_input: usize,
    pub total_output: usize,
    pub request_throughput: f64,
    pub request_goodput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub ttft: Distribution,
    pub tpot: Distribution,
    pub itl: Distribution,
    pub e2el: Distribution,
    /// Time requests waited for the client's concurrency limit (only with --max-concurrency).
    pub client_queue_time: Option<Distribution>,
    /// E2E latency plus client queueing (only with --max-concurrency and a finite rate).
    pub e2el_including_client_queue: Option<Distribution>,
    /// Most output tokens that arrived within one wall-clock second of the run.
    pub max_output_tokens_per_s: f64,
    /// Most requests in flight at one instant.
    pub max_concurrent_requests: usize,
    /// Output length per request (0 for a failed one), in input order.
    pub actual_output_lens: Vec<usize>,
}

/// Time per output token after the first: (latency − ttft) / (output_len − 1), or `None` for
/// a single-token answer.
pub fn time_per_output_token(latency: f64, ttft: f64, output_len: usize) -> Option<f64> {
    (output_len > 1).then(|| (latency - ttft) / (output_len - 1) as f64)
}

/// The run-level settings the metrics depend on.
#[derive(Debug, Clone, Copy)]
pub struct MetricsContext<'a> {
    pub duration_s: f64,
    pub percentiles: &'a [f64],
    pub goodput: &'a GoodputSlo,
    pub max_concurrency: Option<usize>,
    pub request_rate: f64,
}

/// vLLM's `calculate_metrics` over the outcomes of one run.
pub fn calculate_metrics(
    outcomes: &[RequestOutcome],
    context: MetricsContext<'_>,
) -> BenchmarkMetrics {
    let mut actual_output_lens = Vec::with_capacity(outcomes.len());
    let (mut total_input, mut completed, mut good_completed) = (0usize, 0usize, 0usize);
    let (mut itls, mut tpots, mut ttfts, mut e2els) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for outcome in outcomes {
        if !outcome.success {
            actual_output_lens.push(0);
            continue;
        }
        let output_len = outcome.output_len();
        actual_output_lens.push(output_len);
        total_input += outcome.prompt_len;
        let tpot = time_per_output_token(outcome.latency, outcome.ttft, output_len);
        if let Some(tpot) = tpot {
            tpots.push(tpot);
        }
        itls.extend_from_slice(&outcome.itl);
        ttfts.push(outcome.ttft);
        e2els.push(outcome.latency);
        completed += 1;
        if !context.goodput.is_empty()
            && meets_slo(context.goodput, outcome.ttft, tpot, outcome.latency)
        {
            good_completed += 1;
        }
    }
    let total_output: usize = actual_output_lens.iter().sum();
    let successful: Vec<&RequestOutcome> = outcomes.iter().filter(|o| o.success).collect();
    let (max_output_tokens_per_s, max_concurrent_requests) = peak_activity(&successful);
    let client_queue_time = context.max_concurrency.map(|_| {
        let waits: Vec<f64> = successful.iter().map(|o| o.client_queue_time).collect();
        Distribution::from_seconds(&waits, context.percentiles)
    });
    let e2el_including_client_queue =
        (context.max_concurrency.is_some() && context.request_rate.is_finite()).then(|| {
            let totals: Vec<f64> = successful
                .iter()
                .map(|o| o.latency + o.client_queue_time)
                .collect();
            Distribution::from_seconds(&totals, context.percentiles)
        });
    let duration = context.duration_s;
    BenchmarkMetrics {
        completed,
        failed: outcomes.len() - completed,
        total_input,
        total_output,
        request_throughput: completed as f64 / duration,
        request_goodput: good_completed as f64 / duration,
        output_throughput: total_output as f64 / duration,
        total_token_throughput: (total_input + total_output) as f64 / duration,
        ttft: Distribution::from_seconds(&ttfts, context.percentiles),
        tpot: Distribution::from_seconds(&tpots, context.percentiles),
        itl: Distribution::from_seconds(&itls, context.percentiles),
        e2el: Distribution::from_seconds(&e2els, context.percentiles),
        client_queue_time,
        e2el_including_client_queue,
        max_output_tokens_per_s,
        max_concurrent_requests,
        actual_output_lens,
    }
}

/// A request is good when every given SLO holds; a one-token answer has TPOT 0 (as in vLLM).
fn meets_slo(slo: &GoodputSlo, ttft: f64, tpot: Option<f64>, latency: f64) -> bool {
    let within =
        |limit_ms: Option<f64>, value_s: f64| limit_ms.is_none_or(|ms| ms / 1000.0 >= value_s);
    within(slo.ttft_ms, ttft)
        && within(slo.tpot_ms, tpot.unwrap_or(0.0))
        && within(slo.e2el_ms, latency)
}

/// Peak output tokens in one-second buckets (token times from start + ttft + itl gaps) and
/// the exact peak number of overlapping [start, end) request intervals.
fn peak_activity(successful: &[&RequestOutcome]) -> (f64, usize) {
    let Some(min_start) = successful
        .iter()
        .map(|o| o.start_time)
        .min_by(f64::total_cmp)
    else {
        return (0.0, 0);
    };
    let max_end = successful
        .iter()
        .map(|o| o.start_time + o.latency)
        .fold(min_start, f64::max);
    let buckets = (max_end - min_start).ceil() as usize + 1;
    let mut tokens_per_second = vec![0usize; buckets];
    // A pooling answer (no output tokens) has no token times.
    for outcome in successful.iter().filter(|o| o.output_len() > 0) {
        let mut token_time = outcome.start_time + outcome.ttft;
        let mut times = vec![token_time];
        for gap in &outcome.itl {
            token_time += gap;
            times.push(token_time);
        }
        for time in times {
            let bucket = (time - min_start).floor();
            if bucket >= 0.0 && (bucket as usize) < buckets {
                tokens_per_second[bucket as usize] += 1;
            }
        }
    }
    let mut events: Vec<(f64, i32)> = successful
        .iter()
        .flat_map(|o| [(o.start_time, 1), (o.start_time + o.latency, -1)])
        .collect();
    // Departures sort before arrivals at the same instant: intervals are half-open.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut current, mut peak) = (0i32, 0i32);
    for (_, delta) in events {
        current += delta;
        peak = peak.max(current);
    }
    let max_tokens = tokens_per_second.iter().copied().max().unwrap_or(0);
    (max_tokens as f64, peak.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    // Reference values from numpy 2.4 (np.percentile, default method="linear").
    #[test]
    fn percentile_matches_numpy() {
        let values = [
            0.0123, 0.0456, 0.0099, 0.1200, 0.0333, 0.0501, 0.0777, 0.0250, 0.0610, 0.0042,
        ];
        let expected = [
            (0.0, 0.0042),
            (1.0, 0.004713),
            (25.0, 0.015475000000000001),
            (50.0, 0.03945),
            (90.0, 0.08192999999999999),
            (99.0, 0.116193),
            (99.9, 0.11961930000000005),
            (100.0, 0.12),
        ];
        for (p, want) in expected {
            let got = percentile(&values, p);
            assert!(close(got, want), "p{p}: got {got}, numpy {want}");
        }
        assert!(close(mean(&values), 0.04391));
        assert!(close(std_dev(&values), 0.033863858315319004));
        let small = [5.0, 1.0, 3.0];
        for (p, want) in [(10.0, 1.4), (50.0, 3.0), (75.0, 4.0), (99.0, 4.96)] {
            assert!(close(percentile(&small, p), want), "p{p}");
        }
        assert_eq!(percentile(&[7.5], 99.0), 7.5);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    fn outcome(start: f64, ttft: f64, itl: &[f64], usage_tokens: Option<usize>) -> RequestOutcome {
        RequestOutcome {
            success: true,
            prompt_len: 10,
            output_tokens: usage_tokens,
            content_chunks: itl.len() + 1,
            ttft,
            itl: itl.to_vec(),
            latency: ttft + itl.iter().sum::<f64>(),
            start_time: start,
            client_queue_time: 0.0,
            generated_text: String::new(),
            error: String::new(),
        }
    }

    fn failed() -> RequestOutcome {
        RequestOutcome {
            success: false,
            error: "HTTP 500".into(),
            prompt_len: 10,
            ..outcome(0.0, 0.0, &[], None)
        }
    }

    #[test]
    fn tpot_itl_and_goodput_from_synthetic_records() {
        // r0: ttft 100 ms, 4 tokens, gaps 20/30/40 ms -> latency 190 ms, tpot 30 ms.
        // r1: ttft 300 ms, usage says 3 tokens but only 2 chunks arrived (a merged chunk):
        //     latency 350 ms, tpot = 50/2 = 25 ms.
        // r2: one token only: no TPOT sample, TPOT counts as 0 for goodput.
        let outcomes = vec![
            outcome(0.0, 0.100, &[0.020, 0.030, 0.040], None),
            outcome(0.5, 0.300, &[0.050], Some(3)),
            outcome(1.0, 0.050, &[], None),
            failed(),
        ];
        let slo = GoodputSlo {
            ttft_ms: Some(200.0),
            tpot_ms: Some(40.0),
            e2el_ms: None,
        };
        let metrics = calculate_metrics(
            &outcomes,
            MetricsContext {
                duration_s: 2.0,
                percentiles: &[50.0, 99.0],
                goodput: &slo,
                max_concurrency: None,
                request_rate: f64::INFINITY,
            },
        );
        assert_eq!(metrics.completed, 3);
        assert_eq!(metrics.failed, 1);
        assert_eq!(metrics.actual_output_lens, vec![4, 3, 1, 0]);
        assert_eq!(metrics.total_output, 8);
        assert_eq!(metrics.total_input, 30);
        assert!(close(metrics.output_throughput, 4.0));
        assert!(close(metrics.total_token_throughput, 19.0));
        assert!(close(metrics.request_throughput, 1.5));
        // Good: r0 (ttft 100 <= 200, tpot 30 <= 40) and r2 (ttft 50, tpot 0); r1 has ttft 300.
        assert!(close(metrics.request_goodput, 1.0));
        assert!(
            close(metrics.tpot.mean_ms, 27.5),
            "{}",
            metrics.tpot.mean_ms
        );
        assert!(close(metrics.itl.mean_ms, 35.0));
        assert!(close(metrics.itl.median_ms, 35.0));
        assert!(close(metrics.ttft.median_ms, 100.0));
        assert!(close(metrics.e2el.at(50.0).unwrap_or(f64::NAN), 190.0));
        // Token buckets: r0 tokens at 0.1..0.19 (4 in second 0), r1 at 0.8 and 0.85 (second 0),
        // r2 at 1.05 (second 1) -> peak 6 tokens in one second.
        assert_eq!(metrics.max_output_tokens_per_s, 6.0);
        // r0 [0, 0.19), r1 [0.5, 0.85), r2 [1.0, 1.05): never overlapping.
        assert_eq!(metrics.max_concurrent_requests, 1);
        assert!(metrics.client_queue_time.is_none());
    }

    #[test]
    fn pooling_answers_count_no_output_tokens_at_peak() {
        // Embeddings: no output tokens, no chunks; two overlapping requests.
        let pooled = |start| RequestOutcome {
            content_chunks: 0,
            output_tokens: Some(0),
            ..outcome(start, 0.030, &[], Some(0))
        };
        let metrics = calculate_metrics(
            &[pooled(0.0), pooled(0.01)],
            MetricsContext {
                duration_s: 1.0,
                percentiles: &[99.0],
                goodput: &GoodputSlo::default(),
                max_concurrency: None,
                request_rate: f64::INFINITY,
            },
        );
        assert_eq!(metrics.total_output, 0);
        assert_eq!(metrics.max_output_tokens_per_s, 0.0);
        assert_eq!(metrics.max_concurrent_requests, 2);
        assert!(close(metrics.e2el.mean_ms, 30.0));
    }

    #[test]
    fn all_failed_gives_zeros_not_nan() {
        let metrics = calculate_metrics(
            &[failed(), failed()],
            MetricsContext {
                duration_s: 1.0,
                percentiles: &[99.0],
                goodput: &GoodputSlo::default(),
                max_concurrency: Some(2),
                request_rate: 5.0,
            },
        );
        assert_eq!(metrics.completed, 0);
        assert_eq!(metrics.failed, 2);
        assert_eq!(metrics.ttft.mean_ms, 0.0);
        assert_eq!(metrics.ttft.at(99.0), Some(0.0));
        assert_eq!(metrics.max_concurrent_requests, 0);
        assert!(metrics.client_queue_time.is_some());
        assert!(metrics.e2el_including_client_queue.is_some());
    }

    #[test]
    fn overlapping_requests_count_toward_peak_concurrency() {
        let outcomes = vec![
            outcome(0.0, 0.5, &[0.5], None), // [0, 1.0)
            outcome(0.2, 0.5, &[0.5], None), // [0.2, 1.2)
            outcome(1.0, 0.1, &[0.1], None), // [1.0, 1.2): starts as r0 ends
        ];
        let metrics = calculate_metrics(
            &outcomes,
            MetricsContext {
                duration_s: 1.2,
                percentiles: &[99.0],
                goodput: &GoodputSlo::default(),
                max_concurrency: None,
                request_rate: f64::INFINITY,
            },
        );
        assert_eq!(metrics.max_concurrent_requests, 2);
    }
}
