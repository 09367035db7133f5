//! Weight loading: from a tensor container (GGUF or safetensors) into the compute layer's
//! matrices, with tensor names mapped per container.

mod store;

use tokenmill_kernels::{dequantize, DType, QMatrix};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use std::borrow::Cow;
pub use store::safetensors_shards_from_index;
use store::RawTensor;
pub(crate) use store::TensorStore;

/// Several linear layers over the same input, whose outputs are read side by side
/// (`[q | k | v]`, `[gate | up]`). Parts of one type are fused into a single matrix at load so
/// one matmul produces all of them; mixed-type parts (Q4_K_M files quantize V differently)
/// stay separate so each keeps its fast quantized kernel.
#[derive(Debug)]
pub(crate) struct StackedLinear {
    pub matrices: Vec<QMatrix>,
    pub total_width: usize,
}

/// The weights of one transformer block.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub qkv: StackedLinear,
    /// `[q_dim + 2 * kv_dim]`, present for Qwen2-style attention bias.
    pub qkv_bias: Option<Vec<f32>>,
    pub attn_output: QMatrix,
    pub ffn_norm: Vec<f32>,
    /// Gate and up projections: `[gate | up]`.
    pub gate_up: StackedLinear,
    pub down: QMatrix,
}

#[derive(Debug)]
pub(crate) struct ModelWeights {
    pub embedding: QMatrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    pub output: Option<QMatrix>,
}

/// How one container names the Llama-family tensors.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TensorNaming {
    Gguf,
    HuggingFace,
}

impl TensorNaming {
    fn embedding(self) -> &'static str {
        match self {
            TensorNaming::Gguf => "token_embd.weight",
            TensorNaming::HuggingFace => "model.embed_tokens.weight",
        }
    }

    fn output_norm(self) -> &'static str {
        match self {
            TensorNaming::Gguf => "output_norm.weight",
            TensorNaming::HuggingFace => "model.norm.weight",
        }
    }

    fn output(self) -> &'static str {
        match self {
            TensorNaming::Gguf => "output.weight",
            TensorNaming::HuggingFace => "lm_head.weight",
        }
    }

    /// The name of a per-layer tensor given its GGUF short name.
    fn layer(self, layer: usize, gguf_name: &str) -> String {
        match self {
            TensorNaming::Gguf => format!("blk.{layer}.{gguf_name}"),
            TensorNaming::HuggingFace => {
                let hf_name = match gguf_name {
                    "attn_norm.weight" => "input_layernorm.weight",
                    "attn_q.weight" => "self_attn.q_proj.weight",
                    "attn_k.weight" => "self_attn.k_proj.weight",
                    "attn_v.weight" => "self_attn.v_proj.weight",
                    "attn_q.bias" => "self_attn.q_proj.bias",
                    "attn_k.bias" => "self_attn.k_proj.bias",
                    "attn_v.bias" => "self_attn.v_proj.bias",
                    "attn_output.weight" => "self_attn.o_proj.weight",
                    "ffn_norm.weight" => "post_attention_layernorm.weight",
                    "ffn_gate.weight" => "mlp.gate_proj.weight",
                    "ffn_up.weight" => "mlp.up_proj.weight",
                    "ffn_down.weight" => "mlp.down_proj.weight",
                    other => other,
                };
                format!("model.layers.{layer}.{hf_name}")
            }
        }
    }
}

/// Reads every weight the forward pass needs, checking shapes against `config`.
pub(crate) fn load_weights(
    store: &TensorStore,
    naming: TensorNaming,
    config: &ModelConfig,
    dequantize_to_f32: bool,
) -> Result<ModelWeights> {
    let store = &WeightReader {
        store,
        dequantize_to_f32,
    };
    let hidden = config.hidden_size;
    let embedding = load_matrix(store, naming.embedding(), config.vocab_size, hidden)?;
    let mut layers = Vec::with_capacity(config.num_layers);
    for layer in 0..config.num_layers {
        layers.push(load_layer(store, naming, config, layer)?);
    }
    let output_norm = load_vector(store.store, naming.output_norm(), hidden)?;
    let output = if store.store.contains(naming.output()) {
        Some(load_matrix(
            store,
            naming.output(),
            config.vocab_size,
            hidden,
        )?)
    } else if config.tie_word_embeddings || matches!(naming, TensorNaming::Gguf) {
        None
    } else {
        return Err(ModelError::MissingTensor(naming.output().into()));
    };
    Ok(ModelWeights {
        embedding,
        layers,
        output_norm,
        output,
    })
}

fn load_layer(
    store: &WeightReader<'_>,
    naming: TensorNaming,
    config: &ModelConfig,
    layer: usize,
) -> Result<LayerWeights> {
    let name = |short: &str| naming.layer(layer, short);
    let hidden = config.hidden_size;
    let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
    let qkv = load_fused(
        store,
        &[
            (name("attn_q.weight"), q_dim),
            (name("attn_k.weight"), kv_dim),
            (name("attn_v.weight"), kv_dim),
        ],
        hidden,
    )?;
    let qkv_bias = if config.attention_bias {
        let mut bias = load_vector(store.store, &name("attn_q.bias"), q_dim)?;
        bias.extend(load_vector(store.store, &name("attn_k.bias"), kv_dim)?);
        bias.extend(load_vector(store.store, &name("attn_v.bias"), kv_dim)?);
        Some(bias)
    } else {
        None
    };
    let intermediate = config.intermediate_size;
    Ok(LayerWeights {
        attn_norm: load_vector(store.store, &name("attn_norm.weight"), hidden)?,
        qkv,
        qkv_bias,
        attn_output: load_matrix(store, &name("attn_output.weight"), hidden, q_dim)?,
        ffn_norm: load_vector(store.store, &name("ffn_norm.weight"), hidden)?,
        gate_up: load_fused(
            store,
            &[
                (name("ffn_gate.weight"), intermediate),
                (name("ffn_up.weight"), intermediate),
            ],
            hidden,
        )?,
        down: load_matrix(store, &name("ffn_down.weight"), hidden, intermediate)?,
    })
}

