//! Qwen3 (dense) and Qwen3-MoE: the Llama block with a per-head RMSNorm on Q and K (QK-norm),
//! no bias, rotating half-split pairs in both formats; Qwen3-MoE has a routed mixture of
//! experts as every layer's FFN (HF `model_type: qwen3_moe`, GGUF `qwen3moe`).

use super::family::Family;
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::{ModelError, Result};

pub(super) struct Qwen3;

pub(super) struct Qwen3Moe;

const QWEN3: Architecture = Architecture::new("qwen3");
const QWEN3_MOE: Architecture = Architecture::new("qwen3moe");

/// Both forms' HF config: the shared fields, with QK-norm.
fn hf_config(
    config_json: &str,
    architecture: Architecture,
    name: &'static str,
) -> Result<ModelConfig> {
    let raw: HfCommon = parse_config_json(config_json)?;
    let mut config = raw.decoder_config(architecture, name)?;
    config.qk_norm = true;
    Ok(config)
}

/// Qwen3-MoE without experts is not a model this family runs.
fn require_experts(config: ModelConfig) -> Result<ModelConfig> {
    match config.moe {
        Some(_) => Ok(config),
        None => Err(ModelError::MissingMetadata("qwen3moe.expert_count".into())),
    }
}

impl Family for Qwen3 {
    fn architecture(&self) -> Architecture {
        QWEN3
    }

    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        gguf.decoder_config("Qwen3", RopeStyle::Neox)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        hf_config(config_json, QWEN3, "Qwen3")
    }
}

impl Family for Qwen3Moe {
    fn architecture(&self) -> Architecture {
        QWEN3_MOE
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["qwen3_moe"]
    }

    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        require_experts(gguf.decoder_config("Qwen3-MoE", RopeStyle::Neox)?)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        require_experts(hf_config(config_json, QWEN3_MOE, "Qwen3-MoE")?)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;

    #[test]
    fn qwen3_has_qk_norm_and_its_own_head_dim() {
        let text = r#"{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
            "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
            "sliding_window": null, "use_sliding_window": false, "tie_word_embeddings": true}"#;
        let config = ModelConfig::from_hf_config_json(text).unwrap();
        assert_eq!(config.architecture, "qwen3");
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
}
