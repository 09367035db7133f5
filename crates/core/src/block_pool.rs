//! The fixed pool of KV blocks: reference counts, the LRU free queue and the prefix-cache map.
//!
//! Every block is in exactly one of three states:
//! - used: reference count > 0, owned by one or more request block tables;
//! - cached free: count 0 but still registered under its content hash, reusable by a prefix
//!   hit until it is evicted;
//! - free: count 0, no hash.
//!
//! Free and cached-free blocks sit in one queue; allocation pops from its head. Blocks without
//! a hash are queued at the head (reusing them costs no cache entry), hashed blocks at the tail,
//! so cached content is evicted least recently freed first.
//!
//! Cached content is keyed by its hash and the KV cache group the block serves (vLLM's hybrid
//! manager: a sliding-window group's block for a hash holds other layers' K/V than the
//! full-attention group's). The hashes the pool reports ([`Self::cached_hashes`],
//! [`Self::take_removed`]) are group 0's, the group KV events describe.

use std::collections::HashMap;

use crate::block_hash::BlockHash;
use crate::error::KvCacheError;
use crate::free_queue::FreeBlockQueue;

#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_counts: Vec<u32>,
    block_hashes: Vec<Option<(BlockHash, u32)>>,
    cached_blocks: HashMap<(BlockHash, u32), u32>,
    free_queue: FreeBlockQueue,
    num_cached_free: usize,
    num_evictions: u64,
    /// Group 0's hashes dropped from the cache since the last [`Self::take_removed`]; recorded
    /// only while `record_removals` is set (KV events).
    removed: Vec<BlockHash>,
    record_removals: bool,
}

impl BlockPool {
    pub fn new(num_blocks: u32) -> Result<Self, KvCacheError> {
        if num_blocks == 0 || num_blocks == u32::MAX {
            return Err(KvCacheError::InvalidConfig {
                reason: format!("num_blocks must be in 1..{}, got {num_blocks}", u32::MAX),
            });
        }
        Ok(Self {
            ref_counts: vec![0; num_blocks as usize],
            block_hashes: vec![None; num_blocks as usize],
            cached_blocks: HashMap::new(),
            free_queue: FreeBlockQueue::new_full(num_blocks),
            num_cached_free: 0,
            num_evictions: 0,
            removed: Vec::new(),
            record_removals: false,
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks available to allocation: free plus cached-free.
    pub fn num_free_blocks(&self) -> usize {
        self.free_queue.len()
    }

    /// Free blocks that still hold reusable cached content.
    pub fn num_cached_free_blocks(&self) -> usize {
        self.num_cached_free
    }

    /// Blocks with a reference count above zero.
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.free_queue.len()
    }

    /// How many times a cached block's content was dropped to reuse the block.
    pub fn num_evictions(&self) -> u64 {
        self.num_evictions
    }

    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_counts.get(block as usize).copied().unwrap_or(0)
    }

    pub fn block_hash(&self, block: u32) -> Option<BlockHash> {
        self.block_hashes
            .get(block as usize)
            .copied()
            .flatten()
            .map(|(hash, _)| hash)
    }

    /// Starts recording the hashes that leave the cache (see [`Self::take_removed`]).
    pub fn record_removals(&mut self) {
        self.record_removals = true;
    }

    /// The hashes that left the cache since the last call, in the order they left.
    pub fn take_removed(&mut self) -> Vec<BlockHash> {
        std::mem::take(&mut self.removed)
    }

    /// How many hashes group 0's cache holds (blocks in use and cached-free).
    pub fn num_cached_hashes(&self) -> usize {
        self.cached_blocks
            .keys()
            .filter(|(_, group)| *group == 0)
            .count()
    }

    /// Every hash group 0's cache holds, in no particular order.
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.cached_blocks
            .keys()
            .filter(|(_, group)| *group == 0)
            .map(|&(hash, _)| hash)
    }

    /// Group 0's block holding content `hash`, if it is still cached.
    pub fn cached_block(&self, hash: BlockHash) -> Option<u32> {
        self.cached_block_in(0, hash)
    }

    /// KV cache group `group`'s block holding content `hash`, if it is still cached.
    pub fn cached_block_in(&self, group: u32, hash: BlockHash) -> Option<u32> {
        self.cached_blocks.get(&(hash, group)).copied()
    }

