//! The model seam: the [`CausalLm`] trait every family implements, and the loader that picks
//! the family from the architecture a checkpoint declares.

use std::any::Any;

use tokenmill_gguf::GgufFile;
use tokenmill_kernels::ThreadPool;

use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::families::WeightSource;
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::Workspace;
use crate::source::ModelSource;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Expand quantized weights to f32 at load: exact weights and the dense f32 kernels, at
    /// 4-8x the memory. For accuracy checks and prefill-heavy work.
    pub dequantize_to_f32: bool,
    /// Skip an untied output head (`output.weight` / `lm_head.weight`): the model then serves
    /// [`CausalLm::forward_hidden`] only (decoder embedders; a checkpoint saved as a bare
    /// `*Model` has no head) and `forward` is an error.
    pub hidden_states_only: bool,
}

/// A causal language model over a paged KV cache: what the engine, `bench speed` and the
/// tests drive, whatever the family.
///
/// A model owns its weights only. The KV cache, the activation [`Workspace`] and the thread
/// pool are the caller's, so one model serves any number of caches and the caller decides
/// where threads come from (the engine's sampler runs on the same pool). `forward` takes a
/// flattened batch of many sequences, mixing prefill chunks and decode tokens, and must give
/// each row the same result whatever else is in the batch.
pub trait CausalLm: Any + Send + Sync + std::fmt::Debug {
    /// The hyper-parameters the model was loaded with.
    fn config(&self) -> &ModelConfig;

    /// What each layer keeps in the KV cache; [`KvCacheStorage`] is sized from it.
    fn kv_layout(&self) -> &[LayerKvLayout];

    /// Bytes of weight storage in the compute layer's layout.
    fn weight_bytes(&self) -> usize;

    /// Bytes of weights one decode step reads in full: every layer matrix and the output
    /// projection (the embedding table when the head is tied). An untied embedding table is
    /// left out: a step reads only one of its rows per token.
    fn decode_weight_bytes(&self) -> usize;

    /// Runs one step over a flattened batch on `pool`: writes every token's K/V into `kv` at
    /// its slot, attends over each sequence's cached context, and leaves
    /// `[batch.logits_indices.len(), vocab_size]` logits in `logits`.
    fn forward(
        &self,
        pool: &ThreadPool,
        batch: &BatchInput,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        logits: &mut Vec<f32>,
    ) -> Result<()>;

    /// Runs the same step as [`CausalLm::forward`] but stops after the final norm: leaves
    /// every token's last hidden state, `[batch.num_tokens()][hidden_size]`, in `hidden`
    /// instead of logits (`logits_indices` is ignored). The pooling runner's decoder
    /// embedders pool these rows.
    fn forward_hidden(
        &self,
        pool: &ThreadPool,
        batch: &BatchInput,
        kv: &mut KvCacheStorage,
        workspace: &mut Workspace,
        hidden: &mut Vec<f32>,
    ) -> Result<()>;
}

/// Loads the model a [`ModelSource`] names, through the family its architecture names in the
/// registry (`crate::families`).
///
/// A boxed trait object rather than an enum of families: the engine never names a family, a
/// family file (and its registry line) is all a new architecture adds, and a backend in
/// another crate can implement [`CausalLm`] too. The cost is one virtual call per forward
/// pass, nothing next to the pass itself.
pub fn load_model(source: &ModelSource, options: &LoadOptions) -> Result<Box<dyn CausalLm>> {
    match source {
        ModelSource::Gguf(path) => load_gguf_model(&GgufFile::open(path)?, options),
        ModelSource::HfDirectory(dir) => {
            let config = ModelConfig::from_hf_config_file(&dir.join("config.json"))?;
            let family = config.architecture.family();
            family.build(WeightSource::HfDirectory(dir), config, options)
        }
    }
}

/// Loads a model from an open GGUF file, so its tokenizer can be read from the same file.
pub fn load_gguf_model(file: &GgufFile, options: &LoadOptions) -> Result<Box<dyn CausalLm>> {
    let config = ModelConfig::from_gguf(file)?;
    let family = config.architecture.family();
    family.build(WeightSource::Gguf(file), config, options)
}

/// Reads a model's hyper-parameters from its metadata only (no weights), e.g. to size a KV
/// budget before loading.
pub fn read_model_config(source: &ModelSource) -> Result<ModelConfig> {
    match source {
        ModelSource::Gguf(path) => ModelConfig::from_gguf(&GgufFile::open(path)?),
        ModelSource::HfDirectory(dir) => ModelConfig::from_hf_config_file(&dir.join("config.json")),
    }
}

/// The cache layout a model with `config` will report ([`CausalLm::kv_layout`]), without
/// loading it: its family's declaration.
pub fn kv_layout(config: &ModelConfig) -> Vec<LayerKvLayout> {
    config.architecture.family().kv_layout(config)
}

/// The concrete model behind a loaded one: the per-block loaders (`LlamaModel::load`) load
/// through the registry and check that the family built their block.
pub(crate) fn downcast_model<M: CausalLm>(model: Box<dyn CausalLm>, block: &str) -> Result<M> {
    let architecture = model.config().architecture.name();
    let model: Box<dyn Any> = model;
    model
        .downcast::<M>()
        .map(|model| *model)
        .map_err(|_| ModelError::InvalidMetadata {
            key: "general.architecture".into(),
            message: format!(
                "`{architecture}` does not run on the {block} block (load_model picks its family's)"
            ),
        })
}

/// Checks a batch against the model and cache before any kernel reads it: every family's
/// `forward` starts here.
pub(crate) fn validate_batch(
    config: &ModelConfig,
    batch: &BatchInput,
    kv: &KvCacheStorage,
) -> Result<()> {
    let n = batch.num_tokens();
    if batch.positions.len() != n || batch.slot_mapping.len() != n {
        return Err(ModelError::InvalidBatch(format!(
            "{n} tokens but {} positions and {} slots",
            batch.positions.len(),
            batch.slot_mapping.len()
        )));
    }
    if kv.num_layers() != config.num_layers {
        return Err(ModelError::InvalidBatch(format!(
            "KV cache has {} layers, model has {}",
            kv.num_layers(),
            config.num_layers
        )));
    }
    if let Some(&token) = batch
        .token_ids
        .iter()
        .find(|&&token| token as usize >= config.vocab_size)
    {
        return Err(ModelError::InvalidBatch(format!(
            "token id {token} is outside the vocabulary of {}",
            config.vocab_size
        )));
    }
    let lora = &batch.lora;
    if !lora.slots.is_empty() && lora.slots.len() != n {
        return Err(ModelError::InvalidBatch(format!(
            "{n} tokens but {} LoRA slots",
            lora.slots.len()
        )));
    }
    if let Some(&slot) = lora
        .slots
        .iter()
        .find(|&&slot| slot as usize > lora.adapters.len())
    {
        return Err(ModelError::InvalidBatch(format!(
            "LoRA slot {slot} but the step has {} adapters",
            lora.adapters.len()
        )));
    }
    if let Some(adapter) = lora
        .adapters
        .iter()
        .find(|adapter| adapter.num_layers() != config.num_layers)
    {
        return Err(ModelError::InvalidBatch(format!(
            "LoRA adapter {} has {} layers, model has {}",
            adapter.path().display(),
            adapter.num_layers(),
            config.num_layers
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
