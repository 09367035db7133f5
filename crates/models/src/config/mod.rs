//! Typed model hyper-parameters: what every family shares.
//!
//! A checkpoint's family is found in the registry (`crate::families`, which also holds the
//! entry points `ModelConfig::from_gguf` and `from_hf_config_json`) by its GGUF
//! `general.architecture` or HF `model_type`; the family parses its own config (its
//! `config.json` fields in a struct of the file's shape, its GGUF quirks) into the
//! [`ModelConfig`] the shared layers read. What every family reads the same way lives here:
//! the GGUF key reader and the fields every decoder has (`gguf.rs`), the common
//! `config.json` fields, RoPE scaling and mixtures of experts (`hf.rs`).

mod gguf;
mod hf;

use serde::Deserialize;
use tokenmill_gguf::GgufFile;

use crate::error::{ModelError, Result};

pub(crate) use gguf::GgufMetadata;
pub(crate) use hf::{parse_config_json, sliding_layers_from_types, HfCommon};

/// The architecture a checkpoint declares, as GGUF spells it (`llama`, `qwen3moe`, `gemma3`):
/// also the prefix of its GGUF metadata keys. Each family declares its own as a constant;
/// [`Architecture::from_name`] finds one in the registry (`crate::families`), so holding one
/// means a registered family runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    name: &'static str,
}

impl Architecture {
    /// A family's own architecture.
    pub(crate) const fn new(name: &'static str) -> Architecture {
        Architecture { name }
    }

    /// The GGUF name, which is also the metadata key prefix (`gemma3.embedding_length`).
    pub fn name(self) -> &'static str {
        self.name
    }
}

impl PartialEq<&str> for Architecture {
    fn eq(&self, name: &&str) -> bool {
        self.name == *name
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
    /// Phi-3's LongRoPE: pair `i`'s frequency divided by [`ModelConfig::rope_freq_factors`]
    /// `[i]`, cos and sin multiplied by `attn_factor`. The factors are the long ones when the
    /// model's context exceeds `original_max_position_embeddings`, as llama.cpp chooses them
    /// for a context of the trained length (HF switches per forward pass; a fixed choice keeps
    /// cached keys and batch rows consistent).
    LongRope {
        original_max_position_embeddings: usize,
        attn_factor: f32,
    },
    /// YaRN (gpt-oss; `tokenmill_kernels::RopeScaling::Yarn` has the formula).
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// cos and sin are multiplied by it (`0.1 ln(factor) + 1` unless the file says).
        attention_factor: f32,
        /// The ramp's ends are rounded to whole pairs (HF's default and llama.cpp's only
        /// behaviour); gpt-oss was trained without.
        truncate: bool,
    },
}

