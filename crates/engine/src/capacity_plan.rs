//! Capacity planning: how many KV blocks the byte budget buys for the model's cache layout,
//! and what that allows (the KV cache groups, `max_model_len`, the step's token budget), as a
//! pure function of the layout, the engine flags and the budget. A model with recurrent
//! layers first reserves one recurrent-state slot per sequence that may run out of the budget
//! ([`plan_state_slots`]); the blocks get the rest. vLLM keeps the same decision
//! apart from start-up (`get_kv_cache_configs`); here [`crate::startup`] reads the budget and
//! the layout, calls [`plan_capacity`], then logs and builds from the plan.

use tokenmill_core::{capacity, SchedulerConfig, StateSlotConfig};
use tokenmill_models::{KvCacheDType, LayerKvLayout, LayerStateLayout, StateCacheStorage};

use crate::config::DEFAULT_MAX_NUM_BATCHED_TOKENS;
use crate::kv_groups::{longest_fitting_len, KvPlan};
use crate::stats::CapacityReport;
use crate::{EngineConfig, EngineError};

/// What the plan depends on besides the engine flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CapacityInputs<'a> {
    /// What each attention layer keeps in the cache (the model family's declaration).
    pub layout: &'a [LayerKvLayout],
    /// What each recurrent layer keeps per sequence (empty for a pure transformer).
    pub state_layout: &'a [LayerStateLayout],
    /// The context the model was trained for: `max_model_len` when the flag does not say.
    pub max_position_embeddings: usize,
    /// The element type K/V are stored as (`--kv-cache-dtype` resolved for the model).
    pub kv_storage: KvCacheDType,
    /// The KV budget in bytes.
    pub kv_cache_bytes: u64,
}

/// The decision: the KV cache groups the scheduler and the runner share, the scheduler's
/// configuration, and the start-up report of both.
#[derive(Debug, Clone)]
pub(crate) struct CapacityPlan {
    pub kv_plan: KvPlan,
    pub scheduler: SchedulerConfig,
    pub report: CapacityReport,
}

