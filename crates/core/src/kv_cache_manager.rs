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
//! With a sliding window ([`KvCacheConfig::sliding_window`], for models whose every layer
//! attends to the last `w` positions only, as Mistral's) a request's leading blocks that no
//! future query can see are released each step ([`KvCacheManager::remove_skipped_blocks`],
//! called by the scheduler before it grows the table) and a prefix hit only takes the blocks
//! inside the first new query's window (vLLM's sliding-window manager). The table keeps its
//! length, so position `p` stays at entry `p / block_size`: released entries hold the id of the
//! request's first block still held, a placeholder that attention never reads (it skips the
//! blocks wholly before every query's window) and that is always a valid block id.
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
    /// Every layer attends only to the last `w` positions (`(p - w, p]`): blocks wholly before
    /// the window of every future query are released. `None`: full attention (or a hybrid
    /// model, whose global layers need the whole context), nothing is released early.
    pub sliding_window: Option<usize>,
}

impl KvCacheConfig {
    /// Leading blocks that no query at position `num_computed_tokens` or later can see: with a
    /// window `w` the next query (at `num_computed_tokens`) sees keys from
    /// `num_computed_tokens + 1 - w` on, the same first block attention starts from.
    pub fn num_skipped_blocks(&self, num_computed_tokens: usize) -> usize {
        match self.sliding_window {
            Some(window) => (num_computed_tokens + 1).saturating_sub(window) / self.block_size,
            None => 0,
        }
    }

    /// The most blocks one request holds at once when a step feeds it at most
    /// `max_tokens_per_step` tokens and it never grows past `max_model_len`: the whole
    /// sequence without a window; with one, the window before the step's first token plus the
    /// step's tokens (vLLM's `ceil((w - 1 + max_num_batched_tokens) / block_size) + 1`).
    pub fn max_blocks_per_request(
        &self,
        max_model_len: usize,
        max_tokens_per_step: usize,
    ) -> usize {
        let whole = max_model_len.div_ceil(self.block_size.max(1));
        match self.sliding_window {
            Some(window) => {
                let windowed = (window.saturating_sub(1) + max_tokens_per_step)
                    .div_ceil(self.block_size.max(1))
                    + 1;
                whole.min(windowed)
            }
            None => whole,
        }
    }
}

/// The result of a prefix-cache lookup: cached blocks covering a prefix of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    /// The hit blocks the request takes: those after `num_skipped_blocks`.
    block_ids: Vec<u32>,
    /// Leading blocks of the hit outside the first new query's window (sliding window only):
    /// covered by the hit but not taken.
    num_skipped_blocks: usize,
    num_computed_tokens: usize,
    num_queried_tokens: usize,
}

impl ComputedBlocks {
    /// Tokens whose KV the hit already holds (a multiple of the block size).
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// The hit blocks the request takes, first block first (after the skipped ones).
    pub fn block_ids(&self) -> &[u32] {
        &self.block_ids
    }

    /// Leading blocks of the hit outside the window of the first new query: the request takes
    /// no block for them (0 without a sliding window).
    pub fn num_skipped_blocks(&self) -> usize {
        self.num_skipped_blocks
    }
}

#[derive(Debug, Clone, Default)]
struct RequestBlocks {
    /// One entry per block of the sequence; the first `num_skipped` are placeholders.
    block_ids: Vec<u32>,
    /// Leading blocks already registered in the prefix cache (or found there).
    num_cached_blocks: usize,
    /// Leading entries released (or never taken) because they lie before the sliding window;
    /// they hold the id of the first block still held.
    num_skipped: usize,
}

impl RequestBlocks {
    /// The blocks the request holds a reference on.
    fn owned(&self) -> &[u32] {
        &self.block_ids[self.num_skipped.min(self.block_ids.len())..]
    }

