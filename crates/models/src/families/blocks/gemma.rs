//! The Gemma block (Gemma 3 and Gemma 4, text). Each block norms both sides of attention and
//! of the MLP: `x += post_attn(attn(pre_attn(x))); x += post_ffw(mlp(pre_ffw(x)))`, with
//! QK-norm, a GELU-tanh gate, embeddings scaled by `sqrt(hidden)` and a head tied to the
//! 262k-token embedding. Local layers slide (their own RoPE base, no scaling); global layers
//! see the whole context.
//!
//! Gemma 4 adds, each read from its [`ModelConfig`] fields: global layers of their own
//! geometry (`full_attention`: wider heads, their own KV heads, V from K's projection,
//! proportional RoPE), V normed, the last layers reading an earlier layer's KV
//! (`kv_shared_layers`), per-layer embeddings (PLE: a per-token, per-layer vector from a
//! table and a projection of the embedding, gated into each layer's output), per-layer MLP
//! widths, a scalar per layer and (26B-A4B, `moe`) routed experts beside every layer's MLP:
//! `x += post_ffw(post_ffw_1(mlp(pre_ffw(x))) + post_ffw_2(experts(pre_ffw_2(x))))`, the
//! router reading `x` itself ([`Routing::Scaled`]).
//!
//! Gemma 3's HF norm weights are the `w` of `x * (1 + w)`, with the 1 already added in GGUF
//! files (llama.cpp's converter adds it), so its HF loader folds it in; Gemma 4's norms are
//! plain in both.

use tokenmill_kernels::ThreadPool;

use super::super::family::WeightSource;
use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::compact_rows;
use crate::layers::{
    Activation, AttentionBlock, AttentionOptions, AttentionShape, EmbeddingAndHead, GatedMlp,
    MoeBlock, PerLayerEmbeddings, PerLayerGate, RmsNorm, Rope, Routing, Step, Workspace,
};
use crate::loader::{LayerTensors, TensorNaming, TensorStore, WeightReader};
use crate::model::{validate_batch, CausalLm, LoadOptions};

/// A loaded Gemma model: weights, its two RoPE tables and (Gemma 4) its per-layer
/// embeddings. Like every family it owns no KV cache and no threads.
#[derive(Debug)]
pub struct GemmaModel {
    config: ModelConfig,
    kv_layout: Vec<LayerKvLayout>,
    ends: EmbeddingAndHead,
    layers: Vec<GemmaLayer>,
    global_rope: Rope,
    /// The local layers' table; `None` when the file declares no sliding window (every
    /// layer is then global, as llama.cpp runs such a file).
    local_rope: Option<Rope>,
    per_layer: Option<PerLayerEmbeddings>,
}

/// One Gemma block: four norms around attention and the MLP, then (Gemma 4) the per-layer
/// embedding's gate and the layer's scalar.
#[derive(Debug)]
struct GemmaLayer {
    attn_norm: RmsNorm,
    attention: AttentionBlock,
    post_attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
    /// Gemma 4's routed experts beside the MLP (which is then the shared expert).
    experts: Option<RoutedExperts>,
    post_ffw_norm: RmsNorm,
    per_layer: Option<PerLayerGate>,
    /// Multiplies the layer's output (Gemma 4's `layer_scalar`).
    output_scale: Option<f32>,
    /// Whether the layer slides (and so uses the local RoPE table).
    local: bool,
}

impl GemmaModel {
    /// Builds a Gemma model (Gemma 3's and Gemma 4's `Family::build`).
    pub(crate) fn build(
        weights: WeightSource<'_>,
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        options: &LoadOptions,
    ) -> Result<GemmaModel> {
        let dequantize = options.dequantize_to_f32;
        let gemma3 = config.architecture == "gemma3";
        let mut store = match weights {
            WeightSource::Gguf(file) => TensorStore::from_gguf(file),
            WeightSource::HfDirectory(dir) => TensorStore::from_hf_directory(dir)?,
        };
        // The multimodal checkpoint keeps the text model under `model.language_model.`.
        if let WeightSource::HfDirectory(_) = weights {
            if !store.contains("model.embed_tokens.weight")
                && store.contains("model.language_model.embed_tokens.weight")
            {
                store.rename_prefix("model.language_model.", "model.");
            }
        }
        let renames = if gemma3 {
            GEMMA3_HF_RENAMES
        } else {
            GEMMA4_HF_RENAMES
        };
        let reader = match weights {
            WeightSource::Gguf(_) => WeightReader::new(&store, TensorNaming::Gguf, dequantize),
            // Gemma 3's HF norms are the `w` of `x * (1 + w)`.
            WeightSource::HfDirectory(_) => {
                let reader =
                    WeightReader::new(&store, TensorNaming::HuggingFace(renames), dequantize);
                if gemma3 {
                    reader.with_norm_shift(1.0)
                } else {
                    reader
                }
            }
        };
        GemmaModel::from_reader(config, kv_layout, &reader, options.hidden_states_only)
    }

