//! [`Sampler`]: one request's logits row → its next token, with vLLM's semantics.
//!
//! A sampler belongs to one request: it owns that request's RNG (seeded from
//! [`SamplingParams::seed`], so a seeded request draws the same tokens whatever it is batched
//! with), its [`LogitsChain`] and scratch buffers reused across steps. The order of operations
//! follows vLLM V1: a grammar's mask (structured outputs), then raw logprobs; then the rest of
//! the chain (allowed tokens, bad words, min-tokens ban, logit bias, penalties); then either greedy
//! argmax (temperature 0) or temperature, min-p, top-k, top-p and a random draw.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::logprobs::token_logprobs;
use super::params::SamplingParams;
use super::processors::{History, LogitsChain, LogitsProcessor};
use crate::error::{ModelError, Result};

/// The token drawn for one sequence at one step.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub token_id: u32,
    /// Log-probability of `token_id` under the model's raw distribution; present when
    /// [`SamplingParams::logprobs`] is set.
    pub logprob: Option<f32>,
    /// The `logprobs` most likely tokens under the raw distribution, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// One request's sampler: its parameters, processors, RNG and reusable scratch space.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    chain: LogitsChain,
    rng: StdRng,
    /// The processed copy of the row (unused while the chain is empty).
    logits: Vec<f32>,
    /// The row with only the grammar's mask applied (unused without a grammar).
    masked: Vec<f32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for a request whose prompt is `prompt` (the repetition penalty counts it).
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Sampler {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Sampler {
            chain: LogitsChain::new(&params, prompt),
            params,
            rng,
            logits: Vec::new(),
            masked: Vec::new(),
            candidates: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The request's processors (where a grammar is attached).
    pub fn chain_mut(&mut self) -> &mut LogitsChain {
        &mut self.chain
    }

    /// Draws the next token from `logits` (one row of the model's output) and lets the chain
    /// accept it. `history.output` is the output before this token; the caller appends it.
    pub fn sample(&mut self, logits: &[f32], history: &History<'_>) -> Result<SampledToken> {
        self.sample_or_verify(logits, history, None)
    }

    /// Speculative decoding: the token to emit at a position where a proposer drafted `draft`
    /// (a point guess, no draft distribution), with the same chain, history and logprobs as
    /// [`Self::sample`]. Greedy requests emit the argmax, which matches the draft or not.
    /// Random requests use rejection sampling: the draft is accepted with probability `p(draft)`
    /// under the final distribution (after temperature, min-p, top-k, top-p); otherwise a token
    /// is drawn from `p` with the draft removed. Either way the emitted token is distributed
    /// exactly as `p`, so speculation changes no request's output distribution. The caller
    /// stops verifying at the first emitted token that differs from its draft.
    pub fn verify(
        &mut self,
        logits: &[f32],
        history: &History<'_>,
        draft: u32,
    ) -> Result<SampledToken> {
        self.sample_or_verify(logits, history, Some(draft))
    }

    fn sample_or_verify(
        &mut self,
        logits: &[f32],
        history: &History<'_>,
        draft: Option<u32>,
    ) -> Result<SampledToken> {
        if logits.is_empty() {
            return Err(ModelError::InvalidSamplingParams("empty logits row".into()));
        }
        // NaN compares false with everything, so argmax and the draw would quietly skip it; a
        // row holding one (or +inf) says the model's output is broken for this request.
        if let Some((token_id, value)) = first_nan_or_infinity(logits) {
            return Err(ModelError::NonFiniteLogits { token_id, value });
        }
        // vLLM applies a grammar's bitmask to the logits before its sampler, so even the raw
        // logprobs of a structured-output request see the mask; nothing else touches `raw`.
        let raw: &[f32] = if self.chain.has_grammar() {
            self.masked.clear();
            self.masked.extend_from_slice(logits);
            self.chain.apply_grammar(&mut self.masked, history)?;
            &self.masked
        } else {
            logits
        };
        let processed: &[f32] = if self.chain.is_empty() {
            raw
        } else {
            self.logits.clear();
            self.logits.extend_from_slice(raw);
            self.chain.apply_processors(&mut self.logits, history)?;
            if self.chain.has_grammar() && self.logits.iter().all(|l| *l == f32::NEG_INFINITY) {
                // The grammar is the hard constraint: where a later processor leaves nothing
                // (min_tokens banning the EOS of a grammar that has ended), the grammar wins.
                self.logits.copy_from_slice(raw);
            }
            &self.logits
        };
        let token_id = if self.params.is_greedy() {
            argmax(processed)
        } else {
            draw(
                processed,
                &self.params,
                &mut self.rng,
                &mut self.candidates,
                draft,
            )
        }
        .ok_or_else(|| {
            ModelError::NoAllowedToken(
                "allowed_token_ids, bad_words, min_tokens and the structured output together \
                 exclude every token"
                    .into(),
            )
        })?;
        self.chain.accept(token_id)?;
        let (logprob, top_logprobs) = match self.params.logprobs {
            Some(count) => {
                let (logprob, top) = token_logprobs(raw, token_id, count);
                (Some(logprob), top)
            }
            None => (None, Vec::new()),
        };
        Ok(SampledToken {
            token_id,
            logprob,
            top_logprobs,
        })
    }
}

/// Temperature, min-p, top-k, top-p, then one uniform draw over what is left. With a `draft`
/// (speculative verification) the draft is first accepted with its probability, and on
/// rejection the draw is over what is left without it (the residual of a one-hot draft).
fn draw(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut StdRng,
    candidates: &mut Vec<(u32, f32)>,
    draft: Option<u32>,
) -> Option<u32> {
    let temperature = params.temperature;
    let max_logit = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max_logit == f32::NEG_INFINITY || max_logit.is_nan() {
        return None;
    }
    // min-p in logit space: p_i >= min_p * p_max  <=>  l_i/T >= l_max/T + ln(min_p).
    let min_scaled = if params.min_p > 0.0 {
        max_logit / temperature + params.min_p.ln()
    } else {
        f32::NEG_INFINITY
    };
    candidates.clear();
    for (id, &logit) in logits.iter().enumerate() {
        let scaled = logit / temperature;
        if scaled > f32::NEG_INFINITY && scaled >= min_scaled {
            candidates.push((id as u32, scaled));
        }
    }
    if let Some(k) = params.top_k {
        if k < candidates.len() {
            candidates.select_nth_unstable_by(k - 1, by_likelihood);
            candidates.truncate(k);
        }
    }
    let max_scaled = max_logit / temperature;
    if params.top_p < 1.0 {
        keep_nucleus(candidates, params.top_p, max_scaled);
    } else if params.top_k.is_some() {
        candidates.sort_unstable_by(by_likelihood);
    }
    let mut total = 0.0f64;
    for candidate in candidates.iter_mut() {
        candidate.1 = weight(candidate.1, max_scaled);
        total += f64::from(candidate.1);
    }
    if let Some(draft) = draft {
        let draft_weight = candidates
            .iter()
            .find(|candidate| candidate.0 == draft)
            .map_or(0.0, |candidate| f64::from(candidate.1));
        if rng.random::<f64>() * total < draft_weight {
            return Some(draft);
        }
        if draft_weight >= total {
            // Only the draft has mass left (rounding made the draw miss it).
            return Some(draft);
        }
        total -= draft_weight;
    }
    let target = rng.random::<f64>() * total;
    let mut cumulative = 0.0f64;
    let mut last = None;
    for candidate in candidates.iter() {
        if Some(candidate.0) == draft {
            continue;
        }
        cumulative += f64::from(candidate.1);
        last = Some(candidate.0);
        if cumulative > target {
            return last;
        }
    }
    // Rounding can leave `target` a hair above the final sum: take the last candidate.
    last
}

/// Most likely first; the lower id first among equal scaled logits (a total order, so every
/// selection and sort below has one result).
fn by_likelihood(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// A scaled logit's unnormalized probability.
fn weight(scaled: f32, max_scaled: f32) -> f32 {
    (scaled - max_scaled).exp()
}

/// Keeps the smallest most-likely-first prefix of `candidates` (`(id, scaled logit)`) whose
/// probability reaches `top_p`, sorted most likely first.
///
/// Sorting the whole vocabulary costs milliseconds a row; a nucleus is usually a few dozen
/// tokens. So the prefix is sorted in growing chunks: the next most likely `chunk` candidates
/// are selected (`select_nth_unstable_by`, linear) and sorted, until the running sum reaches
/// the threshold. The kept tokens and their order are exactly those of a full sort; the total
/// the threshold is taken of is summed in the candidates' incoming order.
fn keep_nucleus(candidates: &mut Vec<(u32, f32)>, top_p: f32, max_scaled: f32) {
    let total: f64 = candidates
        .iter()
        .map(|candidate| f64::from(weight(candidate.1, max_scaled)))
        .sum();
    let threshold = f64::from(top_p) * total;
    let len = candidates.len();
    let (mut sorted, mut cumulative) = (0, 0.0f64);
    let mut chunk = 64;
    while sorted < len {
        let end = (sorted + chunk).min(len);
        let rest = &mut candidates[sorted..];
        let take = end - sorted;
        if take < rest.len() {
            rest.select_nth_unstable_by(take - 1, by_likelihood);
        }
        rest[..take].sort_unstable_by(by_likelihood);
        for index in sorted..end {
            cumulative += f64::from(weight(candidates[index].1, max_scaled));
            if cumulative >= threshold {
                candidates.truncate(index + 1);
                return;
            }
        }
        sorted = end;
        chunk *= 4;
    }
}

/// The first NaN or +inf in a raw logits row (-inf is a masked token, not an error). The scan
/// is branch-free per block of 64 so it vectorizes: it runs on every sampled row.
fn first_nan_or_infinity(logits: &[f32]) -> Option<(u32, f32)> {
    const BLOCK: usize = 64;
    // NaN and +inf are the values that are not below +inf.
    let suspect = |value: f32| value.is_nan() | (value == f32::INFINITY);
    let block = logits
        .chunks(BLOCK)
        .position(|block| block.iter().fold(false, |bad, &l| bad | suspect(l)))?;
    logits
        .iter()
        .enumerate()
        .skip(block * BLOCK)
        .find(|(_, &l)| suspect(l))
        .map(|(id, &l)| (id as u32, l))
}

/// Index of the largest finite-or-infinite logit, lowest id on ties; `None` if all are -inf
/// (NaN logits are skipped).
///
/// Sixteen lanes each keep the first maximum of their own ids (a strict `>`, so -inf and NaN
/// never enter), which the compiler turns into vector compares and blends; the lanes are then
/// folded by value, lowest id among equal values. That is the id a front-to-back scan keeping
/// the first strict maximum finds, at a tenth of its time on a 49k vocabulary.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut index = [u32::MAX; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    let mut first = 0u32;
    for chunk in &mut chunks {
        for (lane, (&logit, (best, index))) in chunk
            .iter()
            .zip(best.iter_mut().zip(index.iter_mut()))
            .enumerate()
        {
            let take = logit > *best;
            *best = if take { logit } else { *best };
            *index = if take { first + lane as u32 } else { *index };
        }
        first += LANES as u32;
    }
    let mut winner: Option<(u32, f32)> = None;
    for (&logit, &id) in best.iter().zip(&index) {
        if logit == f32::NEG_INFINITY {
            continue;
        }
        let better = winner.is_none_or(|(best_id, best_logit)| {
            logit > best_logit || (logit == best_logit && id < best_id)
        });
        if better {
            winner = Some((id, logit));
        }
    }
    // The tail's ids come after every lane's, so a strict `>` keeps the earlier id on ties.
    for (offset, &logit) in chunks.remainder().iter().enumerate() {
        if logit == f32::NEG_INFINITY || logit.is_nan() {
            continue;
        }
        if winner.is_none_or(|(_, best_logit)| logit > best_logit) {
            winner = Some((first + offset as u32, logit));
        }
    }
    winner.map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_with(params: SamplingParams, logits: &[f32]) -> u32 {
        Sampler::new(params, &[])
            .sample(logits, &History::default())
            .unwrap()
            .token_id
    }

    fn draw_counts(params: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut sampler = Sampler::new(params, &[]);
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            let token = sampler.sample(logits, &History::default()).unwrap();
            counts[token.token_id as usize] += 1;
        }
        counts
    }

    #[test]
    fn a_nan_or_infinite_logit_fails_the_row_instead_of_being_skipped() {
        for bad in [f32::NAN, f32::INFINITY] {
            let mut logits = vec![0.5f32; 300];
            logits[200] = bad;
            for params in [SamplingParams::greedy(), SamplingParams::default()] {
                let mut sampler = Sampler::new(params, &[]);
                match sampler.sample(&logits, &History::default()) {
                    Err(ModelError::NonFiniteLogits { token_id, .. }) => assert_eq!(token_id, 200),
                    other => panic!("{bad}: expected a non-finite-logit error, got {other:?}"),
                }
            }
        }
        // -inf is a masked token, not an error.
        let mut logits = vec![f32::NEG_INFINITY; 300];
        logits[7] = 1.0;
        assert_eq!(sample_with(SamplingParams::greedy(), &logits), 7);
        assert_eq!(first_nan_or_infinity(&logits), None);
    }

    #[test]
    fn nothing_left_to_sample_is_its_own_error() {
        let params = SamplingParams {
            allowed_token_ids: Some(vec![1]),
            bad_words_token_ids: vec![vec![1]],
            ..SamplingParams::greedy()
        };
        let mut sampler = Sampler::new(params, &[]);
        let error = sampler.sample(&[0.0; 4], &History::default()).unwrap_err();
        assert!(matches!(error, ModelError::NoAllowedToken(_)), "{error}");
    }

    #[test]
    fn greedy_picks_max_and_lowest_id_on_ties() {
        assert_eq!(
            sample_with(SamplingParams::greedy(), &[0.1, 2.0, -1.0, 2.0]),
            1
        );
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), None);
    }

    /// The first strict maximum, scanned front to back: what `argmax` must return.
    fn first_max(logits: &[f32]) -> Option<u32> {
        let mut best: Option<(usize, f32)> = None;
        for (id, &logit) in logits.iter().enumerate() {
            if logit == f32::NEG_INFINITY || logit.is_nan() {
                continue;
            }
            if best.is_none_or(|(_, best_logit)| logit > best_logit) {
                best = Some((id, logit));
            }
        }
        best.map(|(id, _)| id as u32)
    }

    #[test]
    fn argmax_is_the_first_strict_maximum() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for len in [0usize, 1, 5, 15, 16, 17, 31, 33, 100, 1000, 49_152] {
            for _ in 0..20 {
                // Few distinct values, so ties across lanes, chunks and the tail are common.
                let logits: Vec<f32> = (0..len)
                    .map(|_| match next() % 12 {
                        0 => f32::NEG_INFINITY,
                        1 => f32::NAN,
                        2 => 0.0,
                        3 => -0.0,
                        4 => f32::INFINITY,
                        k => (k % 5) as f32 - 2.0,
                    })
                    .collect();
                assert_eq!(argmax(&logits), first_max(&logits), "{logits:?}");
                let finite: Vec<f32> = (0..len).map(|_| (next() % 7) as f32).collect();
                assert_eq!(argmax(&finite), first_max(&finite));
            }
        }
        assert_eq!(argmax(&[f32::NAN; 40]), None);
        assert_eq!(argmax(&[-0.0, 0.0]), Some(0));
        assert_eq!(argmax(&[0.0, -0.0]), Some(0));
    }

    #[test]
    fn the_chain_runs_before_the_pick_and_accepts_it() {
        let logits = [5.0, 1.0, 0.0, 0.5];
        let allowed = SamplingParams {
            allowed_token_ids: Some(vec![2, 3]),
            ..SamplingParams::greedy()
        };
        assert_eq!(sample_with(allowed, &logits), 3);
        let banned = SamplingParams {
            bad_words_token_ids: vec![vec![0]],
            ..SamplingParams::greedy()
        };
        assert_eq!(sample_with(banned, &logits), 1);
        let biased = SamplingParams {
            logit_bias: vec![(2, 10.0)],
            ..SamplingParams::greedy()
        };
        assert_eq!(sample_with(biased, &logits), 2);
        let min_tokens = SamplingParams {
            min_tokens: 1,
            all_stop_token_ids: vec![0, 1],
            ..SamplingParams::greedy()
        };
        let mut sampler = Sampler::new(min_tokens, &[]);
        assert_eq!(
            sampler
                .sample(&logits, &History::default())
                .unwrap()
                .token_id,
            3
        );
        let after_one = History {
            prompt: &[],
            output: &[3],
        };
        assert_eq!(sampler.sample(&logits, &after_one).unwrap().token_id, 0);
        let all_banned = SamplingParams {
            bad_words_token_ids: vec![vec![0], vec![1], vec![2], vec![3]],
            ..SamplingParams::greedy()
        };
        assert!(Sampler::new(all_banned, &[])
            .sample(&logits, &History::default())
            .is_err());
        // Frequency penalty 1: each pick of token 0 costs it one logit; accept counts it.
        let mut sampler = Sampler::new(
            SamplingParams {
                frequency_penalty: 1.0,
                ..SamplingParams::greedy()
            },
            &[],
        );
        let picks: Vec<u32> = (0..6)
            .map(|_| {
                sampler
                    .sample(&[3.5, 2.0], &History::default())
                    .unwrap()
                    .token_id
            })
            .collect();
        assert_eq!(picks, vec![0, 0, 1, 0, 1, 0]);
    }

    #[test]
    fn top_k_keeps_only_k_tokens() {
        let logits = [1.0, 3.0, 2.0, 0.0, 2.5];
        let params = SamplingParams {
            top_k: Some(2),
            seed: Some(7),
            ..SamplingParams::default()
        };
        let counts = draw_counts(params, &logits, 2000);
        assert_eq!(counts[0] + counts[2] + counts[3], 0, "{counts:?}");
        assert!(counts[1] > counts[4] && counts[4] > 0, "{counts:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_p() {
        // Probabilities 0.5, 0.3, 0.2: top_p 0.6 keeps the first two.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let params = SamplingParams {
            top_p: 0.6,
            seed: Some(3),
            ..SamplingParams::default()
        };
        let counts = draw_counts(params, &logits, 4000);
        assert_eq!(counts[2], 0, "{counts:?}");
        // 0.5 / 0.8 = 62.5 % of draws go to token 0.
        let share = counts[0] as f64 / 4000.0;
        assert!((share - 0.625).abs() < 0.04, "{counts:?}");
    }

    /// The chunked nucleus keeps exactly the tokens, in the order, that sorting every
    /// candidate and cutting at the same threshold keeps.
    #[test]
    fn nucleus_equals_the_full_sort() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..60 {
            let len = [3, 64, 65, 300, 5000][case % 5];
            let spread = [0.5f32, 4.0, 20.0][case % 3];
            let mut row: Vec<(u32, f32)> = (0..len as u32)
                .map(|id| {
                    (
                        id,
                        ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread,
                    )
                })
                .collect();
            if case % 4 == 0 {
                // Ties: equal logits must be ordered by id.
                for pair in row.iter_mut() {
                    pair.1 = (pair.1 * 2.0).round();
                }
            }
            let top_p = [0.1f32, 0.5, 0.9, 0.95, 0.999][case % 5];
            let max = row.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
            let total: f64 = row.iter().map(|c| f64::from(weight(c.1, max))).sum();
            let mut reference = row.clone();
            reference.sort_unstable_by(by_likelihood);
            let mut cumulative = 0.0f64;
            let mut keep = reference.len();
            for (index, candidate) in reference.iter().enumerate() {
                cumulative += f64::from(weight(candidate.1, max));
                if cumulative >= f64::from(top_p) * total {
                    keep = index + 1;
                    break;
                }
            }
            reference.truncate(keep);
            keep_nucleus(&mut row, top_p, max);
            assert_eq!(row, reference, "case {case}");
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        // Probabilities 0.6, 0.3, 0.1; min_p 0.2 → threshold 0.12 drops token 2.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let params = SamplingParams {
            min_p: 0.2,
            seed: Some(11),
            ..SamplingParams::default()
        };
        let counts = draw_counts(params, &logits, 3000);
        assert_eq!(counts[2], 0, "{counts:?}");
        assert!(counts[1] > 0, "{counts:?}");
    }

    #[test]
    fn temperature_sharpens_the_distribution() {
        let logits = [1.0, 0.0];
        let hot = draw_counts(
            SamplingParams {
                temperature: 1.0,
                seed: Some(5),
                ..SamplingParams::default()
            },
            &logits,
            4000,
        );
        let cold = draw_counts(
            SamplingParams {
                temperature: 0.25,
                seed: Some(5),
                ..SamplingParams::default()
            },
            &logits,
            4000,
        );
        // p0 = 1/(1+e^-1) = 0.731 at T=1 and 1/(1+e^-4) = 0.982 at T=0.25.
        assert!((hot[0] as f64 / 4000.0 - 0.731).abs() < 0.03, "{hot:?}");
        assert!((cold[0] as f64 / 4000.0 - 0.982).abs() < 0.01, "{cold:?}");
    }

    #[test]
    fn seeded_sampling_reproduces() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams {
            seed: Some(1234),
            top_p: 0.9,
            ..SamplingParams::default()
        };
        let draw = |params: SamplingParams| {
            let mut sampler = Sampler::new(params, &[]);
            (0..20)
                .map(|_| {
                    sampler
                        .sample(&logits, &History::default())
                        .unwrap()
                        .token_id
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(params.clone()), draw(params.clone()));
        let other = SamplingParams {
            seed: Some(4321),
            ..params.clone()
        };
        assert_ne!(draw(params), draw(other));
    }

    #[test]
    fn logprobs_are_raw_log_softmax() {
        let logits = [2.0f32, 1.0, 0.0, 1.0];
        let mut sampler = Sampler::new(
            SamplingParams {
                logprobs: Some(3),
                repetition_penalty: 5.0,
                ..SamplingParams::greedy()
            },
            &[0],
        );
        let token = sampler.sample(&logits, &History::default()).unwrap();
        // The penalty moves the choice to token 1, but logprobs describe the raw model output.
        assert_eq!(token.token_id, 1);
        let normalizer = (2.0f32.exp() + 2.0 * 1.0f32.exp() + 1.0).ln();
        assert!((token.logprob.unwrap() - (1.0 - normalizer)).abs() < 1e-6);
        let ids: Vec<u32> = token.top_logprobs.iter().map(|entry| entry.0).collect();
        assert_eq!(ids, vec![0, 1, 3]);
        assert!((token.top_logprobs[0].1 - (2.0 - normalizer)).abs() < 1e-6);
        let total: f32 = logits.iter().map(|l| (l - normalizer).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod verify_tests;
