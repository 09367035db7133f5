//! Request arrival times: all at once for an infinite rate, else gamma-distributed gaps
//! (shape = burstiness; 1.0 is a Poisson process), precomputed like vLLM's `get_request`.

use rand::Rng;
use rand_distr::{Distribution, Gamma};

use crate::error::BenchError;

/// `count` inter-arrival gaps in seconds for `rate` requests/s. Each gap is
/// Gamma(shape = burstiness, scale = 1 / (rate · burstiness)), so the mean gap is 1/rate and
/// the coefficient of variation is 1/√burstiness.
pub fn inter_arrival_gaps<R: Rng>(
    count: usize,
    rate: f64,
    burstiness: f64,
    rng: &mut R,
) -> Result<Vec<f64>, BenchError> {
    if rate.is_infinite() {
        return Ok(vec![0.0; count]);
    }
    if burstiness.is_infinite() {
        return Ok(vec![1.0 / rate; count]);
    }
    let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness)).map_err(|err| {
        BenchError::InvalidArgument(format!(
            "request rate {rate} / burstiness {burstiness}: {err}"
        ))
    })?;
    Ok((0..count).map(|_| gamma.sample(rng)).collect())
}

/// Send offsets from the run start. As vLLM does, the cumulative gaps are rescaled so the last
/// request goes out at exactly count / rate: the throughput of runs with different seeds then
/// does not drift by the 1–2 % a raw sum would.
pub fn arrival_offsets<R: Rng>(
    count: usize,
    rate: f64,
    burstiness: f64,
    rng: &mut R,
) -> Result<Vec<f64>, BenchError> {
    let gaps = inter_arrival_gaps(count, rate, burstiness, rng)?;
    let mut offsets = Vec::with_capacity(count);
    let mut total = 0.0;
    for gap in gaps {
        total += gap;
        offsets.push(total);
    }
    if rate.is_finite() && total > 0.0 {
        let factor = (count as f64 / rate) / total;
        offsets.iter_mut().for_each(|offset| *offset *= factor);
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn mean_and_cv(gaps: &[f64]) -> (f64, f64) {
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let variance = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        (mean, variance.sqrt() / mean)
    }

    fn gaps_of(offsets: &[f64]) -> Vec<f64> {
        let mut previous = 0.0;
        offsets
            .iter()
            .map(|&offset| {
                let gap = offset - previous;
                previous = offset;
                gap
            })
            .collect()
    }

    #[test]
    fn poisson_at_rate_20_has_50ms_mean_and_unit_cv() {
        for seed in [0, 1, 2, 3, 4] {
            let mut rng = StdRng::seed_from_u64(seed);
            let raw = inter_arrival_gaps(200, 20.0, 1.0, &mut rng).unwrap();
            let (mean, cv) = mean_and_cv(&raw);
            assert!(
                (mean - 0.050).abs() < 0.005,
                "seed {seed}: raw mean gap {mean}"
            );
            assert!((0.8..1.2).contains(&cv), "seed {seed}: raw CV {cv}");

            let mut rng = StdRng::seed_from_u64(seed);
            let offsets = arrival_offsets(200, 20.0, 1.0, &mut rng).unwrap();
            let gaps = gaps_of(&offsets);
            let (mean, cv) = mean_and_cv(&gaps);
            assert!(
                (mean - 0.050).abs() < 0.005,
                "seed {seed}: scheduled mean gap {mean}"
            );
            assert!((0.8..1.2).contains(&cv), "seed {seed}: scheduled CV {cv}");
            assert!(
                (offsets[199] - 10.0).abs() < 1e-9,
                "last request at count/rate"
            );
            assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
        }
    }

    #[test]
    fn burstiness_changes_the_spread_not_the_mean() {
        let mut rng = StdRng::seed_from_u64(7);
        let bursty = gaps_of(&arrival_offsets(2000, 20.0, 0.25, &mut rng).unwrap());
        let smooth = gaps_of(&arrival_offsets(2000, 20.0, 4.0, &mut rng).unwrap());
        let (bursty_mean, bursty_cv) = mean_and_cv(&bursty);
        let (smooth_mean, smooth_cv) = mean_and_cv(&smooth);
        assert!((bursty_mean - 0.05).abs() < 0.005 && (smooth_mean - 0.05).abs() < 0.005);
        // CV = 1/sqrt(shape): 2.0 for 0.25, 0.5 for 4.
        assert!((1.6..2.4).contains(&bursty_cv), "bursty CV {bursty_cv}");
        assert!((0.4..0.6).contains(&smooth_cv), "smooth CV {smooth_cv}");
        let constant = arrival_offsets(4, 20.0, f64::INFINITY, &mut rng).unwrap();
        assert!(gaps_of(&constant)
            .iter()
            .all(|gap| (gap - 0.05).abs() < 1e-12));
    }

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(
            arrival_offsets(3, f64::INFINITY, 1.0, &mut rng).unwrap(),
            vec![0.0; 3]
        );
    }

    #[test]
    fn same_seed_same_schedule() {
        let a = arrival_offsets(50, 5.0, 1.0, &mut StdRng::seed_from_u64(42)).unwrap();
        let b = arrival_offsets(50, 5.0, 1.0, &mut StdRng::seed_from_u64(42)).unwrap();
        let c = arrival_offsets(50, 5.0, 1.0, &mut StdRng::seed_from_u64(43)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
