//! Weight loading: from a tensor container (GGUF or safetensors) into the compute layer's
//! matrices, with tensor names mapped per container. Which tensors a model has is its family's
//! business (`crate::families`); this module only reads, checks shapes and converts.

mod store;

use tokenmill_kernels::{dequantize, DType, QMatrix};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use crate::layers::{Linear, RmsNorm, RowBytes, RowTable, StackedLinear};
use std::borrow::Cow;
pub use store::safetensors_shards_from_index;
use store::RawTensor;
pub(crate) use store::{DerivedTensor, StoredTensor, TensorStore};

/// How one container names tensors. Names are written in GGUF's convention
/// (`token_embd.weight`, `blk.N.attn_q.weight`) and mapped to HF's here, so a family file
/// names each tensor once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TensorNaming {
    Gguf,
    /// HF's names, with a family's own renames (GGUF short name → HF name in the layer)
    /// looked up before the shared table.
    HuggingFace(&'static [(&'static str, &'static str)]),
}

impl TensorNaming {
    /// HF's names with no family renames.
    pub const HF: TensorNaming = TensorNaming::HuggingFace(&[]);

    /// The name of a model-level tensor given its GGUF name.
    pub fn global(self, gguf_name: &'static str) -> &'static str {
        match self {
            TensorNaming::Gguf => gguf_name,
            TensorNaming::HuggingFace(_) => match gguf_name {
                "token_embd.weight" => "model.embed_tokens.weight",
                "output_norm.weight" => "model.norm.weight",
                "output.weight" => "lm_head.weight",
                "per_layer_token_embd.weight" => "model.embed_tokens_per_layer.weight",
                "per_layer_model_proj.weight" => "model.per_layer_model_projection.weight",
                "per_layer_proj_norm.weight" => "model.per_layer_projection_norm.weight",
                other => other,
            },
        }
    }

    /// The name of a per-layer tensor given its GGUF short name.
    fn layer(self, layer: usize, gguf_name: &str) -> String {
        match self {
            // Phi-3's fused gate/up is GGUF's `ffn_up` with both halves.
            TensorNaming::Gguf if gguf_name == FUSED_GATE_UP => {
                format!("blk.{layer}.ffn_up.weight")
            }
            TensorNaming::Gguf => format!("blk.{layer}.{gguf_name}"),
            TensorNaming::HuggingFace(renames) => {
                let renamed = renames.iter().find(|(gguf, _)| *gguf == gguf_name);
                let hf_name = match renamed {
                    Some((_, hf_name)) => hf_name,
                    None => match gguf_name {
                        "post_attention_norm.weight" => "post_attention_layernorm.weight",
                        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
                        "attn_q_norm.weight" => "self_attn.q_norm.weight",
                        "attn_k_norm.weight" => "self_attn.k_norm.weight",
                        "attn_norm.weight" => "input_layernorm.weight",
                        "attn_q.weight" => "self_attn.q_proj.weight",
                        "attn_k.weight" => "self_attn.k_proj.weight",
                        "attn_v.weight" => "self_attn.v_proj.weight",
                        "attn_qkv.weight" => "self_attn.qkv_proj.weight",
                        FUSED_GATE_UP => "mlp.gate_up_proj.weight",
                        "attn_q.bias" => "self_attn.q_proj.bias",
                        "attn_k.bias" => "self_attn.k_proj.bias",
                        "attn_v.bias" => "self_attn.v_proj.bias",
                        "attn_output.weight" => "self_attn.o_proj.weight",
                        "ffn_norm.weight" => "post_attention_layernorm.weight",
                        "ffn_gate.weight" => "mlp.gate_proj.weight",
                        "ffn_up.weight" => "mlp.up_proj.weight",
                        "ffn_down.weight" => "mlp.down_proj.weight",
                        "ffn_gate_inp.weight" => "mlp.gate.weight",
                        other => other,
                    },
                };
                format!("model.layers.{layer}.{hf_name}")
            }
        }
    }
}

/// The name a family asks for Phi-3's fused `[gate | up]` projection: GGUF stores it as
/// `ffn_up.weight` (twice the rows), HF as `mlp.gate_up_proj.weight`.
pub(crate) const FUSED_GATE_UP: &str = "ffn_gate_up.weight";

/// Reads tensors from a store, optionally expanding quantized weights to f32.
pub(crate) struct WeightReader<'a> {
    store: &'a TensorStore<'a>,
    naming: TensorNaming,
    dequantize_to_f32: bool,
    /// Added to every RMSNorm weight at load: 1 for HF Gemma checkpoints, whose norms
    /// compute `x * (1 + w)` (GGUF converters have already added it).
    norm_shift: f32,
}

