//! Gemma 4 (text: E2B / E4B, 31B; GGUF `gemma4`, HF `Gemma4ForCausalLM` with `model_type`
//! `gemma4_text`, `Gemma4ForConditionalGeneration` with `gemma4` and the text model's fields
//! under `text_config`), on the Gemma block ([`GemmaModel`]) with its Gemma 4 parts: sliding
//! layers and global layers of their own geometry (wider heads, fewer KV heads, V taken from
//! K's projection, proportional RoPE on a share of the pairs), V normed, KV-shared last layers,
//! per-layer embeddings and double-wide MLPs, a scalar per layer, no score scaling, and the
//! 26B-A4B's routed experts beside every layer's MLP (`enable_moe_block`; GGUF
//! `expert_count`).
//!
//! Not yet: bidirectional attention over all tokens (`use_bidirectional_attention: "all"`,
//! refused).

use serde::Deserialize;

use super::blocks::GemmaModel;
use super::family::{Family, WeightSource};
use crate::config::{
    parse_config_json, Architecture, FullAttentionGeometry, GgufMetadata, HfCommon, ModelConfig,
    MoeConfig, RopeStyle,
};
use crate::error::{ModelError, Result};
use crate::model::{CausalLm, LoadOptions};

pub(super) struct Gemma4;

pub(super) const GEMMA4: Architecture = Architecture::new("gemma4");

/// `Gemma4TextConfig`'s own fields beside the shared ones.
#[derive(Deserialize)]
struct Gemma4TextConfig {
    #[serde(flatten)]
    common: HfCommon,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_parameters: Option<Gemma4RopeParameters>,
    final_logit_softcapping: Option<f64>,
    hidden_activation: Option<String>,
    use_bidirectional_attention: Option<String>,
    vocab_size_per_layer_input: Option<usize>,
    hidden_size_per_layer_input: Option<usize>,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default)]
    num_kv_shared_layers: usize,
    #[serde(default)]
    enable_moe_block: bool,
    /// The experts' shape (read here, not by [`HfCommon`], which knows Qwen3-MoE's
    /// `num_experts_per_tok` where Gemma 4 says `top_k_experts`).
    num_experts: Option<usize>,
    top_k_experts: Option<usize>,
    moe_intermediate_size: Option<usize>,
    #[serde(default)]
    use_double_wide_mlp: bool,
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    /// What transformers writes in place of the two above: per layer index, overrides.
    per_layer_config: Option<std::collections::BTreeMap<String, LayerOverride>>,
}

#[derive(Deserialize)]
struct LayerOverride {
    head_dim: Option<usize>,
    num_key_value_heads: Option<usize>,
}

/// RoPE per layer kind.
#[derive(Deserialize)]
struct Gemma4RopeParameters {
    sliding_attention: Option<RopeParameters>,
    full_attention: Option<RopeParameters>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
}

/// `Gemma4Config` (the multimodal checkpoint): the text model under `text_config`.
#[derive(Deserialize)]
struct Gemma4Config {
    text_config: serde_json::Value,
    tie_word_embeddings: Option<bool>,
}

fn invalid(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::InvalidMetadata {
        key: key.into(),
        message: message.into(),
    }
}

impl Family for Gemma4 {
    fn architecture(&self) -> Architecture {
        GEMMA4
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["gemma4_text"]
    }

