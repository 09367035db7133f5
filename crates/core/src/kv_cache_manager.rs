//! Per-request block tables over the [`BlockPool`], with automatic prefix caching.
//!
//! The scheduler talks to this type only in token counts and request ids and gets block ids
//! back; it never sees reference counts or the free queue. The life of a request's table:
//!
//! 1. admission: [`KvCacheManager::get_computed_blocks`] looks up the longest run of cached
//!    full blocks matching the request's hash chain (a pure lookup), then
//!    [`KvCacheManager::allocate_slots`] with that hit takes references on the hit blocks and
//!    allocates the rest, atomically: on failure nothing changes, so a request that cannot be
//!    admitted leaves no references behind (vLLM splits the steps the same way);
//! 2. each step: `allocate_slots` grows the table to cover the step's tokens;
//! 3. after the step: [`KvCacheManager::cache_full_blocks`] registers blocks that are now full
//!    and computed, so later requests can share them;
//! 4. end or preemption: [`KvCacheManager::free`] drops the references, tail block first, so
//!    a request's last blocks are evicted before its (more shareable) first ones.
//!
//! With [`KvCacheManager::enable_events`] the manager also logs what the prefix cache gains
//! (step 3) and loses (evictions in step 1 or 2, [`KvCacheManager::reset_prefix_cache`]) as
//! [`KvCacheEvent`]s, drained by [`KvCacheManager::drain_events`].

use std::collections::HashMap;

use crate::block_hash::{BlockHash, BlockHashChain};
use crate::block_pool::BlockPool;
use crate::error::KvCacheError;
use crate::kv_events::KvCacheEvent;
use crate::request::RequestId;

/// Shape of the KV cache as the manager sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub num_blocks: u32,
    /// Tokens per block.
    pub block_size: usize,
    pub enable_prefix_caching: bool,
}

/// The result of a prefix-cache lookup: cached blocks covering a prefix of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    block_ids: Vec<u32>,
    num_computed_tokens: usize,
    num_queried_tokens: usize,
}

impl ComputedBlocks {
    /// Tokens whose KV the hit already holds (a multiple of the block size).
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// The hit blocks, first block first.
    pub fn block_ids(&self) -> &[u32] {
        &self.block_ids
    }
}

#[derive(Debug, Clone, Default)]
struct RequestBlocks {
    block_ids: Vec<u32>,
    /// Leading blocks already registered in the prefix cache (or found there).
    num_cached_blocks: usize,
}

/// Cumulative prefix-cache counters, in tokens (vLLM's `prefix_cache_queries/hits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
}

#[derive(Debug, Clone)]
pub struct KvCacheManager {
    config: KvCacheConfig,
    pool: BlockPool,
    tables: HashMap<RequestId, RequestBlocks>,
    prefix_stats: PrefixCacheStats,
    /// The event log; `None` until [`Self::enable_events`].
    events: Option<Vec<KvCacheEvent>>,
}

impl KvCacheManager {
    pub fn new(config: KvCacheConfig) -> Result<Self, KvCacheError> {
        if config.block_size == 0 {
            return Err(KvCacheError::InvalidConfig {
                reason: "block_size must be at least 1".to_owned(),
            });
        }
        Ok(Self {
            config,
            pool: BlockPool::new(config.num_blocks)?,
            tables: HashMap::new(),
            prefix_stats: PrefixCacheStats::default(),
            events: None,
        })
    }

    /// Starts logging [`KvCacheEvent`]s; drain them with [`Self::drain_events`].
    pub fn enable_events(&mut self) {
        if self.events.is_none() {
            self.events = Some(Vec::new());
            self.pool.record_removals();
        }
    }

    /// Moves the events logged since the last call to the end of `out`, oldest first.
    pub fn drain_events(&mut self, out: &mut Vec<KvCacheEvent>) {
        if let Some(events) = &mut self.events {
            out.append(events);
        }
    }

    /// Logs the hashes the pool dropped since the last call as one `BlockRemoved`.
    fn log_removals(&mut self) {
        if let Some(events) = &mut self.events {
            let block_hashes = self.pool.take_removed();
            if !block_hashes.is_empty() {
                events.push(KvCacheEvent::BlockRemoved { block_hashes });
            }
        }
    }