    fn from_reader(
        config: ModelConfig,
        kv_layout: Vec<LayerKvLayout>,
        reader: &WeightReader<'_>,
        hidden_states_only: bool,
    ) -> Result<GemmaModel> {
        if !config.qk_norm {
            return Err(ModelError::MissingTensor("blk.0.attn_q_norm.weight".into()));
        }
        // llama.cpp multiplies by sqrtf(n_embd) in f32; HF rounds the scale to the weights'
        // dtype, which for bf16 checkpoints is 25.25 instead of 25.30 at hidden 640.
        let ends = EmbeddingAndHead::load(reader, &config, hidden_states_only)?
            .with_embedding_scale((config.hidden_size as f32).sqrt());
        let layers = (0..config.num_layers)
            .map(|layer| GemmaLayer::load(reader, &config, layer))
            .collect::<Result<Vec<_>>>()?;
        let per_layer = config
            .per_layer_input_size
            .map(|width| PerLayerEmbeddings::load(reader, &config, width))
            .transpose()?;
        Ok(GemmaModel {
            kv_layout,
            global_rope: global_rope(reader, &config)?,
            local_rope: Rope::local_from_config(&config)?,
            config,
            ends,
            layers,
            per_layer,
        })
    }

    /// Sizes every workspace buffer for `n` tokens and `rows` logits rows.
    fn prepare(&self, workspace: &mut Workspace, n: usize, rows: usize) {
        let config = &self.config;
        workspace.prepare_residual(n, rows, config.hidden_size);
        workspace
            .attention
            .prepare(n, AttentionShape::widest(config));
        let widest_mlp = (0..config.num_layers)
            .map(|layer| config.layer_intermediate_size(layer))
            .max()
            .unwrap_or(config.intermediate_size);
        workspace.mlp.prepare(n, widest_mlp);
        if let Some(moe) = config.moe {
            workspace.moe.prepare(n, config.hidden_size, moe);
            workspace.prepare_routed(n, config.hidden_size);
        }
        if let Some(per_layer) = &self.per_layer {
            per_layer.prepare(&mut workspace.per_layer, n);
        }
    }

    /// Validates the batch, embeds it and runs every block: the residual stream in
    /// `workspace.hidden` is then ready for the final norm (sized for `rows` logits rows).
    ///
    /// With `prune`, the layers after the last one that writes the cache (Gemma 4's KV-shared
    /// layers) run only on the rows the logits depend on ([`BatchInput::logits_suffix`]):
    /// the returned batch then describes `workspace.hidden`'s rows (`None`: `step`'s do).
    /// Each row's values are the same either way: every block but attention is row by row,
    /// and attention reads the same cache as a later prefill chunk would.
    fn run_layers(
        &self,
        step: &Step<'_>,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        rows: usize,
        prune: bool,
    ) -> Result<Option<BatchInput>> {
        validate_batch(&self.config, step.batch, kv)?;
        self.prepare(workspace, step.num_tokens(), rows);
        self.ends.embed(step, workspace)?;
        if let Some(per_layer) = &self.per_layer {
            per_layer.inputs(step, workspace)?;
        }
        let cached = self.config.num_kv_cache_layers();
        let (writing, shared) = self.layers.split_at(cached.min(self.layers.len()));
        self.run_range(step, writing, 0, kv, workspace)?;
        if shared.is_empty() {
            return Ok(None);
        }
        let pruned = match prune.then(|| step.batch.logits_suffix()).flatten() {
            Some((batch, kept)) => {
                compact_rows(&mut workspace.hidden, self.config.hidden_size, &kept);
                if let Some(per_layer) = &self.per_layer {
                    per_layer.keep_rows(&mut workspace.per_layer, &kept);
                }
                self.prepare(workspace, batch.num_tokens(), rows);
                Some(batch)
            }
            None => None,
        };
        let reduced = pruned.as_ref().map(|batch| Step {
            pool: step.pool,
            batch,
        });
        let step = reduced.as_ref().unwrap_or(step);
        if step.num_tokens() > 0 {
            self.run_range(step, shared, writing.len(), kv, workspace)?;
        }
        Ok(pruned)
    }

    /// Runs `layers`, the model's layers from `first` on.
    fn run_range(
        &self,
        step: &Step<'_>,
        layers: &[GemmaLayer],
        first: usize,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
    ) -> Result<()> {
        for (offset, layer) in layers.iter().enumerate() {
            let rope = match (&self.local_rope, layer.local) {
                (Some(local), true) => local,
                _ => &self.global_rope,
            };
            let index = first + offset;
            layer.forward(step, rope, (index, self.layers.len()), kv, workspace)?;
        }
        Ok(())
    }
}