    /// Points the placeholder entries at the first block held (a valid id attention never
    /// reads). Nothing to do when they already do, or when no block is held after them yet.
    fn refresh_placeholders(&mut self) {
        if let Some(&first_held) = self.block_ids.get(self.num_skipped) {
            if self.num_skipped > 0 && self.block_ids[0] != first_held {
                self.block_ids[..self.num_skipped].fill(first_held);
            }
        }
    }
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
        // Hashes chain over the whole prefix, so a cached block at index `i` vouches for every
        // token before it: a hit of `k` blocks needs only the blocks its first new query can
        // see, those from `num_skipped_blocks(k * block_size)` on. Without a window that is
        // all of them, so the scan stops at the first miss.
        let mut run: Vec<u32> = Vec::new();
        for (index, &hash) in hashes.hashes().iter().take(max_hit_blocks).enumerate() {
            match self.pool.cached_block(hash) {
                Some(block) => run.push(block),
                None if self.config.sliding_window.is_none() => break,
                None => {
                    run.clear();
                    continue;
                }
            }
            // The hit's last block is always taken, even when a window shorter than a block
            // would need none: it is what vouches for the prefix.
            let num_hit = index + 1;
            let needed = (num_hit
                - self
                    .config
                    .num_skipped_blocks(num_hit * self.config.block_size))
            .max(1);
            if run.len() >= needed {
                result.block_ids.clear();
                result
                    .block_ids
                    .extend_from_slice(&run[run.len() - needed..]);
                result.num_skipped_blocks = num_hit - needed;
            }
        }
        result.num_computed_tokens =
            (result.num_skipped_blocks + result.block_ids.len()) * self.config.block_size;
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
        let hit_skipped = prefix_hit.map_or(0, |hit| hit.num_skipped_blocks);
        if (!hit_blocks.is_empty() || hit_skipped > 0) && existing > 0 {
            return Err(KvCacheError::AlreadyAllocated { request_id });
        }
        let required = num_total_tokens.div_ceil(self.config.block_size);
        let num_new = required.saturating_sub(existing + hit_skipped + hit_blocks.len());
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
        if hit_skipped > 0 {
            // Placeholders until a held block follows; `refresh_placeholders` sets them.
            table.block_ids.resize(hit_skipped, 0);
            table.num_skipped = hit_skipped;
        }
        table.block_ids.extend_from_slice(hit_blocks);
        table.num_cached_blocks += hit_skipped + hit_blocks.len();
        table.block_ids.extend(new_blocks);
        table.refresh_placeholders();
        if let Some(hit) = prefix_hit {
            self.prefix_stats.queries += hit.num_queried_tokens as u64;
            self.prefix_stats.hits += hit.num_computed_tokens as u64;
        }
        Ok(())
    }

    /// Releases the request's leading blocks that no query at `num_computed_tokens` or later
    /// can see (a no-op without a sliding window). The scheduler calls it before growing a
    /// running request's table, with the tokens computed so far: every query still to come is
    /// at that position or later. Released blocks keep their cached content until evicted,
    /// oldest first.
    pub fn remove_skipped_blocks(&mut self, request_id: RequestId, num_computed_tokens: usize) {
        let Some(table) = self.tables.get_mut(&request_id) else {
            return;
        };
        let target = self
            .config
            .num_skipped_blocks(num_computed_tokens)
            .min(table.block_ids.len());
        if target <= table.num_skipped {
            return;
        }
        self.pool
            .free(table.block_ids[table.num_skipped..target].iter().copied());
        table.num_skipped = target;
        table.refresh_placeholders();
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
        // Placeholder entries hold no block of this request's own to register.
        let first_new = table.num_cached_blocks.max(table.num_skipped);
        for index in first_new..num_full {
            self.pool
                .cache_block(table.block_ids[index], hashes.hashes()[index]);
        }
        table.num_cached_blocks = first_new.max(num_full);
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
            self.pool.free(table.owned().iter().rev().copied());
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
            .max(table.num_cached_blocks)
            .max(table.num_skipped);
        if keep < table.block_ids.len() {
            let tail = table.block_ids.split_off(keep);
            self.pool.free(tail.into_iter().rev());
        }
    }

    /// The request's block table, first block first: entry `i` holds positions
    /// `i * block_size..(i + 1) * block_size`. Under a sliding window the leading
    /// [`Self::num_skipped_blocks`] entries are placeholders (see the module docs).
    pub fn block_table(&self, request_id: RequestId) -> Option<&[u32]> {
        self.tables
            .get(&request_id)
            .map(|table| table.block_ids.as_slice())
    }

    /// The blocks the request holds a reference on: its table after the skipped entries.
    pub fn owned_blocks(&self, request_id: RequestId) -> Option<&[u32]> {
        self.tables.get(&request_id).map(RequestBlocks::owned)
    }

    /// Leading entries of the request's table released for the sliding window (0 without one).
    pub fn num_skipped_blocks(&self, request_id: RequestId) -> usize {
        self.tables
            .get(&request_id)
            .map_or(0, |table| table.num_skipped)
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
            if table.num_skipped > table.block_ids.len() {
                return Err(KvCacheError::InvariantViolated {
                    detail: format!("request {request_id} skips more blocks than it has"),
                });
            }
            let mut seen = table.owned().to_vec();
            seen.sort_unstable();
            if seen.windows(2).any(|pair| pair[0] == pair[1]) {
                return Err(KvCacheError::InvariantViolated {
                    detail: format!("request {request_id} holds a block twice"),
                });
            }
            for &block in table.owned() {
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
            sliding_window: None,
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

    fn windowed(num_blocks: u32, caching: bool, window: usize) -> KvCacheManager {
        KvCacheManager::new(KvCacheConfig {
            sliding_window: Some(window),
            ..manager(num_blocks, caching).config()
        })
        .unwrap()
    }

    #[test]
    fn skipped_blocks_and_the_per_request_bound() {
        let config = windowed(4, false, 6).config();
        // The query at 12 sees 7..=12: block 0 (0..4) is wholly before, block 1 (4..8) not.
        assert_eq!(config.num_skipped_blocks(12), 1);
        assert_eq!(config.num_skipped_blocks(4), 0);
        assert_eq!(config.num_skipped_blocks(13), 2);
        assert_eq!(manager(4, false).config().num_skipped_blocks(1000), 0);
        // Window 6 and 8-token steps: ceil(13 / 4) + 1 = 5 blocks, or the whole sequence.
        assert_eq!(config.max_blocks_per_request(1000, 8), 5);
        assert_eq!(config.max_blocks_per_request(12, 8), 3);
        assert_eq!(
            manager(4, false).config().max_blocks_per_request(1000, 8),
            250
        );
    }

    #[test]
    fn window_releases_leading_blocks_and_keeps_positions() {
        let mut kv = windowed(6, false, 6);
        kv.allocate_slots(RequestId(1), 12, None).unwrap();
        let table = kv.block_table(RequestId(1)).unwrap().to_vec();
        kv.remove_skipped_blocks(RequestId(1), 12);
        assert_eq!(kv.num_skipped_blocks(RequestId(1)), 1);
        assert_eq!(kv.ref_count(table[0]), 0);
        assert_eq!(kv.num_free_blocks(), 4);
        // Entry 1 still holds positions 4..8; entry 0 points at a held block.
        let now = kv.block_table(RequestId(1)).unwrap().to_vec();
        assert_eq!(now.len(), 3);
        assert_eq!(&now[1..], &table[1..]);
        assert_eq!(now[0], table[1]);
        assert_eq!(kv.owned_blocks(RequestId(1)).unwrap(), &table[1..]);
        accounting_holds(&kv);
        // Going back never re-takes blocks; growing allocates only the new ones.
        kv.remove_skipped_blocks(RequestId(1), 4);
        assert_eq!(kv.num_skipped_blocks(RequestId(1)), 1);
        kv.allocate_slots(RequestId(1), 20, None).unwrap();
        kv.remove_skipped_blocks(RequestId(1), 19);
        assert_eq!(kv.num_skipped_blocks(RequestId(1)), 3);
        assert_eq!(kv.owned_blocks(RequestId(1)).unwrap().len(), 2);
        let table = kv.block_table(RequestId(1)).unwrap().to_vec();
        assert!(table[..3].iter().all(|&b| b == table[3]));
        // Truncation keeps what was released released; free returns only held blocks.
        kv.truncate(RequestId(1), 4);
        assert_eq!(kv.block_table(RequestId(1)).unwrap().len(), 3);
        accounting_holds(&kv);
        kv.free(RequestId(1));
        assert_eq!(kv.num_used_blocks(), 0);
        accounting_holds(&kv);
    }

    #[test]
    fn window_prefix_hit_needs_and_takes_only_the_window_blocks() {
        let mut kv = windowed(8, true, 6);
        let prompt: Vec<u32> = (0..17).collect();
        run_prefill(&mut kv, 1, &prompt);
        let table_one = kv.block_table(RequestId(1)).unwrap().to_vec();
        // The query at 17 sees 12..=17: blocks 0..3 go back, cached, oldest first.
        kv.remove_skipped_blocks(RequestId(1), 17);
        assert_eq!(kv.num_cached_free_blocks(), 3);
        accounting_holds(&kv);
        // Another request takes the 3 uncached free blocks and evicts blocks 0 and 1.
        kv.allocate_slots(RequestId(2), 20, None).unwrap();
        assert_eq!(kv.num_evictions(), 2);
        kv.free(RequestId(2));
        // The same prompt plus one token: its first new query (at 16) sees 11..=16, so blocks
        // 2 and 3 suffice although blocks 0 and 1 are gone.
        let mut longer = prompt.clone();
        longer.push(99);
        let hashes = chain(&longer, None);
        let hit = kv.get_computed_blocks(&hashes, longer.len());
        assert_eq!(hit.num_computed_tokens(), 16);
        assert_eq!(hit.num_skipped_blocks(), 2);
        assert_eq!(hit.block_ids(), &table_one[2..4]);
        kv.allocate_slots(RequestId(3), longer.len(), Some(&hit))
            .unwrap();
        let table = kv.block_table(RequestId(3)).unwrap().to_vec();
        assert_eq!(table.len(), 5);
        assert_eq!(&table[2..4], &table_one[2..4]);
        assert_eq!(table[0], table_one[2]);
        assert_eq!(kv.ref_count(table_one[3]), 2);
        assert_eq!(kv.ref_count(table_one[2]), 1);
        kv.cache_full_blocks(RequestId(3), &hashes, &longer, longer.len());
        accounting_holds(&kv);
        // Without the window the same pool state gives no hit: block 0 is gone.
        let mut full = manager(8, true);
        run_prefill(&mut full, 1, &prompt);
        full.free(RequestId(1));
        full.allocate_slots(RequestId(2), 32, None).unwrap();
        assert_eq!(
            full.get_computed_blocks(&hashes, longer.len())
                .num_computed_tokens(),
            0
        );
        // A window shorter than a block: the query at 16 needs no cached key, yet the hit
        // takes its last block, which vouches for the prefix; the scheduler then releases it.
        let mut tiny = windowed(8, true, 1);
        run_prefill(&mut tiny, 1, &prompt);
        let hit = tiny.get_computed_blocks(&hashes, longer.len());
        assert_eq!(hit.num_computed_tokens(), 16);
        assert_eq!(hit.num_skipped_blocks(), 3);
        assert_eq!(hit.block_ids().len(), 1);
        tiny.allocate_slots(RequestId(2), longer.len(), Some(&hit))
            .unwrap();
        assert_eq!(tiny.owned_blocks(RequestId(2)).unwrap().len(), 2);
        tiny.remove_skipped_blocks(RequestId(2), 16);
        assert_eq!(tiny.owned_blocks(RequestId(2)).unwrap().len(), 1);
        accounting_holds(&tiny);
        tiny.free(RequestId(2));
        accounting_holds(&tiny);
    }
}
