//! GGUF's `llama`: Llama 2/3, SmolLM2, TinyLlama, and Mixtral (a `llama` file with experts;
//! HF's `model_type: mixtral`), on the Llama block.

use super::family::Family;
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::Result;

/// GGUF's `llama`: Llama 2/3, SmolLM2, TinyLlama, and Mixtral (a `llama` file with experts;
/// HF's `model_type: mixtral`).
pub(super) struct Llama;

const LLAMA: Architecture = Architecture::new("llama");

impl Llama {
    fn name(config: &ModelConfig) -> &'static str {
        if config.moe.is_some() {
            "Mixtral"
        } else {
            "Llama"
        }
    }
}

impl Family for Llama {
    fn architecture(&self) -> Architecture {
        LLAMA
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["mixtral"]
    }

    /// llama.cpp's converter permutes Llama Q/K rows to rotate adjacent pairs.
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Llama", RopeStyle::Normal)?;
        config.family_name = Llama::name(&config);
        Ok(config)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let raw: HfCommon = parse_config_json(config_json)?;
        let mut config = raw.decoder_config(LLAMA, "Llama")?;
        config.family_name = Llama::name(&config);
        Ok(config)
    }
}
