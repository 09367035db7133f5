//! What the user may change about a pooling model at start-up: vLLM's `--convert` (how a
//! generative checkpoint becomes a pooling model) and `--pooler-config` (the pooling method
//! and normalization, over the model's and sentence-transformers' defaults).

use serde_json::Value;

use super::{PoolingMethod, PoolingModelInfo, PoolingTask};
use crate::cache_dtype::ModelDtype;
use crate::error::{ModelError, Result};

/// vLLM's `--convert`: what a model without a pooling head of its own becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvertOption {
    /// Encoders are served as they are; decoders (`*ForCausalLM`) become embedders.
    #[default]
    Auto,
    /// No conversion: only models that pool natively (BERT) are accepted.
    None,
    /// Decoders become embedders (their final hidden states pooled).
    Embed,
}

impl ConvertOption {
    /// Parses vLLM's values; `classify` and `reward` exist in vLLM but are refused here by
    /// name (a decoder has no trained classification or reward head to convert to).
    pub fn parse(value: &str) -> Result<ConvertOption> {
        match value {
            "auto" => Ok(ConvertOption::Auto),
            "none" => Ok(ConvertOption::None),
            "embed" => Ok(ConvertOption::Embed),
            "classify" | "reward" => Err(ModelError::PoolingOption(format!(
                "--convert {value} is not supported (supported: auto, none, embed)"
            ))),
            other => Err(ModelError::PoolingOption(format!(
                "--convert {other:?} is not one of vLLM's values (auto, none, embed, classify, \
                 reward); supported: auto, none, embed"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConvertOption::Auto => "auto",
            ConvertOption::None => "none",
            ConvertOption::Embed => "embed",
        }
    }
}

/// vLLM's `--pooler-config` (formerly `--override-pooler-config`): the keys tokenmill
/// implements. Unset fields keep the model's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolerConfig {
    pub pooling_type: Option<PoolingMethod>,
    pub normalize: Option<bool>,
}

/// vLLM `PoolerConfig` keys that exist there but are not implemented here: refused by name
/// rather than ignored.
const UNSUPPORTED_KEYS: &[&str] = &[
    "dimensions",
    "enable_chunked_processing",
    "max_embed_len",
    "softmax",
    "activation",
    "use_activation",
    "logit_bias",
    "step_tag_id",
    "returned_token_ids",
];

impl PoolerConfig {
    /// Parses the flag's JSON object, e.g. `{"pooling_type": "LAST", "normalize": true}`.
    /// `pooling_type` is one of LAST, MEAN, CLS (vLLM's ALL and STEP are refused by name);
    /// any other key is refused by name.
    pub fn from_json(text: &str) -> Result<PoolerConfig> {
        let bad =
            |message: String| ModelError::PoolingOption(format!("--pooler-config: {message}"));
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        let Value::Object(map) = value else {
            return Err(bad("expected a JSON object".into()));
        };
        let mut config = PoolerConfig::default();
        for (key, value) in &map {
            match key.as_str() {
                "pooling_type" => {
                    config.pooling_type = match value {
                        Value::Null => None,
                        Value::String(name) => Some(parse_pooling_type(name).map_err(bad)?),
                        other => {
                            return Err(bad(format!("pooling_type must be a string, not {other}")))
                        }
                    }
                }
                "normalize" => {
                    config.normalize = match value {
                        Value::Null => None,
                        Value::Bool(flag) => Some(*flag),
                        other => {
                            return Err(bad(format!(
                                "normalize must be true or false, not {other}"
                            )))
                        }
                    }
                }
                key if UNSUPPORTED_KEYS.contains(&key) => {
                    return Err(bad(format!(
                        "{key} is not supported (supported keys: pooling_type, normalize)"
                    )))
                }
                other => {
                    return Err(bad(format!(
                        "unknown key {other:?} (supported keys: pooling_type, normalize)"
                    )))
                }
            }
        }
        Ok(config)
    }

    /// Applies the set fields over `info`'s defaults. `normalize` applies to embedding models
    /// only (a classifier's logits go through the route's activation instead).
    pub fn apply(&self, info: &mut PoolingModelInfo) -> Result<()> {
        if let Some(method) = self.pooling_type {
            info.method = method;
        }
        if let Some(normalize) = self.normalize {
            if info.task != PoolingTask::Embed {
                return Err(ModelError::PoolingOption(format!(
                    "--pooler-config: normalize applies to embedding models; {} is a {} model",
                    info.architecture,
                    info.task.name()
                )));
            }
            info.normalize = normalize;
        }
        Ok(())
    }
}

fn parse_pooling_type(name: &str) -> std::result::Result<PoolingMethod, String> {
    match name.to_ascii_uppercase().as_str() {
        "LAST" => Ok(PoolingMethod::Last),
        "MEAN" => Ok(PoolingMethod::Mean),
        "CLS" => Ok(PoolingMethod::Cls),
        "ALL" | "STEP" => Err(format!(
            "pooling_type {name} (per-token output) is not supported (supported: LAST, MEAN, CLS)"
        )),
        _ => Err(format!(
            "unknown pooling_type {name:?} (supported: LAST, MEAN, CLS)"
        )),
    }
}

/// How [`super::load_pooling_model_with`] loads a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolingOptions {
    pub convert: ConvertOption,
    pub pooler: PoolerConfig,
    /// `--dtype`: an encoder's linear layers in f32, bf16 or int8 pairs
    /// ([`crate::EncoderPrecision::for_dtype`]); decoder embedders compute in f32 whatever it
    /// says.
    pub dtype: ModelDtype,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(task: PoolingTask) -> PoolingModelInfo {
        PoolingModelInfo {
            architecture: "test".into(),
            task,
            output_dim: 4,
            labels: Vec::new(),
            vocab_size: 10,
            max_model_len: 8,
            method: PoolingMethod::Last,
            normalize: true,
            matryoshka_dimensions: None,
        }
    }

    #[test]
    fn pooler_config_parses_and_applies() {
        let config =
            PoolerConfig::from_json(r#"{"pooling_type": "MEAN", "normalize": false}"#).unwrap();
        assert_eq!(config.pooling_type, Some(PoolingMethod::Mean));
        assert_eq!(config.normalize, Some(false));
        let mut embed = info(PoolingTask::Embed);
        config.apply(&mut embed).unwrap();
        assert_eq!(
            (embed.method, embed.normalize),
            (PoolingMethod::Mean, false)
        );
        let cls = PoolerConfig::from_json(r#"{"pooling_type": "cls"}"#).unwrap();
        let mut embed = info(PoolingTask::Embed);
        cls.apply(&mut embed).unwrap();
        assert_eq!((embed.method, embed.normalize), (PoolingMethod::Cls, true));
        assert_eq!(
            PoolerConfig::from_json("{}").unwrap(),
            PoolerConfig::default()
        );
    }

    #[test]
    fn pooler_config_refuses_by_name() {
        for (text, named) in [
            (r#"{"pooling_type": "ALL"}"#, "ALL"),
            (r#"{"pooling_type": "STEP"}"#, "STEP"),
            (r#"{"pooling_type": "MAX"}"#, "MAX"),
            (r#"{"dimensions": 8}"#, "dimensions"),
            (r#"{"softmax": true}"#, "softmax"),
            (r#"{"poolingtype": "LAST"}"#, "poolingtype"),
            (r#"{"normalize": "yes"}"#, "normalize"),
            ("[1]", "JSON object"),
            ("LAST", "JSON object"),
        ] {
            let error = PoolerConfig::from_json(text).unwrap_err().to_string();
            assert!(error.contains(named), "{text}: {error}");
        }
        let normalize = PoolerConfig::from_json(r#"{"normalize": true}"#).unwrap();
        let error = normalize
            .apply(&mut info(PoolingTask::Classify))
            .unwrap_err();
        assert!(error.to_string().contains("normalize"), "{error}");
    }

    #[test]
    fn convert_values() {
        assert_eq!(ConvertOption::parse("embed").unwrap(), ConvertOption::Embed);
        assert_eq!(ConvertOption::parse("none").unwrap(), ConvertOption::None);
        assert_eq!(ConvertOption::parse("auto").unwrap(), ConvertOption::Auto);
        for value in ["classify", "reward", "generate"] {
            let error = ConvertOption::parse(value).unwrap_err().to_string();
            assert!(error.contains(value), "{error}");
        }
    }
}
