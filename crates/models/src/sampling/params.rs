//! [`SamplingParams`]: one request's sampling settings, with vLLM's names, defaults and ranges.

use std::collections::HashSet;

use super::grammar::StructuredOutput;
use super::thinking_budget::ThinkingBudget;
use crate::error::{ModelError, Result};

/// Below this temperature sampling is greedy, as in vLLM (`_SAMPLING_EPS`).
pub(crate) const GREEDY_TEMPERATURE: f32 = 1e-5;

/// One request's sampling settings (vLLM `SamplingParams` names and defaults). The
/// logits-processor chain ([`crate::LogitsChain`]) is built from it once per request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens; `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Seeds this request's RNG; `None` draws a fresh seed.
    pub seed: Option<u64>,
    /// > 1 discourages tokens seen in the prompt or output; 1 = off.
    pub repetition_penalty: f32,
    /// Subtracted once from every token that appears in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// Added to the logits of the given tokens before penalties.
    pub logit_bias: Vec<(u32, f32)>,
    /// Return this many most likely tokens (and the chosen token's logprob); `None` = none.
    pub logprobs: Option<usize>,
    /// If set, only these tokens may be sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// `bad_words` as token sequences (vLLM's `_bad_words_token_ids`, from
    /// `tokenmill_text::Tokenizer::bad_words_token_ids`): a sequence's last token is banned
    /// whenever the output so far ends with the tokens before it (always, for one token).
    pub bad_words_token_ids: Vec<Vec<u32>>,
    /// [`SamplingParams::all_stop_token_ids`] may not be sampled (nor end the request) before
    /// this many tokens were generated.
    pub min_tokens: u32,
    /// What `min_tokens` holds back: the request's stop token ids plus, unless it ignores EOS,
    /// the model's EOS ids (vLLM's `all_stop_token_ids`). The engine fills it when it admits a
    /// request, since only it knows the EOS set; callers leave it empty.
    pub all_stop_token_ids: Vec<u32>,
    /// Structured outputs: the grammar the output must match. The executor compiles it with
    /// the model's [`crate::GrammarCompiler`] and puts it first in the chain.
    pub structured_output: Option<StructuredOutput>,
    /// The reasoning-token budget (vLLM's `thinking_token_budget`): once the output has spent
    /// it inside reasoning sections, the end marker is forced.
    pub thinking_budget: Option<ThinkingBudget>,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
            allowed_token_ids: None,
            bad_words_token_ids: Vec::new(),
            min_tokens: 0,
            all_stop_token_ids: Vec::new(),
            structured_output: None,
            thinking_budget: None,
        }
    }
}

impl SamplingParams {
    /// Deterministic argmax decoding.
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    /// Rejects values vLLM rejects, with the offending field named. The HTTP server has
    /// already checked its requests (`tokenmill-protocol`); this guards every other caller.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, message: String| {
            Err(ModelError::InvalidSamplingParams(format!(
                "{field}: {message}"
            )))
        };
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return invalid(
                "temperature",
                format!("must be >= 0, got {}", self.temperature),
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", format!("must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid("min_p", format!("must be in [0, 1], got {}", self.min_p));
        }
        if self.top_k == Some(0) {
            return invalid("top_k", "must be at least 1 (or unset)".into());
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return invalid(
                "repetition_penalty",
                format!("must be > 0, got {}", self.repetition_penalty),
            );
        }
        for (field, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return invalid(field, format!("must be in [-2, 2], got {value}"));
            }
        }
        if self.allowed_token_ids.as_ref().is_some_and(Vec::is_empty) {
            return invalid("allowed_token_ids", "must not be empty".into());
        }
        if self.bad_words_token_ids.iter().any(Vec::is_empty) {
            return invalid("bad_words", "a bad word has no tokens".into());
        }
        if let Some(budget) = &self.thinking_budget {
            if budget.start_token_ids.is_empty() || budget.end_token_ids.is_empty() {
                return invalid(
                    "thinking_token_budget",
                    "the reasoning start and end markers must have tokens".into(),
                );
            }
        }
        self.check_satisfiable(&self.all_stop_token_ids)
            .map_err(|error| ModelError::InvalidSamplingParams(error.to_string()))
    }

    /// Refuses constraints that leave no token to sample, where that is known before the
    /// first step: every allowed id banned by a one-token bad word, or, under `min_tokens`,
    /// every remaining allowed id a stop token (`stop_token_ids` are the request's stop ids
    /// plus, unless it ignores EOS, the model's EOS ids: what
    /// [`SamplingParams::all_stop_token_ids`] will hold). What only shows while decoding (a
    /// grammar that allows none of the allowed ids) ends that request with an error instead.
    pub fn check_satisfiable(&self, stop_token_ids: &[u32]) -> Result<(), Unsatisfiable> {
        let Some(allowed) = &self.allowed_token_ids else {
            return Ok(());
        };
        let banned: HashSet<u32> = self
            .bad_words_token_ids
            .iter()
            .filter_map(|word| match word.as_slice() {
                [only] => Some(*only),
                _ => None,
            })
            .collect();
        let mut open = allowed.iter().filter(|id| !banned.contains(id)).peekable();
        if open.peek().is_none() {
            return Err(Unsatisfiable::AllowedTokensBanned);
        }
        if self.min_tokens > 0 && open.all(|id| stop_token_ids.contains(id)) {
            return Err(Unsatisfiable::MinTokensOnlyStopTokens {
                min_tokens: self.min_tokens,
            });
        }
        Ok(())
    }
}