    /// llama.cpp's `gemma4`: `key_length` is the global layers' head size and
    /// `key_length_swa` the sliding layers'; `head_count_kv` and `feed_forward_length` may be
    /// per layer; the global layers' proportional RoPE is in `rope_freqs.weight` (read by the
    /// block); the sliding layers from `attention.sliding_window_pattern`.
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Gemma 4", RopeStyle::Neox)?;
        let layers = config.num_layers;
        let full_head_dim = config.head_dim;
        let swa_head_dim = gguf.required_usize("attention.key_length_swa")?;
        let sliding: Vec<bool> = gguf
            .array("attention.sliding_window_pattern")
            .ok_or_else(|| {
                ModelError::MissingMetadata(gguf.key("attention.sliding_window_pattern"))
            })?
            .iter()
            .map(|flag| flag.as_bool().unwrap_or(false))
            .collect();
        let kv_heads = gguf.per_layer_usizes("attention.head_count_kv")?;
        let kv_heads_of = |global: bool| -> usize {
            kv_heads
                .as_ref()
                .and_then(|heads| {
                    sliding
                        .iter()
                        .position(|&swa| swa != global)
                        .and_then(|layer| heads.get(layer).copied())
                })
                .unwrap_or(config.num_kv_heads)
        };
        let (swa_kv_heads, full_kv_heads) = (kv_heads_of(false), kv_heads_of(true));
        if let Some(heads) = &kv_heads {
            let consistent = heads.len() == layers
                && heads
                    .iter()
                    .zip(&sliding)
                    .all(|(&h, &swa)| h == if swa { swa_kv_heads } else { full_kv_heads });
            if !consistent {
                return Err(invalid(
                    &gguf.key("attention.head_count_kv"),
                    "KV heads must be one count for the sliding layers and one for the others",
                ));
            }
        }
        let full_rotary = config.rotary_dim;
        config.head_dim = swa_head_dim;
        config.num_kv_heads = swa_kv_heads;
        config.rotary_dim = gguf
            .optional_usize("rope.dimension_count_swa")?
            .unwrap_or(swa_head_dim);
        config.rope_local_theta = Some(gguf.optional_f32("rope.freq_base_swa").unwrap_or(10_000.0));
        let shared = gguf
            .optional_usize("attention.shared_kv_layers")?
            .unwrap_or(0);
        // `rope_freqs.weight` marks the unrotated pairs with huge divisors (the block turns
        // them by its values); without it every pair of the declared rotary dims turns.
        let rotated_pairs = match rope_freqs(gguf)? {
            Some(factors) => factors.iter().filter(|&&f| f < UNROTATED_DIVISOR).count(),
            None => full_rotary / 2,
        };
        config.full_attention = Some(FullAttentionGeometry {
            num_kv_heads: full_kv_heads,
            head_dim: full_head_dim,
            rotated_pairs,
            values_are_keys: first_full_layer(&sliding).is_some_and(|layer| {
                gguf.file()
                    .tensor(&format!("blk.{layer}.attn_v.weight"))
                    .is_none()
            }),
        });
        config.sliding_layers = Some(sliding);
        config.kv_shared_layers = shared;
        config.per_layer_input_size = gguf
            .optional_usize("embedding_length_per_layer_input")?
            .filter(|&width| width > 0);
        config.layer_intermediate_sizes = gguf.per_layer_usizes("feed_forward_length")?;
        config.query_pre_attn_scalar = Some(1.0);
        config.qk_norm = true;
        config.value_norm = true;
        Ok(config)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let (text, outer_tie) = match parse_config_json::<Gemma4Config>(config_json) {
            Ok(outer) => (outer.text_config, outer.tie_word_embeddings),
            Err(_) => (parse_config_json::<serde_json::Value>(config_json)?, None),
        };
        let raw: Gemma4TextConfig =
            serde_json::from_value(text).map_err(|source| ModelError::ConfigJson {
                path: "config.json".into(),
                source,
            })?;
        let moe = raw.enable_moe_block.then(|| moe_config(&raw)).transpose()?;
        if raw.use_bidirectional_attention.as_deref() == Some("all") {
            return Err(invalid(
                "use_bidirectional_attention",
                "bidirectional attention over every token is not supported",
            ));
        }
        if let Some(activation) = raw.hidden_activation.as_deref() {
            if activation != "gelu_pytorch_tanh" {
                return Err(invalid(
                    "hidden_activation",
                    format!("unsupported activation `{activation}`"),
                ));
            }
        }
        let layers = raw.common.num_hidden_layers;
        let mut sliding: Vec<bool> = match &raw.layer_types {
            Some(types) => crate::config::sliding_layers_from_types(types)?,
            None => (0..layers).map(|layer| (layer + 1) % 6 != 0).collect(),
        };
        // transformers forces the last layer global.
        if let Some(last) = sliding.last_mut() {
            *last = false;
        }
        if let Some(per_layer) = raw.vocab_size_per_layer_input {
            if raw.hidden_size_per_layer_input.unwrap_or(0) > 0
                && per_layer != raw.common.vocab_size
            {
                return Err(invalid(
                    "vocab_size_per_layer_input",
                    format!(
                        "{per_layer} per-layer embedding rows for a {}-token vocabulary",
                        raw.common.vocab_size
                    ),
                ));
            }
        }
        let overrides = |pick: fn(&LayerOverride) -> Option<usize>| {
            raw.per_layer_config.as_ref().and_then(|layers| {
                layers
                    .iter()
                    .filter(|(index, _)| {
                        index
                            .parse::<usize>()
                            .is_ok_and(|layer| sliding.get(layer) == Some(&false))
                    })
                    .find_map(|(_, layer)| pick(layer))
            })
        };
        let swa_head_dim = raw.common.head_dim.unwrap_or(256);
        let swa_kv_heads = raw
            .common
            .num_key_value_heads
            .unwrap_or(raw.common.num_attention_heads);
        let full_head_dim = raw
            .global_head_dim
            .or_else(|| overrides(|layer| layer.head_dim))
            .unwrap_or(512);
        // transformers gives the global layers their own KV heads only with K = V.
        let full_kv_heads = match raw.attention_k_eq_v {
            true => raw
                .num_global_key_value_heads
                .or_else(|| overrides(|layer| layer.num_key_value_heads))
                .unwrap_or(swa_kv_heads),
            false => swa_kv_heads,
        };
        let rope = raw.rope_parameters.as_ref();
        let swa_rope = rope.and_then(|rope| rope.sliding_attention.as_ref());
        let full_rope = rope.and_then(|rope| rope.full_attention.as_ref());
        for (kind, params, allowed) in [
            ("sliding_attention", swa_rope, "default"),
            ("full_attention", full_rope, "proportional"),
        ] {
            if let Some(kind_name) = params.and_then(|p| p.rope_type.as_deref()) {
                if kind_name != allowed && kind_name != "default" {
                    return Err(invalid(
                        &format!("rope_parameters.{kind}.rope_type"),
                        format!("unsupported RoPE type `{kind_name}`"),
                    ));
                }
            }
        }
        let swa_partial = swa_rope
            .and_then(|p| p.partial_rotary_factor)
            .unwrap_or(1.0);
        let full_partial = match full_rope {
            Some(params) if params.rope_type.as_deref() == Some("default") => {
                params.partial_rotary_factor.unwrap_or(1.0)
            }
            Some(params) => params.partial_rotary_factor.unwrap_or(1.0),
            None => 0.25,
        };
        let first_shared = layers.saturating_sub(raw.num_kv_shared_layers);
        let tie = raw.common.tie_word_embeddings.or(outer_tie).unwrap_or(true);
        let intermediate = raw.common.intermediate_size;
        let mut common = raw.common;
        common.head_dim = Some(swa_head_dim);
        common.tie_word_embeddings = Some(tie);
        common.use_sliding_window = None;
        let mut config = common.decoder_config(GEMMA4, "Gemma 4")?;
        config.rotary_dim = (swa_head_dim as f64 * swa_partial) as usize;
        config.rope_theta = full_rope.and_then(|p| p.rope_theta).unwrap_or(1_000_000.0) as f32;
        config.rope_local_theta =
            Some(swa_rope.and_then(|p| p.rope_theta).unwrap_or(10_000.0) as f32);
        config.sliding_window = Some(raw.sliding_window.unwrap_or(512));
        config.full_attention = Some(FullAttentionGeometry {
            num_kv_heads: full_kv_heads,
            head_dim: full_head_dim,
            rotated_pairs: (full_partial * full_head_dim as f64 / 2.0) as usize,
            values_are_keys: raw.attention_k_eq_v,
        });
        config.sliding_layers = Some(sliding);
        config.kv_shared_layers = raw.num_kv_shared_layers;
        config.per_layer_input_size = raw.hidden_size_per_layer_input.filter(|&w| w > 0);
        config.layer_intermediate_sizes = raw.use_double_wide_mlp.then(|| {
            (0..layers)
                .map(|layer| intermediate * if layer < first_shared { 1 } else { 2 })
                .collect()
        });
        config.final_logit_softcapping = raw.final_logit_softcapping.map(|c| c as f32);
        config.query_pre_attn_scalar = Some(1.0);
        config.qk_norm = true;
        config.value_norm = true;
        config.moe = moe;
        Ok(config)
    }

    fn build(
        &self,
        weights: WeightSource<'_>,
        config: ModelConfig,
        options: &LoadOptions,
    ) -> Result<Box<dyn CausalLm>> {
        let kv_layout = self.kv_layout(&config);
        Ok(Box::new(GemmaModel::build(
            weights, config, kv_layout, options,
        )?))
    }
}

