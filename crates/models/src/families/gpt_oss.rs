//! gpt-oss (GGUF `gpt-oss`, llama.cpp's `openai-moe`; HF `GptOssForCausalLM` with
//! `model_type: gpt_oss`) on the Llama block ([`LlamaModel`]): Q/K/V and output biases, a
//! learned attention sink per head, sliding (128) and full attention layers alternating from a
//! sliding first layer, YaRN over 4,096 trained positions without truncation, and every FFN a
//! routed mixture of experts whose router and projections carry biases and whose gate is the
//! clamped SwiGLU (`alpha` 1.702, `limit` 7). The experts are MXFP4 in the released files,
//! which is a weight type like any other (`tokenmill_kernels::DType::MXFP4`).
//!
//! Not yet: HF directories (the released safetensors keep the experts as MXFP4
//! `*_blocks` / `*_scales` with gate and up interleaved): refused by name at load, convert to
//! GGUF with llama.cpp's `convert_hf_to_gguf.py`; the config is still read (for capacity
//! planning and `read_model_config`).

use serde::Deserialize;

use super::family::{Family, WeightSource};
use crate::config::{
    parse_config_json, Architecture, ClampedSwiglu, GgufMetadata, HfCommon, ModelConfig,
    RopeScaling, RopeStyle,
};
use crate::error::{ModelError, Result};
use crate::families::blocks::LlamaModel;
use crate::model::{CausalLm, LoadOptions};

pub(super) struct GptOss;

const GPT_OSS: Architecture = Architecture::new("gpt-oss");

/// llama.cpp hard-codes gpt-oss's SwiGLU constants (`LLM_FFN_SWIGLU_OAI_MOE`); HF's
/// defaults are the same.
const SWIGLU: ClampedSwiglu = ClampedSwiglu {
    alpha: 1.702,
    limit: 7.0,
};

/// `GptOssConfig`'s own fields beside the shared ones.
#[derive(Deserialize)]
struct GptOssConfig {
    #[serde(flatten)]
    common: HfCommon,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    swiglu_alpha: Option<f64>,
    swiglu_limit: Option<f64>,
}

/// What says whether the RoPE base and norm epsilon were given (HF's gpt-oss defaults, 150,000
/// and 1e-5, differ from the shared ones) and whether a RoPE scaling was.
#[derive(Deserialize)]
struct Given {
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
    rope_parameters: Option<GivenRope>,
    rope_scaling: Option<GivenRope>,
}

#[derive(Deserialize)]
struct GivenRope {
    rope_theta: Option<f64>,
}

/// The parts every gpt-oss has whatever the format: sinks, biases, the clamped SwiGLU, YaRN
/// untruncated (the model was trained so; llama.cpp truncates, a small difference on the ramp's
/// two end pairs), and experts.
fn gpt_oss_parts(mut config: ModelConfig, swiglu: ClampedSwiglu) -> Result<ModelConfig> {
    if config.moe.is_none() {
        return Err(ModelError::MissingMetadata("gpt-oss expert count".into()));
    }
    config.attention_sinks = true;
    config.expert_bias = true;
    config.clamped_swiglu = Some(swiglu);
    if let RopeScaling::Yarn { truncate, .. } = &mut config.rope_scaling {
        *truncate = false;
    }
    Ok(config)
}

impl Family for GptOss {
    fn architecture(&self) -> Architecture {
        GPT_OSS
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["gpt_oss"]
    }