fn check_shape(name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
    if actual != expected {
        return Err(ModelError::TensorShape {
            tensor: name.into(),
            expected: expected.to_vec(),
            actual: actual.to_vec(),
        });
    }
    Ok(())
}

/// Reads tensors from a store, optionally expanding quantized weights to f32.
struct WeightReader<'a> {
    store: &'a TensorStore,
    dequantize_to_f32: bool,
}

impl WeightReader<'_> {
    fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        let tensor = self.store.get(name)?;
        if !self.dequantize_to_f32 || tensor.dtype == DType::F32 {
            return Ok(tensor);
        }
        let count: usize = tensor.shape.iter().product();
        let mut values = vec![0.0f32; count];
        dequantize(tensor.dtype, &tensor.bytes, &mut values)?;
        Ok(RawTensor {
            dtype: DType::F32,
            bytes: Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            shape: tensor.shape,
        })
    }
}

fn load_matrix(
    store: &WeightReader<'_>,
    name: &str,
    rows: usize,
    columns: usize,
) -> Result<QMatrix> {
    let tensor = store.get(name)?;
    check_shape(name, tensor.shape, &[rows, columns])?;
    Ok(QMatrix::from_bytes(
        tensor.dtype,
        rows,
        columns,
        &tensor.bytes,
    )?)
}

/// Stacks matrices with the same input width by concatenating their rows. Every supported
/// type stores a row as whole blocks, so concatenating the bytes is exact.
fn load_fused(
    store: &WeightReader<'_>,
    parts: &[(String, usize)],
    columns: usize,
) -> Result<StackedLinear> {
    let mut tensors = Vec::with_capacity(parts.len());
    for (name, rows) in parts {
        let tensor = store.get(name)?;
        check_shape(name, tensor.shape, &[*rows, columns])?;
        tensors.push(tensor);
    }
    let total_rows: usize = parts.iter().map(|(_, rows)| rows).sum();
    let first_dtype = tensors.first().map(|t| t.dtype).unwrap_or(DType::F32);
    let matrices = if tensors.iter().all(|t| t.dtype == first_dtype) {
        let bytes: Vec<u8> = tensors
            .iter()
            .flat_map(|t| t.bytes.iter().copied())
            .collect();
        vec![QMatrix::from_bytes(
            first_dtype,
            total_rows,
            columns,
            &bytes,
        )?]
    } else {
        let mut matrices = Vec::with_capacity(parts.len());
        for (tensor, (_, rows)) in tensors.iter().zip(parts) {
            matrices.push(QMatrix::from_bytes(
                tensor.dtype,
                *rows,
                columns,
                &tensor.bytes,
            )?);
        }
        matrices
    };
    Ok(StackedLinear {
        matrices,
        total_width: total_rows,
    })
}

fn load_vector(store: &TensorStore, name: &str, length: usize) -> Result<Vec<f32>> {
    let tensor = store.get(name)?;
    check_shape(name, tensor.shape, &[length])?;
    let mut values = vec![0.0; length];
    dequantize(tensor.dtype, &tensor.bytes, &mut values)?;
    Ok(values)
}

/// Recovers Llama 3 RoPE scaling from a GGUF's `rope_freqs.weight`.
///
/// llama.cpp's converter stores Llama 3.x scaling as one divisor per rotation pair instead of
/// the four HF parameters. The divisors follow from those parameters, so this finds the
/// standard parameter set (low 1, high 4, the original context length from metadata or 8192,
/// factor = the largest divisor) that reproduces them, and refuses files it cannot explain.
pub(crate) fn llama3_scaling_from_rope_freqs(
    store: &TensorStore,
    config: &ModelConfig,
    original_context_length: Option<usize>,
) -> Result<RopeScaling> {
    const NAME: &str = "rope_freqs.weight";
    let half = config.rotary_dim / 2;
    let divisors = load_vector(store, NAME, half)?;
    let factor = divisors.iter().copied().fold(1.0f32, f32::max);
    if factor <= 1.0 {
        return Ok(RopeScaling::None);
    }
    let candidates = [original_context_length.unwrap_or(8192), 8192, 4096, 2048];
    for original in candidates {
        let scaling = RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: original,
        };
        let matches = divisors.iter().enumerate().all(|(pair, &divisor)| {
            let base = 1.0
                / f64::from(config.rope_theta).powf((2 * pair) as f64 / config.rotary_dim as f64);
            let expected = base / llama3_scaled(base, factor, original);
            (expected - f64::from(divisor)).abs() <= 1e-3 * expected
        });
        if matches {
            return Ok(scaling);
        }
    }
    Err(ModelError::InvalidMetadata {
        key: NAME.into(),
        message: "per-frequency RoPE factors that do not match Llama 3 scaling are not supported"
            .into(),
    })
}

/// HF's `_compute_llama3_parameters` for one frequency, with low 1 and high 4.
fn llama3_scaled(inv_freq: f64, factor: f32, original: usize) -> f64 {
    let (factor, low, high, original) = (f64::from(factor), 1.0, 4.0, original as f64);
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    if wavelen < original / high {
        inv_freq
    } else if wavelen > original / low {
        inv_freq / factor
    } else {
        let smooth = (original / wavelen - low) / (high - low);
        (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    }
}
