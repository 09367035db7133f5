//! The paged KV cache's memory. Which block belongs to which sequence is the KV cache
//! manager's business (`tokenmill-core`); this is only the storage the model reads and writes.

use tokenmill_kernels::{KvCacheBuffer, KvCacheDType};

/// What one layer keeps per cached token: its KV heads, their width, and how far back its
/// attention looks. A model reports one per layer ([`crate::CausalLm::kv_layout`]) and the
/// cache is sized from that, so families whose layers differ (Gemma 3's local and global
/// layers) need nothing special here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKvLayout {
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// `Some(w)`: the layer attends to the last `w` positions only (Gemma 3's local layers,
    /// Mistral's `sliding_window`); `None`: to the whole context. The cache still keeps every
    /// block of such a layer; freeing blocks that fell out of every window is the KV
    /// manager's later step.
    pub sliding_window: Option<usize>,
}

impl LayerKvLayout {
    /// Width of one token's key (or value) vector in this layer.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// Per-layer K and V tensors, each laid out `[num_blocks][block_size][num_kv_heads][head_dim]`
/// in the cache's element type (`--kv-cache-dtype`), the layout
/// `tokenmill_kernels::paged_attention` reads.
#[derive(Debug)]
pub struct KvCacheStorage {
    keys: Vec<KvCacheBuffer>,
    values: Vec<KvCacheBuffer>,
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
        let buffers = || {
            layout
                .iter()
                .map(|layer| KvCacheBuffer::zeros(dtype, num_blocks * block_size * layer.kv_dim()))
                .collect()
        };
        KvCacheStorage {
            keys: buffers(),
            values: buffers(),
            num_blocks,
            block_size,
            dtype,
        }
    }

    /// Bytes one block occupies across all layers, K and V, in elements of `dtype`: what a
    /// memory budget divides by.
    pub fn bytes_per_block(
        layout: &[LayerKvLayout],
        block_size: usize,
        dtype: KvCacheDType,
    ) -> usize {
        layout
            .iter()
            .map(|layer| {
                2usize
                    .saturating_mul(block_size)
                    .saturating_mul(layer.kv_dim())
                    .saturating_mul(dtype.element_bytes())
            })
            .fold(0, usize::saturating_add)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_layers(&self) -> usize {
        self.keys.len()
    }

    /// The element type K and V are stored in.
    pub fn dtype(&self) -> KvCacheDType {
        self.dtype
    }

    /// One layer's K and V caches, mutable, for the attention of that layer.
    pub(crate) fn layer_mut(
        &mut self,
        layer: usize,
    ) -> Option<(&mut KvCacheBuffer, &mut KvCacheBuffer)> {
        let keys = self.keys.get_mut(layer)?;
        let values = self.values.get_mut(layer)?;
        Some((keys, values))
    }
}
