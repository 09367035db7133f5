//! Gemma 3 (text). Each block norms both sides of attention and of the MLP:
//! `x += post_attn(attn(pre_attn(x))); x += post_ffw(mlp(pre_ffw(x)))`, with QK-norm, a
//! GELU-tanh gate, embeddings scaled by `sqrt(hidden)` and a head tied to the 262k-token
//! embedding. Five of every six layers are local (a sliding window, RoPE base 10,000, no
//! scaling); every sixth is global (the file's RoPE base and scaling, the whole context).
//!
//! Norm weights are stored as the `w` of `x * (1 + w)` in HF checkpoints and with the 1
//! already added in GGUF files (llama.cpp's converter adds it), so the HF loader folds it in
//! and both compute a plain RMSNorm.

use std::path::Path;

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::ThreadPool;

use serde::Deserialize;

use super::{Family, WeightSource};
use crate::batch::BatchInput;
use crate::config::{
    parse_config_json, Architecture, GgufMetadata, HfCommon, ModelConfig, RopeStyle,
};
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::{
    Activation, AttentionBlock, AttentionOptions, AttentionShape, EmbeddingAndHead, GatedMlp,
    RmsNorm, Rope, Step, Workspace,
};
use crate::loader::{TensorNaming, TensorStore, WeightReader};
use crate::model::{
    downcast_model, load_gguf_model, load_model, validate_batch, CausalLm, LoadOptions,
};
use crate::source::ModelSource;

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
    /// Loads from an open GGUF file (whose tokenizer the caller may read as well); an error
    /// unless it is a Gemma 3 file ([`crate::load_gguf_model`] loads any family).
    pub fn from_gguf(file: &GgufFile, options: &LoadOptions) -> Result<Gemma3Model> {
        downcast_model(load_gguf_model(file, options)?, "Gemma 3")
    }

    /// Loads an HF directory (`config.json` + safetensors of a `Gemma3ForCausalLM`).
    pub fn load_hf_directory(dir: &Path, options: &LoadOptions) -> Result<Gemma3Model> {
        let source = ModelSource::HfDirectory(dir.to_path_buf());
        downcast_model(load_model(&source, options)?, "Gemma 3")
    }

    fn build(
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

pub(super) struct Gemma3;

const GEMMA3: Architecture = Architecture::new("gemma3", &Gemma3);

/// Gemma 3's `config.json` (`Gemma3TextConfig`): the shared fields and its own.
#[derive(Deserialize)]
struct Gemma3Config {
    #[serde(flatten)]
    common: HfCommon,
    sliding_window: Option<usize>,
    /// The older period form and the newer per-layer list of local and global layers.
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    hidden_activation: Option<String>,
}

impl Family for Gemma3 {
    fn architecture(&self) -> Architecture {
        GEMMA3
    }

    /// HF calls the text model `gemma3_text`.
    fn aliases(&self) -> &'static [&'static str] {
        &["gemma3_text"]
    }

    /// llama.cpp's Gemma 3: every sixth layer global, local layers on base 10,000. GGUF has
    /// no `query_pre_attn_scalar`: llama.cpp scales by head_dim^-1/2, except for the 27B model
    /// (62 layers), which uses hidden / heads.
    fn config_from_gguf(&self, gguf: &GgufMetadata<'_>) -> Result<ModelConfig> {
        let mut config = gguf.decoder_config("Gemma 3", RopeStyle::Neox)?;
        config.sliding_window_pattern = Some(6);
        config.rope_local_theta = config.sliding_window.map(|_| 10_000.0);
        config.query_pre_attn_scalar =
            (config.num_layers == 62).then(|| (config.hidden_size / config.num_heads) as f32);
        Ok(config)
    }

    fn config_from_hf(&self, config_json: &str) -> Result<ModelConfig> {
        let mut raw: Gemma3Config = parse_config_json(config_json)?;
        let period = global_layer_period(&raw)?;
        // Its config defaults to a tied head; its local layers come from `layer_types`.
        let tie_word_embeddings = raw.common.tie_word_embeddings.unwrap_or(true);
        raw.common.use_sliding_window = None;
        let mut config = raw.common.decoder_config(GEMMA3, "Gemma 3")?;
        config.tie_word_embeddings = tie_word_embeddings;
        config.qk_norm = true;
        config.sliding_window = raw.sliding_window;
        config.sliding_window_pattern = Some(period);
        config.rope_local_theta = Some(raw.rope_local_base_freq.unwrap_or(10_000.0) as f32);
        config.query_pre_attn_scalar = raw.query_pre_attn_scalar.map(|v| v as f32);
        config.final_logit_softcapping = raw.final_logit_softcapping.map(|v| v as f32);
        if raw.attn_logit_softcapping.is_some() {
            return Err(ModelError::InvalidMetadata {
                key: "attn_logit_softcapping".into(),
                message: "attention logit soft-capping is not supported".into(),
            });
        }
        if let Some(activation) = raw.hidden_activation.as_deref() {
            if activation != "gelu_pytorch_tanh" {
                return Err(ModelError::InvalidMetadata {
                    key: "hidden_activation".into(),
                    message: format!("unsupported activation `{activation}`"),
                });
            }
        }
        Ok(config)
    }

    fn build(
        &self,
        weights: WeightSource<'_>,
        config: ModelConfig,
        options: &LoadOptions,
    ) -> Result<Box<dyn CausalLm>> {
        let kv_layout = self.kv_layout(&config);
        Ok(Box::new(Gemma3Model::build(
            weights, config, kv_layout, options,
        )?))
    }
}

