//! What the engine's unit tests share: the real model's path, a small scheduler with its
//! metrics (16 blocks of 16 tokens, 64-token requests), and [`RecurrentHashLm`], a test
//! double for the recurrent-state slot plumbing.

use std::sync::Arc;

use tokenmill_core::{KvCacheGroups, Scheduler, SchedulerConfig, SchedulingPolicy};
use tokenmill_kernels::ThreadPool;
use tokenmill_metrics::{EngineMetrics, MetricsConfig};
use tokenmill_models::{
    BatchInput, CausalLm, KvCacheStorage, LayerKvLayout, LayerStateLayout, ModelConfig, ModelError,
    Workspace,
};

pub use tokenmill_test_assets::default_model as model_path;

pub fn small_scheduler() -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        max_model_len: 64,
        block_size: 16,
        num_blocks: 16,
        enable_prefix_caching: true,
        policy: SchedulingPolicy::Fcfs,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: true,
        sliding_window: None,
        kv_groups: KvCacheGroups::Single,
        state_slots: tokenmill_core::StateSlotConfig::none(),
    })
    .unwrap()
}

pub fn small_metrics() -> Arc<EngineMetrics> {
    Arc::new(EngineMetrics::new(MetricsConfig {
        model_name: "test".into(),
        max_model_len: 64,
        block_size: 16,
        num_blocks: 16,
        enable_prefix_caching: true,
        cache_dtype: "auto".into(),
    }))
}

/// A test double for the engine's recurrent-state slot plumbing, **not a model**: a
/// [`CausalLm`] with one paged attention layer (so requests take real KV blocks) and one
/// "recurrent" layer whose per-sequence state, kept in the sequence's slot of the
/// [`tokenmill_models::StateCacheStorage`], is a running hash of every token fed so far plus
/// the count of positions it covers. Each logits row is one-hot on a token picked by the
/// hash after that row's token, so greedy output is a function of the whole sequence *as the
/// state saw it*: a slot that is shared, stale (left by another request), not reset at
/// position 0, or missing a chunk changes the tokens. A run that continues (`position > 0`)
/// from a slot whose position count is not its start position, or whose owner mark is
/// missing, is an error, so such bugs also fail loudly. It never reads the K/V buffers.
#[derive(Debug)]
pub struct RecurrentHashLm {
    config: ModelConfig,
    kv_layout: Vec<LayerKvLayout>,
    state_layout: Vec<LayerStateLayout>,
}

/// Written into a slot's first convolution element by every run: a zeroed (reset) slot lacks
/// it.
const STATE_MARK: f32 = 7.0;
/// Greedy picks land in `300..20_000`, ordinary subword tokens of the default model's
/// vocabulary (no EOS, no special tokens).
const PICK_LOW: u64 = 300;
const PICK_SPAN: u64 = 19_700;

impl RecurrentHashLm {
    /// The double over `base`'s vocabulary (the tokenizer it is served with).
    pub fn new(base: &ModelConfig) -> RecurrentHashLm {
        let mut config = base.clone();
        config.num_layers = 2;
        RecurrentHashLm {
            config,
            kv_layout: vec![LayerKvLayout {
                num_kv_heads: 1,
                head_dim: 8,
                sliding_window: None,
            }],
            // Positions and the mark; the 64-bit hash in four exact 16-bit pieces.
            state_layout: vec![LayerStateLayout {
                conv_elems: 2,
                recurrent_elems: 4,
            }],
        }
    }

    fn mix(hash: u64, token: u32) -> u64 {
        (hash ^ u64::from(token))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29)
            ^ 0x5851_F42D_4C95_7F2D
    }

    /// Advances one sequence's state over its run and returns the hash after each token.
    fn run_sequence(
        kv: &mut KvCacheStorage,
        slot: usize,
        start: usize,
        tokens: &[u32],
    ) -> tokenmill_models::Result<Vec<u64>> {
        if start == 0 {
            kv.state_mut().reset_slot(slot);
        }
        let (conv, recurrent) = kv
            .state_mut()
            .slot_mut(0, slot)
            .ok_or_else(|| ModelError::InvalidBatch(format!("state slot {slot} out of range")))?;
        if start > 0 && (conv[1] != STATE_MARK || conv[0] as usize != start) {
            return Err(ModelError::InvalidBatch(format!(
                "stale recurrent state: slot {slot} covers {} positions (mark {}), the run \
                 starts at {start}",
                conv[0], conv[1]
            )));
        }
        let mut hash = recurrent
            .iter()
            .enumerate()
            .fold(0u64, |hash, (i, &piece)| {
                hash | ((piece as u64) << (16 * i))
            });
        let hashes: Vec<u64> = tokens
            .iter()
            .map(|&token| {
                hash = Self::mix(hash, token);
                hash
            })
            .collect();
        for (i, piece) in recurrent.iter_mut().enumerate() {
            *piece = ((hash >> (16 * i)) & 0xFFFF) as f32;
        }
        conv[0] = (start + tokens.len()) as f32;
        conv[1] = STATE_MARK;
        Ok(hashes)
    }
}

impl CausalLm for RecurrentHashLm {
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
        0
    }

    fn decode_weight_bytes(&self) -> usize {
        0
    }

    fn forward(
        &self,
        _pool: &ThreadPool,
        batch: &BatchInput,
        kv: &mut KvCacheStorage,
        _workspace: &mut Workspace,
        logits: &mut Vec<f32>,
    ) -> tokenmill_models::Result<()> {
        if batch.state_slots.len() != batch.seqs.len() {
            return Err(ModelError::InvalidBatch(format!(
                "{} sequences but {} state slots",
                batch.seqs.len(),
                batch.state_slots.len()
            )));
        }
        let mut row_hashes = vec![0u64; batch.num_tokens()];
        for (seq, &slot) in batch.seqs.iter().zip(&batch.state_slots) {
            let rows = seq.query_start..seq.query_start + seq.query_len;
            let start = batch.positions.get(seq.query_start).copied().unwrap_or(0) as usize;
            let tokens = batch.token_ids.get(rows.clone()).unwrap_or_default();
            let hashes = Self::run_sequence(kv, slot as usize, start, tokens)?;
            row_hashes[rows].copy_from_slice(&hashes);
        }
        let vocab = self.config.vocab_size;
        logits.clear();
        logits.resize(batch.logits_indices.len() * vocab, 0.0);
        for (index, &row) in batch.logits_indices.iter().enumerate() {
            let hash = row_hashes[row as usize];
            let token = (PICK_LOW + hash % PICK_SPAN) as usize;
            logits[index * vocab + token] = 1.0;
        }
        Ok(())
    }

    fn forward_hidden(
        &self,
        _pool: &ThreadPool,
        _batch: &BatchInput,
        _kv: &mut KvCacheStorage,
        _workspace: &mut Workspace,
        _hidden: &mut Vec<f32>,
    ) -> tokenmill_models::Result<()> {
        Err(ModelError::InvalidBatch(
            "the recurrent-state test double has no hidden states".into(),
        ))
    }
}
