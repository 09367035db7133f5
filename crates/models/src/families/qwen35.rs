//! Qwen3.5 / Qwen3.6 dense (GGUF `qwen35`; HF `Qwen3_5ForCausalLM` with `model_type`
//! `qwen3_5_text`, `Qwen3_5ForConditionalGeneration` with `qwen3_5` and the text model's
//! fields under `text_config`), on its own hybrid block ([`Qwen35Model`]): names, both
//! configs, and a cache layout of paged K/V for the attention layers and a recurrent state
//! for the Gated DeltaNet layers.

use serde::Deserialize;
use tokenmill_kernels::KeyHeadOrder;

use super::blocks::Qwen35Model;
use super::family::{Family, WeightSource};
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, LinearAttentionConfig, ModelConfig,
    RopeStyle,
};
use crate::error::{ModelError, Result};
use crate::kv_cache::LayerKvLayout;
use crate::layers::AttentionShape;
use crate::model::{CausalLm, LoadOptions};
use crate::state_cache::LayerStateLayout;

pub(super) struct Qwen35;

const QWEN35: Architecture = Architecture::new("qwen35");

/// The text model's `config.json` fields (`Qwen3_5TextConfig`).
#[derive(Deserialize)]
struct Qwen35TextConfig {
    #[serde(flatten)]
    common: HfCommon,
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    rope_parameters: Option<RopeParameters>,
    hidden_act: Option<String>,
}

/// transformers 5's `rope_parameters` (Qwen3.5 keeps its RoPE base and partial rotary there).
#[derive(Deserialize)]
struct RopeParameters {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
}

/// `Qwen3_5Config` (the multimodal checkpoint): the text model's fields under `text_config`.
#[derive(Deserialize)]
struct Qwen35Config {
    text_config: serde_json::Value,
    tie_word_embeddings: Option<bool>,
}

impl Family for Qwen35 {
    fn architecture(&self) -> Architecture {
        QWEN35
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["qwen3_5_text", "qwen3_5"]
    }

    /// llama.cpp's `qwen35`: the DeltaNet shape under `ssm.*`, the full-attention layers
    /// from `attention.recurrent_layers` (or every `full_attention_interval`-th), value heads
    /// in the converter's tiled order.
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Qwen3.5", RopeStyle::Neox)?;
        let num_v_heads = gguf.required_usize("ssm.time_step_rank")?;
        let inner = gguf.required_usize("ssm.inner_size")?;
        let interval = gguf.optional_usize("full_attention_interval")?.unwrap_or(4);
        let linear = LinearAttentionConfig {
            num_k_heads: gguf.required_usize("ssm.group_count")?,
            num_v_heads,
            head_k_dim: gguf.required_usize("ssm.state_size")?,
            head_v_dim: crate::config::divide_exact(
                "ssm.inner_size / ssm.time_step_rank",
                inner,
                num_v_heads,
            )?,
            conv_kernel: gguf.required_usize("ssm.conv_kernel")?,
            full_attention_interval: interval,
            key_heads: KeyHeadOrder::Tiled,
        };
        if let Some(flags) = gguf.array("attention.recurrent_layers") {
            let recurrent: Vec<Option<bool>> = flags.iter().map(|flag| flag.as_bool()).collect();
            check_periodic(
                "attention.recurrent_layers",
                recurrent.iter().take(config.num_layers).copied(),
                &linear,
            )?;
        }
        if let Some(sections) = gguf.array("rope.dimension_sections") {
            // Text-only positions are equal in the first three sections; a fourth section
            // would rotate by another position id.
            if sections.get(3).and_then(|s| s.as_u64()).unwrap_or(0) != 0 {
                return Err(ModelError::InvalidMetadata {
                    key: gguf.key("rope.dimension_sections"),
                    message: "a non-empty fourth multimodal RoPE section is not supported".into(),
                });
            }
        }
        config.linear_attention = Some(linear);
        config.attention_output_gate = true;
        config.qk_norm = true;
        Ok(config)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        // The multimodal checkpoint nests the text model; its head may be tied at the top.
        let (text, outer_tie) = match parse_config_json::<Qwen35Config>(config_json) {
            Ok(outer) => (outer.text_config, outer.tie_word_embeddings),
            Err(_) => (parse_config_json::<serde_json::Value>(config_json)?, None),
        };
        let raw: Qwen35TextConfig =
            serde_json::from_value(text).map_err(|source| ModelError::ConfigJson {
                path: "config.json".into(),
                source,
            })?;
        if let Some(activation) = raw.hidden_act.as_deref() {
            if activation != "silu" {
                return Err(ModelError::InvalidMetadata {
                    key: "hidden_act".into(),
                    message: format!("unsupported activation `{activation}`"),
                });
            }
        }
        let missing = |key: &str| ModelError::MissingMetadata(key.into());
        let interval = match (&raw.layer_types, raw.full_attention_interval) {
            (Some(types), _) => types
                .iter()
                .position(|kind| kind == "full_attention")
                .map_or(types.len() + 1, |index| index + 1),
            (None, interval) => interval.unwrap_or(4),
        };
        let linear = LinearAttentionConfig {
            num_k_heads: raw
                .linear_num_key_heads
                .ok_or_else(|| missing("linear_num_key_heads"))?,
            num_v_heads: raw
                .linear_num_value_heads
                .ok_or_else(|| missing("linear_num_value_heads"))?,
            head_k_dim: raw.linear_key_head_dim.unwrap_or(128),
            head_v_dim: raw.linear_value_head_dim.unwrap_or(128),
            conv_kernel: raw.linear_conv_kernel_dim.unwrap_or(4),
            full_attention_interval: interval,
            key_heads: KeyHeadOrder::Grouped,
        };
        if let Some(types) = &raw.layer_types {
            if types.len() != raw.common.num_hidden_layers {
                return Err(ModelError::InvalidMetadata {
                    key: "layer_types".into(),
                    message: format!(
                        "{} entries for {} layers",
                        types.len(),
                        raw.common.num_hidden_layers
                    ),
                });
            }
            let kinds = types.iter().map(|kind| match kind.as_str() {
                "linear_attention" => Some(true),
                "full_attention" => Some(false),
                _ => None,
            });
            check_periodic("layer_types", kinds, &linear)?;
        }
        let head_dim = raw.common.head_dim.unwrap_or(256);
        let (theta, partial) = match &raw.rope_parameters {
            Some(rope) => {
                if let Some(kind) = rope.rope_type.as_deref() {
                    if kind != "default" {
                        return Err(ModelError::InvalidMetadata {
                            key: "rope_parameters.rope_type".into(),
                            message: format!("unsupported RoPE type `{kind}`"),
                        });
                    }
                }
                (rope.rope_theta, rope.partial_rotary_factor)
            }
            None => (None, None),
        };
        let tie = raw
            .common
            .tie_word_embeddings
            .or(outer_tie)
            .unwrap_or(false);
        let mut common = raw.common;
        common.head_dim = Some(head_dim);
        common.tie_word_embeddings = Some(tie);
        let mut config = common.decoder_config(QWEN35, "Qwen3.5")?;
        if let Some(theta) = theta {
            config.rope_theta = theta as f32;
        }
        // transformers defaults `partial_rotary_factor` to 0.25 for Qwen3.5.
        config.rotary_dim = (head_dim as f64 * partial.unwrap_or(0.25)).round() as usize;
        config.linear_attention = Some(linear);
        config.attention_output_gate = true;
        config.qk_norm = true;
        Ok(config)
    }

    fn build(
        &self,
        weights: WeightSource<'_>,
        config: ModelConfig,
        options: &LoadOptions,
    ) -> Result<Box<dyn CausalLm>> {
        let kv_layout = self.kv_layout(&config);
        let state_layout = self.state_layout(&config);
        Ok(Box::new(Qwen35Model::build(
            weights,
            config,
            kv_layout,
            state_layout,
            options,
        )?))
    }

    /// Paged K/V for the full-attention layers only, in layer order.
    fn kv_layout(&self, config: &ModelConfig) -> Vec<LayerKvLayout> {
        let shape = AttentionShape::of(config);
        (0..config.num_layers)
            .filter(|&layer| !is_linear(config, layer))
            .map(|_| shape.kv_layout(None))
            .collect()
    }

    /// A convolution window and a recurrent state per Gated DeltaNet layer, in layer order.
    fn state_layout(&self, config: &ModelConfig) -> Vec<LayerStateLayout> {
        let Some(linear) = config.linear_attention else {
            return Vec::new();
        };
        (0..config.num_layers)
            .filter(|&layer| linear.is_linear(layer))
            .map(|_| linear.state_layout())
            .collect()
    }
}

