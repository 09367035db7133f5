//! The Llama family: Llama 2/3, SmolLM2, TinyLlama, Mistral (with its sliding window), Qwen2
//! (Llama with a QKV bias), Qwen3 (Llama with QK-norm and its own head_dim), and their
//! mixture-of-experts forms, Mixtral (Llama with experts) and Qwen3-MoE, and Phi-3 /
//! Phi-4-mini (fused QKV and gate/up tensors, partial rotary, LongRoPE), and gpt-oss (QKV and
//! output biases, attention sinks, alternating sliding layers, YaRN, biased experts with the
//! clamped SwiGLU). Pre-norm blocks:
//! `x += attn(rms(x)); x += ffn(rms(x))`, the FFN a SiLU-gated MLP or a routed mixture of
//! SiLU-gated experts ([`FeedForward`]), one RoPE table. The variants differ only in
//! [`ModelConfig`] fields the shared blocks read ([`AttentionOptions`], `ModelConfig::moe`),
//! so they are one implementation rather than copies.

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::ThreadPool;

use super::super::family::WeightSource;
use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::{
    AttentionBlock, AttentionOptions, AttentionShape, EmbeddingAndHead, FeedForward, RmsNorm, Rope,
    Step, Workspace,
};
use crate::loader::{llama3_scaling_from_rope_freqs, TensorNaming, TensorStore, WeightReader};
use crate::model::{validate_batch, CausalLm, LoadOptions};

/// A loaded Llama-family model: weights prepared for the compute layer and its RoPE table.
/// It owns no KV cache and no threads: each [`CausalLm::forward`] reads and writes the
/// caller's [`KvCacheStorage`] through the batch's block tables, on the caller's pool.
#[derive(Debug)]
pub struct LlamaModel {
    config: ModelConfig,
    kv_layout: Vec<LayerKvLayout>,
    ends: EmbeddingAndHead,
    layers: Vec<LlamaLayer>,
    rope: Rope,
}

/// One transformer block.
#[derive(Debug)]
struct LlamaLayer {
    attn_norm: RmsNorm,
    attention: AttentionBlock,
    ffn_norm: RmsNorm,
    ffn: FeedForward,
}

impl LlamaModel {
    /// Builds a Llama-shaped family's model (the default of `Family::build`).
    pub(crate) fn build(
        weights: WeightSource<'_>,
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        options: &LoadOptions,
    ) -> Result<LlamaModel> {
        match weights {
            WeightSource::Gguf(file) => {
                LlamaModel::build_from_gguf(file, config, kv_layout, options)
            }
            WeightSource::HfDirectory(dir) => {
                let store = TensorStore::from_hf_directory(dir)?;
                LlamaModel::from_store(config, kv_layout, &store, TensorNaming::HF, options)
            }
        }
    }

    /// From a GGUF: llama.cpp stores Llama 3.x RoPE scaling as per-pair divisors in
    /// `rope_freqs.weight`.
    fn build_from_gguf(
        file: &GgufFile,
        mut config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        options: &LoadOptions,
    ) -> Result<LlamaModel> {
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
        LlamaModel::from_store(config, kv_layout, &store, TensorNaming::Gguf, options)
    }

    /// Reads every weight the forward pass needs, checking shapes against `config`.
    pub(crate) fn from_store(
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        store: &TensorStore<'_>,
        naming: TensorNaming,
        options: &LoadOptions,
    ) -> Result<LlamaModel> {
        let reader = WeightReader::new(store, naming, options.dequantize_to_f32);
        let ends = EmbeddingAndHead::load(&reader, &config, options.hidden_states_only)?;
        let layers = (0..config.num_layers)
            .map(|layer| LlamaLayer::load(&reader, &config, layer))
            .collect::<Result<Vec<_>>>()?;
        let rope = Rope::from_config(&config)?;
        Ok(LlamaModel {
            config,
            kv_layout,
            ends,
            layers,
            rope,
        })
    }

    /// Sizes every workspace buffer for `n` tokens and `rows` logits rows.
    fn prepare(&self, workspace: &mut Workspace, n: usize, rows: usize) {
        let config = &self.config;
        workspace.prepare_residual(n, rows, config.hidden_size);
        workspace.attention.prepare(n, AttentionShape::of(config));
        FeedForward::prepare(config, n, &mut workspace.mlp, &mut workspace.moe);
    }