/// Gemma 4's mixture of experts: the routed experts with their own norms, and the norm of the
/// dense MLP's output before the two are summed.
#[derive(Debug)]
struct RoutedExperts {
    /// The MLP's output norm (`post_ffw_norm_1`, HF `post_feedforward_layernorm_1`).
    post_mlp_norm: RmsNorm,
    /// The experts' input norm (`pre_ffw_norm_2`).
    pre_norm: RmsNorm,
    block: MoeBlock,
    /// The experts' output norm (`post_ffw_norm_2`).
    post_norm: RmsNorm,
}

impl RoutedExperts {
    fn load(tensors: &LayerTensors<'_>, config: &ModelConfig) -> Result<Option<RoutedExperts>> {
        let Some(moe) = config.moe else {
            return Ok(None);
        };
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(Some(RoutedExperts {
            post_mlp_norm: tensors.rms_norm("post_ffw_norm_1.weight", hidden, eps)?,
            pre_norm: tensors.rms_norm("pre_ffw_norm_2.weight", hidden, eps)?,
            block: MoeBlock::load(tensors, config, moe, Routing::Scaled, Activation::GeluTanh)?,
            post_norm: tensors.rms_norm("post_ffw_norm_2.weight", hidden, eps)?,
        }))
    }

    /// With the MLP's output in `ws.projected` and the residual stream in `ws.hidden`:
    /// `ws.projected = post_mlp(projected) + post(experts(pre(hidden)))`, routed by `hidden`.
    fn forward(&self, step: &Step<'_>, layer: usize, ws: &mut Workspace) -> Result<()> {
        let pool = step.pool;
        self.post_mlp_norm
            .forward_rows(pool, &ws.projected, &mut ws.normed)?;
        self.pre_norm
            .forward_rows(pool, &ws.hidden, &mut ws.projected)?;
        self.block
            .route(step, layer, &ws.hidden, &mut ws.moe, &mut ws.linear)?;
        let n = step.num_tokens() * self.pre_norm.width();
        let Some(routed) = ws.routed.get_mut(..n) else {
            return Err(ModelError::InvalidBatch(format!(
                "experts' output buffer not prepared for {} tokens",
                step.num_tokens()
            )));
        };
        self.block.experts(
            step,
            layer,
            &ws.projected,
            &mut ws.moe,
            &mut ws.linear,
            routed,
        )?;
        self.post_norm
            .forward_rows(pool, routed, &mut ws.projected)?;
        tokenmill_kernels::add_rows(pool, &mut ws.projected, &ws.normed, self.pre_norm.width())?;
        Ok(())
    }

    fn storage_bytes(&self) -> usize {
        self.block.storage_bytes()
    }

    fn decode_bytes(&self) -> usize {
        self.block.decode_bytes()
    }
}

/// The global layers' RoPE table: Gemma 4's proportional RoPE over their own head size (the
/// GGUF's `rope_freqs.weight` marks the unrotated pairs with huge divisors; HF's turn not at
/// all), or the config's table.
fn global_rope(reader: &WeightReader<'_>, config: &ModelConfig) -> Result<Rope> {
    let Some(full) = config.full_attention else {
        return Rope::from_config(config);
    };
    let pairs = full.head_dim / 2;
    let factors = if reader.contains("rope_freqs.weight") {
        reader.vector_named("rope_freqs.weight", pairs)?
    } else {
        (0..pairs)
            .map(|pair| {
                if pair < full.rotated_pairs {
                    1.0
                } else {
                    f32::INFINITY
                }
            })
            .collect()
    };
    Rope::with_factors(config, full.head_dim, config.rope_theta, &factors)
}

impl GemmaLayer {
    fn load(reader: &WeightReader<'_>, config: &ModelConfig, layer: usize) -> Result<GemmaLayer> {
        let tensors = reader.layer(layer);
        let (hidden, eps) = (config.hidden_size, config.rms_norm_eps);
        let options = AttentionOptions::for_layer(config, layer);
        let shape = AttentionShape::of_layer(config, layer);
        let output_scale = if tensors.contains("layer_output_scale.weight") {
            tensors
                .vector("layer_output_scale.weight", 1)?
                .first()
                .copied()
        } else {
            None
        };
        Ok(GemmaLayer {
            attn_norm: tensors.rms_norm("attn_norm.weight", hidden, eps)?,
            attention: AttentionBlock::load(&tensors, shape, hidden, options)?,
            post_attention_norm: tensors.rms_norm("post_attention_norm.weight", hidden, eps)?,
            ffn_norm: tensors.rms_norm("ffn_norm.weight", hidden, eps)?,
            mlp: GatedMlp::load(
                &tensors,
                hidden,
                config.layer_intermediate_size(layer),
                Activation::GeluTanh,
            )?,
            experts: RoutedExperts::load(&tensors, config)?,
            post_ffw_norm: tensors.rms_norm("post_ffw_norm.weight", hidden, eps)?,
            per_layer: config
                .per_layer_input_size
                .map(|width| PerLayerGate::load(&tensors, config, width))
                .transpose()?,
            output_scale,
            local: options.sliding_window.is_some(),
        })
    }

