//! A classic Prometheus histogram that records a whole engine step's observations under one
//! lock.
//!
//! prometheus-client's `Histogram` locks once per `observe`. The engine reports inter-token
//! latencies for every token emitted in a step, so with the stock type a 256-sequence decode
//! step would take 256 locks on the engine thread. `StepHistogram::observe_all` takes the
//! lock once per step instead, and encodes through the crate's own histogram encoder, so the
//! exposition is identical.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram with fixed upper bounds plus the implicit `+Inf` bucket. Cloning shares the
/// underlying counts, like the crate's metric types.
#[derive(Debug, Clone)]
pub struct StepHistogram {
    inner: Arc<Mutex<HistogramState>>,
}

#[derive(Debug)]
struct HistogramState {
    sum: f64,
    count: u64,
    /// `(upper_bound, count in this bucket alone)`; the last entry is `+Inf`. The encoder
    /// accumulates the per-bucket counts into Prometheus' cumulative `le` series.
    buckets: Vec<(f64, u64)>,
}

/// A copy of a histogram's state, for tests and for callers that summarise locally.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Sum of all observed values.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
    /// `(upper_bound, cumulative count)`, ending with `f64::INFINITY`.
    pub cumulative_buckets: Vec<(f64, u64)>,
}

impl StepHistogram {
    /// A histogram with the given finite, increasing upper bounds. Non-finite bounds are
    /// dropped: `+Inf` is always added as the last bucket.
    pub fn new(upper_bounds: &[f64]) -> Self {
        let buckets = upper_bounds
            .iter()
            .copied()
            .filter(|bound| bound.is_finite())
            .chain(std::iter::once(f64::INFINITY))
            .map(|bound| (bound, 0))
            .collect();
        Self {
            inner: Arc::new(Mutex::new(HistogramState {
                sum: 0.0,
                count: 0,
                buckets,
            })),
        }
    }

    /// Records one value.
    pub fn observe(&self, value: f64) {
        self.observe_all(std::iter::once(value));
    }

    /// Records every value of a step under a single lock.
    pub fn observe_all(&self, values: impl IntoIterator<Item = f64>) {
        let mut values = values.into_iter().peekable();
        if values.peek().is_none() {
            return;
        }
        let mut state = self.lock();
        for value in values {
            state.sum += value;
            state.count += 1;
            // NaN compares false everywhere and so lands in +Inf, as in the Go and Python
            // clients.
            let index = state
                .buckets
                .iter()
                .position(|(upper_bound, _)| value <= *upper_bound)
                .unwrap_or(state.buckets.len() - 1);
            state.buckets[index].1 += 1;
        }
    }

    /// The current sum, count and cumulative buckets.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let state = self.lock();
        let mut cumulative = 0;
        let cumulative_buckets = state
            .buckets
            .iter()
            .map(|(upper_bound, count)| {
                cumulative += count;
                (*upper_bound, cumulative)
            })
            .collect();
        HistogramSnapshot {
            sum: state.sum,
            count: state.count,
            cumulative_buckets,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HistogramState> {
        // The state is a few numbers updated without intermediate invariants, so a panic in
        // another holder cannot leave it half-written in a way that matters for metrics.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl TypedMetric for StepHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for StepHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let state = self.lock();
        encoder.encode_histogram::<NoLabelSet>(state.sum, state.count, &state.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_whose_bound_is_not_below_them() {
        let histogram = StepHistogram::new(&[1.0, 2.0, 5.0]);
        histogram.observe_all([0.5, 1.0, 1.5, 5.0, 7.0]);
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 5);
        assert!((snapshot.sum - 15.0).abs() < 1e-12);
        assert_eq!(
            snapshot.cumulative_buckets,
            vec![(1.0, 2), (2.0, 3), (5.0, 4), (f64::INFINITY, 5)]
        );
    }

    #[test]
    fn nan_goes_to_the_infinite_bucket() {
        let histogram = StepHistogram::new(&[1.0]);
        histogram.observe(f64::NAN);
        let snapshot = histogram.snapshot();
        assert_eq!(
            snapshot.cumulative_buckets,
            vec![(1.0, 0), (f64::INFINITY, 1)]
        );
    }

    #[test]
    fn an_empty_bound_list_still_has_the_infinite_bucket() {
        let histogram = StepHistogram::new(&[]);
        histogram.observe(3.0);
        assert_eq!(
            histogram.snapshot().cumulative_buckets,
            vec![(f64::INFINITY, 1)]
        );
    }

    #[test]
    fn clones_share_counts() {
        let histogram = StepHistogram::new(&[1.0]);
        let clone = histogram.clone();
        clone.observe(0.5);
        assert_eq!(histogram.snapshot().count, 1);
    }
}