/// Plans the KV capacity for `config`'s flags over `inputs`; an error when one max-length
/// request cannot fit in the pool (the message says which flag to change).
pub(crate) fn plan_capacity(
    config: &EngineConfig,
    inputs: &CapacityInputs<'_>,
) -> Result<CapacityPlan, EngineError> {
    let kv_plan = KvPlan::for_layout(inputs.layout, config.disable_hybrid_kv_cache_manager);
    let bytes_per_block = kv_plan.bytes_per_block(config.block_size, inputs.kv_storage);
    let kv_bytes = inputs.kv_cache_bytes;
    let sliding_window = kv_plan.sliding_window;
    let mut scheduler = SchedulerConfig {
        // Without chunked prefill the budget follows max_model_len, set below.
        max_num_batched_tokens: config
            .max_num_batched_tokens
            .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS),
        max_num_seqs: config.max_num_seqs,
        max_model_len: 2,
        block_size: config.block_size,
        num_blocks: 0,
        enable_prefix_caching: config.enable_prefix_caching,
        policy: config.scheduling_policy,
        long_prefill_token_threshold: None,
        enable_chunked_prefill: config.enable_chunked_prefill,
        sliding_window,
        kv_groups: kv_plan.groups,
        state_slots: StateSlotConfig::none(),
    };
    let bytes_per_slot = StateCacheStorage::bytes_per_slot(inputs.state_layout) as u64;
    let num_slots = plan_state_slots(&scheduler, config, inputs, bytes_per_block, bytes_per_slot)?;
    let state_bytes = u64::from(num_slots) * bytes_per_slot;
    let num_blocks =
        capacity::num_blocks_for_budget(kv_bytes.saturating_sub(state_bytes), bytes_per_block);
    scheduler.num_blocks = num_blocks;
    if num_slots > 0 {
        // A sequence runs only with a slot, and the slots are all the state there is.
        scheduler.max_num_seqs = num_slots as usize;
        scheduler.state_slots = StateSlotConfig {
            num_slots,
            bytes_per_slot,
            bytes_per_block: bytes_per_block as u64,
        };
    }
    let pool_tokens =
        capacity::kv_cache_size_tokens(num_blocks, config.block_size) / kv_plan.num_groups();
    let trained = inputs.max_position_embeddings;
    scheduler.max_model_len = match config.max_model_len {
        Some(len) => len,
        // Under a window on every layer a request holds only the window's blocks.
        None if !kv_plan.is_hybrid() && sliding_window.is_some() => trained,
        None if !kv_plan.is_hybrid() => trained.min(pool_tokens),
        // Hybrid: the full groups hold the sequence, the sliding ones at most a window.
        None => longest_fitting_len(scheduler, trained),
    };
    let max_model_len = scheduler.max_model_len;
    if !config.enable_chunked_prefill && config.max_num_batched_tokens.is_none() {
        scheduler.max_num_batched_tokens = max_model_len.max(2048);
    }
    let blocks_per_request = scheduler.max_blocks_per_request();
    let report = CapacityReport {
        kv_cache_bytes: kv_bytes,
        kv_cache_dtype: config.kv_cache_dtype,
        kv_storage: inputs.kv_storage,
        num_blocks,
        block_size: config.block_size,
        max_model_len,
        blocks_per_request,
        num_kv_cache_groups: kv_plan.num_groups(),
        num_state_slots: num_slots as usize,
        bytes_per_state_slot: bytes_per_slot,
    };
    if (num_blocks as usize) < blocks_per_request {
        return Err(EngineError::Config(format!(
            "the KV cache holds {pool_tokens} tokens ({num_blocks} blocks of {} from a {} MiB \
             budget) but one max-length request of {max_model_len} tokens needs \
             {blocks_per_request} blocks: raise --kv-cache-memory (or \
             --gpu-memory-utilization) or lower --max-model-len",
            config.block_size,
            kv_bytes >> 20
        )));
    }
    Ok(CapacityPlan {
        kv_plan,
        scheduler,
        report,
    })
}

/// Recurrent-state slots for a model whose slot takes `bytes_per_slot` (0: no recurrent
/// layers, no slots): one per sequence that may run (`--max-num-seqs`), as vLLM reserves
/// state for every sequence it may schedule; fewer when the budget cannot hold them beside
/// the blocks of one request of `--max-model-len` (without the flag, of one step's tokens:
/// the context is then what the remaining blocks hold). An error when not even one fits.
fn plan_state_slots(
    base: &SchedulerConfig,
    config: &EngineConfig,
    inputs: &CapacityInputs<'_>,
    bytes_per_block: usize,
    bytes_per_slot: u64,
) -> Result<u32, EngineError> {
    if bytes_per_slot == 0 {
        return Ok(0);
    }
    let keep_len = config
        .max_model_len
        .unwrap_or_else(|| {
            inputs
                .max_position_embeddings
                .min(base.max_num_batched_tokens)
        })
        .max(2);
    let keep_blocks = SchedulerConfig {
        max_model_len: keep_len,
        ..*base
    }
    .max_blocks_per_request();
    let keep_bytes = (keep_blocks as u64).saturating_mul(bytes_per_block as u64);
    let room = inputs.kv_cache_bytes.saturating_sub(keep_bytes) / bytes_per_slot;
    let num_slots = (config.max_num_seqs as u64)
        .min(room)
        .min(u64::from(u32::MAX));
    if num_slots == 0 {
        return Err(EngineError::Config(format!(
            "the KV cache memory ({:.1} MiB) cannot hold one recurrent-state slot ({:.1} MiB) \
             beside the {keep_blocks} KV blocks of one {keep_len}-token request: raise \
             --kv-cache-memory (or --gpu-memory-utilization) or lower --max-model-len",
            inputs.kv_cache_bytes as f64 / f64::from(1u32 << 20),
            bytes_per_slot as f64 / f64::from(1u32 << 20),
        )));
    }
    Ok(num_slots as u32)
}