impl RopeScaling {
    /// YaRN's default attention factor for `factor` (HF's `get_mscale`, llama.cpp's): 1 up
    /// to a factor of 1, `0.1 ln(factor) + 1` above.
    pub fn yarn_attention_factor(factor: f32) -> f32 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * factor.ln() + 1.0
        }
    }
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
    /// The family that runs it, as the start-up log names it (`Mixtral` for a `llama` file
    /// with experts): its family's choice.
    pub family_name: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates: the first `rotary_dim` (`head_dim` except
    /// Phi-4-mini's partial rotary); the rest pass through unrotated.
    pub rotary_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// [`RopeScaling::LongRope`]'s per-pair frequency divisors (`rotary_dim / 2` of them).
    pub rope_freq_factors: Option<Vec<f32>>,
    pub rope_style: RopeStyle,
    /// The context length the model was trained for (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Whether Q, K and V projections carry a bias (Qwen2, or Llama with `attention_bias`).
    pub attention_bias: bool,
    /// Whether Q and K go through a per-head RMSNorm before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// `Some(w)`: sliding layers attend to the last `w` positions only (Mistral, Gemma 3).
    pub sliding_window: Option<usize>,
    /// With a sliding window, `Some(n)`: every `n`-th layer (`(i + 1) % n == 0`) is global
    /// and the others slide (Gemma 3: 6); `None`: every layer slides (Mistral).
    pub sliding_window_pattern: Option<usize>,
    /// RoPE base of the sliding layers when it differs from `rope_theta` (Gemma 3's local
    /// layers: 10,000, without the global layers' scaling).
    pub rope_local_theta: Option<f32>,
    /// Scores are scaled by `query_pre_attn_scalar^-1/2` instead of `head_dim^-1/2`
    /// (Gemma 3's `query_pre_attn_scalar`).
    pub query_pre_attn_scalar: Option<f32>,
    /// `Some(c)`: logits become `c * tanh(logits / c)` (Gemma's `final_logit_softcapping`).
    pub final_logit_softcapping: Option<f32>,
    /// `Some`: every layer's FFN is a routed mixture of experts (Mixtral, Qwen3-MoE).
    pub moe: Option<MoeConfig>,
    /// `Some`: a hybrid model whose layers are Gated DeltaNet (linear attention) except every
    /// `full_attention_interval`-th (Qwen3.5, Qwen3-Next).
    pub linear_attention: Option<LinearAttentionConfig>,
    /// The attention layers' query projection also yields a per-head output gate
    /// (`attn_output * sigmoid(gate)`; Qwen3.5, Qwen3-Next).
    pub attention_output_gate: bool,
    /// Per layer, whether it slides, for layers that follow no `sliding_window_pattern`
    /// period (Gemma 4's `layer_types`); `None`: the period (or every layer) decides.
    pub sliding_layers: Option<Vec<bool>>,
    /// The full-attention layers' own geometry where it differs from the sliding layers'
    /// (`num_kv_heads` and `head_dim` above): Gemma 4's wider global heads.
    pub full_attention: Option<FullAttentionGeometry>,
    /// The last `kv_shared_layers` layers compute no K/V: each attends over the cache of the
    /// last earlier layer of its kind (Gemma 4's `num_kv_shared_layers`), so the cache has
    /// `num_layers - kv_shared_layers` layers.
    pub kv_shared_layers: usize,
    /// `Some(width)`: per-layer embeddings (Gemma 4's PLE), `width` values per token and
    /// layer, added to each layer's output through a gate.
    pub per_layer_input_size: Option<usize>,
    /// Each layer's MLP width where the layers differ (Gemma 4's double-wide MLPs in the
    /// KV-shared layers); `None`: every layer is `intermediate_size` wide.
    pub layer_intermediate_sizes: Option<Vec<usize>>,
    /// V is RMS-normed per head (no weight) before it is cached (Gemma 4).
    pub value_norm: bool,
    /// Every attention layer has a learned sink logit per query head (`attn_sinks`, HF
    /// `self_attn.sinks`: gpt-oss).
    pub attention_sinks: bool,
    /// The attention output projection carries a bias (gpt-oss).
    pub attention_output_bias: bool,
    /// The router and every expert projection carry a bias (gpt-oss).
    pub expert_bias: bool,
    /// The experts' gate is gpt-oss's clamped SwiGLU instead of SiLU.
    pub clamped_swiglu: Option<ClampedSwiglu>,
}

/// gpt-oss's expert activation: `min(g, limit) · σ(alpha · min(g, limit)) · (clamp(u, ±limit) + 1)`
/// (HF `swiglu_alpha`, `swiglu_limit`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClampedSwiglu {
    pub alpha: f32,
    pub limit: f32,
}

/// The full-attention layers' attention where it differs from the sliding layers' (Gemma 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullAttentionGeometry {
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Proportional RoPE: the first `rotated_pairs` of the `head_dim / 2` half-split pairs
    /// turn at `theta^(-2i / head_dim)`, the others pass unrotated.
    pub rotated_pairs: usize,
    /// The layers have no V projection: V is K's projection (before K's norm and RoPE).
    pub values_are_keys: bool,
}