/// Sampling constraints that leave no token to sample ([`SamplingParams::check_satisfiable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsatisfiable {
    #[error("allowed_token_ids: every allowed token is banned by bad_words, so nothing can be generated")]
    AllowedTokensBanned,
    #[error(
        "min_tokens: {min_tokens} tokens must come before a stop token, but every allowed \
         token (allowed_token_ids, less bad_words) is a stop token (EOS or stop_token_ids)"
    )]
    MinTokensOnlyStopTokens { min_tokens: u32 },
}

impl Unsatisfiable {
    /// The request field the error names.
    pub fn param(&self) -> &'static str {
        match self {
            Unsatisfiable::AllowedTokensBanned => "allowed_token_ids",
            Unsatisfiable::MinTokensOnlyStopTokens { .. } => "min_tokens",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        let bad = SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
        let bad = SamplingParams {
            bad_words_token_ids: vec![vec![]],
            ..SamplingParams::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("bad_words"));
        assert!(SamplingParams::default().validate().is_ok());
    }

    #[test]
    fn constraints_that_leave_no_token_are_refused_before_the_first_step() {
        let eos = 2;
        // vLLM accepts these; they can only fail once decoding starts.
        let only_eos = SamplingParams {
            allowed_token_ids: Some(vec![eos]),
            min_tokens: 3,
            ..SamplingParams::default()
        };
        assert_eq!(
            only_eos.check_satisfiable(&[eos]),
            Err(Unsatisfiable::MinTokensOnlyStopTokens { min_tokens: 3 })
        );
        // Without min_tokens (or with EOS not a stop id: ignore_eos) it is fine.
        assert_eq!(only_eos.check_satisfiable(&[]), Ok(()));
        let no_min = SamplingParams {
            min_tokens: 0,
            ..only_eos.clone()
        };
        assert_eq!(no_min.check_satisfiable(&[eos]), Ok(()));
        // A stop token id the client allowed and banned under min_tokens.
        let stop_only = SamplingParams {
            allowed_token_ids: Some(vec![7, 9]),
            bad_words_token_ids: vec![vec![9]],
            min_tokens: 1,
            ..SamplingParams::default()
        };
        let error = stop_only.check_satisfiable(&[eos, 7]).unwrap_err();
        assert_eq!(error.param(), "min_tokens");
        assert_eq!(stop_only.check_satisfiable(&[eos]), Ok(()));
        let banned = SamplingParams {
            allowed_token_ids: Some(vec![5, 6]),
            // A two-token bad word bans 6 only after 5: not always.
            bad_words_token_ids: vec![vec![5], vec![5, 6]],
            ..SamplingParams::default()
        };
        assert_eq!(banned.check_satisfiable(&[]), Ok(()));
        let banned = SamplingParams {
            bad_words_token_ids: vec![vec![5], vec![6]],
            ..banned
        };
        assert_eq!(
            banned.check_satisfiable(&[]),
            Err(Unsatisfiable::AllowedTokensBanned)
        );
        // `validate` applies the check with the engine's stop ids.
        let error = SamplingParams {
            all_stop_token_ids: vec![eos],
            ..only_eos
        }
        .validate()
        .unwrap_err();
        assert!(error.to_string().contains("min_tokens"), "{error}");
    }
}
