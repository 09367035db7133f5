//! Logits processors: per-request steps that edit a logits row before a token is picked.
//!
//! A request's [`LogitsChain`] is built once from its [`SamplingParams`] and holds only the
//! processors the request uses (default parameters build an empty chain, which costs
//! nothing). The order is vLLM V1's: a grammar mask (the structured-outputs slot), allowed
//! token ids, bad words, the min-tokens ban, logit bias, repetition and frequency/presence
//! penalties, then the thinking budget (`thinking_budget.rs`), which can force a token. Raw
//! logprobs are taken before every processor but the grammar, so they describe the model, not the processors (vLLM's `raw_logprobs`); vLLM
//! applies a grammar's bitmask to the logits before its sampler, so those logprobs see it.
//! State is per request (penalty counts, grammar position), so a request's result never
//! depends on the rest of the batch.

use std::collections::{HashMap, HashSet};

use super::params::SamplingParams;
use super::thinking_budget::ThinkingBudgetProcessor;
use crate::error::Result;

/// The tokens a request has seen when its next token is picked.
#[derive(Debug, Clone, Copy, Default)]
pub struct History<'a> {
    pub prompt: &'a [u32],
    /// Tokens generated so far, oldest first.
    pub output: &'a [u32],
}

/// One step of a request's logits processing.
pub trait LogitsProcessor: Send + std::fmt::Debug {
    /// Edits `logits` (one vocabulary-sized row) for the request's next token; a token
    /// set to `-inf` cannot be picked.
    fn apply(&mut self, logits: &mut [f32], history: &History<'_>) -> Result<()>;

    /// The token picked after `apply`; incremental state (counts, a grammar's position)
    /// advances here rather than being rebuilt from the history each step. Stateless
    /// processors keep the default, which does nothing.
    fn accept(&mut self, _token: u32) -> Result<()> {
        Ok(())
    }
}

/// Only the given tokens may be picked.
#[derive(Debug)]
pub(crate) struct AllowedTokens {
    /// Sorted, without duplicates.
    ids: Vec<u32>,
}

impl AllowedTokens {
    pub(crate) fn new(ids: &[u32]) -> AllowedTokens {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        AllowedTokens { ids }
    }
}

impl LogitsProcessor for AllowedTokens {
    fn apply(&mut self, logits: &mut [f32], _: &History<'_>) -> Result<()> {
        let mut allowed = self.ids.iter().peekable();
        for (id, logit) in logits.iter_mut().enumerate() {
            if allowed.next_if_eq(&&(id as u32)).is_none() {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
}

/// vLLM's bad words: a word's last token is banned whenever the output ends with the tokens
/// before it (a one-token word is banned always). Only the output counts, not the prompt.
#[derive(Debug)]
pub(crate) struct BadWords {
    words: Vec<Vec<u32>>,
}

impl BadWords {
    pub(crate) fn new(words: &[Vec<u32>]) -> BadWords {
        BadWords {
            words: words.to_vec(),
        }
    }
}

impl LogitsProcessor for BadWords {
    fn apply(&mut self, logits: &mut [f32], history: &History<'_>) -> Result<()> {
        for word in &self.words {
            let Some((&last, prefix)) = word.split_last() else {
                continue;
            };
            if history.output.ends_with(prefix) {
                if let Some(logit) = logits.get_mut(last as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }
}

/// EOS and stop tokens cannot be picked before `min_tokens` tokens were generated.
#[derive(Debug)]
pub(crate) struct MinTokens {
    min_tokens: usize,
    banned: Vec<u32>,
}

impl LogitsProcessor for MinTokens {
    fn apply(&mut self, logits: &mut [f32], history: &History<'_>) -> Result<()> {
        if history.output.len() < self.min_tokens {
            for &id in &self.banned {
                if let Some(logit) = logits.get_mut(id as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }
}

/// Adds a fixed bias to some tokens' logits.
#[derive(Debug)]
pub(crate) struct LogitBias {
    bias: Vec<(u32, f32)>,
}

impl LogitsProcessor for LogitBias {
    fn apply(&mut self, logits: &mut [f32], _: &History<'_>) -> Result<()> {
        for &(id, bias) in &self.bias {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit += bias;
            }
        }
        Ok(())
    }
}

/// Divides positive and multiplies negative logits by `penalty`, once per distinct token of
/// the prompt and the output (CTRL's / vLLM's repetition penalty).
#[derive(Debug)]
pub(crate) struct RepetitionPenalty {
    penalty: f32,
    seen: HashSet<u32>,
    /// `seen` in first-seen order, iterated each step (a `HashSet` walk visits its buckets).
    distinct: Vec<u32>,
}

impl RepetitionPenalty {
    pub(crate) fn new(penalty: f32, prompt: &[u32]) -> RepetitionPenalty {
        let mut processor = RepetitionPenalty {
            penalty,
            seen: HashSet::new(),
            distinct: Vec::new(),
        };
        for &id in prompt {
            processor.see(id);
        }
        processor
    }

    fn see(&mut self, id: u32) {
        if self.seen.insert(id) {
            self.distinct.push(id);
        }
    }
}

impl LogitsProcessor for RepetitionPenalty {
    fn apply(&mut self, logits: &mut [f32], _: &History<'_>) -> Result<()> {
        for &id in &self.distinct {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit = if *logit > 0.0 {
                    *logit / self.penalty
                } else {
                    *logit * self.penalty
                };
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.see(token);
        Ok(())
    }
}

/// OpenAI's frequency and presence penalties: `frequency * count + presence` is subtracted
/// from every token generated `count > 0` times (the prompt does not count).
#[derive(Debug)]
pub(crate) struct OccurrencePenalties {
    frequency: f32,
    presence: f32,
    /// `(token, times generated)`, in first-generated order.
    counts: Vec<(u32, u32)>,
    /// Token → its index in `counts`.
    index: HashMap<u32, usize>,
}

impl OccurrencePenalties {
    pub(crate) fn new(frequency: f32, presence: f32) -> OccurrencePenalties {
        OccurrencePenalties {
            frequency,
            presence,
            counts: Vec::new(),
            index: HashMap::new(),
        }
    }
}

impl LogitsProcessor for OccurrencePenalties {
    fn apply(&mut self, logits: &mut [f32], _: &History<'_>) -> Result<()> {
        for &(id, count) in &self.counts {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit -= self.frequency * count as f32 + self.presence;
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        let next = self.counts.len();
        let at = *self.index.entry(token).or_insert(next);
        match self.counts.get_mut(at) {
            Some(entry) => entry.1 += 1,
            None => self.counts.push((token, 1)),
        }
        Ok(())
    }
}

/// One request's processors, in application order.
#[derive(Debug, Default)]
pub struct LogitsChain {
    /// The structured-outputs slot: a grammar's token mask comes first (as vLLM applies its
    /// bitmask before the sampler) and advances on `accept`. Set by [`LogitsChain::set_grammar`].
    grammar: Option<Box<dyn LogitsProcessor>>,
    processors: Vec<Box<dyn LogitsProcessor>>,
}

impl LogitsChain {
    /// The processors `params` asks for, with the prompt's tokens already counted.
    pub fn new(params: &SamplingParams, prompt: &[u32]) -> LogitsChain {
        let mut processors: Vec<Box<dyn LogitsProcessor>> = Vec::new();
        if let Some(allowed) = &params.allowed_token_ids {
            processors.push(Box::new(AllowedTokens::new(allowed)));
        }
        if !params.bad_words_token_ids.is_empty() {
            processors.push(Box::new(BadWords::new(&params.bad_words_token_ids)));
        }
        if params.min_tokens > 0 && !params.all_stop_token_ids.is_empty() {
            processors.push(Box::new(MinTokens {
                min_tokens: params.min_tokens as usize,
                banned: params.all_stop_token_ids.clone(),
            }));
        }
        if !params.logit_bias.is_empty() {
            processors.push(Box::new(LogitBias {
                bias: params.logit_bias.clone(),
            }));
        }
        if params.repetition_penalty != 1.0 {
            processors.push(Box::new(RepetitionPenalty::new(
                params.repetition_penalty,
                prompt,
            )));
        }
        if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            processors.push(Box::new(OccurrencePenalties::new(
                params.frequency_penalty,
                params.presence_penalty,
            )));
        }
        // Last: once the budget is spent the end marker is forced whatever came before.
        if let Some(budget) = &params.thinking_budget {
            processors.push(Box::new(ThinkingBudgetProcessor::new(budget, prompt)));
        }
        LogitsChain {
            grammar: None,
            processors,
        }
    }

    /// Puts a grammar's mask first in the chain (structured outputs), replacing any earlier one.
    pub fn set_grammar(&mut self, grammar: Box<dyn LogitsProcessor>) {
        self.grammar = Some(grammar);
    }

    /// Whether a grammar is attached (its mask comes before raw logprobs, as in vLLM).
    pub fn has_grammar(&self) -> bool {
        self.grammar.is_some()
    }

    /// The grammar's mask alone (nothing without a grammar).
    pub(crate) fn apply_grammar(
        &mut self,
        logits: &mut [f32],
        history: &History<'_>,
    ) -> Result<()> {
        match &mut self.grammar {
            Some(grammar) => grammar.apply(logits, history),
            None => Ok(()),
        }
    }

    /// Every processor after the grammar.
    pub(crate) fn apply_processors(
        &mut self,
        logits: &mut [f32],
        history: &History<'_>,
    ) -> Result<()> {
        self.processors
            .iter_mut()
            .try_for_each(|processor| processor.apply(logits, history))
    }

    /// No processor: the raw logits are picked from as they are.
    pub fn is_empty(&self) -> bool {
        self.grammar.is_none() && self.processors.is_empty()
    }

    fn all(&mut self) -> impl Iterator<Item = &mut Box<dyn LogitsProcessor>> {
        self.grammar.iter_mut().chain(self.processors.iter_mut())
    }
}

impl LogitsProcessor for LogitsChain {
    fn apply(&mut self, logits: &mut [f32], history: &History<'_>) -> Result<()> {
        self.all()
            .try_for_each(|processor| processor.apply(logits, history))
    }

    fn accept(&mut self, token: u32) -> Result<()> {
        self.all().try_for_each(|processor| processor.accept(token))
    }
}

#[cfg(test)]
mod tests {
    //! Each processor alone against a naive reference, over random logits and histories.

    use std::collections::HashMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const VOCAB: usize = 40;
    const CASES: usize = 300;

    /// Random logits (some negative, some -inf) and token ids, a few outside the vocabulary.
    fn logits(rng: &mut StdRng) -> Vec<f32> {
        (0..VOCAB)
            .map(|_| match rng.random_range(0..20) {
                0 => f32::NEG_INFINITY,
                _ => rng.random_range(-8.0f32..8.0),
            })
            .collect()
    }

    fn tokens(rng: &mut StdRng, max_len: usize) -> Vec<u32> {
        let len = rng.random_range(0..=max_len);
        (0..len)
            .map(|_| rng.random_range(0..VOCAB as u32 + 3))
            .collect()
    }

    /// Runs `processor` once and the reference on a copy; the rows must be bitwise equal.
    fn check(
        processor: &mut dyn LogitsProcessor,
        reference: impl Fn(&mut [f32]),
        row: &[f32],
        history: &History<'_>,
    ) {
        let mut ours = row.to_vec();
        processor.apply(&mut ours, history).unwrap();
        let mut expected = row.to_vec();
        reference(&mut expected);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&expected), "{history:?}");
    }

    #[test]
    fn allowed_tokens_mask_everything_else() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..CASES {
            let allowed = tokens(&mut rng, 8);
            let row = logits(&mut rng);
            check(
                &mut AllowedTokens::new(&allowed),
                |row| {
                    for (id, logit) in row.iter_mut().enumerate() {
                        if !allowed.contains(&(id as u32)) {
                            *logit = f32::NEG_INFINITY;
                        }
                    }
                },
                &row,
                &History::default(),
            );
        }
    }

    /// vLLM's `_apply_bad_words_single_batch`, transcribed.
    fn bad_words_reference(row: &mut [f32], words: &[Vec<u32>], past: &[u32]) {
        for word in words {
            if word.len() > past.len() + 1 {
                continue;
            }
            let prefix_length = word.len() - 1;
            let last = word[prefix_length];
            let actual = &past[past.len() - prefix_length..];
            if actual == &word[..prefix_length] && (last as usize) < row.len() {
                row[last as usize] = f32::NEG_INFINITY;
            }
        }
    }

    #[test]
    fn bad_words_ban_the_last_token_after_the_prefix() {
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..CASES {
            let words: Vec<Vec<u32>> = (0..rng.random_range(1..4))
                .map(|_| {
                    // Small ids so that prefixes occur in the random output.
                    let len = rng.random_range(1..4);
                    (0..len).map(|_| rng.random_range(0..4)).collect()
                })
                .collect();
            let output: Vec<u32> = (0..rng.random_range(0..6))
                .map(|_| rng.random_range(0..4))
                .collect();
            let prompt = tokens(&mut rng, 5);
            let history = History {
                prompt: &prompt,
                output: &output,
            };
            check(
                &mut BadWords::new(&words),
                |row| bad_words_reference(row, &words, &output),
                &logits(&mut rng),
                &history,
            );
        }
        // "a b c": c is banned only right after "a b", and never from the prompt alone.
        let mut row = vec![0.0; 4];
        let words = [vec![1, 2, 3]];
        let history = History {
            prompt: &[1, 2],
            output: &[],
        };
        BadWords::new(&words).apply(&mut row, &history).unwrap();
        assert_eq!(row[3], 0.0);
        let history = History {
            prompt: &[],
            output: &[0, 1, 2],
        };
        BadWords::new(&words).apply(&mut row, &history).unwrap();
        assert_eq!(row[3], f32::NEG_INFINITY);
    }

    #[test]
    fn min_tokens_bans_stop_tokens_until_enough_were_generated() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..CASES {
            let banned = tokens(&mut rng, 3);
            let min_tokens = rng.random_range(0..6);
            let output = tokens(&mut rng, 8);
            let history = History {
                prompt: &[],
                output: &output,
            };
            check(
                &mut MinTokens {
                    min_tokens,
                    banned: banned.clone(),
                },
                |row| {
                    for &id in &banned {
                        if output.len() < min_tokens && (id as usize) < row.len() {
                            row[id as usize] = f32::NEG_INFINITY;
                        }
                    }
                },
                &logits(&mut rng),
                &history,
            );
        }
    }

    #[test]
    fn logit_bias_adds() {
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..CASES {
            let bias: Vec<(u32, f32)> = tokens(&mut rng, 5)
                .into_iter()
                .map(|id| (id, rng.random_range(-100.0f32..100.0)))
                .collect();
            check(
                &mut LogitBias { bias: bias.clone() },
                |row| {
                    for &(id, value) in &bias {
                        if (id as usize) < row.len() {
                            row[id as usize] += value;
                        }
                    }
                },
                &logits(&mut rng),
                &History::default(),
            );
        }
    }

    /// The sampler's penalties before they became processors: every step rebuilds a map over
    /// the whole history (repetition: once per distinct prompt-or-output token; frequency and
    /// presence: output counts).
    fn rebuild_per_step_penalties(
        row: &mut [f32],
        params: &SamplingParams,
        prompt: &[u32],
        output: &[u32],
    ) {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        if params.repetition_penalty != 1.0 {
            let penalty = params.repetition_penalty;
            for &id in prompt.iter().chain(output) {
                if counts.insert(id, 1).is_none() {
                    if let Some(logit) = row.get_mut(id as usize) {
                        *logit = if *logit > 0.0 {
                            *logit / penalty
                        } else {
                            *logit * penalty
                        };
                    }
                }
            }
        }
        if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            counts.clear();
            for &id in output {
                *counts.entry(id).or_insert(0) += 1;
            }
            for (&id, &count) in &counts {
                if let Some(logit) = row.get_mut(id as usize) {
                    *logit -= params.frequency_penalty * count as f32 + params.presence_penalty;
                }
            }
        }
    }

    #[test]
    fn incremental_penalties_equal_the_rebuild_per_step_code_on_a_long_history() {
        let mut rng = StdRng::seed_from_u64(5);
        for round in 0..6 {
            let params = SamplingParams {
                repetition_penalty: [1.0, 1.3, 0.7][round % 3],
                frequency_penalty: if round < 3 {
                    0.0
                } else {
                    rng.random_range(-2.0..2.0)
                },
                presence_penalty: if round % 2 == 0 {
                    0.0
                } else {
                    rng.random_range(-2.0..2.0)
                },
                ..SamplingParams::greedy()
            };
            let prompt = tokens(&mut rng, 200);
            let mut chain = LogitsChain::new(&params, &prompt);
            let mut output = Vec::new();
            for _ in 0..1000 {
                let row = logits(&mut rng);
                let history = History {
                    prompt: &prompt,
                    output: &output,
                };
                check(
                    &mut chain,
                    |row| rebuild_per_step_penalties(row, &params, &prompt, &output),
                    &row,
                    &history,
                );
                let token = rng.random_range(0..VOCAB as u32 + 3);
                chain.accept(token).unwrap();
                output.push(token);
            }
        }
    }

    #[test]
    fn default_parameters_build_an_empty_chain_and_the_order_is_vllms() {
        assert!(LogitsChain::new(&SamplingParams::default(), &[1, 2]).is_empty());
        // Bias then repetition penalty: (1 + 1) / 2, not 1 / 2 + 1.
        let params = SamplingParams {
            logit_bias: vec![(0, 1.0)],
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut row = vec![1.0, 1.0];
        let mut chain = LogitsChain::new(&params, &[0]);
        assert!(!chain.is_empty());
        chain.apply(&mut row, &History::default()).unwrap();
        assert_eq!(row, vec![1.0, 1.0]);
    }
}
