//! `--speculative-config`: vLLM's JSON object, checked into a [`SpeculativeConfig`]. Every key
//! is either honoured or refused by name; so is every method tokenmill does not implement.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::EngineError;

/// The proposers tokenmill implements, as vLLM's `method` spells them.
pub const SUPPORTED_METHODS: [&str; 3] = ["ngram", "suffix", "draft_model"];

/// Longest draft accepted from the flag; a step verifies at most this many tokens per request.
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

/// Which proposer drafts the tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecMethod {
    /// Prompt lookup: the continuation of the latest earlier occurrence of the request's last
    /// `prompt_lookup_min..=prompt_lookup_max` tokens, in its own prompt and output.
    Ngram {
        prompt_lookup_min: usize,
        prompt_lookup_max: usize,
    },
    /// Suffix matching over the request's tokens and recent requests' outputs, the draft
    /// length following the match length.
    Suffix {
        /// Longest suffix matched (vLLM's `suffix_decoding_max_tree_depth`).
        max_tree_depth: usize,
        /// Finished requests whose outputs stay searchable
        /// (`suffix_decoding_max_cached_requests`).
        max_cached_requests: usize,
        /// Draft at most `max_spec_factor × match length` tokens
        /// (`suffix_decoding_max_spec_factor`).
        max_spec_factor: f64,
        /// Stop drafting where the continuation's observed frequency falls below this
        /// (`suffix_decoding_min_token_prob`).
        min_token_prob: f64,
    },
    /// A second model with the same vocabulary drafts greedily (`model`: a GGUF file or an
    /// HF directory).
    DraftModel { model: PathBuf },
}

/// Speculative decoding settings (vLLM's `SpeculativeConfig` subset that tokenmill runs).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    pub method: SpecMethod,
    /// Most draft tokens per request and step (`num_speculative_tokens`).
    pub num_speculative_tokens: usize,
    /// Speculation is skipped in steps with more running requests than this
    /// (`disable_by_batch_size`); see [`crate::spec`] for the default.
    pub disable_by_batch_size: usize,
}

impl SpeculativeConfig {
    /// Parses the flag's JSON. Refuses unknown keys and methods by name, as vLLM refuses
    /// bad values, so no setting is silently ignored.
    pub fn from_json(text: &str) -> Result<SpeculativeConfig, EngineError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("not a JSON object: {e}")))?;
        let Value::Object(object) = value else {
            return Err(invalid("not a JSON object".into()));
        };
        let method = match object.get("method") {
            Some(Value::String(method)) => method.as_str(),
            Some(_) => return Err(invalid("`method` must be a string".into())),
            None => return Err(invalid(format!("`method` is required ({})", methods()))),
        };
        if !SUPPORTED_METHODS.contains(&method) {
            return Err(invalid(format!(
                "method `{method}` is not supported ({})",
                methods()
            )));
        }
        let keys: &[&str] = match method {
            "ngram" => &["prompt_lookup_min", "prompt_lookup_max"],
            "draft_model" => &["model"],
            _ => &[
                "suffix_decoding_max_tree_depth",
                "suffix_decoding_max_cached_requests",
                "suffix_decoding_max_spec_factor",
                "suffix_decoding_min_token_prob",
            ],
        };
        const COMMON: [&str; 3] = ["method", "num_speculative_tokens", "disable_by_batch_size"];
        if let Some(key) = object
            .keys()
            .find(|key| !COMMON.contains(&key.as_str()) && !keys.contains(&key.as_str()))
        {
            return Err(invalid(format!(
                "key `{key}` is not supported with method `{method}` (supported: {})",
                COMMON
                    .iter()
                    .chain(keys)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let num_speculative_tokens = match usize_key(&object, "num_speculative_tokens")? {
            Some(k) if (1..=MAX_SPECULATIVE_TOKENS).contains(&k) => k,
            Some(k) => {
                return Err(invalid(format!(
                    "num_speculative_tokens must be 1 to {MAX_SPECULATIVE_TOKENS}, got {k}"
                )))
            }
            None => return Err(invalid("`num_speculative_tokens` is required".into())),
        };
        let disable_by_batch_size = match usize_key(&object, "disable_by_batch_size")? {
            Some(size) if size >= 2 => size,
            Some(size) => {
                return Err(invalid(format!(
                    "disable_by_batch_size must be at least 2, got {size}"
                )))
            }
            None => default_disable_by_batch_size(num_speculative_tokens),
        };
        let method =
            match method {
                "ngram" => ngram_method(&object)?,
                "draft_model" => match object.get("model") {
                    Some(Value::String(model)) if !model.is_empty() => SpecMethod::DraftModel {
                        model: PathBuf::from(model),
                    },
                    _ => return Err(invalid(
                        "method `draft_model` needs `model`: the draft model's GGUF file or HF \
                         directory"
                            .into(),
                    )),
                },
                _ => suffix_method(&object)?,
            };
        Ok(SpeculativeConfig {
            method,
            num_speculative_tokens,
            disable_by_batch_size,
        })
    }

    /// `ngram`, `suffix` or `draft_model`.
    pub fn method_name(&self) -> &'static str {
        match self.method {
            SpecMethod::Ngram { .. } => "ngram",
            SpecMethod::Suffix { .. } => "suffix",
            SpecMethod::DraftModel { .. } => "draft_model",
        }
    }
}

/// Rows per step above which speculation is skipped by default: the batch's decode rows
/// times `1 + k` drafts-and-decode rows stay within 64, where a step is still dominated by
/// reading the weights once (the forward pass's cost grows little with rows below that on
/// the CPU kernels; above, extra rows cost compute that rejected drafts do not repay).
pub fn default_disable_by_batch_size(num_speculative_tokens: usize) -> usize {
    (64 / (1 + num_speculative_tokens)).max(2)
}

/// vLLM's defaults: both bounds 5 when neither is given, else the missing one copies the
/// other.
fn ngram_method(object: &Map<String, Value>) -> Result<SpecMethod, EngineError> {
    let min = usize_key(object, "prompt_lookup_min")?;
    let max = usize_key(object, "prompt_lookup_max")?;
    let (prompt_lookup_min, prompt_lookup_max) = match (min, max) {
        (None, None) => (5, 5),
        (Some(min), None) => (min, min),
        (None, Some(max)) => (max, max),
        (Some(min), Some(max)) => (min, max),
    };
    if prompt_lookup_min == 0 || prompt_lookup_max < prompt_lookup_min {
        return Err(invalid(format!(
            "prompt_lookup_min ({prompt_lookup_min}) must be at least 1 and at most \
             prompt_lookup_max ({prompt_lookup_max})"
        )));
    }
    Ok(SpecMethod::Ngram {
        prompt_lookup_min,
        prompt_lookup_max,
    })
}

/// vLLM's (Arctic Inference's) defaults: depth 24, 10000 cached requests, factor 1.0,
/// probability 0.1.
fn suffix_method(object: &Map<String, Value>) -> Result<SpecMethod, EngineError> {
    let max_tree_depth = usize_key(object, "suffix_decoding_max_tree_depth")?.unwrap_or(24);
    let max_cached_requests =
        usize_key(object, "suffix_decoding_max_cached_requests")?.unwrap_or(10_000);
    let max_spec_factor = f64_key(object, "suffix_decoding_max_spec_factor")?.unwrap_or(1.0);
    let min_token_prob = f64_key(object, "suffix_decoding_min_token_prob")?.unwrap_or(0.1);
    if max_tree_depth == 0 {
        return Err(invalid(
            "suffix_decoding_max_tree_depth must be at least 1".into(),
        ));
    }
    if !(max_spec_factor > 0.0 && max_spec_factor.is_finite()) {
        return Err(invalid(
            "suffix_decoding_max_spec_factor must be positive".into(),
        ));
    }
    if !(0.0..=1.0).contains(&min_token_prob) {
        return Err(invalid(
            "suffix_decoding_min_token_prob must be in [0, 1]".into(),
        ));
    }
    Ok(SpecMethod::Suffix {
        max_tree_depth,
        max_cached_requests,
        max_spec_factor,
        min_token_prob,
    })
}

fn usize_key(object: &Map<String, Value>, key: &str) -> Result<Option<usize>, EngineError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| invalid(format!("`{key}` must be a non-negative integer"))),
    }
}