    /// Takes `count` blocks from the head of the free queue, dropping any cached content they
    /// held. All or nothing.
    pub fn allocate(&mut self, count: usize) -> Result<Vec<u32>, KvCacheError> {
        if count > self.free_queue.len() {
            return Err(KvCacheError::OutOfBlocks {
                needed: count,
                available: self.free_queue.len(),
            });
        }
        let mut blocks = Vec::with_capacity(count);
        for _ in 0..count {
            let Some(block) = self.free_queue.pop_front() else {
                break;
            };
            if let Some(key) = self.block_hashes[block as usize].take() {
                self.cached_blocks.remove(&key);
                self.num_cached_free -= 1;
                self.num_evictions += 1;
                if self.record_removals && key.1 == 0 {
                    self.removed.push(key.0);
                }
            }
            self.ref_counts[block as usize] = 1;
            blocks.push(block);
        }
        Ok(blocks)
    }

    /// Adds one reference to each block (a prefix hit), pulling free ones out of the queue.
    pub fn touch(&mut self, blocks: &[u32]) {
        for &block in blocks {
            let i = block as usize;
            if self.ref_counts[i] == 0 {
                self.free_queue.remove(block);
                if self.block_hashes[i].is_some() {
                    self.num_cached_free -= 1;
                }
            }
            self.ref_counts[i] += 1;
        }
    }

    /// Drops one reference from each block, in the given order; blocks reaching zero join the
    /// free queue in that order (hashed ones at the tail, the rest at the head).
    pub fn free(&mut self, blocks: impl IntoIterator<Item = u32>) {
        for block in blocks {
            let i = block as usize;
            debug_assert!(self.ref_counts[i] > 0, "double free of block {block}");
            self.ref_counts[i] = self.ref_counts[i].saturating_sub(1);
            if self.ref_counts[i] == 0 && !self.free_queue.contains(block) {
                if self.block_hashes[i].is_some() {
                    self.free_queue.push_back(block);
                    self.num_cached_free += 1;
                } else {
                    self.free_queue.push_front(block);
                }
            }
        }
    }

    /// Registers a used block's content hash. When another block already holds the same content
    /// (two requests computed it at once) this block stays unregistered and `false` is returned.
    pub fn cache_block(&mut self, block: u32, hash: BlockHash) -> bool {
        self.cache_block_in(0, block, hash)
    }

    /// [`Self::cache_block`] for KV cache group `group`.
    pub fn cache_block_in(&mut self, group: u32, block: u32, hash: BlockHash) -> bool {
        let i = block as usize;
        let key = (hash, group);
        if self.block_hashes[i] == Some(key) {
            return true;
        }
        if self.block_hashes[i].is_some() || self.cached_blocks.contains_key(&key) {
            return false;
        }
        self.cached_blocks.insert(key, block);
        self.block_hashes[i] = Some(key);
        if self.ref_counts[i] == 0 {
            // Not expected (callers cache blocks they own), but keeps the counters exact.
            self.num_cached_free += 1;
        }
        true
    }