impl<'a> WeightReader<'a> {
    pub fn new(
        store: &'a TensorStore<'a>,
        naming: TensorNaming,
        dequantize_to_f32: bool,
    ) -> WeightReader<'a> {
        WeightReader {
            store,
            naming,
            dequantize_to_f32,
            norm_shift: 0.0,
        }
    }

    /// Folds `(1 + w)` norms into plain ones: every RMSNorm weight read gets `shift` added.
    pub fn with_norm_shift(self, shift: f32) -> WeightReader<'a> {
        WeightReader {
            norm_shift: shift,
            ..self
        }
    }

    /// The naming convention of the container.
    pub fn naming(&self) -> TensorNaming {
        self.naming
    }

    fn norm(&self, name: &str, length: usize, eps: f32) -> Result<RmsNorm> {
        let mut weight = load_vector(self.store, name, length)?;
        if self.norm_shift != 0.0 {
            weight.iter_mut().for_each(|w| *w += self.norm_shift);
        }
        Ok(RmsNorm::new(weight, eps))
    }

    /// Whether a model-level tensor (GGUF name) is present.
    pub fn contains(&self, gguf_name: &'static str) -> bool {
        self.store.contains(self.naming.global(gguf_name))
    }

    /// A model-level `[rows, columns]` matrix by GGUF name.
    pub fn matrix(&self, gguf_name: &'static str, rows: usize, columns: usize) -> Result<Linear> {
        load_matrix(self, self.naming.global(gguf_name), rows, columns)
    }

    /// A model-level RMSNorm weight by GGUF name.
    pub fn rms_norm(&self, gguf_name: &'static str, length: usize, eps: f32) -> Result<RmsNorm> {
        self.norm(self.naming.global(gguf_name), length, eps)
    }

    /// Whether a tensor is present under its full container name (families that name their
    /// own tensors, such as BERT's `encoder.layer.N.attention.self.query.weight`).
    pub fn contains_named(&self, name: &str) -> bool {
        self.store.contains(name)
    }

    /// A `[rows, columns]` matrix by its full container name.
    pub fn matrix_named(&self, name: &str, rows: usize, columns: usize) -> Result<Linear> {
        load_matrix(self, name, rows, columns)
    }

    /// Matrices over the same input stacked by rows, by full container names.
    pub fn stacked_named(
        &self,
        parts: &[(String, usize)],
        columns: usize,
    ) -> Result<StackedLinear> {
        load_fused(self, parts, columns)
    }

    /// Matrices over the same input stacked by rows, as row-major f32 values, when every
    /// part is stored as F32, F16 or BF16 (widened exactly); `None` when one is quantized.
    /// For kernels that pack float weights their own way (the encoder GEMM).
    pub fn float_rows_named(
        &self,
        parts: &[(String, usize)],
        columns: usize,
    ) -> Result<Option<Vec<f32>>> {
        let mut values = Vec::new();
        for (name, rows) in parts {
            let tensor = self.get(name)?;
            check_shape(name, tensor.shape, &[*rows, columns])?;
            if !matches!(tensor.dtype, DType::F32 | DType::F16 | DType::BF16) {
                return Ok(None);
            }
            let start = values.len();
            values.resize(start + rows * columns, 0.0);
            dequantize(tensor.dtype, &tensor.bytes, &mut values[start..])?;
        }
        Ok(Some(values))
    }

    /// A `[length]` vector (a bias, a norm weight) by its full container name, as f32.
    /// A `[rows, columns]` table kept in the file's type and read a row at a time
    /// ([`RowTable`]), by GGUF name.
    pub fn row_table(
        &self,
        gguf_name: &'static str,
        rows: usize,
        columns: usize,
    ) -> Result<RowTable> {
        let name = self.naming.global(gguf_name);
        let tensor = self.store.get(name)?;
        check_shape(name, tensor.shape, &[rows, columns])?;
        // A GGUF table stays in the memory map; safetensors are read into memory.
        let bytes = match self.store.mapped_bytes(name) {
            Some(mapped) => RowBytes::Mapped(mapped),
            None => RowBytes::Owned(tensor.bytes.into_owned()),
        };
        RowTable::new(tensor.dtype, bytes, rows, columns)
    }

    pub fn vector_named(&self, name: &str, length: usize) -> Result<Vec<f32>> {
        load_vector(self.store, name, length)
    }

    /// The tensors of transformer block `layer`.
    pub fn layer(&self, layer: usize) -> LayerTensors<'_> {
        LayerTensors {
            reader: self,
            layer,
        }
    }

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