#[cfg(test)]
mod tests {
    use tokenmill_core::KvCacheGroups;
    use tokenmill_models::ModelSource;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn layer(sliding_window: Option<usize>) -> LayerKvLayout {
        LayerKvLayout {
            num_kv_heads: 2,
            head_dim: 64,
            sliding_window,
        }
    }

    fn config() -> EngineConfig {
        EngineConfig::new(ModelSource::from_path(std::path::PathBuf::from(
            "unused.gguf",
        )))
    }

    fn inputs(layout: &[LayerKvLayout], trained: usize, bytes: u64) -> CapacityInputs<'_> {
        CapacityInputs {
            layout,
            state_layout: &[],
            max_position_embeddings: trained,
            kv_storage: KvCacheDType::F16,
            kv_cache_bytes: bytes,
        }
    }

    /// 4 full-attention layers of 2 × 64 f16 values for K and for V: 2 KiB a token, 32 KiB
    /// a 16-token block.
    #[test]
    fn full_attention_blocks_come_from_the_budget_and_cap_the_context() {
        let layout = [layer(None); 4];
        let config = config();
        let plan = plan_capacity(&config, &inputs(&layout, 8192, 4 * MIB)).unwrap();
        assert_eq!(plan.report.num_blocks, 128);
        assert_eq!(plan.scheduler.num_blocks, 128);
        assert_eq!(plan.report.num_kv_cache_groups, 1);
        // 128 blocks of 16 tokens hold 2,048 tokens: the context the pool holds, not 8,192.
        assert_eq!(plan.report.max_model_len, 2048);
        assert_eq!(plan.report.blocks_per_request, 128);
        assert_eq!(plan.scheduler.kv_groups, KvCacheGroups::Single);
        let roomy = plan_capacity(&config, &inputs(&layout, 1024, 4 * MIB)).unwrap();
        assert_eq!(roomy.report.max_model_len, 1024);
    }

    #[test]
    fn a_context_the_pool_cannot_hold_is_refused_by_flag_name() {
        let layout = [layer(None); 4];
        let mut config = config();
        config.max_model_len = Some(8192);
        let error = plan_capacity(&config, &inputs(&layout, 8192, 4 * MIB)).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("--kv-cache-memory"), "{message}");
        assert!(message.contains("--max-model-len"), "{message}");
    }

    #[test]
    fn mixed_windows_plan_hybrid_groups_unless_disabled() {
        // Gemma 3's pattern: five sliding layers to one global.
        let layout: Vec<LayerKvLayout> = (0..6)
            .map(|i| layer(if i == 5 { None } else { Some(32) }))
            .collect();
        let config = config();
        let plan = plan_capacity(&config, &inputs(&layout, 100_000, 4 * MIB)).unwrap();
        assert!(plan.kv_plan.is_hybrid());
        assert_eq!(plan.scheduler.sliding_window, Some(32));
        assert_eq!(plan.report.num_kv_cache_groups, plan.kv_plan.num_groups());
        // The longest context whose request still fits: its blocks are at most the pool.
        assert!(plan.report.blocks_per_request <= plan.report.num_blocks as usize);
        assert!(plan.report.max_model_len < 100_000);
        let mut disabled = config.clone();
        disabled.disable_hybrid_kv_cache_manager = true;
        let plan = plan_capacity(&disabled, &inputs(&layout, 2048, 4 * MIB)).unwrap();
        assert!(!plan.kv_plan.is_hybrid());
        assert_eq!(plan.scheduler.sliding_window, None);
    }

    #[test]
    fn without_chunked_prefill_the_step_budget_follows_the_context() {
        let layout = [layer(None); 4];
        let mut config = config();
        config.enable_chunked_prefill = false;
        let plan = plan_capacity(&config, &inputs(&layout, 4000, 8 * MIB)).unwrap();
        assert_eq!(plan.scheduler.max_num_batched_tokens, 4000);
        config.max_num_batched_tokens = Some(512);
        let plan = plan_capacity(&config, &inputs(&layout, 4000, 8 * MIB)).unwrap();
        assert_eq!(plan.scheduler.max_num_batched_tokens, 512);
    }

    /// Three recurrent layers of 64 Ki + 192 Ki f32 elements: 3 MiB a slot.
    const STATE: [LayerStateLayout; 3] = [LayerStateLayout {
        conv_elems: 64 << 10,
        recurrent_elems: 192 << 10,
    }; 3];

    #[test]
    fn recurrent_state_is_reserved_per_sequence_before_the_blocks() {
        let layout = [layer(None)];
        let mut config = config();
        config.max_num_seqs = 8;
        config.max_model_len = Some(1024);
        // 8 slots of 3 MiB, then 8 KiB blocks (one layer, 16 tokens of 2 × 64 f16 K and V)
        // from the remaining 40 MiB.
        let hybrid = CapacityInputs {
            state_layout: &STATE,
            ..inputs(&layout, 4096, 64 * MIB)
        };
        let plan = plan_capacity(&config, &hybrid).unwrap();
        assert_eq!(plan.report.num_state_slots, 8);
        assert_eq!(plan.report.bytes_per_state_slot, 3 * MIB);
        assert_eq!(plan.report.state_bytes(), 24 * MIB);
        assert_eq!(plan.report.num_blocks, 5120);
        assert_eq!(plan.scheduler.max_num_seqs, 8);
        assert_eq!(
            plan.scheduler.state_slots,
            StateSlotConfig {
                num_slots: 8,
                bytes_per_slot: 3 * MIB,
                bytes_per_block: 8 << 10,
            }
        );
        // 5,120 blocks hold 80 requests of 1,024 tokens, but 8 slots run 8.
        assert_eq!(plan.report.max_concurrency(), 8.0);
        assert_eq!(plan.report.log_lines().len(), 5);
        // A pure transformer on the same budget: no slots, every byte in blocks.
        let plain = plan_capacity(
            &config,
            &CapacityInputs {
                state_layout: &[],
                ..hybrid
            },
        )
        .unwrap();
        assert_eq!(plain.report.num_state_slots, 0);
        assert_eq!(plain.report.num_blocks, 8192);
        assert_eq!(plain.scheduler.state_slots, StateSlotConfig::none());
    }

    #[test]
    fn a_budget_short_of_state_for_every_sequence_lowers_max_num_seqs() {
        let layout = [layer(None)];
        let mut config = config();
        config.max_num_seqs = 64;
        config.max_model_len = Some(4096);
        // One 4,096-token request needs 256 blocks (2 MiB); 20 MiB leaves room for 6 slots.
        let hybrid = CapacityInputs {
            state_layout: &STATE,
            ..inputs(&layout, 4096, 20 * MIB)
        };
        let plan = plan_capacity(&config, &hybrid).unwrap();
        assert_eq!(plan.report.num_state_slots, 6);
        assert_eq!(plan.scheduler.max_num_seqs, 6);
        assert!(plan.report.num_blocks as usize >= plan.report.blocks_per_request);
        // Not even one slot beside one request: refused by flag name.
        let tiny = CapacityInputs {
            state_layout: &STATE,
            ..inputs(&layout, 4096, 4 * MIB)
        };
        let message = plan_capacity(&config, &tiny).unwrap_err().to_string();
        assert!(message.contains("recurrent-state slot"), "{message}");
        assert!(message.contains("--kv-cache-memory"), "{message}");
        // Without --max-model-len the slots keep one step's blocks and the context is what
        // the rest holds.
        config.max_model_len = None;
        let plan = plan_capacity(&config, &hybrid).unwrap();
        assert_eq!(plan.report.num_state_slots, 6);
        assert_eq!(
            plan.report.max_model_len,
            plan.report.num_blocks as usize * 16
        );
    }
}
