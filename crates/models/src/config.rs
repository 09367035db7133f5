//! Typed model hyper-parameters, read from GGUF metadata or an HF `config.json`.

use std::path::Path;

use serde::Deserialize;
use tokenmill_gguf::GgufFile;

use crate::error::{io_error, ModelError, Result};

/// The Llama-family variants this crate runs. They share one implementation; the differences
/// (QKV bias, RoPE layout) are fields of [`ModelConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3 and everything shaped like it (SmolLM2, TinyLlama, ...).
    Llama,
    Mistral,
    /// Qwen2 and Qwen2.5: Llama with a bias on the Q, K and V projections.
    Qwen2,
}

impl Architecture {
    /// Maps a GGUF `general.architecture` or HF `model_type` string.
    pub fn from_name(name: &str) -> Result<Architecture> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "mistral" => Ok(Architecture::Mistral),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

/// How rotary frequencies are stretched for long contexts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (a.k.a. position interpolation).
    Linear {
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// Which pairs of a head's dimensions RoPE rotates together.
///
/// llama.cpp's converter permutes the rows of Llama Q/K weights so that GGUF Llama files rotate
/// adjacent pairs (`Normal`); HF checkpoints (and Qwen2 everywhere) rotate the two halves of
/// the head (`Neox`, HF's `rotate_half`). The style is a property of the weight file, not of
/// the architecture alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Normal,
    Neox,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (`head_dim` for every supported model).
    pub rotary_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    /// The context length the model was trained for (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Whether Q, K and V projections carry a bias (Qwen2, or Llama with `attention_bias`).
    pub attention_bias: bool,
}

impl ModelConfig {
    /// Width of one token's query vector across all heads.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of one token's key (or value) vector across all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Reads the hyper-parameters from a GGUF file's `{arch}.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let arch_name = file
            .get_str("general.architecture")
            .ok_or_else(|| ModelError::MissingMetadata("general.architecture".into()))?;
        let architecture = Architecture::from_name(arch_name)?;
        let key = |suffix: &str| format!("{arch_name}.{suffix}");
        let required_usize = |suffix: &str| -> Result<usize> {
            let name = key(suffix);
            let value = file
                .get_u64(&name)
                .ok_or_else(|| ModelError::MissingMetadata(name.clone()))?;
            to_usize(&name, value)
        };
        let optional_usize = |suffix: &str| -> Result<Option<usize>> {
            let name = key(suffix);
            file.get_u64(&name).map(|v| to_usize(&name, v)).transpose()
        };
        let optional_f32 = |suffix: &str| file.get_f64(&key(suffix)).map(|v| v as f32);

        let hidden_size = required_usize("embedding_length")?;
        let num_heads = required_usize("attention.head_count")?;
        let num_kv_heads = optional_usize("attention.head_count_kv")?.unwrap_or(num_heads);
        let head_dim = match optional_usize("attention.key_length")? {
            Some(dim) => dim,
            None => divide_exact(
                "embedding_length / attention.head_count",
                hidden_size,
                num_heads,
            )?,
        };
        let vocab_size = match optional_usize("vocab_size")? {
            Some(size) => size,
            None => match file.get_array("tokenizer.ggml.tokens") {
                Some(tokens) => tokens.len(),
                None => {
                    let info = file
                        .tensor("token_embd.weight")
                        .ok_or_else(|| ModelError::MissingMetadata(key("vocab_size")))?;
                    let rows = info.dims.get(1).copied().unwrap_or(0);
                    to_usize("token_embd.weight rows", rows)?
                }
            },
        };
        let max_position_embeddings = required_usize("context_length")?;
        let rope_scaling = match file.get_str(&key("rope.scaling.type")) {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: optional_f32("rope.scaling.factor")
                    .ok_or_else(|| ModelError::MissingMetadata(key("rope.scaling.factor")))?,
            },
            Some(other) => {
                return Err(ModelError::InvalidMetadata {
                    key: key("rope.scaling.type"),
                    message: format!("unsupported RoPE scaling type `{other}`"),
                })
            }
        };
        let rope_style = match architecture {
            Architecture::Llama | Architecture::Mistral => RopeStyle::Normal,
            Architecture::Qwen2 => RopeStyle::Neox,
        };
        let config = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: required_usize("feed_forward_length")?,
            num_layers: required_usize("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim: optional_usize("rope.dimension_count")?.unwrap_or(head_dim),
            rms_norm_eps: optional_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_theta: optional_f32("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            rope_style,
            max_position_embeddings,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            attention_bias: architecture == Architecture::Qwen2
                || file.tensor("blk.0.attn_q.bias").is_some(),
        };
        config.validate()?;
        Ok(config)
    }

