//! The paged KV cache's memory. Which block belongs to which sequence is the KV cache
//! manager's business (`tokenmill-core`); this is only the storage the model reads and writes.

use tokenmill_kernels::{KvCacheBuffer, KvCacheDType};

use crate::state_cache::StateCacheStorage;

/// What one layer keeps per cached token: its KV heads, their width, and how far back its
/// attention looks. A model reports one per layer ([`crate::CausalLm::kv_layout`]) and the
/// cache is sized from that, so families whose layers differ (Gemma 3's local and global
/// layers) need nothing special here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKvLayout {
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// `Some(w)`: the layer attends to the last `w` positions only (Gemma 3's local layers,
    /// Mistral's `sliding_window`); `None`: to the whole context. Releasing the blocks that
    /// fell out of the window is the KV manager's (`tokenmill-core`), per KV cache group
    /// ([`KvCacheGrouping`]).
    pub sliding_window: Option<usize>,
}

impl LayerKvLayout {
    /// Width of one token's key (or value) vector in this layer.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// Which KV cache group's block table each layer uses and which K/V buffers it writes
/// (vLLM's hybrid KV cache manager: `KVCacheGroupSpec`s with a uniform page size).
///
/// [`Self::single`]: one group, one buffer per layer (every layer keeps every block).
/// [`Self::hybrid`] for models mixing full-attention and sliding-window layers (Gemma 3):
/// layers of each kind, in order, fill groups of `group_size` layers (the smaller kind's
/// layer count), full-attention groups first; the `j`-th layer of every group shares buffer
/// `j`. Groups draw their blocks from one pool, so a block id belongs to one group at a time
/// and layers sharing a buffer never touch the same block; a block is `group_size` layers
/// big, and the sliding groups hold only their window's blocks per request, so the memory
/// saved is real.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCacheGrouping {
    /// Per layer: its group and its buffer.
    layers: Vec<(usize, usize)>,
    /// Per buffer: the widest K (or V) vector of the layers sharing it.
    buffer_kv_dims: Vec<usize>,
    num_full_groups: usize,
    num_sliding_groups: usize,
    /// The (largest) window of the sliding groups' layers.
    sliding_window: Option<usize>,
}

impl KvCacheGrouping {
    /// One group, one buffer per layer.
    pub fn single(layout: &[LayerKvLayout]) -> KvCacheGrouping {
        KvCacheGrouping {
            layers: (0..layout.len()).map(|layer| (0, layer)).collect(),
            buffer_kv_dims: layout.iter().map(LayerKvLayout::kv_dim).collect(),
            num_full_groups: 1,
            num_sliding_groups: 0,
            sliding_window: None,
        }
    }

    /// One group whose layers all write and read one buffer (as wide as the widest layer):
    /// for a one-shot forward pass that keeps no K/V after the step (a decoder embedder's),
    /// where each layer writes its K/V and attends over them before the next layer overwrites
    /// them, so the scratch is one layer big instead of `layout.len()`.
    pub fn shared_scratch(layout: &[LayerKvLayout]) -> KvCacheGrouping {
        KvCacheGrouping {
            layers: vec![(0, 0); layout.len()],
            buffer_kv_dims: vec![layout.iter().map(LayerKvLayout::kv_dim).max().unwrap_or(0)],
            num_full_groups: 1,
            num_sliding_groups: 0,
            sliding_window: None,
        }
    }

    /// Groups by attention kind when `layout` mixes full-attention and sliding-window layers;
    /// `None` otherwise (all full: nothing to release; all sliding: one group releases for
    /// every layer). Sliding layers with different windows share the largest.
    pub fn hybrid(layout: &[LayerKvLayout]) -> Option<KvCacheGrouping> {
        let sliding_window = layout.iter().filter_map(|layer| layer.sliding_window).max();
        let num_sliding = layout.iter().filter(|l| l.sliding_window.is_some()).count();
        let num_full = layout.len() - num_sliding;
        if num_sliding == 0 || num_full == 0 {
            return None;
        }
        let group_size = num_full.min(num_sliding);
        let num_full_groups = num_full.div_ceil(group_size);
        let mut seen = [0usize; 2];
        let mut buffer_kv_dims = vec![0; group_size];
        let layers = layout
            .iter()
            .map(|layer| {
                let sliding = usize::from(layer.sliding_window.is_some());
                let index = seen[sliding];
                seen[sliding] += 1;
                let group = index / group_size + sliding * num_full_groups;
                let buffer = index % group_size;
                buffer_kv_dims[buffer] = buffer_kv_dims[buffer].max(layer.kv_dim());
                (group, buffer)
            })
            .collect();
        Some(KvCacheGrouping {
            layers,
            buffer_kv_dims,
            num_full_groups,
            num_sliding_groups: num_sliding.div_ceil(group_size),
            sliding_window,
        })
    }

    pub fn num_groups(&self) -> usize {
        self.num_full_groups + self.num_sliding_groups
    }

    /// Groups of full-attention layers (indices `0..num_full_groups`).
    pub fn num_full_groups(&self) -> usize {
        self.num_full_groups
    }

    /// Groups of sliding-window layers (after the full ones).
    pub fn num_sliding_groups(&self) -> usize {
        self.num_sliding_groups
    }

    /// The sliding groups' window (`None` for [`Self::single`]).
    pub fn sliding_window(&self) -> Option<usize> {
        self.sliding_window
    }

    /// Layer `layer`'s group (whose block table it reads) and buffer.
    pub fn layer(&self, layer: usize) -> Option<(usize, usize)> {
        self.layers.get(layer).copied()
    }

