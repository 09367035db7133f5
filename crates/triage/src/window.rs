//! Windowed analysis over scrapes: counter deltas and rates between two scrapes, histogram
//! quantiles from bucket deltas (PromQL `histogram_quantile` semantics), and gauge statistics
//! over several samples taken in the window.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::exposition::{parse_value, Labels, Sample, Scrape};

/// Which series count: all of them (summed across models and engines), or one `model_name`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesFilter {
    pub model_name: Option<String>,
}

impl SeriesFilter {
    pub fn matches(&self, labels: &Labels) -> bool {
        match &self.model_name {
            None => true,
            Some(wanted) => labels.get("model_name") == Some(wanted.as_str()),
        }
    }
}

fn matching<'a>(
    scrape: &'a Scrape,
    sample_name: &str,
    filter: &'a SeriesFilter,
) -> impl Iterator<Item = &'a Sample> + 'a {
    scrape
        .samples_named(sample_name)
        .filter(move |sample| filter.matches(&sample.labels))
}

/// The sample name a counter is exposed under: `<base>_total` when present, else `<base>`.
fn counter_sample_name(scrapes: &[&Scrape], base: &str) -> String {
    let total = format!("{base}_total");
    if scrapes
        .iter()
        .any(|scrape| scrape.samples_named(&total).next().is_some())
    {
        total
    } else {
        base.to_owned()
    }
}