    /// llama.cpp's `gpt-oss`: the pre-FFN norm is `post_attention_norm`, the biases and sinks
    /// are tensors, sliding layers every other one from layer 0 (`sliding_window_pattern`,
    /// default 2, or a per-layer flag array).
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("gpt-oss", RopeStyle::Neox)?;
        if config.sliding_window.is_none() {
            return Err(ModelError::MissingMetadata(
                gguf.key("attention.sliding_window"),
            ));
        }
        match gguf.array("attention.sliding_window_pattern") {
            Some(flags) => {
                config.sliding_layers =
                    Some(flags.iter().map(|f| f.as_bool().unwrap_or(false)).collect());
            }
            None => {
                config.sliding_window_pattern = Some(
                    gguf.optional_usize("attention.sliding_window_pattern")?
                        .unwrap_or(2),
                );
            }
        }
        config.attention_output_bias = gguf.file().tensor("blk.0.attn_output.bias").is_some();
        gpt_oss_parts(config, SWIGLU)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let raw: GptOssConfig = parse_config_json(config_json)?;
        let given: Given = parse_config_json(config_json)?;
        let layer_types = raw.layer_types;
        let sliding_window = raw.sliding_window.unwrap_or(128);
        let swiglu = ClampedSwiglu {
            alpha: raw.swiglu_alpha.map_or(SWIGLU.alpha, |a| a as f32),
            limit: raw.swiglu_limit.map_or(SWIGLU.limit, |l| l as f32),
        };
        let mut config = raw.common.decoder_config(GPT_OSS, "gpt-oss")?;
        let theta_given = given.rope_theta.is_some()
            || [&given.rope_parameters, &given.rope_scaling]
                .iter()
                .any(|rope| rope.as_ref().is_some_and(|r| r.rope_theta.is_some()));
        if !theta_given {
            config.rope_theta = 150_000.0;
        }
        if given.rms_norm_eps.is_none() {
            config.rms_norm_eps = 1e-5;
        }
        if given.rope_parameters.is_none() && given.rope_scaling.is_none() {
            // HF's default: YaRN 32x over 4,096 positions.
            config.rope_scaling = RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: RopeScaling::yarn_attention_factor(32.0),
                truncate: false,
            };
        }
        config.sliding_window = Some(sliding_window);
        config.sliding_layers = Some(match layer_types {
            Some(types) => {
                if types.len() != config.num_layers {
                    return Err(ModelError::InvalidMetadata {
                        key: "layer_types".into(),
                        message: format!(
                            "{} entries for {} layers",
                            types.len(),
                            config.num_layers
                        ),
                    });
                }
                types
                    .iter()
                    .map(|kind| match kind.as_str() {
                        "sliding_attention" => Ok(true),
                        "full_attention" => Ok(false),
                        other => Err(ModelError::InvalidMetadata {
                            key: "layer_types".into(),
                            message: format!("unknown layer type `{other}`"),
                        }),
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            None => (0..config.num_layers).map(|l| l % 2 == 0).collect(),
        });
        config.attention_output_bias = config.attention_bias;
        gpt_oss_parts(config, swiglu)
    }

    fn build(
        &self,
        weights: WeightSource<'_>,
        config: ModelConfig,
        options: &LoadOptions,
    ) -> Result<Box<dyn CausalLm>> {
        if let WeightSource::HfDirectory(dir) = weights {
            return Err(ModelError::Unsupported(format!(
                "gpt-oss from an HF directory ({}): its experts are MXFP4 blocks with gate and \
                 up interleaved, not read yet; convert it with llama.cpp's \
                 convert_hf_to_gguf.py and serve the GGUF",
                dir.display()
            )));
        }
        let kv_layout = self.kv_layout(&config);
        Ok(Box::new(LlamaModel::build(
            weights, config, kv_layout, options,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{ModelConfig, RopeScaling};

    /// gpt-oss-20b's `config.json` as transformers 5 writes it.
    const GPT_OSS_20B: &str = r#"{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
        "sliding_window": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "attention_bias": true, "tie_word_embeddings": false, "swiglu_limit": 7.0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096,
            "rope_theta": 150000}}"#;

    #[test]
    fn reads_gpt_oss_20b_config() {
        let config = ModelConfig::from_hf_config_json(GPT_OSS_20B).unwrap();
        assert_eq!(config.architecture, "gpt-oss");
        assert_eq!((config.num_heads, config.num_kv_heads, config.head_dim), (64, 8, 64));
        assert_eq!(config.rope_theta, 150_000.0);
        assert_eq!(
            config.rope_scaling,
            RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 32f32.ln() + 1.0,
                truncate: false,
            }
        );
        let windows: Vec<_> = (0..4).map(|l| config.layer_sliding_window(l)).collect();
        assert_eq!(windows, [Some(128), None, Some(128), None]);
        let moe = config.moe.unwrap();
        assert_eq!((moe.num_experts, moe.experts_used, moe.expert_intermediate_size), (32, 4, 2880));
        assert!(config.attention_bias && config.attention_output_bias);
        assert!(config.attention_sinks && config.expert_bias);
        assert_eq!(config.clamped_swiglu.map(|c| (c.alpha, c.limit)), Some((1.702, 7.0)));
        assert!(!config.tie_word_embeddings);
    }

    #[test]
    fn hf_defaults_and_bad_layer_types() {
        let bare = r#"{"model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 4,
            "num_experts_per_tok": 2}"#;
        let config = ModelConfig::from_hf_config_json(bare).unwrap();
        assert_eq!((config.rope_theta, config.rms_norm_eps), (150_000.0, 1e-5));
        assert!(matches!(config.rope_scaling, RopeScaling::Yarn { truncate: false, .. }));
        let windows: Vec<_> = (0..3).map(|l| config.layer_sliding_window(l)).collect();
        assert_eq!(windows, [Some(128), None, Some(128)]);
        let odd = bare.replace(
            r#""num_experts_per_tok": 2"#,
            r#""num_experts_per_tok": 2, "layer_types": ["sliding_attention", "chunked", "full_attention"]"#,
        );
        let error = ModelConfig::from_hf_config_json(&odd).unwrap_err();
        assert!(error.to_string().contains("chunked"), "{error}");
        let dense = bare.replace(r#""num_local_experts": 4,"#, "");
        assert!(ModelConfig::from_hf_config_json(&dense).is_err());
    }
}
