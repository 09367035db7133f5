//! How the engine lays out the KV cache for a model: one group of tables shared by every
//! layer, or vLLM's hybrid KV cache manager (per-attention-kind groups) for models mixing
//! full-attention and sliding-window layers, unless `--disable-hybrid-kv-cache-manager`.

use tokenmill_core::{KvCacheGroups, SchedulerConfig};
use tokenmill_models::{KvCacheDType, KvCacheGrouping, LayerKvLayout};

/// The KV cache layout the scheduler and the model runner share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KvPlan {
    /// Which group's table and which buffer each layer uses (the model runner's side).
    pub grouping: KvCacheGrouping,
    /// The scheduler's side: its groups and the window of the sliding ones.
    pub groups: KvCacheGroups,
    pub sliding_window: Option<usize>,
}

impl KvPlan {
    /// Hybrid grouping for a model mixing full and sliding layers; otherwise one group,
    /// releasing blocks before the window when every layer has one. With
    /// `disable_hybrid` every layer keeps every block (vLLM's
    /// `--disable-hybrid-kv-cache-manager`).
    pub fn for_layout(layout: &[LayerKvLayout], disable_hybrid: bool) -> KvPlan {
        let single = || KvPlan {
            grouping: KvCacheGrouping::single(layout),
            groups: KvCacheGroups::Single,
            sliding_window: None,
        };
        if disable_hybrid {
            return single();
        }
        if let Some(grouping) = KvCacheGrouping::hybrid(layout) {
            return KvPlan {
                groups: KvCacheGroups::Hybrid {
                    full: grouping.num_full_groups(),
                    sliding: grouping.num_sliding_groups(),
                },
                sliding_window: grouping.sliding_window(),
                grouping,
            };
        }
        KvPlan {
            sliding_window: uniform_sliding_window(layout),
            ..single()
        }
    }

    pub fn is_hybrid(&self) -> bool {
        matches!(self.groups, KvCacheGroups::Hybrid { .. })
    }

    pub fn num_groups(&self) -> usize {
        self.grouping.num_groups()
    }

    /// Bytes one block takes (every buffer's K and V).
    pub fn bytes_per_block(&self, block_size: usize, dtype: KvCacheDType) -> usize {
        self.grouping.bytes_per_block(block_size, dtype)
    }
}

/// The window the KV manager may release blocks for when every layer has one: the largest,
/// if they differ, so no layer loses a key it sees. `None` when some layer attends to the
/// whole context.
fn uniform_sliding_window(layout: &[LayerKvLayout]) -> Option<usize> {
    layout
        .iter()
        .map(|layer| layer.sliding_window)
        .try_fold(0, |widest: usize, window| window.map(|w| widest.max(w)))
        .filter(|&widest| widest > 0)
}

/// The longest `max_model_len` up to `limit` one request of which fits in `config`'s pool
/// (its [`SchedulerConfig::max_blocks_per_request`] at most `num_blocks`); `limit` itself when
/// none does, so the start-up check reports it.
pub(crate) fn longest_fitting_len(config: SchedulerConfig, limit: usize) -> usize {
    let fits = |len: usize| {
        SchedulerConfig {
            max_model_len: len,
            ..config
        }
        .max_blocks_per_request()
            <= config.num_blocks as usize
    };
    if fits(limit) || !fits(2) {
        return limit;
    }
    // fits(low) and !fits(high); the need grows with the length.
    let (mut low, mut high) = (2, limit);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid) {
            low = mid;
        } else {
            high = mid;
        }
    }
    low
}

#[cfg(test)]
mod tests {
    use tokenmill_core::SchedulingPolicy;

    use super::*;

    fn gemma3_270m_layout() -> Vec<LayerKvLayout> {
        (0..18)
            .map(|layer| LayerKvLayout {
                num_kv_heads: 1,
                head_dim: 256,
                sliding_window: (layer % 6 != 5).then_some(512),
            })
            .collect()
    }

    #[test]
    fn gemma3_gets_one_full_and_five_sliding_groups_of_three_layers() {
        let layout = gemma3_270m_layout();
        let plan = KvPlan::for_layout(&layout, false);
        assert_eq!(
            plan.groups,
            KvCacheGroups::Hybrid {
                full: 1,
                sliding: 5
            }
        );
        assert_eq!(plan.sliding_window, Some(512));
        // Global layers 5, 11, 17 fill group 0; local layers 0..=4 groups 1 (0, 1, 2) and
        // 2 (3, 4, then 6).
        assert_eq!(plan.grouping.layer(5), Some((0, 0)));
        assert_eq!(plan.grouping.layer(17), Some((0, 2)));
        assert_eq!(plan.grouping.layer(0), Some((1, 0)));
        assert_eq!(plan.grouping.layer(4), Some((2, 1)));
        assert_eq!(plan.grouping.layer(6), Some((2, 2)));
        assert_eq!(plan.grouping.layer(16), Some((5, 2)));
        // A block is three layers big instead of eighteen.
        let f32 = KvCacheDType::F32;
        assert_eq!(plan.bytes_per_block(16, f32), 3 * 2 * 16 * 256 * 4);
        let disabled = KvPlan::for_layout(&layout, true);
        assert_eq!(disabled.groups, KvCacheGroups::Single);
        assert_eq!(disabled.sliding_window, None);
        assert_eq!(disabled.bytes_per_block(16, f32), 18 * 2 * 16 * 256 * 4);
    }

    #[test]
    fn uniform_models_keep_one_group() {
        let mut layout = gemma3_270m_layout();
        for layer in &mut layout {
            layer.sliding_window = Some(64);
        }
        let plan = KvPlan::for_layout(&layout, false);
        assert_eq!(
            (plan.groups, plan.sliding_window),
            (KvCacheGroups::Single, Some(64))
        );
        assert_eq!(KvPlan::for_layout(&layout, true).sliding_window, None);
        for layer in &mut layout {
            layer.sliding_window = None;
        }
        let plan = KvPlan::for_layout(&layout, false);
        assert_eq!(
            (plan.groups, plan.sliding_window),
            (KvCacheGroups::Single, None)
        );
    }

    #[test]
    fn longest_fitting_len_finds_the_boundary() {
        let config = SchedulerConfig {
            max_num_batched_tokens: 64,
            max_num_seqs: 4,
            max_model_len: 2,
            block_size: 16,
            num_blocks: 100,
            enable_prefix_caching: false,
            policy: SchedulingPolicy::Fcfs,
            long_prefill_token_threshold: None,
            enable_chunked_prefill: true,
            sliding_window: Some(32),
            kv_groups: KvCacheGroups::Hybrid {
                full: 1,
                sliding: 2,
            },
            state_slots: tokenmill_core::StateSlotConfig::none(),
        };
        // Each sliding group holds at most ceil((31 + 64) / 16) + 1 = 7 blocks, so the full
        // group gets 100 - 14 = 86 blocks: 1,376 tokens.
        assert_eq!(longest_fitting_len(config, 100_000), 86 * 16);
        assert_eq!(longest_fitting_len(config, 500), 500);
        let single = SchedulerConfig {
            sliding_window: None,
            kv_groups: KvCacheGroups::Single,
            ..config
        };
        assert_eq!(longest_fitting_len(single, 100_000), 1600);
    }
}