/// The Gated DeltaNet layers of a hybrid model (Qwen3.5's `linear_*` config fields, GGUF's
/// `ssm.*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearAttentionConfig {
    /// Query/key heads (`linear_num_key_heads`, GGUF `ssm.group_count`).
    pub num_k_heads: usize,
    /// Value heads (`linear_num_value_heads`, GGUF `ssm.time_step_rank`).
    pub num_v_heads: usize,
    /// `linear_key_head_dim` (GGUF `ssm.state_size`).
    pub head_k_dim: usize,
    /// `linear_value_head_dim` (GGUF `ssm.inner_size / ssm.time_step_rank`).
    pub head_v_dim: usize,
    /// Taps of the causal depthwise convolution (`linear_conv_kernel_dim`, GGUF
    /// `ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Layer `i` is full attention when `(i + 1) % full_attention_interval == 0`.
    pub full_attention_interval: usize,
    /// Which key head a value head reads: HF checkpoints group value heads by key head;
    /// llama.cpp's converter reorders them so they cycle (a property of the file, like
    /// [`RopeStyle`]).
    pub key_heads: tokenmill_kernels::KeyHeadOrder,
}

impl LinearAttentionConfig {
    /// The kernels' description of one layer's heads.
    pub fn shape(&self) -> tokenmill_kernels::DeltaRuleShape {
        tokenmill_kernels::DeltaRuleShape {
            num_k_heads: self.num_k_heads,
            num_v_heads: self.num_v_heads,
            head_k_dim: self.head_k_dim,
            head_v_dim: self.head_v_dim,
            key_heads: self.key_heads,
        }
    }

    /// Channels of the convolution: `[q | k | v]` of one token.
    pub fn conv_dim(&self) -> usize {
        2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim
    }

    /// What one layer keeps per sequence: the last `conv_kernel - 1` inputs of the
    /// convolution and one `[head_k_dim][head_v_dim]` state per value head.
    pub fn state_layout(&self) -> crate::state_cache::LayerStateLayout {
        crate::state_cache::LayerStateLayout {
            conv_elems: (self.conv_kernel - 1) * self.conv_dim(),
            recurrent_elems: self.num_v_heads * self.head_k_dim * self.head_v_dim,
        }
    }

    /// Whether layer `layer` is a Gated DeltaNet layer (else full attention).
    pub fn is_linear(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// A mixture-of-experts FFN's shape: each token goes through the `experts_used` experts its
/// router scores highest, weighted by their renormalized softmax probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per layer (`expert_count`).
    pub num_experts: usize,
    /// Experts each token is routed to (`expert_used_count`, the top-k).
    pub experts_used: usize,
    /// Width of one expert's gated MLP (`expert_feed_forward_length`; Mixtral's is
    /// `feed_forward_length`).
    pub expert_intermediate_size: usize,
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

    /// The family that runs it, as the start-up log names it.
    pub fn family(&self) -> &'static str {
        self.family_name
    }

    /// `, 8 experts (2 per token)` for a mixture of experts, empty otherwise: the start-up
    /// line's description of the FFN.
    pub fn describe_experts(&self) -> String {
        self.moe.map_or_else(String::new, |moe| {
            format!(
                ", {} experts ({} per token)",
                moe.num_experts, moe.experts_used
            )
        })
    }

    /// The sliding window of layer `layer`, `None` for a layer that sees the whole context.
    pub fn layer_sliding_window(&self, layer: usize) -> Option<usize> {
        let window = self.sliding_window?;
        if let Some(sliding) = &self.sliding_layers {
            return sliding
                .get(layer)
                .copied()
                .unwrap_or(false)
                .then_some(window);
        }
        match self.sliding_window_pattern {
            Some(period) if (layer + 1).is_multiple_of(period) => None,
            _ => Some(window),
        }
    }

