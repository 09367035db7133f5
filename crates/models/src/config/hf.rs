//! What every decoder family reads the same way from an HF `config.json`: sizes, RoPE base
//! and scaling (including LongRoPE and partial rotary), a tied head, a QKV bias and a mixture
//! of experts. A family's own config struct flattens [`HfCommon`] beside its own fields and
//! starts from [`HfCommon::decoder_config`].

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::{divide_exact, Architecture, ModelConfig, MoeConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};

/// Parses `config.json` text into a family's struct (errors name `config.json`; the file
/// reader puts the real path in).
pub(crate) fn parse_config_json<T: DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|source| ModelError::ConfigJson {
        path: "config.json".into(),
        source,
    })
}

/// Per layer, whether an HF `layer_types` entry is `sliding_attention` (true) or
/// `full_attention` (false); any other kind is refused by name (Gemma 4, gpt-oss).
pub(crate) fn sliding_layers_from_types(types: &[String]) -> Result<Vec<bool>> {
    types
        .iter()
        .map(|kind| match kind.as_str() {
            "sliding_attention" => Ok(true),
            "full_attention" => Ok(false),
            other => Err(ModelError::InvalidMetadata {
                key: "layer_types".into(),
                message: format!("unknown layer type `{other}`"),
            }),
        })
        .collect()
}

/// The `config.json` fields every decoder family reads alike. Families put it in their own
/// struct with `#[serde(flatten)]`, so each field is read once whatever the family.
#[derive(Debug, Deserialize)]
pub(crate) struct HfCommon {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    /// transformers 5 calls it `rope_parameters` (and keeps `rope_theta` in it).
    #[serde(alias = "rope_parameters")]
    rope_scaling: Option<HfRopeScaling>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    /// Qwen's per-layer sliding window switch (with `max_window_layers`), not implemented:
    /// `true` is refused rather than ignored.
    pub use_sliding_window: Option<bool>,
    /// Partial rotary (Phi-4-mini): the share of each head RoPE rotates.
    partial_rotary_factor: Option<f64>,
    /// LongRoPE's pre-training context (top level in Phi-3's config).
    original_max_position_embeddings: Option<usize>,
    /// Mixture of experts: Qwen3-MoE's `num_experts`, Mixtral's `num_local_experts`.
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
}

impl HfCommon {
    /// The shared fields as a [`ModelConfig`] of `architecture` run by `family_name`. HF
    /// checkpoints rotate halves (`Neox`); the head is untied unless the config says so; no
    /// QK-norm, sliding window, second RoPE base, score scalar or soft-capping: a family sets
    /// what is its own afterwards.
    pub fn decoder_config(
        mut self,
        architecture: Architecture,
        family_name: &'static str,
    ) -> Result<ModelConfig> {
        let num_kv_heads = self.num_key_value_heads.unwrap_or(self.num_attention_heads);
        let head_dim = match self.head_dim {
            Some(dim) => dim,
            None => divide_exact(
                "hidden_size / num_attention_heads",
                self.hidden_size,
                self.num_attention_heads,
            )?,
        };
        let max_position_embeddings = self.max_position_embeddings.unwrap_or(4096);
        let rope_theta = self
            .rope_theta
            .or_else(|| self.rope_scaling.as_ref().and_then(|s| s.rope_theta));
        let rotary_dim = match self.partial_rotary_factor {
            Some(factor) => (head_dim as f64 * factor).round() as usize,
            None => head_dim,
        };
        let (rope_scaling, rope_freq_factors) = match self.rope_scaling.take() {
            None => (RopeScaling::None, None),
            Some(scaling) => scaling.into_typed(
                max_position_embeddings,
                self.original_max_position_embeddings,
                rotary_dim,
            )?,
        };
        if self.use_sliding_window == Some(true) {
            // Qwen's `max_window_layers` split is not implemented; refuse rather than ignore.
            return Err(ModelError::InvalidMetadata {
                key: "use_sliding_window".into(),
                message: "Qwen-style sliding-window layers are not supported".into(),
            });
        }
        Ok(ModelConfig {
            architecture,
            family_name,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: rope_theta.unwrap_or(10_000.0) as f32,
            rope_scaling,
            rope_freq_factors,
            rope_style: RopeStyle::Neox,
            max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            attention_bias: self.attention_bias.unwrap_or(false),
            qk_norm: false,
            sliding_window: None,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            final_logit_softcapping: None,
            moe: hf_moe(&self)?,
            linear_attention: None,
            attention_output_gate: false,
            sliding_layers: None,
            full_attention: None,
            kv_shared_layers: 0,
            per_layer_input_size: None,
            layer_intermediate_sizes: None,
            value_norm: false,
            attention_sinks: false,
            attention_output_bias: false,
            expert_bias: false,
            clamped_swiglu: None,
        })
    }
}

