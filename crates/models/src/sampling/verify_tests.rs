//! Speculative verification (`Sampler::verify`) against the target distribution, by
//! chi-square tests on many seeded draws.

use super::*;

/// Chi-square statistic of `counts` against `probabilities` (categories of zero probability
/// must have no counts: returns infinity otherwise).
fn chi_square(counts: &[usize], probabilities: &[f64]) -> f64 {
    let total: usize = counts.iter().sum();
    let mut statistic = 0.0;
    for (&count, &p) in counts.iter().zip(probabilities) {
        if p == 0.0 {
            if count > 0 {
                return f64::INFINITY;
            }
            continue;
        }
        let expected = p * total as f64;
        statistic += (count as f64 - expected).powi(2) / expected;
    }
    statistic
}

/// Softmax of `logits / temperature` restricted to the `top_k` most likely, in f64.
fn target(logits: &[f32], temperature: f64, top_k: usize) -> Vec<f64> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let mut p = vec![0.0; logits.len()];
    for &i in order.iter().take(top_k) {
        p[i] = (f64::from(logits[i]) / temperature).exp();
    }
    let sum: f64 = p.iter().sum();
    p.iter().map(|x| x / sum).collect()
}

const LOGITS: [f32; 6] = [2.0, 1.5, 1.0, 0.5, 0.0, -1.0];

fn params(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: Some(5),
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

/// 200,000 verifications of one draft; chi-square with 4 degrees of freedom (five tokens
/// survive top-k) at significance 0.001 has the critical value 18.467.
#[test]
fn rejection_sampling_reproduces_the_target_distribution() {
    let expected = target(&LOGITS, 0.8, 5);
    // A likely draft, an unlikely one, and one top-k removed (never accepted).
    for (draft, seed) in [(0u32, 1u64), (3, 2), (5, 3)] {
        let mut sampler = Sampler::new(params(seed), &[]);
        let mut counts = vec![0usize; LOGITS.len()];
        let mut accepted = 0usize;
        for _ in 0..200_000 {
            let token = sampler
                .verify(&LOGITS, &History::default(), draft)
                .unwrap()
                .token_id;
            counts[token as usize] += 1;
            accepted += usize::from(token == draft);
        }
        let statistic = chi_square(&counts, &expected);
        assert!(
            statistic < 18.467,
            "draft {draft}: chi-square {statistic} over {counts:?} vs {expected:?}"
        );
        // The acceptance rate is the draft's target probability.
        let rate = accepted as f64 / 200_000.0;
        assert!((rate - expected[draft as usize]).abs() < 0.005, "{rate}");
    }
}

/// Two draft positions verified in turn with a frequency penalty: the second sees the first
/// emitted token in its history and its penalty counts, so the joint distribution of the pair
/// is the one plain sampling gives. 16 cells with mass (four tokens), 15 degrees of freedom,
/// significance 0.001: critical value 37.697.
#[test]
fn the_chain_sees_the_accepted_prefix_at_each_draft_position() {
    let logits = [1.0f32, 0.6, 0.2, -0.2];
    let penalty = 0.9f32;
    let mut expected = vec![0.0f64; 16];
    let first = target(&logits, 1.0, 4);
    for (a, pa) in first.iter().enumerate() {
        let mut penalized = logits;
        penalized[a] -= penalty;
        for (b, pb) in target(&penalized, 1.0, 4).iter().enumerate() {
            expected[a * 4 + b] = pa * pb;
        }
    }
    let mut counts = vec![0usize; 16];
    let drafts = [0u32, 1];
    for seed in 0..100_000u64 {
        let mut sampler = Sampler::new(
            SamplingParams {
                frequency_penalty: penalty,
                seed: Some(seed),
                ..SamplingParams::default()
            },
            &[],
        );
        let mut output = Vec::new();
        for &draft in &drafts {
            let history = History {
                prompt: &[],
                output: &output,
            };
            let token = sampler.verify(&logits, &history, draft).unwrap().token_id;
            output.push(token);
            if token != draft {
                break;
            }
        }
        if output.len() < 2 {
            // Rejected at the first position: the next token is sampled normally.
            let history = History {
                prompt: &[],
                output: &output,
            };
            output.push(sampler.sample(&logits, &history).unwrap().token_id);
        }
        counts[output[0] as usize * 4 + output[1] as usize] += 1;
    }
    let statistic = chi_square(&counts, &expected);
    assert!(
        statistic < 37.697,
        "chi-square {statistic} over {counts:?} vs {expected:?}"
    );
}

#[test]
fn greedy_verification_emits_the_argmax_whatever_the_draft() {
    let mut sampler = Sampler::new(SamplingParams::greedy(), &[]);
    for draft in 0..6 {
        let token = sampler.verify(&LOGITS, &History::default(), draft).unwrap();
        assert_eq!(token.token_id, 0);
    }
}
