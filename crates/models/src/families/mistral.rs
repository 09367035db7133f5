//! Mistral: the Llama block with an optional sliding window over every layer (`sliding_window`
//! in both formats; GGUF's `mistral.attention.sliding_window`).

use serde::Deserialize;

use super::family::Family;
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::Result;

pub(super) struct Mistral;

const MISTRAL: Architecture = Architecture::new("mistral");

/// Mistral's `config.json`: the shared fields and its window.
#[derive(Deserialize)]
struct MistralConfig {
    #[serde(flatten)]
    common: HfCommon,
    sliding_window: Option<usize>,
}

impl Family for Mistral {
    fn architecture(&self) -> Architecture {
        MISTRAL
    }

    /// Its GGUF Q/K rows are permuted like Llama's (adjacent pairs).
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        gguf.decoder_config("Mistral", RopeStyle::Normal)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let raw: MistralConfig = parse_config_json(config_json)?;
        let mut config = raw.common.decoder_config(MISTRAL, "Mistral")?;
        config.sliding_window = raw.sliding_window;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;

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
}
