//! Qwen2 and Qwen2.5: the Llama block with a bias on the Q, K and V projections, rotating
//! half-split pairs in both formats.

use super::family::Family;
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::Result;

pub(super) struct Qwen2;

const QWEN2: Architecture = Architecture::new("qwen2");

impl Family for Qwen2 {
    fn architecture(&self) -> Architecture {
        QWEN2
    }

    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Qwen2", RopeStyle::Neox)?;
        config.attention_bias = true;
        Ok(config)
    }

    /// Its configs name a `sliding_window` they do not use (`use_sliding_window: false`).
    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let raw: HfCommon = parse_config_json(config_json)?;
        let mut config = raw.decoder_config(QWEN2, "Qwen2")?;
        config.attention_bias = true;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ModelConfig, RopeScaling};

    #[test]
    fn qwen2_has_attention_bias() {
        let text = r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "rope_theta": 1000000.0, "tie_word_embeddings": true,
            "rope_scaling": null}"#;
        let config = ModelConfig::from_hf_config_json(text).unwrap();
        assert_eq!(config.architecture, "qwen2");
        assert!(config.attention_bias);
        assert!(config.tie_word_embeddings);
        assert_eq!(config.head_dim, 64);
        assert_eq!(config.rope_scaling, RopeScaling::None);
    }
}
