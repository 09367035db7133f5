//! Gemma 3 (text), on its own block ([`GemmaModel`]): names, its `config.json`
//! (`Gemma3TextConfig`) and GGUF quirks (every sixth layer global, local layers on RoPE base
//! 10,000, the 27B model's score scale).

use serde::Deserialize;

use super::blocks::GemmaModel;
use super::family::{Family, WeightSource};
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::{ModelError, Result};
use crate::model::{CausalLm, LoadOptions};

pub(super) struct Gemma3;

const GEMMA3: Architecture = Architecture::new("gemma3");

/// Gemma 3's `config.json` (`Gemma3TextConfig`): the shared fields and its own.
#[derive(Deserialize)]
struct Gemma3Config {
    #[serde(flatten)]
    common: HfCommon,
    sliding_window: Option<usize>,
    /// The older period form and the newer per-layer list of local and global layers.
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    hidden_activation: Option<String>,
}

impl Family for Gemma3 {
    fn architecture(&self) -> Architecture {
        GEMMA3
    }

    /// HF calls the text model `gemma3_text`.
    fn aliases(&self) -> &'static [&'static str] {
        &["gemma3_text"]
    }

    /// llama.cpp's Gemma 3: every sixth layer global, local layers on base 10,000. GGUF has
    /// no `query_pre_attn_scalar`: llama.cpp scales by head_dim^-1/2, except for the 27B model
    /// (62 layers), which uses hidden / heads.
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Gemma 3", RopeStyle::Neox)?;
        config.sliding_window_pattern = Some(6);
        config.rope_local_theta = config.sliding_window.map(|_| 10_000.0);
        config.query_pre_attn_scalar =
            (config.num_layers == 62).then(|| (config.hidden_size / config.num_heads) as f32);
        Ok(config)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let mut raw: Gemma3Config = parse_config_json(config_json)?;
        let period = global_layer_period(&raw)?;
        // Its config defaults to a tied head; its local layers come from `layer_types`.
        let tie_word_embeddings = raw.common.tie_word_embeddings.unwrap_or(true);
        raw.common.use_sliding_window = None;
        let mut config = raw.common.decoder_config(GEMMA3, "Gemma 3")?;
        config.tie_word_embeddings = tie_word_embeddings;
        config.qk_norm = true;
        config.sliding_window = raw.sliding_window;
        config.sliding_window_pattern = Some(period);
        config.rope_local_theta = Some(raw.rope_local_base_freq.unwrap_or(10_000.0) as f32);
        config.query_pre_attn_scalar = raw.query_pre_attn_scalar.map(|v| v as f32);
        config.final_logit_softcapping = raw.final_logit_softcapping.map(|v| v as f32);
        if raw.attn_logit_softcapping.is_some() {
            return Err(ModelError::InvalidMetadata {
                key: "attn_logit_softcapping".into(),
                message: "attention logit soft-capping is not supported".into(),
            });
        }
        if let Some(activation) = raw.hidden_activation.as_deref() {
            if activation != "gelu_pytorch_tanh" {
                return Err(ModelError::InvalidMetadata {
                    key: "hidden_activation".into(),
                    message: format!("unsupported activation `{activation}`"),
                });
            }
        }
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

/// The period of global layers from `layer_types` (which must follow one) or
/// `sliding_window_pattern`, 6 when neither is given.
fn global_layer_period(raw: &Gemma3Config) -> Result<usize> {
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

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;

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
        assert_eq!(config.architecture, "gemma3");
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
}