/// One transformer block's tensors, named by their GGUF short names (`attn_q.weight`).
pub(crate) struct LayerTensors<'a> {
    reader: &'a WeightReader<'a>,
    layer: usize,
}

impl LayerTensors<'_> {
    fn name(&self, short: &str) -> String {
        let name = self.reader.naming.layer(self.layer, short);
        // HF Mixtral calls the MoE block `block_sparse_moe` where Qwen3-MoE says `mlp`.
        if short == "ffn_gate_inp.weight"
            && self.reader.naming != TensorNaming::Gguf
            && !self.reader.store.contains(&name)
        {
            return format!("model.layers.{}.block_sparse_moe.gate.weight", self.layer);
        }
        name
    }

    /// HF checkpoints store experts as 2-D tensors, one per expert and projection:
    /// Qwen3-MoE's `mlp.experts.E.gate_proj.weight`, Mixtral's
    /// `block_sparse_moe.experts.E.w1.weight` (`w3` up, `w2` down).
    fn hf_expert_name(&self, short: &str, expert: usize) -> Result<String> {
        let (qwen, mixtral) = match short {
            "ffn_gate_exps.weight" => ("gate_proj", "w1"),
            "ffn_up_exps.weight" => ("up_proj", "w3"),
            "ffn_down_exps.weight" => ("down_proj", "w2"),
            other => return Err(ModelError::MissingTensor(self.name(other))),
        };
        let layer = self.layer;
        let name = format!("model.layers.{layer}.mlp.experts.{expert}.{qwen}.weight");
        if self.reader.store.contains(&name) {
            return Ok(name);
        }
        Ok(format!(
            "model.layers.{layer}.block_sparse_moe.experts.{expert}.{mixtral}.weight"
        ))
    }

    /// Whether the block has tensor `short`.
    pub fn contains(&self, short: &str) -> bool {
        self.reader.store.contains(&self.name(short))
    }

    /// A `[rows, columns]` matrix.
    pub fn matrix(&self, short: &str, rows: usize, columns: usize) -> Result<Linear> {
        load_matrix(self.reader, &self.name(short), rows, columns)
    }

    /// Matrices over the same input, stacked by rows: `parts` are `(short name, rows)`.
    pub fn stacked(&self, parts: &[(&str, usize)], columns: usize) -> Result<StackedLinear> {
        let named: Vec<(String, usize)> = parts
            .iter()
            .map(|&(short, rows)| (self.name(short), rows))
            .collect();
        load_fused(self.reader, &named, columns)
    }

    /// One stacked matrix per expert from 3-D expert tensors `[experts, rows, columns]`
    /// (`ffn_gate_exps.weight`): expert `e`'s rows of every part, stacked as [`Self::stacked`]
    /// stacks 2-D ones. An expert's rows are contiguous whole blocks in every supported type,
    /// so its matrix is a byte range of the tensor, repacked like any dense weight. Most HF
    /// checkpoints hold one 2-D tensor per expert instead ([`Self::hf_expert_name`]); those
    /// whose family renames the parts to 3-D tensors (Gemma 4's `experts.gate_up_proj`) are
    /// read as GGUF's are.
    pub fn expert_stacks(
        &self,
        parts: &[(&str, usize)],
        columns: usize,
        experts: usize,
    ) -> Result<Vec<StackedLinear>> {
        let per_expert_tensors = self.reader.naming != TensorNaming::Gguf
            && !parts.iter().all(|&(short, _)| self.contains(short));
        if per_expert_tensors {
            return (0..experts)
                .map(|expert| {
                    let named = parts
                        .iter()
                        .map(|&(short, rows)| Ok((self.hf_expert_name(short, expert)?, rows)))
                        .collect::<Result<Vec<_>>>()?;
                    load_fused(self.reader, &named, columns)
                })
                .collect();
        }
        let mut tensors = Vec::with_capacity(parts.len());
        for &(short, rows) in parts {
            let name = self.name(short);
            let tensor = self.reader.get(&name)?;
            check_shape(&name, tensor.shape, &[experts, rows, columns])?;
            tensors.push(tensor);
        }
        (0..experts)
            .map(|expert| {
                let slices: Vec<(DType, &[u8], usize)> = tensors
                    .iter()
                    .zip(parts)
                    .map(|(tensor, &(_, rows))| {
                        let per_expert = tensor.bytes.len() / experts;
                        let bytes = &tensor.bytes[expert * per_expert..(expert + 1) * per_expert];
                        (tensor.dtype, bytes, rows)
                    })
                    .collect();
                fuse(&slices, columns)
            })
            .collect()
    }

    /// A `[length]` vector (a norm weight, a bias), always read as f32.
    pub fn vector(&self, short: &str, length: usize) -> Result<Vec<f32>> {
        load_vector(self.reader.store, &self.name(short), length)
    }

    /// A tensor of `shape` read as f32 values, whatever extra unit dimensions the container
    /// gives it (HF's depthwise convolution weight is `[channels, 1, kernel]`, GGUF's
    /// `[channels, kernel]`).
    pub fn values(&self, short: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let name = self.name(short);
        let tensor = self.reader.store.get(&name)?;
        let squeezed: Vec<usize> = tensor.shape.iter().copied().filter(|&d| d != 1).collect();
        let wanted: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
        check_shape(&name, &squeezed, &wanted)?;
        let mut values = vec![0.0; shape.iter().product()];
        dequantize(tensor.dtype, &tensor.bytes, &mut values)?;
        Ok(values)
    }

    /// An RMSNorm weight (shifted as the reader says).
    pub fn rms_norm(&self, short: &str, length: usize, eps: f32) -> Result<RmsNorm> {
        self.reader.norm(&self.name(short), length, eps)
    }
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

