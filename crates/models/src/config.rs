//! Typed model hyper-parameters, read from GGUF metadata or an HF `config.json`.

use std::path::Path;

use serde::Deserialize;
use tokenmill_gguf::GgufFile;

use crate::error::{io_error, ModelError, Result};

/// The architectures this crate runs. The Llama-shaped ones share one implementation
/// (`families/llama.rs`) whose differences (QKV bias, QK-norm, RoPE layout, sliding window)
/// are fields of [`ModelConfig`]; Gemma 3 has its own block (`families/gemma3.rs`). A
/// mixture-of-experts feed-forward is a field too ([`ModelConfig::moe`]): Mixtral is `Llama`
/// with experts, Qwen3-MoE is Qwen3 with experts in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3 and everything shaped like it (SmolLM2, TinyLlama, ...).
    Llama,
    /// Llama with an optional sliding window over every layer.
    Mistral,
    /// Qwen2 and Qwen2.5: Llama with a bias on the Q, K and V projections.
    Qwen2,
    /// Qwen3 (dense): Llama with a per-head RMSNorm on Q and K (QK-norm), no bias.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, a routed mixture of experts as every layer's FFN.
    Qwen3Moe,
    /// Gemma 3 (text): pre- and post-norms, QK-norm, GELU-tanh gate, scaled embeddings,
    /// interleaved sliding-window (local) and global layers.
    Gemma3,
    /// Phi-3 and Phi-4-mini: Llama's block with fused `attn_qkv` and gate/up (`ffn_up` holding
    /// both halves), partial rotary (`rope.dimension_count` < head_dim) and LongRoPE
    /// (`rope_factors_long`/`_short`).
    Phi3,
}

