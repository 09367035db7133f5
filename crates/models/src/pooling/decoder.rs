//! Decoders as embedders (vLLM's `--convert embed`, Qwen3-Embedding's recipe): any
//! [`CausalLm`] runs its usual causal forward pass over each whole sequence, stops after the
//! final norm ([`CausalLm::forward_hidden`]) and the rows are pooled — the last token's by
//! default (vLLM's default for converted decoders), or the mean, or the first.
//!
//! The pass needs K/V for its own sequences only: they go to a scratch cache in the
//! [`EncoderWorkspace`] whose blocks are handed out afresh each step (sequence after
//! sequence), so nothing is kept between steps and a row depends on its own tokens only. Each
//! layer attends only over the K/V it has just written, so all layers share one f32 buffer
//! ([`KvCacheGrouping::shared_scratch`]): the scratch is one layer's K/V for the step's tokens.

use std::path::Path;

use serde::Deserialize;
use tokenmill_kernels::{KvCacheDType, ThreadPool};

use super::{
    pool_rows, read_json, sentence_transformers_max_len, sentence_transformers_pooling,
    EncoderBatch, EncoderWorkspace, PoolingMethod, PoolingModel, PoolingModelInfo, PoolingTask,
};
use crate::batch::BatchInput;
use crate::error::{ModelError, Result};
use crate::families::load_model;
use crate::kv_cache::{KvCacheGrouping, KvCacheStorage};
use crate::layers::Workspace;
use crate::model::{CausalLm, LoadOptions};
use crate::source::ModelSource;

/// Tokens per block of the scratch cache.
const SCRATCH_BLOCK: usize = 16;

/// A decoder-only language model served as an embedding model.
#[derive(Debug)]
pub struct DecoderEmbedder {
    model: Box<dyn CausalLm>,
    pub(crate) info: PoolingModelInfo,
}

/// The decoder pass's buffers inside an [`EncoderWorkspace`]: the flattened batch, the
/// scratch K/V (grown to the largest step), the decoder's activations and its hidden rows.
#[derive(Debug, Default)]
pub(crate) struct DecoderScratch {
    batch: BatchInput,
    block_table: Vec<u32>,
    kv: Option<KvCacheStorage>,
    workspace: Workspace,
    hidden: Vec<f32>,
}

/// The `config.json` fields an HF embedder adds to a decoder's.
#[derive(Deserialize, Default)]
struct EmbedderFields {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    is_matryoshka: Option<bool>,
    #[serde(default)]
    matryoshka_dimensions: Option<Vec<usize>>,
}

impl DecoderEmbedder {
    /// Loads a decoder checkpoint (GGUF or HF directory; any family [`load_model`] knows) as
    /// an embedder: last-token pooling, normalized, unless an HF directory's
    /// sentence-transformers modules (`modules.json`, `1_Pooling/config.json`) say otherwise.
    pub fn load(source: &ModelSource) -> Result<DecoderEmbedder> {
        let options = LoadOptions {
            hidden_states_only: true,
            ..LoadOptions::default()
        };
        let model = load_model(source, &options)?;
        let config = model.config();
        let default = (PoolingMethod::Last, true);
        let (architecture, method, normalize, max_len, matryoshka) = match source {
            ModelSource::Gguf(_) => (
                config.architecture.name().to_string(),
                default.0,
                default.1,
                config.max_position_embeddings,
                None,
            ),
            ModelSource::HfDirectory(dir) => {
                let fields: EmbedderFields = read_json(&dir.join("config.json"))?;
                let (method, normalize) = sentence_transformers_pooling(dir, default)?;
                let max_len = sentence_transformers_max_len(dir)
                    .map_or(config.max_position_embeddings, |len| {
                        len.min(config.max_position_embeddings)
                    });
                let matryoshka = match (fields.matryoshka_dimensions, fields.is_matryoshka) {
                    (Some(dimensions), _) => Some(dimensions),
                    (None, Some(true)) => Some(Vec::new()),
                    _ => None,
                };
                let architecture = fields
                    .architectures
                    .first()
                    .cloned()
                    .unwrap_or_else(|| config.architecture.name().to_string());
                (architecture, method, normalize, max_len, matryoshka)
            }
        };
        let info = PoolingModelInfo {
            architecture: format!("{architecture} (as embedder)"),
            task: PoolingTask::Embed,
            output_dim: config.hidden_size,
            labels: Vec::new(),
            vocab_size: config.vocab_size,
            max_model_len: max_len,
            method,
            normalize,
            matryoshka_dimensions: matryoshka,
        };
        Ok(DecoderEmbedder { model, info })
    }
}

/// Whether an HF directory's `config.json` describes a decoder the generation loader knows
/// (its `model_type`), i.e. one `--convert embed` applies to.
pub(crate) fn hf_dir_is_decoder(dir: &Path) -> bool {
    crate::families::read_model_config(&ModelSource::HfDirectory(dir.to_path_buf())).is_ok()
}

impl PoolingModel for DecoderEmbedder {
    fn info(&self) -> &PoolingModelInfo {
        &self.info
    }

    fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    fn pool(
        &self,
        pool: &ThreadPool,
        batch: &EncoderBatch,
        workspace: &mut EncoderWorkspace,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if batch.token_type_ids.iter().any(|&t| t != 0) {
            return Err(ModelError::InvalidBatch(
                "a decoder embedder takes single texts, not token-type-id pairs".into(),
            ));
        }
        let scratch = &mut workspace.decoder;
        let blocks: usize = batch
            .seqs
            .iter()
            .map(|seq| seq.len.div_ceil(SCRATCH_BLOCK))
            .sum();
        if scratch
            .kv
            .as_ref()
            .is_none_or(|kv| kv.num_blocks() < blocks)
        {
            // Drop the old cache before allocating the larger one.
            scratch.kv = None;
            // KV-shared layers (Gemma 4's) read an earlier layer's K/V after later layers
            // wrote theirs, so such a model keeps a buffer per layer.
            let layout = self.model.kv_layout();
            let grouping = if self.model.config().kv_shared_layers > 0 {
                KvCacheGrouping::single(layout)
            } else {
                KvCacheGrouping::shared_scratch(layout)
            };
            scratch.kv = Some(KvCacheStorage::grouped(
                grouping,
                blocks,
                SCRATCH_BLOCK,
                KvCacheDType::F32,
            ));
        }
        let Some(kv) = scratch.kv.as_mut() else {
            return Err(ModelError::InvalidBatch("no scratch KV cache".into()));
        };
        scratch.batch.clear();
        let mut next_block = 0u32;
        for seq in &batch.seqs {
            let ids = batch
                .token_ids
                .get(seq.start..seq.start + seq.len)
                .ok_or_else(|| ModelError::InvalidBatch("a sequence outside the batch".into()))?;
            let count = seq.len.div_ceil(SCRATCH_BLOCK) as u32;
            scratch.block_table.clear();
            scratch.block_table.extend(next_block..next_block + count);
            next_block += count;
            scratch
                .batch
                .add_sequence(ids, 0, &scratch.block_table, SCRATCH_BLOCK, false)?;
        }
        self.model.forward_hidden(
            pool,
            &scratch.batch,
            kv,
            &mut scratch.workspace,
            &mut scratch.hidden,
        )?;
        let h = self.info.output_dim;
        out.clear();
        out.resize(batch.seqs.len() * h, 0.0);
        for (seq, row) in batch.seqs.iter().zip(out.chunks_exact_mut(h)) {
            let rows = &scratch.hidden[seq.start * h..(seq.start + seq.len) * h];
            pool_rows(self.info.method, rows, h, row);
        }
        Ok(())
    }
}