    fn storage_bytes(&self) -> usize {
        self.dense_bytes()
            + self
                .experts
                .as_ref()
                .map_or(0, RoutedExperts::storage_bytes)
    }

    /// Bytes one decode token reads: the dense weights and the experts it is routed to.
    fn decode_bytes(&self) -> usize {
        self.dense_bytes() + self.experts.as_ref().map_or(0, RoutedExperts::decode_bytes)
    }

    fn dense_bytes(&self) -> usize {
        self.attention.storage_bytes()
            + self.mlp.storage_bytes()
            + self
                .per_layer
                .as_ref()
                .map_or(0, PerLayerGate::storage_bytes)
    }

    /// `x += post(attn(pre(x))); x += post(mlp(pre(x)))` on the workspace's residual stream,
    /// then the per-layer embedding's part and the layer's scalar (Gemma 4; `layers`: the
    /// model's layer count, the per-layer inputs' stride).
    fn forward(
        &self,
        step: &Step<'_>,
        rope: &Rope,
        (index, layers): (usize, usize),
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
        if let Some(experts) = &self.experts {
            experts.forward(step, index, ws)?;
        }
        ws.add_normed_residual(step.pool, &self.post_ffw_norm)?;
        if let Some(per_layer) = &self.per_layer {
            per_layer.forward(step, index, layers, ws)?;
        }
        if let Some(scale) = self.output_scale {
            let n = step.num_tokens() * self.attn_norm.width();
            ws.hidden[..n].iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }
}

impl CausalLm for GemmaModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_layout(&self) -> &[LayerKvLayout] {
        &self.kv_layout
    }

    fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(GemmaLayer::storage_bytes).sum();
        let per_layer = self
            .per_layer
            .as_ref()
            .map_or(0, PerLayerEmbeddings::storage_bytes);
        layers + per_layer + self.ends.storage_bytes()
    }

    /// The per-layer embedding table is read one row per token, its projection whole; of
    /// the experts only those a token is routed to.
    fn decode_weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(GemmaLayer::decode_bytes).sum();
        let per_layer = self
            .per_layer
            .as_ref()
            .map_or(0, PerLayerEmbeddings::decode_bytes);
        layers + per_layer + self.ends.decode_bytes()
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
        let rows = batch.logits_indices.len();
        let pruned = self.run_layers(&step, kv, workspace, rows, true)?;
        let batch = pruned.as_ref().unwrap_or(batch);
        self.ends.logits(&Step { pool, batch }, workspace, logits)
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
        self.run_layers(&step, kv, workspace, 0, false)?;
        self.ends.final_hidden(&step, workspace, hidden)
    }
}

/// HF's names for the tensors whose GGUF names mean something else in the Gemma block: four
/// norms per layer, so `post_attention_layernorm` is the norm after attention (GGUF
/// `post_attention_norm`), not the one before the MLP (`ffn_norm`).
const GEMMA3_HF_RENAMES: &[(&str, &str)] =
    &[("ffn_norm.weight", "pre_feedforward_layernorm.weight")];

/// Gemma 3's renames, Gemma 4's per-layer embedding gate and layer scalar, and its router,
/// 3-D expert tensors and the norms around them.
const GEMMA4_HF_RENAMES: &[(&str, &str)] = &[
    ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
    ("ffn_gate_inp.weight", "router.proj.weight"),
    ("ffn_gate_inp.scale", "router.scale"),
    ("ffn_down_exps.scale", "router.per_expert_scale"),
    ("ffn_gate_up_exps.weight", "experts.gate_up_proj"),
    ("ffn_down_exps.weight", "experts.down_proj"),
    (
        "post_ffw_norm_1.weight",
        "post_feedforward_layernorm_1.weight",
    ),
    (
        "pre_ffw_norm_2.weight",
        "pre_feedforward_layernorm_2.weight",
    ),
    (
        "post_ffw_norm_2.weight",
        "post_feedforward_layernorm_2.weight",
    ),
    ("inp_gate.weight", "per_layer_input_gate.weight"),
    ("proj.weight", "per_layer_projection.weight"),
    ("post_norm.weight", "post_per_layer_input_norm.weight"),
    ("layer_output_scale.weight", "layer_scalar"),
];
