//! Log-softmax and top-k over one raw logits row: the one implementation behind sampled-token
//! logprobs and prompt logprobs.

/// `log(sum(exp(logits)))`, computed stably.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = logits
        .iter()
        .map(|&logit| f64::from((logit - max).exp()))
        .sum();
    max + sum.ln() as f32
}

/// Log-probability of `token_id` under the distribution `logits` describes (`-inf` when the
/// id is outside the row), and the `top` most likely tokens as `(id, logprob)`, most likely
/// first, lowest id on ties.
pub fn token_logprobs(logits: &[f32], token_id: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let log_normalizer = log_sum_exp(logits);
    let logprob = logits
        .get(token_id as usize)
        .map_or(f32::NEG_INFINITY, |&logit| logit - log_normalizer);
    (logprob, top_logprobs(logits, top, log_normalizer))
}

/// The `count` largest logits as `(id, logit - log_normalizer)`, most likely first, lowest id
/// on ties.
fn top_logprobs(logits: &[f32], count: usize, log_normalizer: f32) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(count + 1);
    if count == 0 {
        return top;
    }
    for (id, &logit) in logits.iter().enumerate() {
        if top.len() == count && top.last().is_some_and(|&(_, smallest)| logit <= smallest) {
            continue;
        }
        // Insert after every entry that is at least as large, so earlier (lower) ids win ties.
        let position = top.partition_point(|&(_, existing)| existing >= logit);
        top.insert(position, (id as u32, logit));
        top.truncate(count);
    }
    for entry in &mut top {
        entry.1 -= log_normalizer;
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_top_k_against_a_sort() {
        let logits = [2.0f32, 1.0, 0.0, 1.0, -3.0];
        let normalizer = logits.iter().map(|l| f64::from(l.exp())).sum::<f64>().ln() as f32;
        let (logprob, top) = token_logprobs(&logits, 3, 3);
        assert!((logprob - (1.0 - normalizer)).abs() < 1e-6);
        // Ties (ids 1 and 3) keep the lower id first.
        let ids: Vec<u32> = top.iter().map(|entry| entry.0).collect();
        assert_eq!(ids, vec![0, 1, 3]);
        assert!((top[0].1 - (2.0 - normalizer)).abs() < 1e-6);
        assert_eq!(token_logprobs(&logits, 9, 0), (f32::NEG_INFINITY, vec![]));
        let (_, all) = token_logprobs(&logits, 0, 10);
        assert_eq!(all.len(), logits.len());
        let total: f32 = all.iter().map(|entry| entry.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