    /// Validates the batch, embeds it and runs every block: the residual stream in
    /// `workspace.hidden` is then ready for the final norm (sized for `rows` logits rows).
    fn run_layers(
        &self,
        step: &Step<'_>,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        rows: usize,
    ) -> Result<()> {
        validate_batch(&self.config, step.batch, kv)?;
        self.prepare(workspace, step.num_tokens(), rows);
        self.ends.embed(step, workspace)?;
        if let Some(first) = self.layers.first() {
            first
                .attn_norm
                .forward_rows(step.pool, &workspace.hidden, &mut workspace.normed)?;
        }
        for (index, layer) in self.layers.iter().enumerate() {
            let next_norm = self.layers.get(index + 1).map(|next| &next.attn_norm);
            layer.forward(step, &self.rope, index, kv, workspace, next_norm)?;
        }
        Ok(())
    }
}

impl LlamaLayer {
    fn load(reader: &WeightReader<'_>, config: &ModelConfig, layer: usize) -> Result<LlamaLayer> {
        let tensors = reader.layer(layer);
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(LlamaLayer {
            attn_norm: tensors.rms_norm("attn_norm.weight", hidden, eps)?,
            attention: AttentionBlock::load(
                &tensors,
                AttentionShape::of(config),
                hidden,
                AttentionOptions::for_layer(config, layer),
            )?,
            // gpt-oss's GGUF keeps HF's name for the pre-FFN norm.
            ffn_norm: if tensors.contains("ffn_norm.weight") {
                tensors.rms_norm("ffn_norm.weight", hidden, eps)?
            } else {
                tensors.rms_norm("post_attention_norm.weight", hidden, eps)?
            },
            ffn: FeedForward::load(&tensors, config)?,
        })
    }

    fn storage_bytes(&self) -> usize {
        self.attention.storage_bytes() + self.ffn.storage_bytes()
    }

    /// Bytes one decode token reads (a mixture of experts reads only its chosen experts).
    fn decode_bytes(&self) -> usize {
        self.attention.storage_bytes() + self.ffn.decode_bytes()
    }

    /// `x += attn(norm(x)); x += mlp(norm(x))` on the workspace's residual stream, whose
    /// attention norm `ws.normed` already holds. Each residual add and the norm after it run
    /// as one pass: the MLP norm's, then `next_norm`'s (the next block's attention norm; none
    /// after the last block, whose residual stream goes to the final norm).
    fn forward(
        &self,
        step: &Step<'_>,
        rope: &Rope,
        index: usize,
        kv: &mut KvCacheStorage,
        ws: &mut Workspace,
        next_norm: Option<&RmsNorm>,
    ) -> Result<()> {
        self.attention.forward(
            step,
            rope,
            index,
            kv,
            &ws.normed,
            &mut ws.attention,
            &mut ws.linear,
            &mut ws.projected,
        )?;
        ws.add_residual_and_norm(step.pool, &self.ffn_norm)?;
        self.ffn.forward(
            step,
            index,
            &ws.normed,
            &mut ws.mlp,
            &mut ws.moe,
            &mut ws.linear,
            &mut ws.projected,
        )?;
        match next_norm {
            Some(norm) => ws.add_residual_and_norm(step.pool, norm),
            None => ws.add_residual(step.pool, self.attn_norm.width()),
        }
    }
}

impl CausalLm for LlamaModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_layout(&self) -> &[LayerKvLayout] {
        &self.kv_layout
    }

    fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(LlamaLayer::storage_bytes).sum();
        layers + self.ends.storage_bytes()
    }

    fn decode_weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(LlamaLayer::decode_bytes).sum();
        layers + self.ends.decode_bytes()
    }

    fn forward(
        &self,
        pool: &ThreadPool,
        batch: &BatchInput,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let step = Step { pool, batch };
        self.run_layers(&step, kv, workspace, batch.logits_indices.len())?;
        self.ends.logits(&step, workspace, logits)
    }

    fn forward_hidden(
        &self,
        pool: &ThreadPool,
        batch: &BatchInput,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        hidden: &mut Vec<f32>,
    ) -> Result<()> {
        let step = Step { pool, batch };
        self.run_layers(&step, kv, workspace, 0)?;
        self.ends.final_hidden(&step, workspace, hidden)
    }
}