/// The period of global layers from `layer_types` (which must follow one) or
/// `sliding_window_pattern`, 6 when neither is given.
fn global_layer_period(raw: &Gemma3Config) -> Result<usize> {
    let Some(types) = &raw.layer_types else {
        return Ok(raw.sliding_window_pattern.unwrap_or(6).max(1));
    };
    let period = types
        .iter()
        .position(|kind| kind == "full_attention")
        .map_or(types.len() + 1, |index| index + 1);
    let periodic = types.iter().enumerate().all(|(layer, kind)| {
        let global = (layer + 1).is_multiple_of(period);
        kind == if global {
            "full_attention"
        } else {
            "sliding_attention"
        }
    });
    if !periodic {
        return Err(ModelError::InvalidMetadata {
            key: "layer_types".into(),
            message: "only a periodic pattern ending each period with a global layer is supported"
                .into(),
        });
    }
    Ok(period)
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;

    const GEMMA3_270M: &str = r#"{"architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": null,
        "sliding_window": 512, "query_pre_attn_scalar": 256,
        "final_logit_softcapping": null, "attn_logit_softcapping": null,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention",
            "sliding_attention", "sliding_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "full_attention"]}"#;

    #[test]
    fn gemma3_layers_alternate_five_local_one_global() {
        let config = ModelConfig::from_hf_config_json(GEMMA3_270M).unwrap();
        assert_eq!(config.architecture, "gemma3");
        assert_eq!(config.sliding_window_pattern, Some(6));
        let globals: Vec<usize> = (0..config.num_layers)
            .filter(|&layer| config.layer_sliding_window(layer).is_none())
            .collect();
        assert_eq!(globals, [5, 11, 17]);
        assert_eq!(config.layer_sliding_window(0), Some(512));
        assert_eq!(config.rope_local_theta, Some(10_000.0));
        assert_eq!(config.attention_scale(), 1.0 / 16.0);
        assert!(config.qk_norm && config.final_logit_softcapping.is_none());
        let odd = GEMMA3_270M.replacen(r#""full_attention""#, r#""sliding_attention""#, 1);
        assert!(ModelConfig::from_hf_config_json(&odd).is_err());
        let gelu = GEMMA3_270M.replace("gelu_pytorch_tanh", "relu");
        assert!(ModelConfig::from_hf_config_json(&gelu).is_err());
    }
}