/// Sum of a gauge's matching series; `None` when the metric is absent.
pub fn gauge_sum(scrape: &Scrape, name: &str, filter: &SeriesFilter) -> Option<f64> {
    let values: Vec<f64> = matching(scrape, name, filter)
        .map(|sample| sample.value)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Mean of a gauge's matching series (for ratios such as KV usage, one series per engine).
pub fn gauge_mean(scrape: &Scrape, name: &str, filter: &SeriesFilter) -> Option<f64> {
    let values: Vec<f64> = matching(scrape, name, filter)
        .map(|sample| sample.value)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Increase of counter `base` between two scrapes, summed over matching series whose labels
/// satisfy `label_filter`. A series that went down was reset (server restart), so its whole
/// current value counts as the increase, as PromQL's `increase()` does; a series that appeared
/// in the window started from zero.
pub fn counter_increase_where(
    before: &Scrape,
    after: &Scrape,
    base: &str,
    filter: &SeriesFilter,
    label_filter: impl Fn(&Labels) -> bool,
) -> Option<f64> {
    let name = counter_sample_name(&[before, after], base);
    let earlier: BTreeMap<Vec<(String, String)>, f64> = matching(before, &name, filter)
        .map(|sample| (series_key(&sample.labels), sample.value))
        .collect();
    let mut found = false;
    let mut increase = 0.0;
    for sample in matching(after, &name, filter) {
        found = true;
        if !label_filter(&sample.labels) {
            continue;
        }
        increase += match earlier.get(&series_key(&sample.labels)) {
            Some(&previous) if sample.value >= previous => sample.value - previous,
            _ => sample.value,
        };
    }
    found.then_some(increase)
}

/// Increase of counter `base` over all matching series.
pub fn counter_increase(
    before: &Scrape,
    after: &Scrape,
    base: &str,
    filter: &SeriesFilter,
) -> Option<f64> {
    counter_increase_where(before, after, base, filter, |_| true)
}

fn series_key(labels: &Labels) -> Vec<(String, String)> {
    labels
        .canonical()
        .iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// The observations a histogram gained in the window: cumulative bucket counts by upper bound
/// (summed over matching series), plus the sum and count.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramWindow {
    /// `(upper bound, cumulative count)`, sorted by upper bound; the last bound is `+Inf` when
    /// the exposition had one.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl HistogramWindow {
    /// Bucket deltas of histogram `base` between two scrapes.
    pub fn between(
        before: &Scrape,
        after: &Scrape,
        base: &str,
        filter: &SeriesFilter,
    ) -> Option<Self> {
        let bucket_name = format!("{base}_bucket");
        let before_buckets: BTreeMap<Vec<(String, String)>, f64> =
            matching(before, &bucket_name, filter)
                .map(|sample| (series_key(&sample.labels), sample.value))
                .collect();
        // Summed by the bound's text value so that "1" and "1.0" from two engines coalesce.
        let mut by_bound: Vec<(f64, f64)> = Vec::new();
        let mut found = false;
        for sample in matching(after, &bucket_name, filter) {
            let Some(bound) = sample.labels.get("le").and_then(parse_value) else {
                continue;
            };
            found = true;
            let delta = match before_buckets.get(&series_key(&sample.labels)) {
                Some(&previous) if sample.value >= previous => sample.value - previous,
                _ => sample.value,
            };
            match by_bound.iter_mut().find(|(existing, _)| *existing == bound) {
                Some((_, count)) => *count += delta,
                None => by_bound.push((bound, delta)),
            }
        }
        if !found {
            return None;
        }
        by_bound.sort_by(|left, right| left.0.total_cmp(&right.0));
        let sum = counter_increase(before, after, &format!("{base}_sum"), filter).unwrap_or(0.0);
        let count = counter_increase(before, after, &format!("{base}_count"), filter)
            .or_else(|| by_bound.last().map(|&(_, count)| count))
            .unwrap_or(0.0);
        Some(Self {
            buckets: by_bound,
            sum,
            count,
        })
    }

    /// The `q`-quantile, with PromQL `histogram_quantile` semantics: linear interpolation
    /// inside the bucket holding rank `q × count`, the first bucket starting at 0, a rank in the
    /// `+Inf` bucket answering the largest finite bound, and non-monotonic cumulative counts
    /// (from scrapes taken mid-update) forced monotonic. `None` when the window holds no
    /// observations or there is no `+Inf` bucket.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if !(0.0..=1.0).contains(&q) || self.buckets.len() < 2 {
            return None;
        }
        let (last_bound, _) = *self.buckets.last()?;
        if last_bound != f64::INFINITY {
            return None;
        }
        let mut cumulative: Vec<(f64, f64)> = Vec::with_capacity(self.buckets.len());
        let mut running_max = 0.0_f64;
        for &(bound, count) in &self.buckets {
            running_max = running_max.max(count);
            cumulative.push((bound, running_max));
        }
        let observations = cumulative.last().map(|&(_, count)| count)?;
        if observations <= 0.0 {
            return None;
        }
        let rank = q * observations;
        let last_finite = cumulative.len() - 1;
        let bucket = cumulative[..last_finite]
            .iter()
            .position(|&(_, count)| count >= rank)
            .unwrap_or(last_finite);
        if bucket == last_finite {
            return Some(cumulative[last_finite - 1].0);
        }
        let (bucket_end, bucket_cumulative) = cumulative[bucket];
        if bucket == 0 && bucket_end <= 0.0 {
            return Some(bucket_end);
        }
        let (bucket_start, count_below) = if bucket == 0 {
            (0.0, 0.0)
        } else {
            cumulative[bucket - 1]
        };
        let in_bucket = bucket_cumulative - count_below;
        if in_bucket <= 0.0 {
            return Some(bucket_end);
        }
        Some(bucket_start + (bucket_end - bucket_start) * (rank - count_below) / in_bucket)
    }

    /// Mean observation in the window (`sum / count`).
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The largest finite bucket bound (vLLM's token-count histograms end at max_model_len).
    pub fn largest_finite_bound(&self) -> Option<f64> {
        self.buckets
            .iter()
            .rev()
            .map(|&(bound, _)| bound)
            .find(|bound| bound.is_finite())
    }
}

/// Percentiles of one histogram over the window, in the histogram's unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Distribution {
    pub count: f64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Distribution {
    pub fn of(window: &HistogramWindow) -> Self {
        Self {
            count: window.count,
            mean: window.mean(),
            p50: window.quantile(0.50),
            p95: window.quantile(0.95),
            p99: window.quantile(0.99),
        }
    }

    /// Whether any observation landed in the window.
    pub fn has_data(&self) -> bool {
        self.count > 0.0 && self.p50.is_some()
    }
}

/// A gauge's behaviour over the samples of a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GaugeStats {
    pub samples: Vec<f64>,
    pub min: f64,
    pub mean: f64,
    pub max: f64,
    pub first: f64,
    pub last: f64,
    /// Least-squares slope in units per second, the samples taken as evenly spaced.
    pub slope_per_second: f64,
}