fn load_matrix(
    store: &WeightReader<'_>,
    name: &str,
    rows: usize,
    columns: usize,
) -> Result<Linear> {
    let tensor = store.get(name)?;
    check_shape(name, tensor.shape, &[rows, columns])?;
    Ok(Linear::new(QMatrix::from_bytes(
        tensor.dtype,
        rows,
        columns,
        &tensor.bytes,
    )?))
}

/// Stacks matrices with the same input width by concatenating their rows. Every supported
/// type stores a row as whole blocks, so concatenating the bytes is exact. Parts of one type
/// become a single matrix so one matmul produces all of them; mixed-type parts (Q4_K_M files
/// quantize V differently) stay separate so each keeps its fast quantized kernel.
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
    let slices: Vec<(DType, &[u8], usize)> = tensors
        .iter()
        .zip(parts)
        .map(|(tensor, (_, rows))| (tensor.dtype, &*tensor.bytes, *rows))
        .collect();
    fuse(&slices, columns)
}

/// Stacks `(type, GGML bytes, rows)` parts of one input width: one matrix when the types
/// agree, one per part otherwise.
fn fuse(parts: &[(DType, &[u8], usize)], columns: usize) -> Result<StackedLinear> {
    let total_rows: usize = parts.iter().map(|&(_, _, rows)| rows).sum();
    let first_dtype = parts.first().map_or(DType::F32, |&(dtype, _, _)| dtype);
    let matrices = if parts.iter().all(|&(dtype, _, _)| dtype == first_dtype) {
        let bytes: Vec<u8> = parts
            .iter()
            .flat_map(|&(_, bytes, _)| bytes.iter().copied())
            .collect();
        vec![QMatrix::from_bytes(
            first_dtype,
            total_rows,
            columns,
            &bytes,
        )?]
    } else {
        let mut matrices = Vec::with_capacity(parts.len());
        for &(dtype, bytes, rows) in parts {
            matrices.push(QMatrix::from_bytes(dtype, rows, columns, bytes)?);
        }
        matrices
    };
    Ok(StackedLinear::new(matrices))
}