fn is_linear(config: &ModelConfig, layer: usize) -> bool {
    config
        .linear_attention
        .is_some_and(|linear| linear.is_linear(layer))
}

/// Checks a per-layer list of kinds (`Some(true)`: linear attention) against the periodic
/// pattern `linear` describes; only that pattern is supported.
fn check_periodic(
    key: &str,
    kinds: impl Iterator<Item = Option<bool>>,
    linear: &LinearAttentionConfig,
) -> Result<()> {
    for (layer, kind) in kinds.enumerate() {
        if kind != Some(linear.is_linear(layer)) {
            return Err(ModelError::InvalidMetadata {
                key: key.into(),
                message: format!(
                    "layer {layer} breaks the pattern of one full-attention layer every {}",
                    linear.full_attention_interval
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::families::registry;

    /// Qwen3.5-0.8B's text config as its `config.json` nests it (abridged to what is read).
    const QWEN35_08B: &str = r#"{"architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5", "tie_word_embeddings": true,
        "text_config": {"model_type": "qwen3_5_text", "vocab_size": 248320,
        "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "hidden_act": "silu",
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "full_attention_interval": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
            "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
            "mrope_interleaved": true}},
        "vision_config": {"depth": 12}}"#;

    #[test]
    fn qwen35_conditional_generation_config() {
        let config = ModelConfig::from_hf_config_json(QWEN35_08B).unwrap();
        assert_eq!(config.architecture, "qwen35");
        assert_eq!((config.head_dim, config.rotary_dim), (256, 64));
        assert_eq!(config.rope_theta, 1e7);
        assert!(config.tie_word_embeddings && config.qk_norm && config.attention_output_gate);
        let linear = config.linear_attention.unwrap();
        assert_eq!(linear.conv_dim(), 6144);
        assert_eq!(
            linear.state_layout().conv_elems + linear.state_layout().recurrent_elems,
            3 * 6144 + 16 * 128 * 128
        );
        let kv = registry::kv_layout(&config).unwrap();
        let state = registry::state_layout(&config).unwrap();
        assert_eq!((kv.len(), state.len()), (6, 18));
        let odd = QWEN35_08B.replace(
            r#""full_attention_interval": 4"#,
            r#""layer_types": ["full_attention"]"#,
        );
        assert!(ModelConfig::from_hf_config_json(&odd).is_err());
    }
}
