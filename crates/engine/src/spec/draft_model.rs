//! The `draft_model` proposer: a second, smaller [`CausalLm`] with the same vocabulary and
//! its own paged KV cache. For each decoding request it feeds the tokens it has not seen yet
//! (one chunk), then decodes k tokens greedily, one forward pass each. Its cache keeps the
//! request's real tokens; the slots its drafts wrote are overwritten when the request's next
//! real tokens are fed, so nothing is rolled back. Greedy drafts are point proposals, which
//! the target's verification accepts with exactly the target's probabilities.

use std::collections::HashMap;
use std::sync::Arc;

use tokenmill_core::{KvCacheConfig, KvCacheGroups, KvCacheManager, RequestId};
use tokenmill_models::{argmax, BatchInput, KvCacheDType, KvCacheStorage, ModelSource, Workspace};

use super::Proposer;
use crate::model_runner::LoadedModel;
use crate::EngineError;

/// What the draft model's cache is sized from: the target engine's pool.
#[derive(Debug, Clone, Copy)]
pub struct DraftSetup {
    /// Blocks of the target's KV pool; the draft gets as many (as many tokens).
    pub num_blocks: usize,
    pub block_size: usize,
    /// The target's vocabulary: the draft's must be the same size.
    pub vocab_size: usize,
    pub num_threads: Option<usize>,
    /// The target's KV element type; the draft's cache stores the same (as in vLLM, one
    /// `--kv-cache-dtype` for both).
    pub kv_dtype: KvCacheDType,
}

/// See the module docs.
pub struct DraftModelProposer {
    loaded: Arc<LoadedModel>,
    kv_cache: KvCacheStorage,
    blocks: KvCacheManager,
    block_size: usize,
    workspace: Workspace,
    batch: BatchInput,
    logits: Vec<f32>,
    /// Tokens of each request whose KV the draft's cache holds.
    computed: HashMap<RequestId, usize>,
}

impl std::fmt::Debug for DraftModelProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModelProposer")
            .field("model", &self.loaded)
            .finish_non_exhaustive()
    }
}

impl DraftModelProposer {
    /// Loads the draft model at `model` (a GGUF file or HF directory) and its cache.
    pub fn load(
        model: &std::path::Path,
        setup: &DraftSetup,
    ) -> Result<DraftModelProposer, EngineError> {
        let loaded = LoadedModel::load(
            &ModelSource::from_path(model),
            None,
            None,
            setup.num_threads,
        )?;
        let draft_vocab = loaded.config().vocab_size;
        if draft_vocab != setup.vocab_size {
            return Err(EngineError::Config(format!(
                "--speculative-config: the draft model {} has a vocabulary of {draft_vocab} \
                 tokens, the target {}; a draft model must share the target's tokenizer",
                model.display(),
                setup.vocab_size
            )));
        }
        let kv_cache = KvCacheStorage::with_dtype(
            loaded.model.kv_layout(),
            setup.num_blocks,
            setup.block_size,
            setup.kv_dtype,
        );
        let blocks = KvCacheManager::new(KvCacheConfig {
            num_blocks: u32::try_from(setup.num_blocks).unwrap_or(u32::MAX),
            block_size: setup.block_size,
            enable_prefix_caching: false,
            sliding_window: None,
            groups: KvCacheGroups::Single,
        })
        .map_err(|e| EngineError::Config(e.to_string()))?;
        tracing::info!(
            "draft model {}: {} layers, its own KV cache of {} blocks ({})",
            model.display(),
            loaded.config().num_layers,
            setup.num_blocks,
            setup.kv_dtype
        );
        Ok(DraftModelProposer {
            loaded: Arc::new(loaded),
            kv_cache,
            blocks,
            block_size: setup.block_size,
            workspace: Workspace::default(),
            batch: BatchInput::default(),
            logits: Vec::new(),
            computed: HashMap::new(),
        })
    }

    /// Feeds `tokens` at `start` for `request_id` and returns the greedy next token.
    fn next_token(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        start: usize,
    ) -> Result<Option<u32>, EngineError> {
        let table = self.blocks.block_table(request_id).unwrap_or_default();
        self.batch.clear();
        self.batch
            .add_sequence(tokens, start, table, self.block_size, true)?;
        self.loaded.model.forward(
            &self.loaded.pool,
            &self.batch,
            &mut self.kv_cache,
            &mut self.workspace,
            &mut self.logits,
        )?;
        let vocab = self.loaded.config().vocab_size;
        Ok(self.logits.get(..vocab).and_then(argmax))
    }

    fn draft(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        max_drafts: usize,
        drafts: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        let computed = self
            .computed
            .get(&request_id)
            .copied()
            .unwrap_or(0)
            .min(tokens.len().saturating_sub(1));
        // The real tokens plus every draft but the last are written to the cache.
        let needed = tokens.len() + max_drafts - 1;
        if self
            .blocks
            .allocate_slots(request_id, needed, None)
            .is_err()
        {
            // The draft's pool is full: no drafts for this request this step.
            return Ok(());
        }
        let Some(mut token) = self.next_token(request_id, &tokens[computed..], computed)? else {
            return Ok(());
        };
        self.computed.insert(request_id, tokens.len());
        drafts.push(token);
        while drafts.len() < max_drafts {
            let position = tokens.len() + drafts.len() - 1;
            match self.next_token(request_id, &[token], position)? {
                Some(next) => token = next,
                None => break,
            }
            drafts.push(token);
        }
        Ok(())
    }
}

impl Proposer for DraftModelProposer {
    fn propose(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        _num_prompt_tokens: usize,
        max_drafts: usize,
        drafts: &mut Vec<u32>,
    ) {
        drafts.clear();
        if max_drafts == 0 || tokens.is_empty() {
            return;
        }
        if let Err(err) = self.draft(request_id, tokens, max_drafts, drafts) {
            // A failed draft costs only the speculation: decode without drafts.
            tracing::warn!("draft model failed for request {request_id}: {err}");
            drafts.clear();
            self.finish(request_id);
        }
    }

    fn finish(&mut self, request_id: RequestId) {
        self.blocks.free(request_id);
        self.computed.remove(&request_id);
    }
}
