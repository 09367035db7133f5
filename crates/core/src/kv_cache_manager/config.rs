//! The KV cache's shape as the manager sees it: the pool, the block size, and the KV cache
//! groups (vLLM's `KVCacheGroupSpec`s) whose block tables it keeps per request, and the
//! recurrent-state slots of a hybrid model's recurrent layers.

use crate::state_slots::StateSlotConfig;

/// How the model's layers share block tables.
///
/// vLLM's hybrid KV cache manager: layers are grouped by attention type, every group holds
/// the same number of layers (so a block is the same size in every group and all groups
/// draw from one pool), and each group keeps its own block table per request. A block of a
/// sliding-window group is released once it falls out of every future query's window while
/// the full-attention groups keep the whole context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheGroups {
    /// One group: every layer shares one table and attends as
    /// [`KvCacheConfig::sliding_window`] says (no window: full attention).
    #[default]
    Single,
    /// `full` full-attention groups (indices `0..full`) followed by `sliding` groups with the
    /// window [`KvCacheConfig::sliding_window`] (Gemma 3 270M: 3 global and 15 local layers
    /// in groups of 3, so 1 full and 5 sliding groups).
    Hybrid { full: usize, sliding: usize },
}

/// Shape of the KV cache as the manager sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub num_blocks: u32,
    /// Tokens per block.
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    /// The window of the sliding-window groups: their layers attend only to the last `w`
    /// positions (`(p - w, p]`), so blocks wholly before the window of every future query
    /// are released. With [`KvCacheGroups::Single`], `Some(w)` means every layer has the
    /// window and `None` full attention (or a hybrid model run without the hybrid manager,
    /// every layer keeping every block).
    pub sliding_window: Option<usize>,
    pub groups: KvCacheGroups,
    /// The recurrent-state slots beside the blocks (none for a pure transformer): a request
    /// holds one while it holds blocks (see [`crate::StateSlotPool`]).
    pub state_slots: StateSlotConfig,
}

impl KvCacheConfig {
    /// How many KV cache groups (block tables per request) there are.
    pub fn num_groups(&self) -> usize {
        match self.groups {
            KvCacheGroups::Single => 1,
            KvCacheGroups::Hybrid { full, sliding } => full + sliding,
        }
    }

    /// The window group `group`'s layers attend within (`None`: the whole context).
    pub fn group_window(&self, group: usize) -> Option<usize> {
        match self.groups {
            KvCacheGroups::Single => self.sliding_window,
            KvCacheGroups::Hybrid { full, .. } if group < full => None,
            KvCacheGroups::Hybrid { .. } => self.sliding_window,
        }
    }

    /// Whether prefix-cache lookups may hit and full blocks are registered:
    /// `enable_prefix_caching`, unless the model has recurrent layers. A hit would start a
    /// request after positions its recurrent state never saw, and there are no state
    /// checkpoints yet, so such a model recomputes every prompt (vLLM likewise turns prefix
    /// caching off for state-space models without its block-aligned state caching).
    pub fn prefix_caching_active(&self) -> bool {
        self.enable_prefix_caching && !self.state_slots.is_enabled()
    }

    /// Why this shape cannot be managed, if it cannot.
    pub(crate) fn invalid_reason(&self) -> Option<String> {
        if let Some(reason) = self.state_slots.invalid_reason() {
            return Some(reason);
        }
        if self.block_size == 0 {
            return Some("block_size must be at least 1".to_owned());
        }
        if self.sliding_window == Some(0) {
            return Some("sliding_window must be at least 1 when set".to_owned());
        }
        match self.groups {
            KvCacheGroups::Single => None,
            KvCacheGroups::Hybrid { full, sliding } if full + sliding == 0 => {
                Some("a hybrid KV cache needs at least one group".to_owned())
            }
            KvCacheGroups::Hybrid { sliding, .. }
                if sliding > 0 && self.sliding_window.is_none() =>
            {
                Some("hybrid sliding-window groups need sliding_window".to_owned())
            }
            KvCacheGroups::Hybrid { .. } => None,
        }
    }

    /// Leading blocks that no query at position `num_computed_tokens` or later can see in a
    /// group with `window`: the next query (at `num_computed_tokens`) sees keys from
    /// `num_computed_tokens + 1 - w` on, the same first block attention starts from.
    pub(crate) fn skipped_blocks_for(
        &self,
        window: Option<usize>,
        num_computed_tokens: usize,
    ) -> usize {
        match window {
            Some(window) => (num_computed_tokens + 1).saturating_sub(window) / self.block_size,
            None => 0,
        }
    }

    /// `Self::skipped_blocks_for` the sliding-window groups' window (0 without one).
    pub fn num_skipped_blocks(&self, num_computed_tokens: usize) -> usize {
        self.skipped_blocks_for(self.sliding_window, num_computed_tokens)
    }

    /// `Self::skipped_blocks_for` group `group`'s window.
    pub fn group_skipped_blocks(&self, group: usize, num_computed_tokens: usize) -> usize {
        self.skipped_blocks_for(self.group_window(group), num_computed_tokens)
    }

    /// The most blocks one request holds at once, summed over the groups, when a step feeds
    /// it at most `max_tokens_per_step` tokens and it never grows past `max_model_len`: a
    /// full-attention group holds the whole sequence; a windowed one the window before the
    /// step's first token plus the step's tokens (vLLM's
    /// `ceil((w - 1 + max_num_batched_tokens) / block_size) + 1`), or the whole sequence if
    /// that is fewer.
    pub fn max_blocks_per_request(
        &self,
        max_model_len: usize,
        max_tokens_per_step: usize,
    ) -> usize {
        (0..self.num_groups())
            .map(|group| {
                self.group_max_blocks(self.group_window(group), max_model_len, max_tokens_per_step)
            })
            .fold(0, usize::saturating_add)
    }

    fn group_max_blocks(
        &self,
        window: Option<usize>,
        max_model_len: usize,
        max_tokens_per_step: usize,
    ) -> usize {
        let whole = max_model_len.div_ceil(self.block_size.max(1));
        match window {
            Some(window) => {
                let windowed = (window.saturating_sub(1) + max_tokens_per_step)
                    .div_ceil(self.block_size.max(1))
                    + 1;
                whole.min(windowed)
            }
            None => whole,
        }
    }

    /// Tokens the cache holds for one sequence position per group: blocks divided among
    /// the groups (vLLM's `num_blocks // len(kv_cache_groups) * block_size`).
    pub fn num_tokens(&self) -> usize {
        (self.num_blocks as usize / self.num_groups().max(1)).saturating_mul(self.block_size)
    }
}