    /// Reads an HF `config.json`.
    pub fn from_hf_config_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(io_error(path))?;
        ModelConfig::from_hf_config_json(&text).map_err(|error| match error {
            ModelError::ConfigJson { source, .. } => ModelError::ConfigJson {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }

    /// Parses the text of an HF `config.json`. HF checkpoints rotate halves (`Neox`).
    pub fn from_hf_config_json(text: &str) -> Result<ModelConfig> {
        let raw: HfConfig =
            serde_json::from_str(text).map_err(|source| ModelError::ConfigJson {
                path: "config.json".into(),
                source,
            })?;
        let model_type = raw
            .model_type
            .as_deref()
            .ok_or_else(|| ModelError::MissingMetadata("model_type".into()))?;
        let architecture = Architecture::from_name(model_type)?;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = match raw.head_dim {
            Some(dim) => dim,
            None => divide_exact(
                "hidden_size / num_attention_heads",
                raw.hidden_size,
                raw.num_attention_heads,
            )?,
        };
        let rope_scaling = match raw.rope_scaling {
            None => RopeScaling::None,
            Some(scaling) => scaling.into_typed()?,
        };
        let config = ModelConfig {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rotary_dim: head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: raw.rope_theta.unwrap_or(10_000.0) as f32,
            rope_scaling,
            rope_style: RopeStyle::Neox,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: architecture == Architecture::Qwen2
                || raw.attention_bias.unwrap_or(false),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let checks = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, value) in checks {
            if value == 0 {
                return Err(ModelError::InvalidMetadata {
                    key: name.into(),
                    message: "must be positive".into(),
                });
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ModelError::InvalidMetadata {
                key: "num_kv_heads".into(),
                message: format!(
                    "{} query heads are not a multiple of {} KV heads",
                    self.num_heads, self.num_kv_heads
                ),
            });
        }
        if self.rotary_dim != self.head_dim {
            return Err(ModelError::InvalidMetadata {
                key: "rope.dimension_count".into(),
                message: format!(
                    "partial rotary embeddings ({} of {} dims) are not supported",
                    self.rotary_dim, self.head_dim
                ),
            });
        }
        Ok(())
    }
}

fn to_usize(key: &str, value: u64) -> Result<usize> {
    usize::try_from(value).map_err(|_| ModelError::InvalidMetadata {
        key: key.into(),
        message: format!("{value} does not fit in usize"),
    })
}

fn divide_exact(what: &str, numerator: usize, denominator: usize) -> Result<usize> {
    if denominator == 0 || !numerator.is_multiple_of(denominator) {
        return Err(ModelError::InvalidMetadata {
            key: what.into(),
            message: format!("{numerator} is not divisible by {denominator}"),
        });
    }
    Ok(numerator / denominator)
}

/// The subset of an HF `config.json` that the Llama family uses.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeScaling>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    /// Newer configs say `rope_type`, older ones `type`.
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

impl HfRopeScaling {
    fn into_typed(self) -> Result<RopeScaling> {
        let kind = self
            .rope_type
            .clone()
            .or_else(|| self.legacy_type.clone())
            .unwrap_or_else(|| "default".into());
        let field = |name: &str, value: Option<f64>| -> Result<f32> {
            value
                .map(|v| v as f32)
                .ok_or_else(|| ModelError::MissingMetadata(format!("rope_scaling.{name}")))
        };
        match kind.as_str() {
            "default" => Ok(RopeScaling::None),
            "linear" => Ok(RopeScaling::Linear {
                factor: field("factor", self.factor)?,
            }),
            "llama3" => Ok(RopeScaling::Llama3 {
                factor: field("factor", self.factor)?,
                low_freq_factor: field("low_freq_factor", self.low_freq_factor)?,
                high_freq_factor: field("high_freq_factor", self.high_freq_factor)?,
                original_max_position_embeddings: self
                    .original_max_position_embeddings
                    .ok_or_else(|| {
                        ModelError::MissingMetadata(
                            "rope_scaling.original_max_position_embeddings".into(),
                        )
                    })?,
            }),
            other => Err(ModelError::InvalidMetadata {
                key: "rope_scaling.rope_type".into(),
                message: format!("unsupported RoPE scaling type `{other}`"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3_CONFIG: &str = r#"{
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "max_position_embeddings": 131072,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    }"#;

    #[test]
    fn parses_llama3_config_with_rope_scaling() {
        let config = ModelConfig::from_hf_config_json(LLAMA3_CONFIG).unwrap();
        assert_eq!(config.architecture, Architecture::Llama);
        assert_eq!(config.head_dim, 128);
        assert_eq!(config.num_kv_heads, 8);
        assert_eq!(config.kv_dim(), 1024);
        assert_eq!(config.rope_style, RopeStyle::Neox);
        assert!(!config.attention_bias);
        assert_eq!(
            config.rope_scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            }
        );
    }

    #[test]
    fn qwen2_has_attention_bias() {
        let text = r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "rope_theta": 1000000.0, "tie_word_embeddings": true,
            "rope_scaling": null}"#;
        let config = ModelConfig::from_hf_config_json(text).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen2);
        assert!(config.attention_bias);
        assert!(config.tie_word_embeddings);
        assert_eq!(config.head_dim, 64);
        assert_eq!(config.rope_scaling, RopeScaling::None);
    }

    #[test]
    fn unsupported_model_type_is_named() {
        let text = r#"{"model_type": "gemma3", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}"#;
        let error = ModelConfig::from_hf_config_json(text).unwrap_err();
        assert!(error.to_string().contains("`gemma3`"), "{error}");
    }

    #[test]
    fn unsupported_rope_scaling_is_named() {
        let text = r#"{"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "rope_scaling": {"type": "yarn", "factor": 4.0}}"#;
        let error = ModelConfig::from_hf_config_json(text).unwrap_err();
        assert!(error.to_string().contains("`yarn`"), "{error}");
    }
}
