//! gpt-oss (GGUF `gpt-oss`, llama.cpp's `openai-moe`; HF `GptOssForCausalLM` with
//! `model_type: gpt_oss`) on the Llama block ([`LlamaModel`]): Q/K/V and output biases, a
//! learned attention sink per head, sliding (128) and full attention layers alternating from a
//! sliding first layer, YaRN over 4,096 trained positions without truncation, and every FFN a
//! routed mixture of experts whose router and projections carry biases and whose gate is the
//! clamped SwiGLU (`alpha` 1.702, `limit` 7). The experts are MXFP4 in the released files,
//! which is a weight type like any other (`tokenmill_kernels::DType::MXFP4`).
//!
//! HF directories come in two forms: the released one, whose experts are MXFP4
//! `*_blocks` / `*_scales` (rows = outputs, gate and up rows interleaved, two consecutive
//! elements per byte), and `save_pretrained`'s unquantized one (`[experts, in, out]`, gate
//! and up columns interleaved). Either is re-laid out at load into GGUF's per-expert
//! `[experts, out, in]` tensors (MXFP4 blocks in GGML's nibble order, kept at their bytes), as
//! llama.cpp's converter does, and then read like the GGUF.

use serde::Deserialize;

use super::family::{Family, WeightSource};
use crate::config::{
    parse_config_json, sliding_layers_from_types, Architecture, ClampedSwiglu, GgufMetadata,
    HfCommon, ModelConfig, RopeScaling, RopeStyle,
};
use crate::error::{ModelError, Result};
use crate::families::blocks::LlamaModel;
use crate::loader::{DerivedTensor, TensorNaming, TensorStore};
use crate::model::{CausalLm, LoadOptions};
use safetensors::Dtype as SafetensorsDtype;
use tokenmill_kernels::DType;

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
                sliding_layers_from_types(&types)?
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
        let kv_layout = self.kv_layout(&config);
        match weights {
            WeightSource::Gguf(_) => Ok(Box::new(LlamaModel::build(
                weights, config, kv_layout, options,
            )?)),
            WeightSource::HfDirectory(dir) => {
                let mut store = TensorStore::from_hf_directory(dir)?;
                for layer in 0..config.num_layers {
                    derive_experts(&mut store, &config, layer)?;
                }
                Ok(Box::new(LlamaModel::from_store(
                    config,
                    kv_layout,
                    &store,
                    TensorNaming::HuggingFace(HF_RENAMES),
                    options,
                )?))
            }
        }
    }
}