impl Architecture {
    /// Every supported architecture, in the order error messages list them.
    pub const ALL: [Architecture; 7] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
        Architecture::Qwen3Moe,
        Architecture::Phi3,
    ];

    /// Maps a GGUF `general.architecture` or HF `model_type` string (HF calls Gemma 3's text
    /// model `gemma3_text`).
    pub fn from_name(name: &str) -> Result<Architecture> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "mistral" => Ok(Architecture::Mistral),
            "qwen2" => Ok(Architecture::Qwen2),
            "qwen3" => Ok(Architecture::Qwen3),
            "qwen3moe" => Ok(Architecture::Qwen3Moe),
            "gemma3" | "gemma3_text" => Ok(Architecture::Gemma3),
            "phi3" => Ok(Architecture::Phi3),
            // HF's names: Qwen3-MoE, and Mixtral, which GGUF files call `llama`.
            "qwen3_moe" => Ok(Architecture::Qwen3Moe),
            "mixtral" => Ok(Architecture::Llama),
            other => Err(ModelError::UnsupportedArchitecture {
                name: other.to_string(),
                supported: Architecture::supported_list(),
            }),
        }
    }

    /// The GGUF name, which is also the metadata key prefix (`gemma3.embedding_length`).
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
        }
    }

    /// The family that runs it, as the start-up log and `/v1/models` name it.
    pub fn family(self) -> &'static str {
        match self {
            Architecture::Llama => "Llama",
            Architecture::Mistral => "Mistral",
            Architecture::Qwen2 => "Qwen2",
            Architecture::Qwen3 => "Qwen3",
            Architecture::Qwen3Moe => "Qwen3-MoE",
            Architecture::Gemma3 => "Gemma 3",
            Architecture::Phi3 => "Phi-3",
        }
    }

    /// `llama, mistral, ...`: what an unsupported-architecture error lists.
    pub fn supported_list() -> String {
        Architecture::ALL.map(Architecture::name).join(", ")
    }

    /// Whether the family's GGUF files and HF checkpoints both rotate half-split pairs.
    fn always_neox(self) -> bool {
        matches!(
            self,
            Architecture::Qwen2
                | Architecture::Qwen3
                | Architecture::Qwen3Moe
                | Architecture::Gemma3
                | Architecture::Phi3
        )
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

    /// The family that runs it, as the start-up log names it: the architecture's, except
    /// that a `llama` file with experts is Mixtral.
    pub fn family(&self) -> &'static str {
        match (self.architecture, self.moe) {
            (Architecture::Llama, Some(_)) => "Mixtral",
            (architecture, _) => architecture.family(),
        }
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
        match self.sliding_window_pattern {
            Some(period) if (layer + 1).is_multiple_of(period) => None,
            _ => Some(window),
        }
    }

    /// The score scale of every attention layer.
    pub fn attention_scale(&self) -> f32 {
        let scalar = self.query_pre_attn_scalar.unwrap_or(self.head_dim as f32);
        1.0 / scalar.sqrt()
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
            // LongRoPE is read from its factor tensors below.
            None | Some("none") | Some("longrope") => RopeScaling::None,
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
        let rope_style = if architecture.always_neox() {
            RopeStyle::Neox
        } else {
            RopeStyle::Normal
        };
        // llama.cpp disables Phi-3's sliding window (its converters do not describe the
        // layers it applies to), and so does tokenmill, for the same outputs.
        let sliding_window = optional_usize("attention.sliding_window")?
            .filter(|&w| w > 0 && architecture != Architecture::Phi3);
        let num_layers = required_usize("block_count")?;
        let rotary_dim = optional_usize("rope.dimension_count")?.unwrap_or(head_dim);
        let (rope_scaling, rope_freq_factors) =
            match gguf_longrope(file, &key, max_position_embeddings, rotary_dim)? {
                Some((scaling, factors)) => (scaling, Some(factors)),
                None => (rope_scaling, None),
            };
        let is_gemma3 = architecture == Architecture::Gemma3;
        let feed_forward_length = optional_usize("feed_forward_length")?;
        let moe = match optional_usize("expert_count")?.filter(|&count| count > 0) {
            None => None,
            Some(num_experts) => Some(MoeConfig {
                num_experts,
                experts_used: required_usize("expert_used_count")?,
                expert_intermediate_size: match optional_usize("expert_feed_forward_length")? {
                    Some(width) => width,
                    None => required_usize("feed_forward_length")?,
                },
            }),
        };
        let intermediate_size = match (feed_forward_length, moe) {
            (Some(width), _) => width,
            (None, Some(moe)) => moe.expert_intermediate_size,
            (None, None) => required_usize("feed_forward_length")?,
        };
        let config = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            rms_norm_eps: optional_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_theta: optional_f32("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            rope_freq_factors,
            rope_style,
            max_position_embeddings,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            attention_bias: architecture == Architecture::Qwen2
                || file.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: file.tensor("blk.0.attn_q_norm.weight").is_some(),
            sliding_window,
            // llama.cpp's Gemma 3: every sixth layer global, local layers on base 10,000.
            sliding_window_pattern: is_gemma3.then_some(6),
            rope_local_theta: (is_gemma3 && sliding_window.is_some()).then_some(10_000.0),
            // GGUF has no `query_pre_attn_scalar`: llama.cpp scales by head_dim^-1/2, except
            // for the 27B model (62 layers), which uses hidden / heads.
            query_pre_attn_scalar: (is_gemma3 && num_layers == 62)
                .then(|| (hidden_size / num_heads) as f32),
            final_logit_softcapping: optional_f32("final_logit_softcapping").filter(|&c| c > 0.0),
            moe,
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
        let mut raw: HfConfig =
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
        let max_position_embeddings = raw.max_position_embeddings.unwrap_or(4096);
        let rotary_dim = match raw.partial_rotary_factor {
            Some(factor) => (head_dim as f64 * factor).round() as usize,
            None => head_dim,
        };
        let (rope_scaling, rope_freq_factors) = match raw.rope_scaling.take() {
            None => (RopeScaling::None, None),
            Some(scaling) => scaling.into_typed(
                max_position_embeddings,
                raw.original_max_position_embeddings,
                rotary_dim,
            )?,
        };
        let is_gemma3 = architecture == Architecture::Gemma3;
        if raw.use_sliding_window == Some(true) && !is_gemma3 {
            // Qwen's `max_window_layers` split is not implemented; refuse rather than ignore.
            return Err(ModelError::InvalidMetadata {
                key: "use_sliding_window".into(),
                message: "Qwen-style sliding-window layers are not supported".into(),
            });
        }
        let sliding_window = match architecture {
            Architecture::Mistral | Architecture::Gemma3 => raw.sliding_window,
            _ => None,
        };
        let sliding_window_pattern = if is_gemma3 {
            Some(gemma3_pattern(&raw)?)
        } else {
            None
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
            rotary_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: raw.rope_theta.unwrap_or(10_000.0) as f32,
            rope_scaling,
            rope_freq_factors,
            rope_style: RopeStyle::Neox,
            max_position_embeddings,
            // Gemma 3's config defaults to a tied head; Llama's to an untied one.
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(is_gemma3),
            attention_bias: architecture == Architecture::Qwen2
                || raw.attention_bias.unwrap_or(false),
            qk_norm: matches!(
                architecture,
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
            ),
            sliding_window,
            sliding_window_pattern,
            rope_local_theta: if is_gemma3 {
                Some(raw.rope_local_base_freq.unwrap_or(10_000.0) as f32)
            } else {
                None
            },
            query_pre_attn_scalar: raw.query_pre_attn_scalar.map(|v| v as f32),
            final_logit_softcapping: raw.final_logit_softcapping.map(|v| v as f32),
            moe: hf_moe(&raw)?,
        };
        if is_gemma3 && raw.attn_logit_softcapping.is_some() {
            return Err(ModelError::InvalidMetadata {
                key: "attn_logit_softcapping".into(),
                message: "attention logit soft-capping is not supported".into(),
            });
        }
        if let Some(activation) = raw.hidden_activation.as_deref() {
            if is_gemma3 && activation != "gelu_pytorch_tanh" {
                return Err(ModelError::InvalidMetadata {
                    key: "hidden_activation".into(),
                    message: format!("unsupported activation `{activation}`"),
                });
            }
        }
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
        } else if self.architecture == Architecture::Qwen3Moe {
            return Err(ModelError::MissingMetadata("qwen3moe.expert_count".into()));
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
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    /// Gemma 3: the older period form and the newer per-layer list.
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    hidden_activation: Option<String>,
    /// Phi-4-mini: the share of each head RoPE rotates.
    partial_rotary_factor: Option<f64>,
    /// Phi-3's LongRoPE: the pre-training context (top level in its config).
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

/// The mixture of experts an HF config describes, if any. Configurations the block does not
/// implement are refused by name: weights left unnormalized (`norm_topk_prob: false`) and
/// dense layers between the sparse ones.
fn hf_moe(raw: &HfConfig) -> Result<Option<MoeConfig>> {
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

/// Gemma 3's period of global layers from `layer_types` (which must follow one) or
/// `sliding_window_pattern`, 6 when neither is given.
fn gemma3_pattern(raw: &HfConfig) -> Result<usize> {
    let Some(types) = &raw.layer_types else {
        return Ok(raw.sliding_window_pattern.unwrap_or(6).max(1));
    };
    let period = types
        .iter()
        .position(|kind| kind == "full_attention")
        .map_or(types.len() + 1, |index| index + 1);
    let periodic = types.iter().enumerate().all(|(layer, kind)| {
        let global = (layer + 1).is_multiple_of(period);
        kind == if global {
            "full_attention"
        } else {
            "sliding_attention"
        }
    });
    if !periodic {
        return Err(ModelError::InvalidMetadata {
            key: "layer_types".into(),
            message: "only a periodic pattern ending each period with a global layer is supported"
                .into(),
        });
    }
    Ok(period)
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
}

/// Phi-3's LongRoPE from a GGUF: `rope_factors_long.weight` / `rope_factors_short.weight`
/// (llama.cpp's names), `rope.scaling.original_context_length` and
/// `rope.scaling.attn_factor`. `None` when the file has neither factor tensor.
fn gguf_longrope(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    max_position_embeddings: usize,
    rotary_dim: usize,
) -> Result<Option<(RopeScaling, Vec<f32>)>> {
    let (long, short) = ("rope_factors_long.weight", "rope_factors_short.weight");
    if file.tensor(long).is_none() && file.tensor(short).is_none() {
        return Ok(None);
    }
    let original = match file.get_u64(&key("rope.scaling.original_context_length")) {
        Some(value) => to_usize("rope.scaling.original_context_length", value)?,
        None => max_position_embeddings,
    };
    let name = longrope_factor_name(max_position_embeddings, original, long, short);
    let info = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    let expected = rotary_dim / 2;
    if info.dims.iter().product::<u64>() != expected as u64 {
        return Err(ModelError::TensorShape {
            tensor: name.into(),
            expected: vec![expected],
            actual: info.dims.iter().map(|&d| d as usize).collect(),
        });
    }
    let dtype = tokenmill_kernels::DType::from_ggml_id(info.ggml_type.id()).ok_or_else(|| {
        ModelError::UnsupportedTensorType {
            tensor: name.into(),
            dtype: info.ggml_type.name(),
        }
    })?;
    let mut factors = vec![0.0f32; expected];
    tokenmill_kernels::dequantize(dtype, file.tensor_data(info)?, &mut factors)?;
    let attn_factor = file
        .get_f64(&key("rope.scaling.attn_factor"))
        .map_or(1.0, |v| v as f32);
    Ok(Some((
        RopeScaling::LongRope {
            original_max_position_embeddings: original,
            attn_factor,
        },
        factors,
    )))
}

/// The long factors when the context exceeds the pre-training one (llama.cpp's
/// `n_ctx > n_ctx_orig_yarn` at a context of the trained length), else the short ones.
fn longrope_factor_name<'a>(
    max_position_embeddings: usize,
    original: usize,
    long: &'a str,
    short: &'a str,
) -> &'a str {
    if max_position_embeddings > original {
        long
    } else {
        short
    }
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
        Ok((self.into_plain(&kind)?, None))
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
    fn unsupported_model_type_is_named_with_the_supported_list() {
        let text = r#"{"model_type": "falcon", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}"#;
        let error = ModelConfig::from_hf_config_json(text).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("`falcon`"), "{message}");
        assert!(
            message.contains("llama, mistral, qwen2, qwen3, gemma3, qwen3moe, phi3"),
            "{message}"
        );
    }

    #[test]
    fn qwen3_has_qk_norm_and_its_own_head_dim() {
        let text = r#"{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
            "sliding_window": null, "use_sliding_window": false, "tie_word_embeddings": true}"#;
        let config = ModelConfig::from_hf_config_json(text).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen3);
        assert!(config.qk_norm && !config.attention_bias);
        assert_eq!((config.head_dim, config.q_dim()), (128, 2048));
        assert_eq!(config.layer_sliding_window(0), None);
        let sliding = text.replace(
            r#""use_sliding_window": false"#,
            r#""use_sliding_window": true"#,
        );
        let error = ModelConfig::from_hf_config_json(&sliding).unwrap_err();
        assert!(error.to_string().contains("use_sliding_window"), "{error}");
    }

    #[test]
    fn mistral_sliding_window_covers_every_layer() {
        let text = r#"{"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "sliding_window": 4096}"#;
        let config = ModelConfig::from_hf_config_json(text).unwrap();
        assert_eq!(config.sliding_window, Some(4096));
        assert!((0..32).all(|layer| config.layer_sliding_window(layer) == Some(4096)));
        let full = text.replace(r#""sliding_window": 4096"#, r#""sliding_window": null"#);
        let config = ModelConfig::from_hf_config_json(&full).unwrap();
        assert_eq!(config.layer_sliding_window(0), None);
        // Qwen2 configs name a window they do not use.
        let qwen = text.replace("mistral", "qwen2").replace(
            r#""sliding_window": 4096"#,
            r#""sliding_window": 4096, "use_sliding_window": false"#,
        );
        let config = ModelConfig::from_hf_config_json(&qwen).unwrap();
        assert_eq!(config.sliding_window, None);
    }

    const GEMMA3_270M: &str = r#"{"architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": null,
        "sliding_window": 512, "query_pre_attn_scalar": 256,
        "final_logit_softcapping": null, "attn_logit_softcapping": null,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention"]}"#;

    #[test]
    fn gemma3_layers_alternate_five_local_one_global() {
        let config = ModelConfig::from_hf_config_json(GEMMA3_270M).unwrap();
        assert_eq!(config.architecture, Architecture::Gemma3);
        assert_eq!(config.sliding_window_pattern, Some(6));
        let globals: Vec<usize> = (0..config.num_layers)
            .filter(|&layer| config.layer_sliding_window(layer).is_none())
            .collect();
        assert_eq!(globals, [5, 11, 17]);
        assert_eq!(config.layer_sliding_window(0), Some(512));
        assert_eq!(config.rope_local_theta, Some(10_000.0));
        assert_eq!(config.attention_scale(), 1.0 / 16.0);
        assert!(config.qk_norm && config.final_logit_softcapping.is_none());
        let odd = GEMMA3_270M.replacen(r#""full_attention""#, r#""sliding_attention""#, 1);
        assert!(ModelConfig::from_hf_config_json(&odd).is_err());
        let gelu = GEMMA3_270M.replace("gelu_pytorch_tanh", "relu");
        assert!(ModelConfig::from_hf_config_json(&gelu).is_err());
    }

    #[test]
    fn hf_mixture_of_experts_configs() {
        let qwen = r#"{"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128}"#;
        let config = ModelConfig::from_hf_config_json(qwen).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen3Moe);
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
        assert_eq!(
            (config.architecture, config.family()),
            (Architecture::Llama, "Mixtral")
        );
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

    #[test]
    fn unsupported_rope_scaling_is_named() {
        let text = r#"{"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "rope_scaling": {"type": "yarn", "factor": 4.0}}"#;
        let error = ModelConfig::from_hf_config_json(text).unwrap_err();
        assert!(error.to_string().contains("`yarn`"), "{error}");
    }

    /// Phi-4-mini's shape (layers cut to 2): partial rotary 0.75 of 128 dims, LongRoPE with
    /// 48 factors each, original context 4,096 of 131,072 (long factors, attention factor
    /// `sqrt(1 + ln 32 / ln 4096)`).
    #[test]
    fn parses_phi4_mini_config_with_partial_rotary_and_longrope() {
        let long: Vec<String> = (0..48).map(|i| format!("{}.0", 1 + i)).collect();
        let short: Vec<String> = (0..48).map(|_| "1.0".to_owned()).collect();
        let text = format!(
            r#"{{"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
            "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 2, "num_attention_heads": 24, "num_key_value_heads": 8,
            "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "sliding_window": 262144, "tie_word_embeddings": true,
            "rope_scaling": {{"type": "longrope", "long_factor": [{}],
                              "short_factor": [{}]}}}}"#,
            long.join(", "),
            short.join(", ")
        );
        let config = ModelConfig::from_hf_config_json(&text).unwrap();
        assert_eq!(config.architecture, Architecture::Phi3);
        assert_eq!((config.head_dim, config.rotary_dim), (128, 96));
        assert_eq!(config.sliding_window, None);
        let RopeScaling::LongRope {
            original_max_position_embeddings,
            attn_factor,
        } = config.rope_scaling
        else {
            panic!("{:?}", config.rope_scaling);
        };
        assert_eq!(original_max_position_embeddings, 4096);
        let expected = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert!((attn_factor - expected).abs() < 1e-6);
        let factors = config.rope_freq_factors.unwrap();
        assert_eq!((factors[0], factors[47]), (1.0, 48.0));
        // A context no longer than the original one takes the short factors, attention
        // factor 1; a factor list of the wrong length is refused by name.
        let short_context = text.replace("131072", "4096");
        let config = ModelConfig::from_hf_config_json(&short_context).unwrap();
        assert_eq!(config.rope_freq_factors, Some(vec![1.0; 48]));
        assert!(matches!(
            config.rope_scaling,
            RopeScaling::LongRope { attn_factor, .. } if attn_factor == 1.0
        ));
        let error =
            ModelConfig::from_hf_config_json(&short_context.replace("[1.0, ", "[")).unwrap_err();
        assert!(error.to_string().contains("short_factor"), "{error}");
        let error = ModelConfig::from_hf_config_json(&text.replace("0.75", "0.7")).unwrap_err();
        assert!(error.to_string().contains("rotary"), "{error}");
    }
}