    /// The KV and head geometry of layer `layer`: `(num_kv_heads, head_dim)`.
    pub fn layer_kv_geometry(&self, layer: usize) -> (usize, usize) {
        match self.full_attention {
            Some(full) if self.layer_sliding_window(layer).is_none() => {
                (full.num_kv_heads, full.head_dim)
            }
            _ => (self.num_kv_heads, self.head_dim),
        }
    }

    /// Layer `layer`'s MLP width.
    pub fn layer_intermediate_size(&self, layer: usize) -> usize {
        self.layer_intermediate_sizes
            .as_ref()
            .and_then(|sizes| sizes.get(layer).copied())
            .unwrap_or(self.intermediate_size)
    }

    /// The layer whose cached K/V layer `layer` attends over: itself, or for one of the last
    /// `kv_shared_layers` layers the last earlier layer of its kind (sliding or not) that
    /// keeps a cache. Layers that keep a cache are `0..num_layers - kv_shared_layers`, so the
    /// result is also the layer's index in the KV cache.
    pub fn kv_source_layer(&self, layer: usize) -> usize {
        let first_shared = self.num_layers.saturating_sub(self.kv_shared_layers);
        if layer < first_shared {
            return layer;
        }
        let sliding = self.layer_sliding_window(layer).is_some();
        (0..first_shared)
            .rev()
            .find(|&source| self.layer_sliding_window(source).is_some() == sliding)
            .unwrap_or(layer)
    }

    /// Why LoRA adapters cannot run on this model, if they cannot: the adapter hooks assume
    /// one attention geometry and a K/V projection in every layer, which Gemma 4's global
    /// and KV-shared layers break.
    pub fn lora_unsupported_reason(&self) -> Option<String> {
        (self.full_attention.is_some() || self.kv_shared_layers > 0).then(|| {
            format!(
                "LoRA adapters are not supported on {} yet (its global layers have their own \
                 head geometry and its last layers share an earlier layer's K/V)",
                self.family_name
            )
        })
    }

    /// Layers that keep K/V in the cache (all but the KV-shared ones).
    pub fn num_kv_cache_layers(&self) -> usize {
        self.num_layers.saturating_sub(self.kv_shared_layers)
    }

    /// The score scale of every attention layer.
    pub fn attention_scale(&self) -> f32 {
        let scalar = self.query_pre_attn_scalar.unwrap_or(self.head_dim as f32);
        1.0 / scalar.sqrt()
    }

    /// Checks what every family's forward pass relies on; run on every parsed config.
    pub(crate) fn validate(&self) -> Result<()> {
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
        if self.rotary_dim == 0
            || !self.rotary_dim.is_multiple_of(2)
            || self.rotary_dim > self.head_dim
        {
            return Err(ModelError::InvalidMetadata {
                key: "rope.dimension_count".into(),
                message: format!(
                    "{} rotary dims of a {}-dim head: need an even number from 2 to head_dim",
                    self.rotary_dim, self.head_dim
                ),
            });
        }
        if let Some(factors) = &self.rope_freq_factors {
            if factors.len() != self.rotary_dim / 2
                || factors.iter().any(|&f| f.is_nan() || f <= 0.0)
            {
                return Err(ModelError::InvalidMetadata {
                    key: "rope_factors".into(),
                    message: format!(
                        "{} LongRoPE factors for {} rotary dims: need {} positive ones",
                        factors.len(),
                        self.rotary_dim,
                        self.rotary_dim / 2
                    ),
                });
            }
        }
        if let Some(linear) = self.linear_attention {
            let dims = [
                linear.num_k_heads,
                linear.num_v_heads,
                linear.head_k_dim,
                linear.head_v_dim,
                linear.conv_kernel,
                linear.full_attention_interval,
            ];
            if dims.contains(&0)
                || !linear.num_v_heads.is_multiple_of(linear.num_k_heads)
                || linear.head_v_dim > tokenmill_kernels::MAX_HEAD_V_DIM
            {
                return Err(ModelError::InvalidMetadata {
                    key: "linear_attention".into(),
                    message: format!(
                        "{linear:?}: need positive sizes, value heads a multiple of key heads \
                         and value heads at most {} wide",
                        tokenmill_kernels::MAX_HEAD_V_DIM
                    ),
                });
            }
        }
        self.validate_layer_variants()?;
        if let Some(moe) = self.moe {
            if moe.experts_used == 0
                || moe.experts_used > moe.num_experts
                || moe.expert_intermediate_size == 0
            {
                return Err(ModelError::InvalidMetadata {
                    key: "expert_used_count".into(),
                    message: format!(
                        "{} of {} experts per token, each {} wide: need 1 to expert_count \
                         experts of a positive width",
                        moe.experts_used, moe.num_experts, moe.expert_intermediate_size
                    ),
                });
            }
        }
        Ok(())
    }
}

