//! The Llama-family decoder over a paged KV cache.

use std::path::Path;

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::{
    add_inplace, apply_rope, paged_attention, rms_norm, silu_mul, write_kv, AttentionParams,
    MatmulScratch, QMatrix, RopeCache, ThreadPool,
};

use crate::batch::BatchInput;
use crate::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCacheStorage;
use crate::loader::{
    llama3_scaling_from_rope_freqs, load_weights, ModelWeights, StackedLinear, TensorNaming,
    TensorStore,
};
use crate::source::ModelSource;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Worker threads of the model's compute pool (the caller's thread takes part too).
    pub num_threads: usize,
    /// Expand quantized weights to f32 at load: exact weights and the dense f32 kernels, at
    /// 4-8x the memory. For accuracy checks and prefill-heavy work.
    pub dequantize_to_f32: bool,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions {
            num_threads: std::thread::available_parallelism().map_or(1, usize::from),
            dequantize_to_f32: false,
        }
    }
}

/// A loaded Llama-family model: weights prepared for the compute layer, its RoPE table and
/// the thread pool it runs on. It owns no KV cache: each [`LlamaModel::forward`] reads and
/// writes the caller's [`KvCacheStorage`] through the batch's block tables.
#[derive(Debug)]
pub struct LlamaModel {
    config: ModelConfig,
    weights: ModelWeights,
    rope: RopeCache,
    pool: ThreadPool,
}

impl LlamaModel {
    /// Loads the model a [`ModelSource`] names.
    pub fn load(source: &ModelSource, options: &LoadOptions) -> Result<LlamaModel> {
        match source {
            ModelSource::Gguf(path) => LlamaModel::load_gguf(path, options),
            ModelSource::HfDirectory(dir) => LlamaModel::load_hf_directory(dir, options),
        }
    }

    /// Loads a GGUF file.
    pub fn load_gguf(path: &Path, options: &LoadOptions) -> Result<LlamaModel> {
        let file = GgufFile::open(path)?;
        let mut config = ModelConfig::from_gguf(&file)?;
        let original_context_length = file
            .get_u64(&format!(
                "{}.rope.scaling.original_context_length",
                config.architecture.name()
            ))
            .and_then(|length| usize::try_from(length).ok());
        let store = TensorStore::from_gguf(file);
        if store.contains("rope_freqs.weight") {
            config.rope_scaling =
                llama3_scaling_from_rope_freqs(&store, &config, original_context_length)?;
        }
        let weights = load_weights(
            &store,
            TensorNaming::Gguf,
            &config,
            options.dequantize_to_f32,
        )?;
        LlamaModel::from_weights(config, weights, options)
    }

    /// Loads an HF directory (`config.json` + safetensors).
    pub fn load_hf_directory(dir: &Path, options: &LoadOptions) -> Result<LlamaModel> {
        let config = ModelConfig::from_hf_config_file(&dir.join("config.json"))?;
        let store = TensorStore::from_hf_directory(dir)?;
        let weights = load_weights(
            &store,
            TensorNaming::HuggingFace,
            &config,
            options.dequantize_to_f32,
        )?;
        LlamaModel::from_weights(config, weights, options)
    }