    pub fn config(&self) -> KvCacheConfig {
        self.config
    }

    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Finds the longest chain of cached full blocks matching `hashes`, for a request whose
    /// known sequence is `num_tokens` long. At least the last token is always left to compute,
    /// because the step that computes it must produce the logits of the next token. Changes
    /// nothing; pass the result to [`Self::allocate_slots`].
    pub fn get_computed_blocks(
        &self,
        hashes: &BlockHashChain,
        num_tokens: usize,
    ) -> ComputedBlocks {
        let mut result = ComputedBlocks {
            num_queried_tokens: num_tokens,
            ..ComputedBlocks::default()
        };
        if !self.config.enable_prefix_caching || num_tokens == 0 {
            return result;
        }
        let max_hit_blocks = (num_tokens - 1) / self.config.block_size;
        for &hash in hashes.hashes().iter().take(max_hit_blocks) {
            match self.pool.cached_block(hash) {
                Some(block) => result.block_ids.push(block),
                None => break,
            }
        }
        result.num_computed_tokens = result.block_ids.len() * self.config.block_size;
        result
    }

    /// Makes `request_id`'s table cover `num_total_tokens` tokens (those already computed, the
    /// prefix hit, and this step's new ones). `prefix_hit` is only for a request's admission,
    /// when it holds no blocks; its blocks become the head of the table and the lookup counts
    /// toward the prefix-cache statistics. All or nothing: on
    /// [`KvCacheError::OutOfBlocks`] nothing changed.
    pub fn allocate_slots(
        &mut self,
        request_id: RequestId,
        num_total_tokens: usize,
        prefix_hit: Option<&ComputedBlocks>,
    ) -> Result<(), KvCacheError> {
        let existing = self
            .tables
            .get(&request_id)
            .map_or(0, |table| table.block_ids.len());
        let hit_blocks = prefix_hit.map_or(&[][..], |hit| hit.block_ids.as_slice());
        if !hit_blocks.is_empty() && existing > 0 {
            return Err(KvCacheError::AlreadyAllocated { request_id });
        }
        let required = num_total_tokens.div_ceil(self.config.block_size);
        let num_new = required.saturating_sub(existing + hit_blocks.len());
        // Hit blocks nobody references sit in the free queue; taking them shrinks what is left
        // to allocate from.
        let hit_from_free_queue = hit_blocks
            .iter()
            .filter(|&&block| self.pool.ref_count(block) == 0)
            .count();
        let needed = num_new + hit_from_free_queue;
        if needed > self.pool.num_free_blocks() {
            return Err(KvCacheError::OutOfBlocks {
                needed,
                available: self.pool.num_free_blocks(),
            });
        }
        self.pool.touch(hit_blocks);
        let new_blocks = self.pool.allocate(num_new)?;
        self.log_removals();
        let table = self.tables.entry(request_id).or_default();
        table.block_ids.extend_from_slice(hit_blocks);
        table.num_cached_blocks += hit_blocks.len();
        table.block_ids.extend(new_blocks);
        if let Some(hit) = prefix_hit {
            self.prefix_stats.queries += hit.num_queried_tokens as u64;
            self.prefix_stats.hits += hit.num_computed_tokens as u64;
        }
        Ok(())
    }

    /// Registers the request's blocks that are full and computed (the first
    /// `num_computed_tokens` tokens) under their chain hashes. `token_ids` is the request's
    /// sequence (at least those tokens), for the `BlockStored` event. A no-op without prefix
    /// caching.
    pub fn cache_full_blocks(
        &mut self,
        request_id: RequestId,
        hashes: &BlockHashChain,
        token_ids: &[u32],
        num_computed_tokens: usize,
    ) {
        if !self.config.enable_prefix_caching {
            return;
        }
        let Some(table) = self.tables.get_mut(&request_id) else {
            return;
        };
        let block_size = self.config.block_size;
        let num_full = (num_computed_tokens / block_size)
            .min(hashes.hashes().len())
            .min(table.block_ids.len())
            .min(token_ids.len() / block_size);
        let first_new = table.num_cached_blocks;
        for index in first_new..num_full {
            self.pool
                .cache_block(table.block_ids[index], hashes.hashes()[index]);
        }
        table.num_cached_blocks = table.num_cached_blocks.max(num_full);
        // A block whose content another block already holds is not registered again, but its
        // hash is cached all the same, so the event still names it: set semantics hold.
        if let Some(events) = &mut self.events {
            if num_full > first_new {
                events.push(KvCacheEvent::BlockStored {
                    block_hashes: hashes.hashes()[first_new..num_full].to_vec(),
                    parent_block_hash: first_new
                        .checked_sub(1)
                        .map(|parent| hashes.hashes()[parent]),
                    token_ids: token_ids[first_new * block_size..num_full * block_size].to_vec(),
                    block_size,
                    lora_id: hashes.extra_keys().adapter_id,
                });
            }
        }
    }