    /// Bytes one block occupies over all buffers, K and V, in elements of `dtype`: what a
    /// memory budget divides by.
    pub fn bytes_per_block(&self, block_size: usize, dtype: KvCacheDType) -> usize {
        self.buffer_kv_dims
            .iter()
            .map(|&kv_dim| {
                2usize
                    .saturating_mul(block_size)
                    .saturating_mul(kv_dim)
                    .saturating_mul(dtype.element_bytes())
            })
            .fold(0, usize::saturating_add)
    }
}

/// K and V tensors, one pair per buffer of the [`KvCacheGrouping`] (per layer without the
/// hybrid grouping), each laid out `[num_blocks][block_size][num_kv_heads][head_dim]` in the
/// cache's element type (`--kv-cache-dtype`), the layout `tokenmill_kernels::paged_attention`
/// reads. A model with recurrent layers also keeps their per-sequence state here
/// ([`Self::with_state`]).
#[derive(Debug)]
pub struct KvCacheStorage {
    keys: Vec<KvCacheBuffer>,
    values: Vec<KvCacheBuffer>,
    grouping: KvCacheGrouping,
    state: StateCacheStorage,
    num_blocks: usize,
    block_size: usize,
    dtype: KvCacheDType,
}

impl KvCacheStorage {
    /// Allocates (zeroed) f32 storage for `num_blocks` blocks of `block_size` tokens.
    pub fn new(layout: &[LayerKvLayout], num_blocks: usize, block_size: usize) -> KvCacheStorage {
        KvCacheStorage::with_dtype(layout, num_blocks, block_size, KvCacheDType::F32)
    }

    /// Allocates (zeroed) storage whose K and V elements are `dtype`, one layer per entry of
    /// `layout`.
    pub fn with_dtype(
        layout: &[LayerKvLayout],
        num_blocks: usize,
        block_size: usize,
        dtype: KvCacheDType,
    ) -> KvCacheStorage {
        KvCacheStorage::grouped(
            KvCacheGrouping::single(layout),
            num_blocks,
            block_size,
            dtype,
        )
    }

    /// Allocates (zeroed) storage for `grouping`'s buffers, `num_blocks` blocks each.
    pub fn grouped(
        grouping: KvCacheGrouping,
        num_blocks: usize,
        block_size: usize,
        dtype: KvCacheDType,
    ) -> KvCacheStorage {
        let buffers = || {
            grouping
                .buffer_kv_dims
                .iter()
                .map(|&kv_dim| KvCacheBuffer::zeros(dtype, num_blocks * block_size * kv_dim))
                .collect()
        };
        KvCacheStorage {
            keys: buffers(),
            values: buffers(),
            grouping,
            state: StateCacheStorage::default(),
            num_blocks,
            block_size,
            dtype,
        }
    }

    /// The same storage holding `state` as the recurrent layers' state slots.
    pub fn with_state(mut self, state: StateCacheStorage) -> KvCacheStorage {
        self.state = state;
        self
    }

    /// The recurrent layers' state slots (empty for a model without recurrent layers).
    pub fn state(&self) -> &StateCacheStorage {
        &self.state
    }

    /// The recurrent layers' state slots, mutable.
    pub fn state_mut(&mut self) -> &mut StateCacheStorage {
        &mut self.state
    }

    /// Bytes one block occupies across all layers, K and V, in elements of `dtype`, with
    /// one buffer per layer ([`KvCacheGrouping::single`]).
    pub fn bytes_per_block(
        layout: &[LayerKvLayout],
        block_size: usize,
        dtype: KvCacheDType,
    ) -> usize {
        KvCacheGrouping::single(layout).bytes_per_block(block_size, dtype)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_layers(&self) -> usize {
        self.grouping.layers.len()
    }

    /// How the layers share block tables and buffers.
    pub fn grouping(&self) -> &KvCacheGrouping {
        &self.grouping
    }

    /// The element type K and V are stored in.
    pub fn dtype(&self) -> KvCacheDType {
        self.dtype
    }

    /// One layer's KV cache group (whose block table and slots it uses) and its K and V
    /// caches, mutable, for the attention of that layer.
    pub(crate) fn layer_mut(
        &mut self,
        layer: usize,
    ) -> Option<(usize, &mut KvCacheBuffer, &mut KvCacheBuffer)> {
        let (group, buffer) = self.grouping.layer(layer)?;
        let keys = self.keys.get_mut(buffer)?;
        let values = self.values.get_mut(buffer)?;
        Some((group, keys, values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_scratch_is_one_buffer_as_wide_as_the_widest_layer() {
        let layer = |num_kv_heads, sliding_window| LayerKvLayout {
            num_kv_heads,
            head_dim: 64,
            sliding_window,
        };
        let layout = [layer(2, None), layer(4, Some(512)), layer(2, None)];
        let shared = KvCacheGrouping::shared_scratch(&layout);
        assert_eq!(shared.num_groups(), 1);
        for index in 0..layout.len() {
            assert_eq!(shared.layer(index), Some((0, 0)));
        }
        assert_eq!(shared.layer(layout.len()), None);
        let storage = KvCacheStorage::grouped(shared, 3, 16, KvCacheDType::F32);
        assert_eq!(storage.num_layers(), 3);
        // One buffer of the widest layer (256 values per token), K and V, f32.
        assert_eq!(
            storage.grouping().bytes_per_block(16, KvCacheDType::F32),
            2 * 16 * 256 * 4
        );
        assert_eq!(
            KvCacheStorage::bytes_per_block(&layout, 16, KvCacheDType::F32),
            2 * 16 * (128 + 256 + 128) * 4
        );
    }
}