fn load_vector(store: &TensorStore<'_>, name: &str, length: usize) -> Result<Vec<f32>> {
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
    store: &TensorStore<'_>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_gguf::{GgmlType, GgufFile, GgufWriter};
    use tokenmill_kernels::quantize_row_mxfp4;

    /// `rows` rows of `columns` values in `[-2, 2)` from `seed`, quantized to MXFP4.
    fn mxfp4_rows(rows: usize, columns: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.max(1);
        let values: Vec<f32> = (0..rows * columns)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32) * 4.0 - 2.0
            })
            .collect();
        let mut bytes = vec![0u8; rows * DType::MXFP4.row_bytes(columns).unwrap()];
        quantize_row_mxfp4(&values, &mut bytes).unwrap();
        bytes
    }

    fn rows_of(matrix: &QMatrix) -> Vec<Vec<f32>> {
        (0..matrix.out_features())
            .map(|row| {
                let mut values = vec![0.0; matrix.in_features()];
                matrix.row_to_f32(row, &mut values).unwrap();
                values
            })
            .collect()
    }

    fn dequantized_rows(bytes: &[u8], columns: usize) -> Vec<Vec<f32>> {
        bytes
            .chunks_exact(DType::MXFP4.row_bytes(columns).unwrap())
            .map(|row| {
                let mut values = vec![0.0; columns];
                dequantize(DType::MXFP4, row, &mut values).unwrap();
                values
            })
            .collect()
    }

    /// A GGUF's MXFP4 tensors (gpt-oss stores its experts so) load into MXFP4 matrices with
    /// the file's bytes: a 2-D weight, and 3-D `[experts, rows, columns]` expert tensors cut
    /// per expert and stacked by [`LayerTensors::expert_stacks`].
    #[test]
    fn mxfp4_tensors_load_as_matrices_and_per_expert_stacks() {
        let (experts, rows, columns) = (3usize, 16usize, 64usize);
        let attn = mxfp4_rows(8, columns, 1);
        let gate = mxfp4_rows(experts * rows, columns, 2);
        let up = mxfp4_rows(experts * rows, columns, 3);
        let mut writer = GgufWriter::new();
        let mxfp4 = GgmlType::from_id(39);
        writer.add_tensor("blk.0.attn_q.weight", &[64, 8], mxfp4, attn.clone());
        let dims = [columns as u64, rows as u64, experts as u64];
        writer.add_tensor("blk.0.ffn_gate_exps.weight", &dims, mxfp4, gate.clone());
        writer.add_tensor("blk.0.ffn_up_exps.weight", &dims, mxfp4, up.clone());
        let file = GgufFile::from_bytes(writer.to_bytes()).unwrap();
        let store = TensorStore::from_gguf(&file);
        let reader = WeightReader::new(&store, TensorNaming::Gguf, false);
        let layer = reader.layer(0);

        let q = layer
            .stacked(&[("attn_q.weight", 8)], columns)
            .unwrap()
            .into_single()
            .unwrap();
        assert_eq!(q.dtype(), DType::MXFP4);
        assert_eq!(q.storage_bytes(), attn.len(), "kept at the file's bytes");
        assert_eq!(rows_of(&q), dequantized_rows(&attn, columns));

        let parts = [("ffn_gate_exps.weight", rows), ("ffn_up_exps.weight", rows)];
        let stacks = layer.expert_stacks(&parts, columns, experts).unwrap();
        assert_eq!(stacks.len(), experts);
        let expert_bytes = rows * DType::MXFP4.row_bytes(columns).unwrap();
        for (expert, stack) in stacks.into_iter().enumerate() {
            let matrix = stack.into_single().unwrap();
            assert_eq!(matrix.dtype(), DType::MXFP4);
            assert_eq!(
                (matrix.out_features(), matrix.in_features()),
                (2 * rows, columns)
            );
            let range = expert * expert_bytes..(expert + 1) * expert_bytes;
            let mut want = dequantized_rows(&gate[range.clone()], columns);
            want.extend(dequantized_rows(&up[range], columns));
            assert_eq!(rows_of(&matrix), want, "expert {expert}");
        }
    }
}
