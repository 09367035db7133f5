//! The paged KV cache's memory. Which block belongs to which sequence is the KV cache
//! manager's business (`tokenmill-core`); this is only the storage the model reads and writes.

use tokenmill_kernels::{KvCacheBuffer, KvCacheDType};

use crate::config::ModelConfig;

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
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> KvCacheStorage {
        KvCacheStorage::with_dtype(config, num_blocks, block_size, KvCacheDType::F32)
    }

    /// Allocates (zeroed) storage whose K and V elements are `dtype`.
    pub fn with_dtype(
        config: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: KvCacheDType,
    ) -> KvCacheStorage {
        let per_layer = num_blocks * block_size * config.kv_dim();
        KvCacheStorage {
            keys: (0..config.num_layers)
                .map(|_| KvCacheBuffer::zeros(dtype, per_layer))
                .collect(),
            values: (0..config.num_layers)
                .map(|_| KvCacheBuffer::zeros(dtype, per_layer))
                .collect(),
            num_blocks,
            block_size,
            dtype,
        }
    }

    /// Bytes one block occupies across all layers, K and V, in elements of `dtype`: what a
    /// memory budget divides by.
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize, dtype: KvCacheDType) -> usize {
        2usize
            .saturating_mul(config.num_layers)
            .saturating_mul(block_size)
            .saturating_mul(config.kv_dim())
            .saturating_mul(dtype.element_bytes())
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
