//! Gemma 3 (text). Each block norms both sides of attention and of the MLP:
//! `x += post_attn(attn(pre_attn(x))); x += post_ffw(mlp(pre_ffw(x)))`, with QK-norm, a
//! GELU-tanh gate, embeddings scaled by `sqrt(hidden)` and a head tied to the 262k-token
//! embedding. Five of every six layers are local (a sliding window, RoPE base 10,000, no
//! scaling); every sixth is global (the file's RoPE base and scaling, the whole context).
//!
//! Norm weights are stored as the `w` of `x * (1 + w)` in HF checkpoints and with the 1
//! already added in GGUF files (llama.cpp's converter adds it), so the HF loader folds it in
//! and both compute a plain RMSNorm.

use tokenmill_kernels::ThreadPool;

use super::super::family::WeightSource;
use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::{
    Activation, AttentionBlock, AttentionOptions, AttentionShape, EmbeddingAndHead, GatedMlp,
    RmsNorm, Rope, Step, Workspace,
};
use crate::loader::{TensorNaming, TensorStore, WeightReader};
use crate::model::{validate_batch, CausalLm, LoadOptions};

/// A loaded Gemma 3 text model: weights and its two RoPE tables. Like every family it owns
/// no KV cache and no threads.
#[derive(Debug)]
pub struct Gemma3Model {
    config: ModelConfig,
    kv_layout: Vec<LayerKvLayout>,
    ends: EmbeddingAndHead,
    layers: Vec<Gemma3Layer>,
    global_rope: Rope,
    /// The local layers' table; `None` when the file declares no sliding window (every
    /// layer is then global, as llama.cpp runs such a file).
    local_rope: Option<Rope>,
}

/// One Gemma 3 block: four norms around attention and the MLP.
#[derive(Debug)]
struct Gemma3Layer {
    attn_norm: RmsNorm,
    attention: AttentionBlock,
    post_attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
    post_ffw_norm: RmsNorm,
    /// Whether the layer slides (and so uses the local RoPE table).
    local: bool,
}

impl Gemma3Model {
    /// Builds Gemma 3's model (its family's `Family::build`).
    pub(crate) fn build(
        weights: WeightSource<'_>,
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        options: &LoadOptions,
    ) -> Result<Gemma3Model> {
        let dequantize = options.dequantize_to_f32;
        let store = match weights {
            WeightSource::Gguf(file) => TensorStore::from_gguf(file),
            WeightSource::HfDirectory(dir) => TensorStore::from_hf_directory(dir)?,
        };
        let reader = match weights {
            WeightSource::Gguf(_) => WeightReader::new(&store, TensorNaming::Gguf, dequantize),
            // HF stores norms as the `w` of `x * (1 + w)`.
            WeightSource::HfDirectory(_) => {
                WeightReader::new(&store, TensorNaming::HuggingFace(HF_RENAMES), dequantize)
                    .with_norm_shift(1.0)
            }
        };
        Gemma3Model::from_reader(config, kv_layout, &reader, options.hidden_states_only)
    }

    fn from_reader(
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        reader: &WeightReader<'_>,
        hidden_states_only: bool,
    ) -> Result<Gemma3Model> {
        if !config.qk_norm {
            return Err(ModelError::MissingTensor("blk.0.attn_q_norm.weight".into()));
        }
        // llama.cpp multiplies by sqrtf(n_embd) in f32; HF rounds the scale to the weights'
        // dtype, which for bf16 checkpoints is 25.25 instead of 25.30 at hidden 640.
        let ends = EmbeddingAndHead::load(reader, &config, hidden_states_only)?
            .with_embedding_scale((config.hidden_size as f32).sqrt());
        let layers = (0..config.num_layers)
            .map(|layer| Gemma3Layer::load(reader, &config, layer))
            .collect::<Result<Vec<_>>>()?;
        Ok(Gemma3Model {
            kv_layout,
            global_rope: Rope::from_config(&config)?,
            local_rope: Rope::local_from_config(&config)?,
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
        workspace.mlp.prepare(n, config.intermediate_size);
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
        for (index, layer) in self.layers.iter().enumerate() {
            let rope = match (&self.local_rope, layer.local) {
                (Some(local), true) => local,
                _ => &self.global_rope,
            };
            layer.forward(step, rope, index, kv, workspace)?;
        }
        Ok(())
    }
}

impl Gemma3Layer {
    fn load(reader: &WeightReader<'_>, config: &ModelConfig, layer: usize) -> Result<Gemma3Layer> {
        let tensors = reader.layer(layer);
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        let options = AttentionOptions::for_layer(config, layer);
        Ok(Gemma3Layer {
            attn_norm: tensors.rms_norm("attn_norm.weight", hidden, eps)?,
            attention: AttentionBlock::load(&tensors, AttentionShape::of(config), hidden, options)?,
            post_attention_norm: tensors.rms_norm("post_attention_norm.weight", hidden, eps)?,
            ffn_norm: tensors.rms_norm("ffn_norm.weight", hidden, eps)?,
            mlp: GatedMlp::load(
                &tensors,
                hidden,
                config.intermediate_size,
                Activation::GeluTanh,
            )?,
            post_ffw_norm: tensors.rms_norm("post_ffw_norm.weight", hidden, eps)?,
            local: options.sliding_window.is_some(),
        })
    }

    fn storage_bytes(&self) -> usize {
        self.attention.storage_bytes() + self.mlp.storage_bytes()
    }

    /// `x += post(attn(pre(x))); x += post(mlp(pre(x)))` on the workspace's residual stream.
    fn forward(
        &self,
        step: &Step<'_>,
        rope: &Rope,
        index: usize,
        kv: &mut KvCacheStorage,
        ws: &mut Workspace,
    ) -> Result<()> {
        self.attn_norm
            .forward_rows(step.pool, &ws.hidden, &mut ws.normed)?;
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
        ws.add_normed_residual(step.pool, &self.post_attention_norm)?;
        self.ffn_norm
            .forward_rows(step.pool, &ws.hidden, &mut ws.normed)?;
        self.mlp.forward(
            step,
            index,
            &ws.normed,
            &mut ws.mlp,
            &mut ws.linear,
            &mut ws.projected,
        )?;
        ws.add_normed_residual(step.pool, &self.post_ffw_norm)
    }
}

impl CausalLm for Gemma3Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_layout(&self) -> &[LayerKvLayout] {
        &self.kv_layout
    }

    fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Gemma3Layer::storage_bytes).sum();
        layers + self.ends.storage_bytes()
    }

    fn decode_weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Gemma3Layer::storage_bytes).sum();
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

/// HF's names for the tensors whose GGUF names mean something else in Gemma 3's block: four
/// norms per layer, so `post_attention_layernorm` is the norm after attention (GGUF
/// `post_attention_norm`), not the one before the MLP (`ffn_norm`).
const HF_RENAMES: &[(&str, &str)] = &[("ffn_norm.weight", "pre_feedforward_layernorm.weight")];