impl ModelConfig {
    /// Checks the per-layer fields (Gemma 4's): lists one entry per layer, KV-shared layers
    /// with an earlier layer of their kind to read, full-attention geometry in range.
    fn validate_layer_variants(&self) -> Result<()> {
        let invalid = |key: &str, message: String| ModelError::InvalidMetadata {
            key: key.into(),
            message,
        };
        for (key, len) in [
            ("layer_types", self.sliding_layers.as_ref().map(Vec::len)),
            (
                "feed_forward_length",
                self.layer_intermediate_sizes.as_ref().map(Vec::len),
            ),
        ] {
            if let Some(len) = len.filter(|&len| len != self.num_layers) {
                return Err(invalid(
                    key,
                    format!("{len} entries for {} layers", self.num_layers),
                ));
            }
        }
        if self
            .layer_intermediate_sizes
            .as_ref()
            .is_some_and(|sizes| sizes.contains(&0))
        {
            return Err(invalid("feed_forward_length", "must be positive".into()));
        }
        if self.kv_shared_layers >= self.num_layers && self.kv_shared_layers > 0 {
            return Err(invalid(
                "num_kv_shared_layers",
                format!(
                    "{} of {} layers share another layer's KV: none would keep one",
                    self.kv_shared_layers, self.num_layers
                ),
            ));
        }
        let first_shared = self.num_kv_cache_layers();
        if let Some(layer) =
            (first_shared..self.num_layers).find(|&layer| self.kv_source_layer(layer) == layer)
        {
            return Err(invalid(
                "num_kv_shared_layers",
                format!("layer {layer} shares the KV of no earlier layer of its kind"),
            ));
        }
        if let Some(full) = self.full_attention {
            if full.num_kv_heads == 0
                || full.head_dim == 0
                || !full.head_dim.is_multiple_of(2)
                || !self.num_heads.is_multiple_of(full.num_kv_heads)
                || full.rotated_pairs == 0
                || full.rotated_pairs > full.head_dim / 2
            {
                return Err(invalid(
                    "full_attention",
                    format!(
                        "{full:?}: need an even head size, KV heads dividing {} query heads \
                         and 1 to head_dim / 2 rotated pairs",
                        self.num_heads
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A GGUF file's `general.architecture`.
pub(crate) fn gguf_architecture(file: &GgufFile) -> Result<&str> {
    file.get_str("general.architecture")
        .ok_or_else(|| ModelError::MissingMetadata("general.architecture".into()))
}

/// An HF `config.json`'s `model_type`, the name its family is looked up by.
pub(crate) fn hf_model_type(text: &str) -> Result<String> {
    #[derive(Deserialize)]
    struct ModelType {
        model_type: Option<String>,
    }
    parse_config_json::<ModelType>(text)?
        .model_type
        .ok_or_else(|| ModelError::MissingMetadata("model_type".into()))
}

pub(crate) fn to_usize(key: &str, value: u64) -> Result<usize> {
    usize::try_from(value).map_err(|_| ModelError::InvalidMetadata {
        key: key.into(),
        message: format!("{value} does not fit in usize"),
    })
}

pub(crate) fn divide_exact(what: &str, numerator: usize, denominator: usize) -> Result<usize> {
    if denominator == 0 || !numerator.is_multiple_of(denominator) {
        return Err(ModelError::InvalidMetadata {
            key: what.into(),
            message: format!("{numerator} is not divisible by {denominator}"),
        });
    }
    Ok(numerator / denominator)
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
        assert_eq!(config.architecture, "llama");
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
    fn unsupported_model_type_is_named_with_the_supported_list() {
        let text = r#"{"model_type": "falcon", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}"#;
        let error = ModelConfig::from_hf_config_json(text).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("`falcon`"), "{message}");
        assert!(
            message.contains(
                "llama, mistral, qwen2, qwen3, gemma3, gemma4, qwen3moe, phi3, qwen35, gpt-oss"
            ),
            "{message}"
        );
    }

    #[test]
    fn unsupported_rope_scaling_is_named() {
        let text = r#"{"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "rope_scaling": {"type": "dynamic", "factor": 4.0}}"#;
        let error = ModelConfig::from_hf_config_json(text).unwrap_err();
        assert!(error.to_string().contains("`dynamic`"), "{error}");
    }

    /// YaRN (Qwen2.5's long-context configs, gpt-oss): HF's defaults for the betas, the
    /// attention factor and `truncate`; transformers 5's `rope_parameters` spelling too.
    #[test]
    fn yarn_rope_scaling_is_read_with_hf_defaults() {
        let text = r#"{"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "max_position_embeddings": 131072, "rope_theta": 1000000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 32768}}"#;
        let config = ModelConfig::from_hf_config_json(text).unwrap();
        assert_eq!(
            config.rope_scaling,
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 32768,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 4f32.ln() + 1.0,
                truncate: true,
            }
        );
        let v5 = r#"{"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5000.0,
                "beta_fast": 16, "beta_slow": 2, "truncate": false, "attention_factor": 1.5}}"#;
        let config = ModelConfig::from_hf_config_json(v5).unwrap();
        assert_eq!(config.rope_theta, 5000.0);
        assert_eq!(
            config.rope_scaling,
            RopeScaling::Yarn {
                factor: 2.0,
                original_max_position_embeddings: 4096,
                beta_fast: 16.0,
                beta_slow: 2.0,
                attention_factor: 1.5,
                truncate: false,
            }
        );
        let deepseek = v5.replace(r#""attention_factor": 1.5"#, r#""mscale_all_dim": 1.0"#);
        let error = ModelConfig::from_hf_config_json(&deepseek).unwrap_err();
        assert!(error.to_string().contains("mscale"), "{error}");
    }

    #[test]
    fn hf_mixture_of_experts_configs() {
        let qwen = r#"{"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128}"#;
        let config = ModelConfig::from_hf_config_json(qwen).unwrap();
        assert_eq!(config.architecture, "qwen3moe");
        assert!(config.qk_norm);
        let moe = MoeConfig {
            num_experts: 128,
            experts_used: 8,
            expert_intermediate_size: 768,
        };
        assert_eq!(config.moe, Some(moe));
        let mixtral = r#"{"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}"#;
        let config = ModelConfig::from_hf_config_json(mixtral).unwrap();
        assert_eq!(config.architecture, "llama");
        assert_eq!(config.family(), "Mixtral");
        assert_eq!(config.moe.map(|m| m.expert_intermediate_size), Some(14336));
        for (from, to, key) in [
            (
                "\"norm_topk_prob\": true",
                "\"norm_topk_prob\": false",
                "norm_topk_prob",
            ),
            (
                "\"mlp_only_layers\": []",
                "\"mlp_only_layers\": [0]",
                "decoder_sparse_step",
            ),
            (
                "\"num_experts_per_tok\": 8",
                "\"num_experts_per_tok\": 129",
                "expert_used_count",
            ),
        ] {
            let error = ModelConfig::from_hf_config_json(&qwen.replace(from, to)).unwrap_err();
            assert!(error.to_string().contains(key), "{error}");
        }
    }
}
