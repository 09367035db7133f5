//! Qwen3.5 / Qwen3.6 (dense): a hybrid of Gated DeltaNet layers and gated full-attention
//! layers (every `full_attention_interval`-th), each followed by a SiLU-gated MLP:
//! `x += mixer(norm(x)); x += mlp(post_norm(x))`. The attention layers have QK-norm, partial
//! RoPE and a per-head output gate (`AttentionOptions::output_gate`); the DeltaNet layers
//! keep a recurrent state per sequence ([`GatedDeltaNet`]) instead of K/V.
//!
//! Multimodal RoPE: for text-only input every position id of the three sections is the
//! token's position, so the interleaved sections rotate exactly as plain NeoX RoPE over the
//! rotary dims.
//!
//! Norms: HF's `Qwen3_5RMSNorm` computes `x * (1 + w)`, llama.cpp's converter adds the 1
//! (every `*norm.weight` except the DeltaNet output norm, a plain weight), so the HF loader
//! folds it in as Gemma's does. HF stores `A_log`, GGUF `-exp(A_log)`. llama.cpp's converter
//! also reorders value heads when there are more of them than key heads
//! (`LinearAttentionConfig::key_heads`).

use tokenmill_kernels::ThreadPool;

use super::super::family::WeightSource;
use crate::batch::BatchInput;
use crate::config::{LinearAttentionConfig, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::{
    AttentionBlock, AttentionOptions, AttentionShape, EmbeddingAndHead, FeedForward, GatedDeltaNet,
    RmsNorm, Rope, Step, Workspace,
};
use crate::loader::{TensorNaming, TensorStore, WeightReader};
use crate::model::{validate_batch, CausalLm, LoadOptions};
use crate::state_cache::LayerStateLayout;

/// A loaded Qwen3.5 model.
#[derive(Debug)]
pub struct Qwen35Model {
    config: ModelConfig,
    linear: LinearAttentionConfig,
    kv_layout: Vec<LayerKvLayout>,
    state_layout: Vec<LayerStateLayout>,
    ends: EmbeddingAndHead,
    layers: Vec<Qwen35Layer>,
    rope: Rope,
}

/// What mixes tokens in a layer, with the layer's index among its kind (its KV cache layer
/// or its recurrent-state layer).
#[derive(Debug)]
enum Mixer {
    Attention(AttentionBlock, usize),
    DeltaNet(GatedDeltaNet, usize),
}

#[derive(Debug)]
struct Qwen35Layer {
    attn_norm: RmsNorm,
    mixer: Mixer,
    post_attention_norm: RmsNorm,
    ffn: FeedForward,
}

impl Qwen35Model {
    /// Builds Qwen3.5's model (its family's `Family::build`).
    pub(crate) fn build(
        weights: WeightSource<'_>,
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        state_layout: Vec<LayerStateLayout>,
        options: &LoadOptions,
    ) -> Result<Qwen35Model> {
        let dequantize = options.dequantize_to_f32;
        let mut store = match weights {
            WeightSource::Gguf(file) => TensorStore::from_gguf(file),
            WeightSource::HfDirectory(dir) => TensorStore::from_hf_directory(dir)?,
        };
        let reader = match weights {
            WeightSource::Gguf(_) => WeightReader::new(&store, TensorNaming::Gguf, dequantize),
            WeightSource::HfDirectory(_) => {
                // A `*ForConditionalGeneration` checkpoint keeps the text model under
                // `model.language_model.` (the vision tower is not loaded).
                store.rename_prefix("model.language_model.", "model.");
                WeightReader::new(&store, TensorNaming::HuggingFace(HF_RENAMES), dequantize)
                    .with_norm_shift(1.0)
            }
        };
        let linear = config
            .linear_attention
            .ok_or_else(|| ModelError::MissingMetadata("linear attention config".into()))?;
        let ends = EmbeddingAndHead::load(&reader, &config, options.hidden_states_only)?;
        let (mut attention_index, mut state_index) = (0, 0);
        let mut layers = Vec::with_capacity(config.num_layers);
        for layer in 0..config.num_layers {
            let tensors = reader.layer(layer);
            let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
            let mixer = if linear.is_linear(layer) {
                let net = GatedDeltaNet::load(&tensors, reader.naming(), linear, hidden, eps)?;
                state_index += 1;
                Mixer::DeltaNet(net, state_index - 1)
            } else {
                let options = AttentionOptions::for_layer(&config, layer);
                let block =
                    AttentionBlock::load(&tensors, AttentionShape::of(&config), hidden, options)?;
                attention_index += 1;
                Mixer::Attention(block, attention_index - 1)
            };
            layers.push(Qwen35Layer {
                attn_norm: tensors.rms_norm("attn_norm.weight", hidden, eps)?,
                mixer,
                post_attention_norm: tensors.rms_norm("post_attention_norm.weight", hidden, eps)?,
                ffn: FeedForward::load(&tensors, &config)?,
            });
        }
        Ok(Qwen35Model {
            rope: Rope::from_config(&config)?,
            linear,
            kv_layout,
            state_layout,
            config,
            ends,
            layers,
        })
    }

    /// Sizes every workspace buffer for `n` tokens and `rows` logits rows.
    fn prepare(&self, workspace: &mut Workspace, n: usize, rows: usize) {
        let config = &self.config;
        workspace.prepare_residual(n, rows, config.hidden_size);
        workspace.attention.prepare(n, AttentionShape::of(config));
        workspace.delta_net.prepare(n, &self.linear);
        FeedForward::prepare(config, n, &mut workspace.mlp, &mut workspace.moe);
    }

    /// Validates the batch, zeroes the state of every sequence that starts at position 0,
    /// embeds the batch and runs every block: the residual stream in `workspace.hidden` is
    /// then ready for the final norm (sized for `rows` logits rows).
    fn run_layers(
        &self,
        step: &Step<'_>,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        rows: usize,
    ) -> Result<()> {
        let batch = step.batch;
        validate_batch(&self.config, batch, kv)?;
        if !batch.lora.adapters.is_empty() {
            return Err(ModelError::InvalidBatch(
                "LoRA adapters are not supported for Qwen3.5 models".into(),
            ));
        }
        if batch.state_slots.len() != batch.seqs.len() {
            return Err(ModelError::InvalidBatch(format!(
                "{} sequences but {} recurrent-state slots",
                batch.seqs.len(),
                batch.state_slots.len()
            )));
        }
        for (seq, &slot) in batch.seqs.iter().zip(&batch.state_slots) {
            if seq.context_len == seq.query_len {
                kv.state_mut().reset_slot(slot as usize);
            }
        }
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

impl Qwen35Layer {
    fn storage_bytes(&self) -> usize {
        self.mixer_bytes() + self.ffn.storage_bytes()
    }

    fn decode_bytes(&self) -> usize {
        self.mixer_bytes() + self.ffn.decode_bytes()
    }

    fn mixer_bytes(&self) -> usize {
        match &self.mixer {
            Mixer::Attention(block, _) => block.storage_bytes(),
            Mixer::DeltaNet(net, _) => net.storage_bytes(),
        }
    }

    /// `x += mixer(norm(x)); x += ffn(post_norm(x))` on the workspace's residual stream,
    /// whose input norm `ws.normed` already holds; the residual adds are fused with the norm
    /// after them (`next_norm`: the next block's input norm, none after the last block).
    fn forward(
        &self,
        step: &Step<'_>,
        rope: &Rope,
        index: usize,
        kv: &mut KvCacheStorage,
        ws: &mut Workspace,
        next_norm: Option<&RmsNorm>,
    ) -> Result<()> {
        match &self.mixer {
            Mixer::Attention(block, kv_layer) => block.forward(
                step,
                rope,
                *kv_layer,
                kv,
                &ws.normed,
                &mut ws.attention,
                &mut ws.linear,
                &mut ws.projected,
            )?,
            Mixer::DeltaNet(net, state_layer) => net.forward(
                step,
                *state_layer,
                kv,
                &ws.normed,
                &mut ws.delta_net,
                &mut ws.linear,
                &mut ws.projected,
            )?,
        }
        ws.add_residual_and_norm(step.pool, &self.post_attention_norm)?;
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

impl CausalLm for Qwen35Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_layout(&self) -> &[LayerKvLayout] {
        &self.kv_layout
    }

    fn state_layout(&self) -> &[LayerStateLayout] {
        &self.state_layout
    }

    fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Qwen35Layer::storage_bytes).sum();
        layers + self.ends.storage_bytes()
    }

    fn decode_weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Qwen35Layer::decode_bytes).sum();
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

/// HF's names (under `model.layers.N.`) for the Gated DeltaNet tensors, by their GGUF names.
const HF_RENAMES: &[(&str, &str)] = &[
    ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
    ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
    ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
    ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
    ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_norm.weight", "linear_attn.norm.weight"),
    ("ssm_out.weight", "linear_attn.out_proj.weight"),
];
