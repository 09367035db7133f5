//! Phi-3 and Phi-4-mini: the Llama block with fused `attn_qkv` and gate/up tensors (`ffn_up`
//! holding both halves), partial rotary (`rope.dimension_count` < head_dim) and LongRoPE
//! (`rope_factors_long`/`_short`), all read by the shared parsers and layers; what is Phi-3's
//! own is that its sliding window is not applied.

use super::family::Family;
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::Result;

pub(super) struct Phi3;

const PHI3: Architecture = Architecture::new("phi3");

impl Family for Phi3 {
    fn architecture(&self) -> Architecture {
        PHI3
    }

    /// llama.cpp disables Phi-3's sliding window (its converters do not describe the layers
    /// it applies to), and so does tokenmill, for the same outputs.
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Phi-3", RopeStyle::Neox)?;
        config.sliding_window = None;
        Ok(config)
    }

    /// Its `sliding_window` is not read, as in the GGUF.
    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let raw: HfCommon = parse_config_json(config_json)?;
        raw.decoder_config(PHI3, "Phi-3")
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ModelConfig, RopeScaling};

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
        assert_eq!(config.architecture, "phi3");
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