    /// Releases every block of the request; cached content stays reusable until evicted.
    pub fn free(&mut self, request_id: RequestId) {
        if let Some(table) = self.tables.remove(&request_id) {
            self.pool.free(table.block_ids.into_iter().rev());
        }
    }

    /// Shrinks the request's table to the blocks covering its first `num_tokens` tokens,
    /// freeing the rest (tail first), e.g. the lookahead blocks of rejected draft tokens.
    /// Registered blocks are never dropped: they hold computed tokens only.
    pub fn truncate(&mut self, request_id: RequestId, num_tokens: usize) {
        let Some(table) = self.tables.get_mut(&request_id) else {
            return;
        };
        let keep = num_tokens
            .div_ceil(self.config.block_size)
            .max(table.num_cached_blocks);
        if keep < table.block_ids.len() {
            let tail = table.block_ids.split_off(keep);
            self.pool.free(tail.into_iter().rev());
        }
    }

    /// The request's block table, first block first.
    pub fn block_table(&self, request_id: RequestId) -> Option<&[u32]> {
        self.tables
            .get(&request_id)
            .map(|table| table.block_ids.as_slice())
    }

    /// Requests currently holding a table.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks allocation may take: free plus cached-free.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    pub fn num_cached_free_blocks(&self) -> usize {
        self.pool.num_cached_free_blocks()
    }

    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used_blocks()
    }

    /// Fraction of blocks referenced by some request (vLLM's `kv_cache_usage_perc`, 0..1).
    pub fn usage(&self) -> f64 {
        self.pool.num_used_blocks() as f64 / self.pool.num_blocks() as f64
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.prefix_stats
    }

    pub fn num_evictions(&self) -> u64 {
        self.pool.num_evictions()
    }

    /// Reference count of one block (for tests and debugging).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.pool.ref_count(block)
    }

    /// Drops all cached content of free blocks. vLLM's `reset_prefix_cache`. Logged as
    /// `AllBlocksCleared` when nothing stays cached, else as the `BlockRemoved` of what went.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let dropped = self.pool.reset_prefix_cache();
        if self.pool.num_cached_hashes() == 0 {
            if let Some(events) = &mut self.events {
                self.pool.take_removed();
                events.push(KvCacheEvent::AllBlocksCleared);
            }
        } else {
            self.log_removals();
        }
        dropped
    }

    /// Every block hash the prefix cache holds, in no particular order.
    pub fn cached_block_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.pool.cached_hashes()
    }

    /// Checks that every reference count equals the number of tables holding the block, that
    /// no table holds a block twice, and the pool's own bookkeeping.
    pub fn verify(&self) -> Result<(), KvCacheError> {
        self.pool.verify()?;
        let mut owners = vec![0u32; self.pool.num_blocks()];
        for (request_id, table) in &self.tables {
            let mut seen = table.block_ids.clone();
            seen.sort_unstable();
            if seen.windows(2).any(|pair| pair[0] == pair[1]) {
                return Err(KvCacheError::InvariantViolated {
                    detail: format!("request {request_id} holds a block twice"),
                });
            }
            for &block in &table.block_ids {
                match owners.get_mut(block as usize) {
                    Some(count) => *count += 1,
                    None => {
                        return Err(KvCacheError::InvariantViolated {
                            detail: format!("request {request_id} holds unknown block {block}"),
                        })
                    }
                }
            }
        }
        for (block, &count) in owners.iter().enumerate() {
            let ref_count = self.pool.ref_count(block as u32);
            if ref_count != count {
                return Err(KvCacheError::InvariantViolated {
                    detail: format!("block {block}: ref count {ref_count}, {count} owners"),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::BlockHashExtraKeys;

    const BLOCK: usize = 4;

    fn manager(num_blocks: u32, caching: bool) -> KvCacheManager {
        KvCacheManager::new(KvCacheConfig {
            num_blocks,
            block_size: BLOCK,
            enable_prefix_caching: caching,
        })
        .unwrap()
    }

    fn chain(tokens: &[u32], salt: Option<&str>) -> BlockHashChain {
        let mut chain = BlockHashChain::new(
            BLOCK,
            BlockHashExtraKeys {
                cache_salt: salt.map(str::to_owned),
                adapter_id: None,
            },
        );
        chain.extend(tokens);
        chain
    }

    /// Admits `tokens` as request `id`, computes it fully and caches its full blocks.
    fn run_prefill(kv: &mut KvCacheManager, id: u64, tokens: &[u32]) -> ComputedBlocks {
        let hashes = chain(tokens, None);
        let hit = kv.get_computed_blocks(&hashes, tokens.len());
        kv.allocate_slots(RequestId(id), tokens.len(), Some(&hit))
            .unwrap();
        kv.cache_full_blocks(RequestId(id), &hashes, tokens, tokens.len());
        hit
    }

    fn accounting_holds(kv: &KvCacheManager) {
        let uncached_free = kv.num_free_blocks() - kv.num_cached_free_blocks();
        assert_eq!(
            uncached_free + kv.num_cached_free_blocks() + kv.num_used_blocks(),
            kv.num_blocks()
        );
        kv.verify().unwrap();
    }

    #[test]
    fn allocates_whole_blocks_for_tokens() {
        let mut kv = manager(10, false);
        kv.allocate_slots(RequestId(1), 5, None).unwrap();
        assert_eq!(kv.block_table(RequestId(1)).unwrap().len(), 2);
        kv.allocate_slots(RequestId(1), 8, None).unwrap();
        assert_eq!(kv.block_table(RequestId(1)).unwrap().len(), 2);
        kv.allocate_slots(RequestId(1), 9, None).unwrap();
        assert_eq!(kv.block_table(RequestId(1)).unwrap(), &[0, 1, 2]);
        assert!((kv.usage() - 0.3).abs() < 1e-12);
        accounting_holds(&kv);
    }

    #[test]
    fn out_of_blocks_changes_nothing() {
        let mut kv = manager(3, false);
        kv.allocate_slots(RequestId(1), 8, None).unwrap();
        let err = kv.allocate_slots(RequestId(2), 8, None).unwrap_err();
        assert_eq!(
            err,
            KvCacheError::OutOfBlocks {
                needed: 2,
                available: 1
            }
        );
        assert!(kv.block_table(RequestId(2)).is_none());
        assert_eq!(kv.num_free_blocks(), 1);
        accounting_holds(&kv);
    }

    #[test]
    fn prefix_hit_shares_full_blocks_but_never_the_last_token() {
        let mut kv = manager(10, true);
        let prompt: Vec<u32> = (0..12).collect();
        run_prefill(&mut kv, 1, &prompt);

        // Identical 12-token prompt: only 2 of its 3 full blocks may be hit.
        let hit = kv.get_computed_blocks(&chain(&prompt, None), prompt.len());
        assert_eq!(hit.num_computed_tokens(), 8);
        let table_one = kv.block_table(RequestId(1)).unwrap().to_vec();
        assert_eq!(hit.block_ids(), &table_one[..2]);

        // Longer prompt sharing all 3 blocks.
        let mut longer = prompt.clone();
        longer.extend([100, 101]);
        let hit = run_prefill(&mut kv, 2, &longer);
        assert_eq!(hit.num_computed_tokens(), 12);
        assert_eq!(&kv.block_table(RequestId(2)).unwrap()[..3], &table_one[..]);
        for &block in &table_one {
            assert_eq!(kv.ref_count(block), 2);
        }
        assert_eq!(
            kv.prefix_cache_stats(),
            PrefixCacheStats {
                queries: 12 + 14,
                hits: 12
            }
        );
        accounting_holds(&kv);
    }

    #[test]
    fn divergent_or_salted_prompts_do_not_hit() {
        let mut kv = manager(10, true);
        let prompt: Vec<u32> = (0..9).collect();
        run_prefill(&mut kv, 1, &prompt);
        let mut diverged = prompt.clone();
        diverged[5] = 99;
        let hit = kv.get_computed_blocks(&chain(&diverged, None), diverged.len());
        assert_eq!(hit.num_computed_tokens(), 4, "only the first block matches");
        let salted = kv.get_computed_blocks(&chain(&prompt, Some("other")), prompt.len());
        assert_eq!(salted.num_computed_tokens(), 0);
    }

    #[test]
    fn freed_blocks_stay_cached_until_evicted() {
        let mut kv = manager(4, true);
        let prompt: Vec<u32> = (0..9).collect();
        run_prefill(&mut kv, 1, &prompt);
        let table = kv.block_table(RequestId(1)).unwrap().to_vec();
        kv.free(RequestId(1));
        assert_eq!(kv.num_used_blocks(), 0);
        assert_eq!(kv.num_cached_free_blocks(), 2);
        accounting_holds(&kv);

        // Reuse from the cache: the hit blocks leave the free queue.
        let hit = run_prefill(&mut kv, 2, &prompt);
        assert_eq!(hit.num_computed_tokens(), 8);
        assert_eq!(&kv.block_table(RequestId(2)).unwrap()[..2], &table[..2]);
        kv.free(RequestId(2));

        // A different 16-token request needs all 4 blocks: both cached ones are evicted,
        // the request's tail block first.
        let other: Vec<u32> = (50..66).collect();
        let hashes = chain(&other, None);
        kv.allocate_slots(RequestId(3), 16, None).unwrap();
        kv.cache_full_blocks(RequestId(3), &hashes, &other, 16);
        assert_eq!(kv.num_evictions(), 2);
        let hit = kv.get_computed_blocks(&chain(&prompt, None), prompt.len());
        assert_eq!(hit.num_computed_tokens(), 0);
        accounting_holds(&kv);
    }

    #[test]
    fn free_returns_tail_blocks_first_for_eviction() {
        let mut kv = manager(6, true);
        let prompt: Vec<u32> = (0..13).collect();
        run_prefill(&mut kv, 1, &prompt);
        let table = kv.block_table(RequestId(1)).unwrap().to_vec();
        kv.free(RequestId(1));
        // Three cached blocks; evicting one must take the request's last full block, so the
        // first two still match.
        kv.allocate_slots(RequestId(2), 4 * BLOCK, None).unwrap();
        assert_eq!(kv.num_evictions(), 1);
        let hit = kv.get_computed_blocks(&chain(&prompt, None), prompt.len());
        assert_eq!(hit.block_ids(), &table[..2]);
    }

    #[test]
    fn a_free_hit_block_counts_against_free_space() {
        let mut kv = manager(3, true);
        let prompt: Vec<u32> = (0..9).collect();
        run_prefill(&mut kv, 1, &prompt);
        kv.free(RequestId(1));
        kv.allocate_slots(RequestId(2), 4, None).unwrap();
        // Request 2 took the uncached block; the queue holds the 2 cached ones. Taking both as
        // a hit plus 1 new block needs 3 blocks from a queue of 2.
        let hit = kv.get_computed_blocks(&chain(&prompt, None), prompt.len());
        assert_eq!(hit.num_computed_tokens(), 8);
        let err = kv
            .allocate_slots(RequestId(3), hit.num_computed_tokens() + 1, Some(&hit))
            .unwrap_err();
        assert!(matches!(err, KvCacheError::OutOfBlocks { .. }));
        accounting_holds(&kv);
    }

    #[test]
    fn prefix_hit_on_a_request_with_blocks_is_rejected() {
        let mut kv = manager(8, true);
        let prompt: Vec<u32> = (0..9).collect();
        run_prefill(&mut kv, 1, &prompt);
        let hit = kv.get_computed_blocks(&chain(&prompt, None), prompt.len());
        assert_eq!(
            kv.allocate_slots(RequestId(1), 12, Some(&hit)),
            Err(KvCacheError::AlreadyAllocated {
                request_id: RequestId(1)
            })
        );
    }

    #[test]
    fn caching_disabled_never_hits() {
        let mut kv = manager(8, false);
        let prompt: Vec<u32> = (0..9).collect();
        run_prefill(&mut kv, 1, &prompt);
        kv.free(RequestId(1));
        assert_eq!(kv.num_cached_free_blocks(), 0);
        let hit = kv.get_computed_blocks(&chain(&prompt, None), prompt.len());
        assert_eq!(hit.num_computed_tokens(), 0);
    }
}