/// gpt-oss's HF names for GGUF's short names (beside the shared table); the experts' are
/// the tensors [`derive_experts`] adds.
const HF_RENAMES: &[(&str, &str)] = &[
    ("attn_sinks.weight", "self_attn.sinks"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("ffn_gate_inp.weight", "mlp.router.weight"),
    ("ffn_gate_inp.bias", "mlp.router.bias"),
    ("ffn_gate_exps.weight", "mlp.experts.gate_exps"),
    ("ffn_up_exps.weight", "mlp.experts.up_exps"),
    ("ffn_down_exps.weight", "mlp.experts.down_exps"),
    ("ffn_gate_exps.bias", "mlp.experts.gate_exps_bias"),
    ("ffn_up_exps.bias", "mlp.experts.up_exps_bias"),
    ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
];

fn stored(store: &TensorStore<'_>, name: &str) -> Result<crate::loader::StoredTensor> {
    store
        .read_stored(name)
        .unwrap_or_else(|| Err(ModelError::MissingTensor(name.into())))
}

fn bad_shape(name: &str, expected: Vec<usize>, actual: &[usize]) -> ModelError {
    ModelError::TensorShape {
        tensor: name.into(),
        expected,
        actual: actual.to_vec(),
    }
}

/// Adds layer `layer`'s experts in GGUF's layout: `gate_exps` / `up_exps` `[experts, width,
/// hidden]`, `down_exps` `[experts, hidden, width]` (MXFP4 from `*_blocks` / `*_scales`, else
/// the stored float type), and the gate and up biases split out of `gate_up_proj_bias`.
fn derive_experts(store: &mut TensorStore<'_>, config: &ModelConfig, layer: usize) -> Result<()> {
    let moe = config
        .moe
        .ok_or_else(|| ModelError::MissingMetadata("gpt-oss expert count".into()))?;
    let (experts, width, hidden) = (
        moe.num_experts,
        moe.expert_intermediate_size,
        config.hidden_size,
    );
    let prefix = format!("model.layers.{layer}.mlp.experts.");
    let name = |suffix: &str| format!("{prefix}{suffix}");
    let (gate, up, down) = if store.contains(&name("gate_up_proj_blocks")) {
        let gate_up = mxfp4_rows(store, &name("gate_up_proj"), [experts, 2 * width, hidden])?;
        let (gate, up) = split_rows(&gate_up, experts, width, hidden / 32 * 17);
        let down = mxfp4_rows(store, &name("down_proj"), [experts, hidden, width])?;
        let typed = |bytes, shape: [usize; 3]| DerivedTensor {
            dtype: DType::MXFP4,
            shape: shape.to_vec(),
            bytes,
        };
        (
            typed(gate, [experts, width, hidden]),
            typed(up, [experts, width, hidden]),
            typed(down, [experts, hidden, width]),
        )
    } else {
        let gate_up = stored(store, &name("gate_up_proj"))?;
        if gate_up.shape != [experts, hidden, 2 * width] {
            return Err(bad_shape(
                &name("gate_up_proj"),
                vec![experts, hidden, 2 * width],
                &gate_up.shape,
            ));
        }
        let down = stored(store, &name("down_proj"))?;
        if down.shape != [experts, width, hidden] {
            return Err(bad_shape(
                &name("down_proj"),
                vec![experts, width, hidden],
                &down.shape,
            ));
        }
        let dtype = float_dtype(&name("gate_up_proj"), gate_up.dtype)?;
        let size = dtype.block_bytes();
        // `[experts, hidden, 2 * width]` (x @ W, gate and up columns interleaved) →
        // `[experts, width, hidden]` each; `[experts, width, hidden]` → `[experts, hidden, width]`.
        let mut parts = [
            vec![0u8; experts * width * hidden * size],
            vec![0u8; experts * width * hidden * size],
        ];
        for e in 0..experts {
            for h in 0..hidden {
                for r in 0..width {
                    for (part, out) in parts.iter_mut().enumerate() {
                        let from = ((e * hidden + h) * 2 * width + 2 * r + part) * size;
                        let to = ((e * width + r) * hidden + h) * size;
                        out[to..to + size].copy_from_slice(&gate_up.bytes[from..from + size]);
                    }
                }
            }
        }
        let mut transposed = vec![0u8; down.bytes.len()];
        for e in 0..experts {
            for r in 0..width {
                for h in 0..hidden {
                    let from = ((e * width + r) * hidden + h) * size;
                    let to = ((e * hidden + h) * width + r) * size;
                    transposed[to..to + size].copy_from_slice(&down.bytes[from..from + size]);
                }
            }
        }
        let [gate, up] = parts;
        let typed = |bytes, shape: [usize; 3]| DerivedTensor {
            dtype,
            shape: shape.to_vec(),
            bytes,
        };
        (
            typed(gate, [experts, width, hidden]),
            typed(up, [experts, width, hidden]),
            typed(transposed, [experts, hidden, width]),
        )
    };
    let bias_name = name("gate_up_proj_bias");
    let bias = store.get(&bias_name)?;
    if bias.shape != [experts, 2 * width] {
        return Err(bad_shape(&bias_name, vec![experts, 2 * width], bias.shape));
    }
    let mut values = vec![0.0f32; experts * 2 * width];
    tokenmill_kernels::dequantize(bias.dtype, &bias.bytes, &mut values)?;
    let split = |offset: usize| DerivedTensor {
        dtype: DType::F32,
        shape: vec![experts, width],
        bytes: values
            .iter()
            .skip(offset)
            .step_by(2)
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    };
    let (gate_bias, up_bias) = (split(0), split(1));
    store.insert_derived(name("gate_exps"), gate);
    store.insert_derived(name("up_exps"), up);
    store.insert_derived(name("down_exps"), down);
    store.insert_derived(name("gate_exps_bias"), gate_bias);
    store.insert_derived(name("up_exps_bias"), up_bias);
    Ok(())
}

fn float_dtype(name: &str, dtype: SafetensorsDtype) -> Result<DType> {
    match dtype {
        SafetensorsDtype::F32 => Ok(DType::F32),
        SafetensorsDtype::F16 => Ok(DType::F16),
        SafetensorsDtype::BF16 => Ok(DType::BF16),
        other => Err(ModelError::UnsupportedTensorType {
            tensor: name.into(),
            dtype: format!("{other:?}"),
        }),
    }
}

/// `{base}_blocks` (`[experts, rows, columns / 32, 16]`, two consecutive elements per byte,
/// the first in the low nibble) and `{base}_scales` (`[experts, rows, columns / 32]`, E8M0)
/// as GGML MXFP4 rows: per block the scale byte, then element `j` low and `j + 16` high.
fn mxfp4_rows(
    store: &TensorStore<'_>,
    base: &str,
    [experts, rows, columns]: [usize; 3],
) -> Result<Vec<u8>> {
    let blocks_name = format!("{base}_blocks");
    let scales_name = format!("{base}_scales");
    let blocks = stored(store, &blocks_name)?;
    let scales = stored(store, &scales_name)?;
    let per_row = columns / 32;
    if columns % 32 != 0 || blocks.shape != [experts, rows, per_row, 16] {
        return Err(bad_shape(
            &blocks_name,
            vec![experts, rows, per_row, 16],
            &blocks.shape,
        ));
    }
    if scales.shape != [experts, rows, per_row] {
        return Err(bad_shape(
            &scales_name,
            vec![experts, rows, per_row],
            &scales.shape,
        ));
    }
    let mut out = Vec::with_capacity(experts * rows * per_row * 17);
    for (block, &scale) in blocks.bytes.chunks_exact(16).zip(&scales.bytes) {
        let mut codes = [0u8; 32];
        for (k, &byte) in block.iter().enumerate() {
            codes[2 * k] = byte & 0x0F;
            codes[2 * k + 1] = byte >> 4;
        }
        out.push(scale);
        out.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
    }
    Ok(out)
}

/// Rows `[experts, 2 * width, row_bytes]` with gate and up rows interleaved, split into the
/// gate rows and the up rows.
fn split_rows(bytes: &[u8], experts: usize, width: usize, row_bytes: usize) -> (Vec<u8>, Vec<u8>) {
    let (mut gate, mut up) = (
        Vec::with_capacity(bytes.len() / 2),
        Vec::with_capacity(bytes.len() / 2),
    );
    for (index, row) in bytes.chunks_exact(row_bytes).enumerate() {
        if index % 2 == 0 {
            gate.extend_from_slice(row)
        } else {
            up.extend_from_slice(row)
        }
    }
    debug_assert_eq!(gate.len(), experts * width * row_bytes);
    (gate, up)
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
        assert_eq!(
            (config.num_heads, config.num_kv_heads, config.head_dim),
            (64, 8, 64)
        );
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
        assert_eq!(
            (
                moe.num_experts,
                moe.experts_used,
                moe.expert_intermediate_size
            ),
            (32, 4, 2880)
        );
        assert!(config.attention_bias && config.attention_output_bias);
        assert!(config.attention_sinks && config.expert_bias);
        assert_eq!(
            config.clamped_swiglu.map(|c| (c.alpha, c.limit)),
            Some((1.702, 7.0))
        );
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
        assert!(matches!(
            config.rope_scaling,
            RopeScaling::Yarn {
                truncate: false,
                ..
            }
        ));
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
