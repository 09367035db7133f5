//! Histogram bucket boundaries, exactly as vLLM exports them.
//!
//! Dashboards and alert rules written for vLLM compute quantiles with `histogram_quantile` over
//! these `le` values, so a different boundary set would silently change every percentile they
//! show. The lists are copied from the compatibility contract, not tuned for tokenmill.

/// `vllm:time_to_first_token_seconds`.
pub const TIME_TO_FIRST_TOKEN_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// `vllm:inter_token_latency_seconds` and `vllm:request_time_per_output_token_seconds`.
pub const INTER_TOKEN_LATENCY_SECONDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// The per-request phase histograms: e2e, queue, inference, prefill and decode time.
pub const REQUEST_LATENCY_SECONDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// `vllm:iteration_tokens_total` (tokens scheduled in one engine step).
pub const ITERATION_TOKENS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// `vllm:request_params_n`.
pub const REQUEST_PARAMS_N: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];

/// `http_request_duration_seconds{handler, method}`: the coarse default of
/// prometheus-fastapi-instrumentator, which vLLM's API server uses.
pub const HTTP_REQUEST_DURATION_SECONDS: &[f64] = &[0.1, 0.5, 1.0];

/// `http_request_duration_highr_seconds`: the instrumentator's unlabelled high-resolution
/// histogram.
pub const HTTP_REQUEST_DURATION_HIGHR_SECONDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    7.5, 10.0, 30.0, 60.0,
];

/// The 1-2-5 series (1, 2, 5, 10, 20, 50, ...) up to and including `max_value`.
///
/// Token-count histograms use it with `max_value = max_model_len`, so their largest finite
/// bucket is the largest 1-2-5 value a request can reach.
pub fn one_two_five_buckets(max_value: usize) -> Vec<f64> {
    let mut buckets = Vec::new();
    let mut power_of_ten: usize = 1;
    loop {
        for mantissa in [1usize, 2, 5] {
            match mantissa.checked_mul(power_of_ten) {
                Some(value) if value <= max_value => buckets.push(value as f64),
                _ => return buckets,
            }
        }
        power_of_ten = match power_of_ten.checked_mul(10) {
            Some(next) => next,
            None => return buckets,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_series_stops_at_the_maximum() {
        assert_eq!(
            one_two_five_buckets(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(
            one_two_five_buckets(2048),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
        assert_eq!(one_two_five_buckets(4), vec![1.0, 2.0]);
        assert!(one_two_five_buckets(0).is_empty());
    }

    #[test]
    fn one_two_five_series_does_not_overflow() {
        let buckets = one_two_five_buckets(usize::MAX);
        assert!(buckets.len() > 50);
        assert!(buckets.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn fixed_bucket_lists_are_strictly_increasing() {
        for buckets in [
            TIME_TO_FIRST_TOKEN_SECONDS,
            INTER_TOKEN_LATENCY_SECONDS,
            REQUEST_LATENCY_SECONDS,
            ITERATION_TOKENS,
            REQUEST_PARAMS_N,
            HTTP_REQUEST_DURATION_SECONDS,
            HTTP_REQUEST_DURATION_HIGHR_SECONDS,
        ] {
            assert!(buckets.windows(2).all(|pair| pair[0] < pair[1]));
        }
    }
}
