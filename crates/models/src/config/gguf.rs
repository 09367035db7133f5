//! What every decoder family reads the same way from GGUF metadata: `{arch}.*` keys by suffix,
//! and the fields llama.cpp's writers give every decoder (sizes, RoPE base and scaling, the
//! sliding window, LongRoPE factors, experts). A family starts from
//! [`GgufMetadata::decoder_config`] and sets what is its own.

use tokenmill_gguf::GgufFile;

use super::{divide_exact, to_usize, Architecture, ModelConfig, MoeConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};

/// A GGUF file's metadata read under its architecture's key prefix (`qwen3.block_count`).
pub(crate) struct GgufMetadata<'a> {
    file: &'a GgufFile,
    architecture: Architecture,
}

impl<'a> GgufMetadata<'a> {
    pub fn new(file: &'a GgufFile, architecture: Architecture) -> GgufMetadata<'a> {
        GgufMetadata { file, architecture }
    }

    /// The file (for its tensor list).
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The full key of `suffix`: `{arch}.{suffix}`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.architecture.name())
    }

    pub fn required_usize(&self, suffix: &str) -> Result<usize> {
        let name = self.key(suffix);
        let value = self
            .file
            .get_u64(&name)
            .ok_or_else(|| ModelError::MissingMetadata(name.clone()))?;
        to_usize(&name, value)
    }

    pub fn optional_usize(&self, suffix: &str) -> Result<Option<usize>> {
        let name = self.key(suffix);
        self.file
            .get_u64(&name)
            .map(|v| to_usize(&name, v))
            .transpose()
    }

    /// A value llama.cpp reads with `get_key_or_arr`: a number, or one per layer (Gemma 4's
    /// `head_count_kv` and `feed_forward_length`), of which the first is returned here; a
    /// family with per-layer values reads them with [`Self::per_layer_usizes`].
    pub fn optional_usize_or_first(&self, suffix: &str) -> Result<Option<usize>> {
        match self.per_layer_usizes(suffix)? {
            Some(values) => Ok(values.first().copied()),
            None => self.optional_usize(suffix),
        }
    }

    /// A per-layer array of numbers, `None` when the key is absent or a single number.
    pub fn per_layer_usizes(&self, suffix: &str) -> Result<Option<Vec<usize>>> {
        let Some(values) = self.array(suffix) else {
            return Ok(None);
        };
        let name = self.key(suffix);
        values
            .iter()
            .map(|value| {
                let value = value.as_u64().ok_or_else(|| ModelError::InvalidMetadata {
                    key: name.clone(),
                    message: "not an array of integers".into(),
                })?;
                to_usize(&name, value)
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array value, `None` when the key is absent or not an array.
    pub fn array(&self, suffix: &str) -> Option<&'a [tokenmill_gguf::MetadataValue]> {
        self.file.get_array(&self.key(suffix))
    }

    pub fn optional_f32(&self, suffix: &str) -> Option<f32> {
        self.file.get_f64(&self.key(suffix)).map(|v| v as f32)
    }

    /// The fields every decoder's GGUF describes alike, for `family_name` with `rope_style`
    /// (llama.cpp's converter permutes Llama-style Q/K rows to adjacent pairs; the families
    /// it leaves in HF's half-split order say `Neox`). Nothing family-specific is set: no
    /// global-layer pattern, no second RoPE base, the score scale of the head size.
    pub fn decoder_config(
        &self,
        family_name: &'static str,
        rope_style: RopeStyle,
    ) -> Result<ModelConfig> {
        let file = self.file;
        let hidden_size = self.required_usize("embedding_length")?;
        let num_heads = self.required_usize("attention.head_count")?;
        let num_kv_heads = self
            .optional_usize_or_first("attention.head_count_kv")?
            .unwrap_or(num_heads);
        let head_dim = match self.optional_usize("attention.key_length")? {
            Some(dim) => dim,
            None => divide_exact(
                "embedding_length / attention.head_count",
                hidden_size,
                num_heads,
            )?,
        };
        let vocab_size = match self.optional_usize("vocab_size")? {
            Some(size) => size,
            None => match file.get_array("tokenizer.ggml.tokens") {
                Some(tokens) => tokens.len(),
                None => {
                    let info = file
                        .tensor("token_embd.weight")
                        .ok_or_else(|| ModelError::MissingMetadata(self.key("vocab_size")))?;
                    let rows = info.dims.get(1).copied().unwrap_or(0);
                    to_usize("token_embd.weight rows", rows)?
                }
            },
        };
        let max_position_embeddings = self.required_usize("context_length")?;
        let rope_scaling = match file.get_str(&self.key("rope.scaling.type")) {
            // LongRoPE is read from its factor tensors below.
            None | Some("none") | Some("longrope") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: self
                    .optional_f32("rope.scaling.factor")
                    .ok_or_else(|| ModelError::MissingMetadata(self.key("rope.scaling.factor")))?,
            },
            Some("yarn") => self.yarn()?,
            Some(other) => {
                return Err(ModelError::InvalidMetadata {
                    key: self.key("rope.scaling.type"),
                    message: format!("unsupported RoPE scaling type `{other}`"),
                })
            }
        };
        let sliding_window = self
            .optional_usize("attention.sliding_window")?
            .filter(|&w| w > 0);
        let num_layers = self.required_usize("block_count")?;
        let rotary_dim = self
            .optional_usize("rope.dimension_count")?
            .unwrap_or(head_dim);
        let (rope_scaling, rope_freq_factors) =
            match self.longrope(max_position_embeddings, rotary_dim)? {
                Some((scaling, factors)) => (scaling, Some(factors)),
                None => (rope_scaling, None),
            };
        let feed_forward_length = self.optional_usize_or_first("feed_forward_length")?;
        let moe = match self
            .optional_usize("expert_count")?
            .filter(|&count| count > 0)
        {
            None => None,
            Some(num_experts) => Some(MoeConfig {
                num_experts,
                experts_used: self.required_usize("expert_used_count")?,
                expert_intermediate_size: match self.optional_usize("expert_feed_forward_length")? {
                    Some(width) => width,
                    None => self.required_usize("feed_forward_length")?,
                },
            }),
        };
        let intermediate_size = match (feed_forward_length, moe) {
            (Some(width), _) => width,
            (None, Some(moe)) => moe.expert_intermediate_size,
            (None, None) => self.required_usize("feed_forward_length")?,
        };
        Ok(ModelConfig {
            architecture: self.architecture,
            family_name,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            rms_norm_eps: self
                .optional_f32("attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-5),
            rope_theta: self.optional_f32("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            rope_freq_factors,
            rope_style,
            max_position_embeddings,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            attention_bias: file.tensor("blk.0.attn_q.bias").is_some(),
            qk_norm: file.tensor("blk.0.attn_q_norm.weight").is_some(),
            sliding_window,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            final_logit_softcapping: self
                .optional_f32("final_logit_softcapping")
                .filter(|&c| c > 0.0),
            moe,
            linear_attention: None,
            attention_output_gate: false,
            sliding_layers: None,
            full_attention: None,
            kv_shared_layers: 0,
            per_layer_input_size: None,
            layer_intermediate_sizes: None,
            value_norm: false,
            attention_sinks: false,
            attention_output_bias: false,
            expert_bias: false,
            clamped_swiglu: None,
        })
    }

    /// YaRN from a GGUF as llama.cpp reads it: `rope.scaling.factor`,
    /// `rope.scaling.original_context_length`, `rope.scaling.yarn_beta_{fast,slow}` (32 and 1
    /// when absent), and the attention factor `0.1 ln(factor) + 1` times
    /// `rope.scaling.attn_factor` (llama.cpp recomputes it so and ignores
    /// `rope.scaling.yarn_attn_factor`). The ramp is truncated, as llama.cpp always does; a
    /// family trained otherwise (gpt-oss) clears `truncate`. DeepSeek's `yarn_log_mul` and a
    /// partial `yarn_ext_factor` are refused by name.
    fn yarn(&self) -> Result<RopeScaling> {
        let file = self.file;
        let factor = self
            .optional_f32("rope.scaling.factor")
            .ok_or_else(|| ModelError::MissingMetadata(self.key("rope.scaling.factor")))?;
        let original = self.required_usize("rope.scaling.original_context_length")?;
        for (suffix, neutral) in [
            ("rope.scaling.yarn_log_multiplier", 0.0),
            ("rope.scaling.yarn_ext_factor", 1.0),
        ] {
            if let Some(value) = file.get_f64(&self.key(suffix)) {
                if value != neutral {
                    return Err(ModelError::InvalidMetadata {
                        key: self.key(suffix),
                        message: format!("YaRN with {suffix} = {value} is not supported"),
                    });
                }
            }
        }
        let attn_factor = self.optional_f32("rope.scaling.attn_factor").unwrap_or(1.0);
        Ok(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: original,
            beta_fast: self
                .optional_f32("rope.scaling.yarn_beta_fast")
                .unwrap_or(32.0),
            beta_slow: self
                .optional_f32("rope.scaling.yarn_beta_slow")
                .unwrap_or(1.0),
            attention_factor: RopeScaling::yarn_attention_factor(factor) * attn_factor,
            truncate: true,
        })
    }

    /// Phi-3's LongRoPE from a GGUF: `rope_factors_long.weight` / `rope_factors_short.weight`
    /// (llama.cpp's names), `rope.scaling.original_context_length` and
    /// `rope.scaling.attn_factor`. `None` when the file has neither factor tensor.
    fn longrope(
        &self,
        max_position_embeddings: usize,
        rotary_dim: usize,
    ) -> Result<Option<(RopeScaling, Vec<f32>)>> {
        let (file, key) = (self.file, |suffix: &str| self.key(suffix));
        let (long, short) = ("rope_factors_long.weight", "rope_factors_short.weight");
        if file.tensor(long).is_none() && file.tensor(short).is_none() {
            return Ok(None);
        }
        let original = match file.get_u64(&key("rope.scaling.original_context_length")) {
            Some(value) => to_usize("rope.scaling.original_context_length", value)?,
            None => max_position_embeddings,
        };
        let name = longrope_factor_name(max_position_embeddings, original, long, short);
        let info = file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let expected = rotary_dim / 2;
        if info.dims.iter().product::<u64>() != expected as u64 {
            return Err(ModelError::TensorShape {
                tensor: name.into(),
                expected: vec![expected],
                actual: info.dims.iter().map(|&d| d as usize).collect(),
            });
        }
        let dtype =
            tokenmill_kernels::DType::from_ggml_id(info.ggml_type.id()).ok_or_else(|| {
                ModelError::UnsupportedTensorType {
                    tensor: name.into(),
                    dtype: info.ggml_type.name(),
                }
            })?;
        let mut factors = vec![0.0f32; expected];
        tokenmill_kernels::dequantize(dtype, file.tensor_data(info)?, &mut factors)?;
        let attn_factor = file
            .get_f64(&key("rope.scaling.attn_factor"))
            .map_or(1.0, |v| v as f32);
        Ok(Some((
            RopeScaling::LongRope {
                original_max_position_embeddings: original,
                attn_factor,
            },
            factors,
        )))
    }
}

/// The long factors when the context exceeds the pre-training one (llama.cpp's
/// `n_ctx > n_ctx_orig_yarn` at a context of the trained length), else the short ones.
fn longrope_factor_name<'a>(
    max_position_embeddings: usize,
    original: usize,
    long: &'a str,
    short: &'a str,
) -> &'a str {
    if max_position_embeddings > original {
        long
    } else {
        short
    }
}