    fn from_weights(
        config: ModelConfig,
        weights: ModelWeights,
        options: &LoadOptions,
    ) -> Result<LlamaModel> {
        let scaling = match config.rope_scaling {
            RopeScaling::None => tokenmill_kernels::RopeScaling::None,
            RopeScaling::Linear { factor } => tokenmill_kernels::RopeScaling::Linear { factor },
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => tokenmill_kernels::RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            },
        };
        // The table covers the trained context; positions beyond it are computed on the fly.
        let rope = RopeCache::new(
            config.rotary_dim,
            config.rope_theta,
            config.max_position_embeddings.min(1 << 17),
            scaling,
        )?;
        Ok(LlamaModel {
            config,
            weights,
            rope,
            pool: ThreadPool::new(options.num_threads.max(1)),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The pool the forward pass runs on, for callers that want to reuse its workers.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Bytes of weight storage in the compute layer's layout.
    pub fn weight_bytes(&self) -> usize {
        let stacked =
            |s: &StackedLinear| s.matrices.iter().map(QMatrix::storage_bytes).sum::<usize>();
        let layers: usize = self
            .weights
            .layers
            .iter()
            .map(|layer| {
                stacked(&layer.qkv)
                    + stacked(&layer.gate_up)
                    + layer.attn_output.storage_bytes()
                    + layer.down.storage_bytes()
            })
            .sum();
        layers
            + self.weights.embedding.storage_bytes()
            + self
                .weights
                .output
                .as_ref()
                .map_or(0, QMatrix::storage_bytes)
    }

    /// Bytes of weights one decode step reads in full: every layer matrix and the output
    /// projection (the embedding table when the head is tied). An untied embedding table is
    /// left out: a step reads only one of its rows per token.
    pub fn decode_weight_bytes(&self) -> usize {
        match &self.weights.output {
            Some(_) => self.weight_bytes() - self.weights.embedding.storage_bytes(),
            None => self.weight_bytes(),
        }
    }

    /// Runs one step over a flattened batch: writes every token's K/V into `kv` at its slot,
    /// attends over each sequence's cached context, and leaves
    /// `[batch.logits_indices.len(), vocab_size]` logits in `logits`.
    pub fn forward(
        &self,
        batch: &BatchInput,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let config = &self.config;
        let n = batch.num_tokens();
        self.validate_batch(batch, kv)?;
        let (hidden, q_dim, kv_dim) = (config.hidden_size, config.q_dim(), config.kv_dim());
        let intermediate = config.intermediate_size;
        workspace.prepare(config, n, batch.logits_indices.len());
        let ws = workspace;

        for (row, &token) in ws.hidden.chunks_exact_mut(hidden).zip(&batch.token_ids) {
            self.weights.embedding.row_to_f32(token as usize, row)?;
        }

        let attention = AttentionParams {
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            block_size: kv.block_size(),
            scale: 1.0 / (config.head_dim as f32).sqrt(),
        };
        let rope_style = match config.rope_style {
            RopeStyle::Normal => tokenmill_kernels::RopeStyle::Normal,
            RopeStyle::Neox => tokenmill_kernels::RopeStyle::Neox,
        };
        for (layer_index, layer) in self.weights.layers.iter().enumerate() {
            rms_norm(
                &ws.hidden,
                &layer.attn_norm,
                config.rms_norm_eps,
                &mut ws.normed,
            )?;
            self.stacked_matmul(
                &layer.qkv,
                &ws.normed,
                n,
                &mut ws.qkv,
                &mut ws.part,
                &mut ws.scratch,
            )?;
            let qkv_width = q_dim + 2 * kv_dim;
            for (token, row) in ws.qkv.chunks_exact(qkv_width).enumerate() {
                let (q, rest) = row.split_at(q_dim);
                let (k, v) = rest.split_at(kv_dim);
                ws.q[token * q_dim..(token + 1) * q_dim].copy_from_slice(q);
                ws.k[token * kv_dim..(token + 1) * kv_dim].copy_from_slice(k);
                ws.v[token * kv_dim..(token + 1) * kv_dim].copy_from_slice(v);
            }
            if let Some(bias) = &layer.qkv_bias {
                let (q_bias, rest) = bias.split_at(q_dim);
                let (k_bias, v_bias) = rest.split_at(kv_dim);
                for row in ws.q.chunks_exact_mut(q_dim) {
                    add_inplace(row, q_bias)?;
                }
                for row in ws.k.chunks_exact_mut(kv_dim) {
                    add_inplace(row, k_bias)?;
                }
                for row in ws.v.chunks_exact_mut(kv_dim) {
                    add_inplace(row, v_bias)?;
                }
            }
            apply_rope(
                &mut ws.q,
                n,
                config.num_heads,
                config.head_dim,
                &batch.positions,
                &self.rope,
                rope_style,
            )?;
            apply_rope(
                &mut ws.k,
                n,
                config.num_kv_heads,
                config.head_dim,
                &batch.positions,
                &self.rope,
                rope_style,
            )?;
            let (key_cache, value_cache) = kv.layer_mut(layer_index).ok_or_else(|| {
                ModelError::InvalidBatch(format!("KV cache has no layer {layer_index}"))
            })?;
            write_kv(
                &ws.k,
                &ws.v,
                &batch.slot_mapping,
                kv_dim,
                key_cache.as_slice_mut(),
                value_cache.as_slice_mut(),
            )?;
            paged_attention(
                &self.pool,
                &attention,
                &ws.q,
                key_cache.as_slice(),
                value_cache.as_slice(),
                &batch.seqs,
                &batch.block_tables,
                &mut ws.attention,
            )?;
            layer.attn_output.matmul(
                &self.pool,
                &ws.attention,
                n,
                &mut ws.projected,
                &mut ws.scratch,
            )?;
            add_inplace(&mut ws.hidden, &ws.projected)?;

            rms_norm(
                &ws.hidden,
                &layer.ffn_norm,
                config.rms_norm_eps,
                &mut ws.normed,
            )?;
            self.stacked_matmul(
                &layer.gate_up,
                &ws.normed,
                n,
                &mut ws.gate_up,
                &mut ws.part,
                &mut ws.scratch,
            )?;
            for (row, activated) in ws
                .gate_up
                .chunks_exact_mut(2 * intermediate)
                .zip(ws.activated.chunks_exact_mut(intermediate))
            {
                let (gate, up) = row.split_at_mut(intermediate);
                silu_mul(gate, up)?;
                activated.copy_from_slice(gate);
            }
            layer.down.matmul(
                &self.pool,
                &ws.activated,
                n,
                &mut ws.projected,
                &mut ws.scratch,
            )?;
            add_inplace(&mut ws.hidden, &ws.projected)?;
        }

        let rows = batch.logits_indices.len();
        for (out, &index) in ws
            .selected
            .chunks_exact_mut(hidden)
            .zip(&batch.logits_indices)
        {
            let index = index as usize;
            out.copy_from_slice(&ws.hidden[index * hidden..(index + 1) * hidden]);
        }
        rms_norm(
            &ws.selected,
            &self.weights.output_norm,
            config.rms_norm_eps,
            &mut ws.selected_normed,
        )?;
        logits.clear();
        logits.resize(rows * config.vocab_size, 0.0);
        if rows > 0 {
            let head = self
                .weights
                .output
                .as_ref()
                .unwrap_or(&self.weights.embedding);
            head.matmul(
                &self.pool,
                &ws.selected_normed,
                rows,
                logits,
                &mut ws.scratch,
            )?;
        }
        Ok(())
    }

    fn stacked_matmul(
        &self,
        stacked: &StackedLinear,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        part: &mut Vec<f32>,
        scratch: &mut MatmulScratch,
    ) -> Result<()> {
        if let [single] = stacked.matrices.as_slice() {
            single.matmul(&self.pool, x, n, out, scratch)?;
            return Ok(());
        }
        let mut column = 0;
        for matrix in &stacked.matrices {
            let width = matrix.out_features();
            part.clear();
            part.resize(n * width, 0.0);
            matrix.matmul(&self.pool, x, n, part, scratch)?;
            for (out_row, part_row) in out
                .chunks_exact_mut(stacked.total_width)
                .zip(part.chunks_exact(width))
            {
                out_row[column..column + width].copy_from_slice(part_row);
            }
            column += width;
        }
        Ok(())
    }

    fn validate_batch(&self, batch: &BatchInput, kv: &KvCacheStorage) -> Result<()> {
        let n = batch.num_tokens();
        if batch.positions.len() != n || batch.slot_mapping.len() != n {
            return Err(ModelError::InvalidBatch(format!(
                "{n} tokens but {} positions and {} slots",
                batch.positions.len(),
                batch.slot_mapping.len()
            )));
        }
        if kv.num_layers() != self.config.num_layers {
            return Err(ModelError::InvalidBatch(format!(
                "KV cache has {} layers, model has {}",
                kv.num_layers(),
                self.config.num_layers
            )));
        }
        if let Some(&token) = batch
            .token_ids
            .iter()
            .find(|&&token| token as usize >= self.config.vocab_size)
        {
            return Err(ModelError::InvalidBatch(format!(
                "token id {token} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        if let Some(&index) = batch
            .logits_indices
            .iter()
            .find(|&&index| index as usize >= n)
        {
            return Err(ModelError::InvalidBatch(format!(
                "logits row {index} is outside the batch of {n} tokens"
            )));
        }
        Ok(())
    }
}

/// Activation buffers for [`LlamaModel::forward`], grown to the largest batch seen and then
/// reused, so steady-state decoding allocates nothing.
#[derive(Debug, Default)]
pub struct Workspace {
    hidden: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attention: Vec<f32>,
    projected: Vec<f32>,
    gate_up: Vec<f32>,
    activated: Vec<f32>,
    part: Vec<f32>,
    selected: Vec<f32>,
    selected_normed: Vec<f32>,
    scratch: MatmulScratch,
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace::default()
    }

    /// Sizes every buffer for `n` tokens and `rows` logits rows; only grows capacity.
    fn prepare(&mut self, config: &ModelConfig, n: usize, rows: usize) {
        let (hidden, q_dim, kv_dim) = (config.hidden_size, config.q_dim(), config.kv_dim());
        let sizes: [(&mut Vec<f32>, usize); 12] = [
            (&mut self.hidden, n * hidden),
            (&mut self.normed, n * hidden),
            (&mut self.qkv, n * (q_dim + 2 * kv_dim)),
            (&mut self.q, n * q_dim),
            (&mut self.k, n * kv_dim),
            (&mut self.v, n * kv_dim),
            (&mut self.attention, n * q_dim),
            (&mut self.projected, n * hidden),
            (&mut self.gate_up, n * 2 * config.intermediate_size),
            (&mut self.activated, n * config.intermediate_size),
            (&mut self.selected, rows * hidden),
            (&mut self.selected_normed, rows * hidden),
        ];
        for (buffer, len) in sizes {
            buffer.resize(len, 0.0);
        }
    }
}
