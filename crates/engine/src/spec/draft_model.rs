//! The `draft_model` proposer: a second, smaller [`CausalLm`] with the same vocabulary and
//! its own paged KV cache. It drafts for all of a step's decoding requests together: one
//! forward pass feeds every request the tokens it has not seen yet (one chunk each, in one
//! flattened batch), then k − 1 batched passes decode one greedy token per request each. The
//! forward pass's kernels are row-independent (batch invariance), so a request's drafts are
//! the same whichever requests share its passes. Its cache keeps the
//! request's real tokens; the slots its drafts wrote are overwritten when the request's next
//! real tokens are fed, so nothing is rolled back. Greedy drafts are point proposals, which
//! the target's verification accepts with exactly the target's probabilities.

use std::collections::HashMap;
use std::sync::Arc;

use tokenmill_core::{KvCacheConfig, KvCacheGroups, KvCacheManager, RequestId, StateSlotConfig};
use tokenmill_models::{argmax, BatchInput, KvCacheDType, KvCacheStorage, ModelSource, Workspace};

use super::{DraftRequest, Proposer};
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
        let num_recurrent = loaded.model.state_layout().len();
        if num_recurrent > 0 {
            return Err(EngineError::Config(format!(
                "--speculative-config: the draft model {} has {num_recurrent} recurrent layers, \
                 whose state a rejected draft cannot be rolled back out of; a draft model must \
                 be a transformer",
                model.display()
            )));
        }
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
            state_slots: StateSlotConfig::none(),
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

    /// Runs the draft model over `self.batch` and writes each logits row's greedy token
    /// into `next` (`None` where a row has no finite logit).
    fn forward_greedy(&mut self, next: &mut Vec<Option<u32>>) -> Result<(), EngineError> {
        self.loaded.model.forward(
            &self.loaded.pool,
            &self.batch,
            &mut self.kv_cache,
            &mut self.workspace,
            &mut self.logits,
        )?;
        let vocab = self.loaded.config().vocab_size;
        next.clear();
        next.extend((0..self.batch.logits_indices.len()).map(|row| {
            self.logits
                .get(row * vocab..(row + 1) * vocab)
                .and_then(argmax)
        }));
        Ok(())
    }

    /// Drafts for `requests` into `drafts`; the indices of the requests the draft's cache
    /// was fed for go to `fed` (on an error, those whose cache state is unknown).
    fn draft_all(
        &mut self,
        requests: &[DraftRequest<'_>],
        max_drafts: usize,
        drafts: &mut [Vec<u32>],
        fed: &mut Vec<usize>,
    ) -> Result<(), EngineError> {
        // Slots for the real tokens plus every draft but the last (the ones written).
        for (index, request) in requests.iter().enumerate() {
            let needed = request.tokens.len() + max_drafts - 1;
            // The draft's pool is full: no drafts for this request this step.
            if !request.tokens.is_empty()
                && self
                    .blocks
                    .allocate_slots(request.request_id, needed, None)
                    .is_ok()
            {
                fed.push(index);
            }
        }
        // Pass 1: each request's unseen tokens as one chunk.
        self.batch.clear();
        for &index in fed.iter() {
            let request = &requests[index];
            let computed = self
                .computed
                .get(&request.request_id)
                .copied()
                .unwrap_or(0)
                .min(request.tokens.len() - 1);
            let table = self
                .blocks
                .block_table(request.request_id)
                .unwrap_or_default();
            self.batch.add_sequence(
                &request.tokens[computed..],
                computed,
                table,
                self.block_size,
                true,
            )?;
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut next = Vec::with_capacity(fed.len());
        self.forward_greedy(&mut next)?;
        let mut active = Vec::with_capacity(fed.len());
        for (&index, token) in fed.iter().zip(&next) {
            let request = &requests[index];
            self.computed
                .insert(request.request_id, request.tokens.len());
            if let Some(token) = *token {
                drafts[index].push(token);
                active.push(index);
            }
        }
        // Passes 2..=k: one greedy token per still-drafting request.
        for step in 1..max_drafts {
            if active.is_empty() {
                break;
            }
            self.batch.clear();
            for &index in &active {
                let request = &requests[index];
                let table = self
                    .blocks
                    .block_table(request.request_id)
                    .unwrap_or_default();
                let token = drafts[index][step - 1];
                let position = request.tokens.len() + step - 1;
                self.batch
                    .add_sequence(&[token], position, table, self.block_size, true)?;
            }
            self.forward_greedy(&mut next)?;
            let mut kept = 0;
            for row in 0..active.len() {
                let index = active[row];
                if let Some(token) = next[row] {
                    drafts[index].push(token);
                    active[kept] = index;
                    kept += 1;
                }
            }
            active.truncate(kept);
        }
        Ok(())
    }
}

impl Proposer for DraftModelProposer {
    fn propose(
        &mut self,
        request_id: RequestId,
        tokens: &[u32],
        num_prompt_tokens: usize,
        max_drafts: usize,
        drafts: &mut Vec<u32>,
    ) {
        let request = DraftRequest {
            request_id,
            tokens,
            num_prompt_tokens,
        };
        self.propose_all(&[request], max_drafts, std::slice::from_mut(drafts));
    }

    fn propose_all(
        &mut self,
        requests: &[DraftRequest<'_>],
        max_drafts: usize,
        drafts: &mut [Vec<u32>],
    ) {
        drafts.iter_mut().for_each(Vec::clear);
        let requests = &requests[..requests.len().min(drafts.len())];
        if max_drafts == 0 || requests.is_empty() {
            return;
        }
        let mut fed = Vec::with_capacity(requests.len());
        if let Err(err) = self.draft_all(requests, max_drafts, drafts, &mut fed) {
            // A failed draft costs only the speculation: decode without drafts, and feed
            // these requests' caches again from the start next time.
            tracing::warn!(
                "draft model failed for a step of {} requests: {err}",
                requests.len()
            );
            drafts.iter_mut().for_each(Vec::clear);
            for index in fed {
                self.finish(requests[index].request_id);
            }
        }
    }

    fn finish(&mut self, request_id: RequestId) {
        self.blocks.free(request_id);
        self.computed.remove(&request_id);
    }
}