impl GaugeStats {
    /// Statistics of `samples` spread evenly over `window_seconds`; `None` when empty.
    pub fn of(samples: Vec<f64>, window_seconds: f64) -> Option<Self> {
        let first = *samples.first()?;
        let last = *samples.last()?;
        let count = samples.len() as f64;
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = samples.iter().sum::<f64>() / count;
        let slope_per_second = if samples.len() >= 2 && window_seconds > 0.0 {
            let spacing = window_seconds / (count - 1.0);
            let mean_time = spacing * (count - 1.0) / 2.0;
            let (mut covariance, mut variance) = (0.0, 0.0);
            for (index, value) in samples.iter().enumerate() {
                let time = spacing * index as f64 - mean_time;
                covariance += time * (value - mean);
                variance += time * time;
            }
            covariance / variance
        } else {
            0.0
        };
        Some(Self {
            samples,
            min,
            mean,
            max,
            first,
            last,
            slope_per_second,
        })
    }

    /// Whether every sample is at least the one before it.
    pub fn is_non_decreasing(&self) -> bool {
        self.samples.windows(2).all(|pair| pair[1] >= pair[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(buckets: &[(f64, f64)]) -> HistogramWindow {
        HistogramWindow {
            buckets: buckets.to_vec(),
            sum: 0.0,
            count: buckets.last().map(|b| b.1).unwrap_or(0.0),
        }
    }

    #[test]
    fn quantile_interpolates_inside_the_bucket() {
        // 10 observations: 2 ≤ 0.1, 8 in (0.1, 0.5]. p50 rank 5 → 0.1 + 0.4 × 3/8 = 0.25.
        let histogram = window(&[(0.1, 2.0), (0.5, 10.0), (f64::INFINITY, 10.0)]);
        assert!((histogram.quantile(0.5).unwrap() - 0.25).abs() < 1e-12);
        // p10 rank 1 falls in the first bucket, which starts at 0: 0.1 × 1/2 = 0.05.
        assert!((histogram.quantile(0.1).unwrap() - 0.05).abs() < 1e-12);
    }

    #[test]
    fn quantile_in_the_inf_bucket_answers_the_largest_finite_bound() {
        let histogram = window(&[(1.0, 1.0), (2.0, 2.0), (f64::INFINITY, 10.0)]);
        assert_eq!(histogram.quantile(0.99), Some(2.0));
    }

    #[test]
    fn quantile_needs_observations_and_an_inf_bucket() {
        assert_eq!(
            window(&[(1.0, 0.0), (f64::INFINITY, 0.0)]).quantile(0.5),
            None
        );
        assert_eq!(window(&[(1.0, 3.0), (2.0, 4.0)]).quantile(0.5), None);
    }

    #[test]
    fn non_monotonic_buckets_are_forced_monotonic() {
        // The 0.5 bucket reads 3 below the 0.1 bucket's 4: treated as 4, so p50 (rank 3) lies
        // in the first bucket: 0.1 × 3/4 = 0.075.
        let histogram = window(&[(0.1, 4.0), (0.5, 3.0), (1.0, 6.0), (f64::INFINITY, 6.0)]);
        assert!((histogram.quantile(0.5).unwrap() - 0.075).abs() < 1e-12);
    }

    #[test]
    fn gauge_slope_of_a_straight_line() {
        let stats = GaugeStats::of(vec![0.1, 0.2, 0.3, 0.4, 0.5], 40.0).unwrap();
        assert!((stats.slope_per_second - 0.01).abs() < 1e-12);
        assert!(stats.is_non_decreasing());
        assert_eq!(stats.min, 0.1);
        assert_eq!(stats.max, 0.5);
        assert!((stats.mean - 0.3).abs() < 1e-12);
    }

    #[test]
    fn counter_reset_counts_the_current_value() {
        let before = Scrape::parse("x_total{a=\"1\"} 100\nx_total{a=\"2\"} 5\n").unwrap();
        let after =
            Scrape::parse("x_total{a=\"1\"} 7\nx_total{a=\"2\"} 9\nx_total{a=\"3\"} 1\n").unwrap();
        let increase = counter_increase(&before, &after, "x", &SeriesFilter::default());
        assert_eq!(increase, Some(7.0 + 4.0 + 1.0));
    }
}
