//! The paged KV cache's memory. Which block belongs to which sequence is the KV cache
//! manager's business (`tokenmill-core`); this is only the storage the model reads and writes.

use crate::config::ModelConfig;

/// Per-layer K and V tensors, each laid out `[num_blocks][block_size][num_kv_heads][head_dim]`
/// in f32, the layout `tokenmill_kernels::paged_attention` reads.
#[derive(Debug)]
pub struct KvCacheStorage {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    num_blocks: usize,
    block_size: usize,
}

impl KvCacheStorage {
    /// Allocates (zeroed) storage for `num_blocks` blocks of `block_size` tokens.
    pub fn new(config: &ModelConfig, num_blocks: usize, block_size: usize) -> KvCacheStorage {
        let per_layer = num_blocks * block_size * config.kv_dim();
        KvCacheStorage {
            keys: (0..config.num_layers)
                .map(|_| vec![0.0; per_layer])
                .collect(),
            values: (0..config.num_layers)
                .map(|_| vec![0.0; per_layer])
                .collect(),
            num_blocks,
            block_size,
        }
    }

    /// Bytes one block occupies across all layers, K and V: what a memory budget divides by.
    pub fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        2 * config.num_layers * block_size * config.kv_dim() * std::mem::size_of::<f32>()
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

    /// One layer's K and V caches, mutable, for the attention of that layer.
    pub(crate) fn layer_mut(&mut self, layer: usize) -> Option<(&mut [f32], &mut [f32])> {
        let keys = self.keys.get_mut(layer)?;
        let values = self.values.get_mut(layer)?;
        Some((keys, values))
    }
}