    /// Forgets every cached-free block's content (vLLM's `reset_prefix_cache`); blocks in use
    /// keep theirs. Returns how many entries were dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let mut dropped = 0;
        let free_cached: Vec<u32> = self
            .free_queue
            .iter()
            .filter(|&b| self.block_hashes[b as usize].is_some())
            .collect();
        for block in free_cached {
            if let Some(key) = self.block_hashes[block as usize].take() {
                self.cached_blocks.remove(&key);
                if self.record_removals && key.1 == 0 {
                    self.removed.push(key.0);
                }
                self.free_queue.remove(block);
                self.free_queue.push_front(block);
                dropped += 1;
            }
        }
        self.num_cached_free = 0;
        dropped
    }

    /// Blocks in the order allocation would take them.
    pub fn free_queue_order(&self) -> Vec<u32> {
        self.free_queue.iter().collect()
    }

    /// Checks the pool's internal bookkeeping (queue membership, counters, hash map).
    pub fn verify(&self) -> Result<(), KvCacheError> {
        let fail = |detail: String| Err(KvCacheError::InvariantViolated { detail });
        let queued: Vec<u32> = self.free_queue.iter().collect();
        if queued.len() != self.free_queue.len() {
            return fail(format!(
                "free queue links {} blocks but counts {}",
                queued.len(),
                self.free_queue.len()
            ));
        }
        let mut cached_free = 0;
        for block in 0..self.num_blocks() as u32 {
            let i = block as usize;
            let queued = self.free_queue.contains(block);
            if queued != (self.ref_counts[i] == 0) {
                return fail(format!(
                    "block {block}: ref count {} but queued={queued}",
                    self.ref_counts[i]
                ));
            }
            if let Some(hash) = self.block_hashes[i] {
                if self.cached_blocks.get(&hash) != Some(&block) {
                    return fail(format!("block {block} has a hash not mapped to it"));
                }
                if queued {
                    cached_free += 1;
                }
            }
        }
        for (hash, &block) in &self.cached_blocks {
            if self.block_hashes.get(block as usize).copied().flatten() != Some(*hash) {
                return fail(format!(
                    "hash map points at block {block} with other content"
                ));
            }
        }
        if cached_free != self.num_cached_free {
            return fail(format!(
                "{cached_free} cached free blocks but counter says {}",
                self.num_cached_free
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_empty_pool() {
        assert!(BlockPool::new(0).is_err());
    }

    #[test]
    fn allocate_is_all_or_nothing() {
        let mut pool = BlockPool::new(3).unwrap();
        assert_eq!(
            pool.allocate(4),
            Err(KvCacheError::OutOfBlocks {
                needed: 4,
                available: 3
            })
        );
        assert_eq!(pool.num_free_blocks(), 3);
        assert_eq!(pool.allocate(2).unwrap(), vec![0, 1]);
        assert_eq!(pool.num_used_blocks(), 1 + 1);
        pool.verify().unwrap();
    }

    #[test]
    fn cached_blocks_are_evicted_lru_and_uncached_reused_first() {
        let mut pool = BlockPool::new(4).unwrap();
        let blocks = pool.allocate(4).unwrap();
        assert!(pool.cache_block(blocks[0], BlockHash(10)));
        assert!(pool.cache_block(blocks[1], BlockHash(11)));
        pool.free([blocks[1], blocks[0], blocks[2], blocks[3]]);
        // Uncached blocks 2 then 3 went to the head (3 last, so first), cached ones to the tail.
        assert_eq!(pool.free_queue_order(), vec![3, 2, 1, 0]);
        assert_eq!(pool.num_cached_free_blocks(), 2);
        assert_eq!(pool.allocate(3).unwrap(), vec![3, 2, 1]);
        assert_eq!(pool.num_evictions(), 1);
        assert_eq!(pool.cached_block(BlockHash(11)), None);
        assert_eq!(pool.cached_block(BlockHash(10)), Some(0));
        pool.verify().unwrap();
    }

    #[test]
    fn touch_revives_a_cached_free_block() {
        let mut pool = BlockPool::new(3).unwrap();
        let blocks = pool.allocate(1).unwrap();
        pool.cache_block(blocks[0], BlockHash(5));
        pool.free([blocks[0]]);
        assert_eq!(pool.num_cached_free_blocks(), 1);
        pool.touch(&[blocks[0]]);
        assert_eq!(pool.ref_count(blocks[0]), 1);
        assert_eq!(pool.num_cached_free_blocks(), 0);
        assert_eq!(pool.num_free_blocks(), 2);
        pool.touch(&[blocks[0]]);
        assert_eq!(pool.ref_count(blocks[0]), 2);
        pool.free([blocks[0]]);
        assert_eq!(pool.num_free_blocks(), 2);
        pool.verify().unwrap();
    }

    #[test]
    fn duplicate_content_is_registered_once() {
        let mut pool = BlockPool::new(2).unwrap();
        let blocks = pool.allocate(2).unwrap();
        assert!(pool.cache_block(blocks[0], BlockHash(1)));
        assert!(!pool.cache_block(blocks[1], BlockHash(1)));
        assert!(pool.cache_block(blocks[0], BlockHash(1)));
        assert_eq!(pool.block_hash(blocks[1]), None);
        pool.verify().unwrap();
    }

    #[test]
    fn reset_prefix_cache_forgets_free_content_only() {
        let mut pool = BlockPool::new(3).unwrap();
        let blocks = pool.allocate(2).unwrap();
        pool.cache_block(blocks[0], BlockHash(1));
        pool.cache_block(blocks[1], BlockHash(2));
        pool.free([blocks[0]]);
        assert_eq!(pool.reset_prefix_cache(), 1);
        assert_eq!(pool.cached_block(BlockHash(1)), None);
        assert_eq!(pool.cached_block(BlockHash(2)), Some(blocks[1]));
        assert_eq!(pool.num_cached_free_blocks(), 0);
        pool.verify().unwrap();
    }
}