/// The mixture of experts an HF config describes, if any. Configurations the block does not
/// implement are refused by name: weights left unnormalized (`norm_topk_prob: false`) and
/// dense layers between the sparse ones.
fn hf_moe(raw: &HfCommon) -> Result<Option<MoeConfig>> {
    let Some(num_experts) = raw.num_experts.or(raw.num_local_experts).filter(|&n| n > 0) else {
        return Ok(None);
    };
    if raw.norm_topk_prob == Some(false) {
        return Err(ModelError::InvalidMetadata {
            key: "norm_topk_prob".into(),
            message: "unnormalized top-k expert weights are not supported".into(),
        });
    }
    let dense_layers = raw.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty());
    if raw.decoder_sparse_step.is_some_and(|step| step != 1) || dense_layers {
        return Err(ModelError::InvalidMetadata {
            key: "decoder_sparse_step".into(),
            message: "dense layers between the expert layers are not supported".into(),
        });
    }
    Ok(Some(MoeConfig {
        num_experts,
        experts_used: raw
            .num_experts_per_tok
            .ok_or_else(|| ModelError::MissingMetadata("num_experts_per_tok".into()))?,
        expert_intermediate_size: raw.moe_intermediate_size.unwrap_or(raw.intermediate_size),
    }))
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
    /// LongRoPE (`type: longrope`, older `su`): per-pair divisors for long and short contexts.
    long_factor: Option<Vec<f32>>,
    short_factor: Option<Vec<f32>>,
    /// transformers 5's `rope_parameters` carry the base.
    rope_theta: Option<f64>,
    /// YaRN's fields (`beta_*` default to 32 and 1, `truncate` to true; `mscale` and
    /// `mscale_all_dim`, DeepSeek's, are refused).
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    attention_factor: Option<f64>,
    truncate: Option<bool>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
}

impl HfRopeScaling {
    fn into_typed(
        self,
        max_position_embeddings: usize,
        original: Option<usize>,
        rotary_dim: usize,
    ) -> Result<(RopeScaling, Option<Vec<f32>>)> {
        let kind = self
            .rope_type
            .clone()
            .or_else(|| self.legacy_type.clone())
            .unwrap_or_else(|| "default".into());
        if kind == "longrope" || kind == "su" {
            let original = original
                .or(self.original_max_position_embeddings)
                .ok_or_else(|| {
                    ModelError::MissingMetadata("original_max_position_embeddings".into())
                })?;
            let long = max_position_embeddings > original;
            let (name, factors) = if long {
                ("long_factor", self.long_factor)
            } else {
                ("short_factor", self.short_factor)
            };
            let factors = factors
                .ok_or_else(|| ModelError::MissingMetadata(format!("rope_scaling.{name}")))?;
            if factors.len() != rotary_dim / 2 {
                return Err(ModelError::InvalidMetadata {
                    key: format!("rope_scaling.{name}"),
                    message: format!("{} factors for {rotary_dim} rotary dims", factors.len()),
                });
            }
            // HF's Phi3LongRoPEScaledRotaryEmbedding (and llama.cpp's converter).
            let scale = max_position_embeddings as f64 / original as f64;
            let attn_factor = if scale > 1.0 {
                (1.0 + scale.ln() / (original as f64).ln()).sqrt()
            } else {
                1.0
            };
            let scaling = RopeScaling::LongRope {
                original_max_position_embeddings: original,
                attn_factor: attn_factor as f32,
            };
            return Ok((scaling, Some(factors)));
        }
        if kind == "yarn" {
            return Ok((
                self.into_yarn(original.unwrap_or(max_position_embeddings))?,
                None,
            ));
        }
        Ok((self.into_plain(&kind)?, None))
    }

    /// HF's `_compute_yarn_parameters`: the original context from the scaling (else the
    /// top-level `original_max_position_embeddings`, else `max_position_embeddings`).
    fn into_yarn(self, original: usize) -> Result<RopeScaling> {
        if self.mscale.is_some() || self.mscale_all_dim.is_some() {
            return Err(ModelError::InvalidMetadata {
                key: "rope_scaling.mscale".into(),
                message: "YaRN with mscale / mscale_all_dim (DeepSeek) is not supported".into(),
            });
        }
        let factor = self
            .factor
            .ok_or_else(|| ModelError::MissingMetadata("rope_scaling.factor".into()))?
            as f32;
        Ok(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: self
                .original_max_position_embeddings
                .unwrap_or(original),
            beta_fast: self.beta_fast.unwrap_or(32.0) as f32,
            beta_slow: self.beta_slow.unwrap_or(1.0) as f32,
            attention_factor: self
                .attention_factor
                .map_or_else(|| RopeScaling::yarn_attention_factor(factor), |f| f as f32),
            truncate: self.truncate.unwrap_or(true),
        })
    }

    fn into_plain(self, kind: &str) -> Result<RopeScaling> {
        let field = |name: &str, value: Option<f64>| -> Result<f32> {
            value
                .map(|v| v as f32)
                .ok_or_else(|| ModelError::MissingMetadata(format!("rope_scaling.{name}")))
        };
        match kind {
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