fn f64_key(object: &Map<String, Value>, key: &str) -> Result<Option<f64>, EngineError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_f64()
            .map(Some)
            .ok_or_else(|| invalid(format!("`{key}` must be a number"))),
    }
}

fn methods() -> String {
    format!("supported methods: {}", SUPPORTED_METHODS.join(", "))
}

fn invalid(reason: String) -> EngineError {
    EngineError::Config(format!("--speculative-config: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        SpeculativeConfig::from_json(text).unwrap_err().to_string()
    }

    #[test]
    fn ngram_takes_vllms_defaults_and_keys() {
        let config =
            SpeculativeConfig::from_json(r#"{"method": "ngram", "num_speculative_tokens": 4}"#)
                .unwrap();
        assert_eq!(
            config.method,
            SpecMethod::Ngram {
                prompt_lookup_min: 5,
                prompt_lookup_max: 5
            }
        );
        assert_eq!(config.disable_by_batch_size, 12);
        let config = SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2, "disable_by_batch_size": 8}"#,
        )
        .unwrap();
        assert_eq!(
            config.method,
            SpecMethod::Ngram {
                prompt_lookup_min: 2,
                prompt_lookup_max: 4
            }
        );
        assert_eq!(config.disable_by_batch_size, 8);
    }

    #[test]
    fn what_is_not_run_is_refused_by_name() {
        let message = error(r#"{"method": "eagle", "model": "x", "num_speculative_tokens": 3}"#);
        assert!(
            message.contains("`eagle`") && message.contains("ngram, suffix, draft_model"),
            "{message}"
        );
        assert!(
            error(r#"{"method": "draft_model", "num_speculative_tokens": 3}"#)
                .contains("needs `model`")
        );
        let config = SpeculativeConfig::from_json(
            r#"{"method": "draft_model", "model": "d.gguf", "num_speculative_tokens": 3}"#,
        )
        .unwrap();
        assert_eq!(
            config.method,
            SpecMethod::DraftModel {
                model: "d.gguf".into()
            }
        );
        let message = error(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}"#,
        );
        assert!(
            message.contains("`draft_tensor_parallel_size`"),
            "{message}"
        );
        assert!(error(r#"{"method": "ngram"}"#).contains("num_speculative_tokens"));
        assert!(error(r#"{"num_speculative_tokens": 2}"#).contains("supported methods"));
        assert!(error(r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}"#).contains("prompt_lookup_min"));
        assert!(error("[1]").contains("JSON object"));
        assert!(error(
            r#"{"method": "suffix", "num_speculative_tokens": 2, "prompt_lookup_min": 3}"#
        )
        .contains("`prompt_lookup_min`"));
    }
}