/// The routed experts of an `enable_moe_block` config (every layer has them, beside its MLP).
fn moe_config(raw: &Gemma4TextConfig) -> Result<MoeConfig> {
    let required = |value: Option<usize>, key: &str| {
        value
            .filter(|&v| v > 0)
            .ok_or_else(|| ModelError::MissingMetadata(key.into()))
    };
    Ok(MoeConfig {
        num_experts: required(raw.num_experts, "num_experts")?,
        experts_used: required(raw.top_k_experts, "top_k_experts")?,
        expert_intermediate_size: required(raw.moe_intermediate_size, "moe_intermediate_size")?,
    })
}

/// A `rope_freqs.weight` divisor from which on a pair counts as unrotated (llama.cpp's
/// converter writes 1e30).
const UNROTATED_DIVISOR: f32 = 1e20;

/// The GGUF's `rope_freqs.weight` values, if it has one.
fn rope_freqs(gguf: &GgufMetadata<'_>) -> Result<Option<Vec<f32>>> {
    let file = gguf.file();
    let Some(info) = file.tensor("rope_freqs.weight") else {
        return Ok(None);
    };
    let dtype = tokenmill_kernels::DType::from_ggml_id(info.ggml_type.id()).ok_or_else(|| {
        ModelError::UnsupportedTensorType {
            tensor: "rope_freqs.weight".into(),
            dtype: info.ggml_type.name(),
        }
    })?;
    let count = info.dims.iter().product::<u64>() as usize;
    let mut values = vec![0.0f32; count];
    tokenmill_kernels::dequantize(dtype, file.tensor_data(info)?, &mut values)?;
    Ok(Some(values))
}

fn first_full_layer(sliding: &[bool]) -> Option<usize> {
    sliding.iter().position(|&swa| !swa)
}
