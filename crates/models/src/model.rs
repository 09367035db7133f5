//! The model seam: the [`CausalLm`] trait every family's model implements, and the batch
//! check every forward pass starts with. Loading goes through the family registry
//! (`crate::families`: `load_model`).

use std::any::Any;

use tokenmill_kernels::ThreadPool;

use crate::batch::BatchInput;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::layers::Workspace;
use crate::state_cache::LayerStateLayout;

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

    /// What each attention layer keeps in the KV cache, in layer order; [`KvCacheStorage`]
    /// is sized from it. A model with recurrent layers lists its attention layers only.
    fn kv_layout(&self) -> &[LayerKvLayout];

    /// What each recurrent (linear-attention / state-space) layer keeps per sequence, in
    /// layer order: the [`crate::StateCacheStorage`] inside the KV cache is sized from it, and
    /// every sequence of a step names its slot in [`BatchInput::state_slots`]. Empty (the
    /// default) for a pure transformer.
    fn state_layout(&self) -> &[LayerStateLayout] {
        &[]
    }

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
    // KV-shared layers (Gemma 4's) read another layer's cache and keep none of their own.
    let cached_layers = kv.num_layers() + kv.state().num_layers();
    if cached_layers + config.kv_shared_layers != config.num_layers {
        return Err(ModelError::InvalidBatch(format!(
            "KV and state cache have {cached_layers} layers, model has {} ({} sharing another's KV)",
            config.num_layers, config.kv_shared_layers
        )));
    }
    if kv.state().num_layers() > 0 && batch.state_slots.len() != batch.seqs.len() {
        return Err(ModelError::InvalidBatch(format!(
            "{} sequences but {} recurrent-state slots",
            batch.seqs.len(),
            batch.state_slots.len()
        )));
    }
    if let Some(&slot) = batch
        .state_slots
        .iter()
        .find(|&&slot| slot as usize >= kv.state().num_slots())
    {
        return Err(ModelError::InvalidBatch(format!(
            "recurrent-state slot {slot} but the cache has {}",
            kv.state().num_slots()
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
