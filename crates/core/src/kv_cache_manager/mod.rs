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
//! Hybrid models (Gemma 3's local and global layers, [`KvCacheGroups::Hybrid`]) keep one
//! table per KV cache group, all drawn from the one pool and all of the same length: every
//! step allocates, releases and frees in every group at once, all or nothing; a
//! sliding-window group releases its leading blocks as above while full-attention groups
//! keep theirs. Cached blocks are keyed by hash and group, and a prefix hit is the longest
//! one every group can serve (vLLM's `HybridKVCacheCoordinator`): the full groups' run of
//! cached blocks from the start caps it, and each sliding group needs the blocks inside the
//! hit's window.
//!
//! A model with recurrent layers ([`KvCacheConfig::state_slots`]) also needs one
//! recurrent-state slot per request ([`crate::StateSlotPool`], owned here): the request's
//! first `allocate_slots` takes a free slot together with its first blocks, all or nothing
//! ([`KvCacheError::OutOfStateSlots`] when none is free, so admission waits as for blocks),
//! and `free` releases it with the blocks, so a request holds a slot exactly while it holds
//! tables. Prefix caching is off for such a model ([`KvCacheConfig::prefix_caching_active`]).
//!
//! With [`KvCacheManager::enable_events`] the manager also logs what the prefix cache gains
//! (step 3) and loses (evictions in step 1 or 2, [`KvCacheManager::reset_prefix_cache`]) as
//! [`KvCacheEvent`]s, drained by [`KvCacheManager::drain_events`]; they describe group 0's
//! cache (the full-attention group of a hybrid model).

mod config;

use std::collections::HashMap;

use crate::block_hash::{BlockHash, BlockHashChain};
use crate::block_pool::BlockPool;
use crate::error::KvCacheError;
use crate::kv_events::KvCacheEvent;
use crate::request::RequestId;
use crate::state_slots::StateSlotPool;

pub use config::{KvCacheConfig, KvCacheGroups};

/// One group's part of a prefix hit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GroupHit {
    /// The hit blocks the request takes in this group: those after `num_skipped_blocks`.
    block_ids: Vec<u32>,
    /// Leading blocks of the hit outside the first new query's window (sliding-window groups
    /// only): covered by the hit but not taken.
    num_skipped_blocks: usize,
}

/// The result of a prefix-cache lookup: cached blocks covering a prefix of a request, in
/// every KV cache group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    /// One entry per group (empty when nothing was hit).
    groups: Vec<GroupHit>,
    num_computed_tokens: usize,
    num_queried_tokens: usize,
}

impl ComputedBlocks {
    /// Tokens whose KV the hit already holds (a multiple of the block size).
    pub fn num_computed_tokens(&self) -> usize {
        self.num_computed_tokens
    }

    /// Group 0's hit blocks the request takes, first block first (after the skipped ones).
    pub fn block_ids(&self) -> &[u32] {
        self.group_block_ids(0)
    }

    /// Group `group`'s hit blocks the request takes, first block first.
    pub fn group_block_ids(&self, group: usize) -> &[u32] {
        self.groups
            .get(group)
            .map_or(&[][..], |hit| hit.block_ids.as_slice())
    }

    /// Group 0's leading blocks of the hit outside the window of the first new query: the
    /// request takes no block for them (0 without a sliding window).
    pub fn num_skipped_blocks(&self) -> usize {
        self.group_num_skipped_blocks(0)
    }

    /// [`Self::num_skipped_blocks`] of group `group`.
    pub fn group_num_skipped_blocks(&self, group: usize) -> usize {
        self.groups
            .get(group)
            .map_or(0, |hit| hit.num_skipped_blocks)
    }

    fn is_empty(&self) -> bool {
        self.groups
            .iter()
            .all(|hit| hit.block_ids.is_empty() && hit.num_skipped_blocks == 0)
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
    /// Per request, one table per KV cache group, all of the same length.
    tables: HashMap<RequestId, Vec<RequestBlocks>>,
    prefix_stats: PrefixCacheStats,
    /// The event log; `None` until [`Self::enable_events`].
    events: Option<Vec<KvCacheEvent>>,
    /// One recurrent-state slot per request holding tables (empty without recurrent layers).
    state: StateSlotPool,
}

impl KvCacheManager {
    pub fn new(config: KvCacheConfig) -> Result<Self, KvCacheError> {
        if let Some(reason) = config.invalid_reason() {
            return Err(KvCacheError::InvalidConfig { reason });
        }
        Ok(Self {
            config,
            pool: BlockPool::new(config.num_blocks)?,
            tables: HashMap::new(),
            prefix_stats: PrefixCacheStats::default(),
            events: None,
            state: StateSlotPool::new(config.state_slots.num_slots),
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

    pub fn num_groups(&self) -> usize {
        self.config.num_groups()
    }

    /// Blocks a hit of `num_hit` blocks must hold in a group with `window`: those its first
    /// new query can see, and always the last one, even when a window shorter than a block
    /// would need none (it is what vouches for the prefix).
    fn needed_hit_blocks(&self, window: Option<usize>, num_hit: usize) -> usize {
        let skipped = self
            .config
            .skipped_blocks_for(window, num_hit * self.config.block_size);
        (num_hit - skipped).max(1)
    }

    /// Finds the longest chain of cached full blocks matching `hashes` that every group can
    /// serve, for a request whose known sequence is `num_tokens` long. At least the last
    /// token is always left to compute, because the step that computes it must produce the
    /// logits of the next token. Changes nothing; pass the result to [`Self::allocate_slots`].
    pub fn get_computed_blocks(
        &self,
        hashes: &BlockHashChain,
        num_tokens: usize,
    ) -> ComputedBlocks {
        let mut result = ComputedBlocks {
            num_queried_tokens: num_tokens,
            ..ComputedBlocks::default()
        };
        if !self.config.prefix_caching_active() || num_tokens == 0 {
            return result;
        }
        let max_hit_blocks = ((num_tokens - 1) / self.config.block_size).min(hashes.hashes().len());
        let hashes = &hashes.hashes()[..max_hit_blocks];
        let num_groups = self.num_groups();
        // Full-attention groups first: their run of cached blocks from the start caps the
        // hit (a hash chain vouches for every token before it, so a miss ends the run).
        let mut limit = max_hit_blocks;
        let mut found: Vec<Vec<Option<u32>>> = vec![Vec::new(); num_groups];
        for (group, blocks) in found.iter_mut().enumerate() {
            if self.config.group_window(group).is_some() {
                continue;
            }
            for &hash in &hashes[..limit] {
                match self.pool.cached_block_in(group as u32, hash) {
                    Some(block) => blocks.push(Some(block)),
                    None => break,
                }
            }
            limit = limit.min(blocks.len());
        }
        // Sliding-window groups: a hit of `k` blocks needs only the blocks its first new
        // query can see, so runs may start after holes (evicted old blocks).
        let mut runs: Vec<Vec<usize>> = vec![Vec::new(); num_groups];
        for (group, blocks) in found.iter_mut().enumerate() {
            if self.config.group_window(group).is_none() {
                continue;
            }
            let mut run = 0;
            for &hash in &hashes[..limit] {
                let block = self.pool.cached_block_in(group as u32, hash);
                run = if block.is_some() { run + 1 } else { 0 };
                blocks.push(block);
                runs[group].push(run);
            }
        }
        // The longest hit every group serves (k = 0, no hit, always does).
        let serves = |k: usize| {
            (0..num_groups).all(|group| match self.config.group_window(group) {
                None => found[group].len() >= k,
                window => runs[group][k - 1] >= self.needed_hit_blocks(window, k),
            })
        };
        let Some(num_hit) = (1..=limit).rev().find(|&k| serves(k)) else {
            return result;
        };
        result.groups = (0..num_groups)
            .map(|group| {
                let needed = match self.config.group_window(group) {
                    None => num_hit,
                    window => self.needed_hit_blocks(window, num_hit),
                };
                GroupHit {
                    block_ids: found[group][num_hit - needed..num_hit]
                        .iter()
                        .flatten()
                        .copied()
                        .collect(),
                    num_skipped_blocks: num_hit - needed,
                }
            })
            .collect();
        result.num_computed_tokens = num_hit * self.config.block_size;
        result
    }

    /// Makes `request_id`'s tables cover `num_total_tokens` tokens (those already computed,
    /// the prefix hit, and this step's new ones) in every group. `prefix_hit` is only for a
    /// request's admission, when it holds no blocks; its blocks become the head of the tables
    /// and the lookup counts toward the prefix-cache statistics. A request's first call also
    /// takes its recurrent-state slot when the model has recurrent layers. All or nothing: on
    /// [`KvCacheError::OutOfBlocks`] or [`KvCacheError::OutOfStateSlots`] nothing changed.
    pub fn allocate_slots(
        &mut self,
        request_id: RequestId,
        num_total_tokens: usize,
        prefix_hit: Option<&ComputedBlocks>,
    ) -> Result<(), KvCacheError> {
        let num_groups = self.num_groups();
        let existing = self
            .tables
            .get(&request_id)
            .and_then(|tables| tables.first())
            .map_or(0, |table| table.block_ids.len());
        let hit = prefix_hit.filter(|hit| !hit.is_empty());
        if hit.is_some() && existing > 0 {
            return Err(KvCacheError::AlreadyAllocated { request_id });
        }
        let required = num_total_tokens.div_ceil(self.config.block_size);
        let group_hit = |group: usize| {
            hit.map_or((&[][..], 0), |hit| {
                (
                    hit.group_block_ids(group),
                    hit.group_num_skipped_blocks(group),
                )
            })
        };
        let mut num_new = Vec::with_capacity(num_groups);
        // Hit blocks nobody references sit in the free queue; taking them shrinks what is left
        // to allocate from.
        let mut needed = 0;
        for group in 0..num_groups {
            let (blocks, skipped) = group_hit(group);
            let new = required.saturating_sub(existing + skipped + blocks.len());
            num_new.push(new);
            needed += new
                + blocks
                    .iter()
                    .filter(|&&block| self.pool.ref_count(block) == 0)
                    .count();
        }
        let needs_state_slot =
            self.config.state_slots.is_enabled() && !self.tables.contains_key(&request_id);
        if needs_state_slot && self.state.num_free() == 0 {
            return Err(KvCacheError::OutOfStateSlots {
                num_slots: self.state.num_slots(),
            });
        }
        if needed > self.pool.num_free_blocks() {
            return Err(KvCacheError::OutOfBlocks {
                needed,
                available: self.pool.num_free_blocks(),
            });
        }
        for group in 0..num_groups {
            self.pool.touch(group_hit(group).0);
        }
        let mut new_blocks = self.pool.allocate(num_new.iter().sum())?.into_iter();
        if needs_state_slot {
            // A free slot was checked for above, so this cannot fail.
            self.state.allocate(request_id)?;
        }
        self.log_removals();
        let tables = self
            .tables
            .entry(request_id)
            .or_insert_with(|| vec![RequestBlocks::default(); num_groups]);
        for (group, table) in tables.iter_mut().enumerate() {
            let (blocks, skipped) = group_hit(group);
            if skipped > 0 {
                // Placeholders until a held block follows; `refresh_placeholders` sets them.
                table.block_ids.resize(skipped, 0);
                table.num_skipped = skipped;
            }
            table.block_ids.extend_from_slice(blocks);
            table.num_cached_blocks += skipped + blocks.len();
            table
                .block_ids
                .extend(new_blocks.by_ref().take(num_new[group]));
            table.refresh_placeholders();
        }
        if let Some(hit) = prefix_hit {
            self.prefix_stats.queries += hit.num_queried_tokens as u64;
            self.prefix_stats.hits += hit.num_computed_tokens as u64;
        }
        Ok(())
    }

    /// Releases the request's leading blocks that no query at `num_computed_tokens` or later
    /// can see, in every sliding-window group (a no-op without one). The scheduler calls it
    /// before growing a running request's tables, with the tokens computed so far: every
    /// query still to come is at that position or later. Released blocks keep their cached
    /// content until evicted, oldest first.
    pub fn remove_skipped_blocks(&mut self, request_id: RequestId, num_computed_tokens: usize) {
        let Some(tables) = self.tables.get_mut(&request_id) else {
            return;
        };
        for (group, table) in tables.iter_mut().enumerate() {
            let target = self
                .config
                .group_skipped_blocks(group, num_computed_tokens)
                .min(table.block_ids.len());
            if target <= table.num_skipped {
                continue;
            }
            self.pool
                .free(table.block_ids[table.num_skipped..target].iter().copied());
            table.num_skipped = target;
            table.refresh_placeholders();
        }
    }

    /// Registers the request's blocks that are full and computed (the first
    /// `num_computed_tokens` tokens) under their chain hashes, in every group. `token_ids` is
    /// the request's sequence (at least those tokens), for the `BlockStored` event (group
    /// 0's blocks). A no-op without prefix caching.
    pub fn cache_full_blocks(
        &mut self,
        request_id: RequestId,
        hashes: &BlockHashChain,
        token_ids: &[u32],
        num_computed_tokens: usize,
    ) {
        if !self.config.prefix_caching_active() {
            return;
        }
        let Some(tables) = self.tables.get_mut(&request_id) else {
            return;
        };
        let block_size = self.config.block_size;
        let mut stored = None;
        for (group, table) in tables.iter_mut().enumerate() {
            let num_full = (num_computed_tokens / block_size)
                .min(hashes.hashes().len())
                .min(table.block_ids.len())
                .min(token_ids.len() / block_size);
            // Placeholder entries hold no block of this request's own to register.
            let first_new = table.num_cached_blocks.max(table.num_skipped);
            for index in first_new..num_full {
                self.pool.cache_block_in(
                    group as u32,
                    table.block_ids[index],
                    hashes.hashes()[index],
                );
            }
            table.num_cached_blocks = first_new.max(num_full);
            if group == 0 && num_full > first_new {
                stored = Some((first_new, num_full));
            }
        }
        // A block whose content another block already holds is not registered again, but its
        // hash is cached all the same, so the event still names it: set semantics hold.
        if let (Some(events), Some((first_new, num_full))) = (&mut self.events, stored) {
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

    /// Releases every block of the request, in every group, each table tail first; cached
    /// content stays reusable until evicted.
    pub fn free(&mut self, request_id: RequestId) {
        if let Some(tables) = self.tables.remove(&request_id) {
            for table in &tables {
                self.pool.free(table.owned().iter().rev().copied());
            }
        }
        self.state.free(request_id);
    }

    /// Shrinks the request's tables to the blocks covering its first `num_tokens` tokens,
    /// freeing the rest (tail first), e.g. the lookahead blocks of rejected draft tokens.
    /// Registered blocks are never dropped: they hold computed tokens only. Every group keeps
    /// the same length.
    pub fn truncate(&mut self, request_id: RequestId, num_tokens: usize) {
        let Some(tables) = self.tables.get_mut(&request_id) else {
            return;
        };
        let keep = tables
            .iter()
            .map(|table| table.num_cached_blocks.max(table.num_skipped))
            .fold(num_tokens.div_ceil(self.config.block_size), usize::max);
        for table in tables.iter_mut() {
            if keep < table.block_ids.len() {
                let tail = table.block_ids.split_off(keep);
                self.pool.free(tail.into_iter().rev());
            }
        }
    }

    /// Group 0's block table of the request (see [`Self::group_block_table`]).
    pub fn block_table(&self, request_id: RequestId) -> Option<&[u32]> {
        self.group_block_table(request_id, 0)
    }

    /// The request's block table in group `group`, first block first: entry `i` holds
    /// positions `i * block_size..(i + 1) * block_size`. In a sliding-window group the leading
    /// [`Self::group_num_skipped_blocks`] entries are placeholders (see the module docs).
    pub fn group_block_table(&self, request_id: RequestId, group: usize) -> Option<&[u32]> {
        self.tables
            .get(&request_id)
            .and_then(|tables| tables.get(group))
            .map(|table| table.block_ids.as_slice())
    }

    /// The request's block tables, one per group.
    pub fn block_tables(&self, request_id: RequestId) -> Vec<Vec<u32>> {
        self.tables
            .get(&request_id)
            .map_or_else(Vec::new, |tables| {
                tables.iter().map(|table| table.block_ids.clone()).collect()
            })
    }

    /// The blocks the request holds a reference on in group 0: its table after the skipped
    /// entries.
    pub fn owned_blocks(&self, request_id: RequestId) -> Option<&[u32]> {
        self.group_owned_blocks(request_id, 0)
    }

    /// [`Self::owned_blocks`] of group `group`.
    pub fn group_owned_blocks(&self, request_id: RequestId, group: usize) -> Option<&[u32]> {
        self.tables
            .get(&request_id)
            .and_then(|tables| tables.get(group))
            .map(RequestBlocks::owned)
    }

    /// Blocks the request holds a reference on, over all groups.
    pub fn num_owned_blocks(&self, request_id: RequestId) -> usize {
        self.tables.get(&request_id).map_or(0, |tables| {
            tables.iter().map(|table| table.owned().len()).sum()
        })
    }

    /// Leading entries of the request's group-0 table released for the sliding window (0
    /// without one).
    pub fn num_skipped_blocks(&self, request_id: RequestId) -> usize {
        self.group_num_skipped_blocks(request_id, 0)
    }

    /// [`Self::num_skipped_blocks`] of group `group`.
    pub fn group_num_skipped_blocks(&self, request_id: RequestId, group: usize) -> usize {
        self.tables
            .get(&request_id)
            .and_then(|tables| tables.get(group))
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

    /// The recurrent-state slot the request holds (`None` without recurrent layers, or when
    /// the request holds no tables).
    pub fn state_slot(&self, request_id: RequestId) -> Option<u32> {
        self.state.slot(request_id)
    }

    /// Recurrent-state slots in the pool (0 without recurrent layers).
    pub fn num_state_slots(&self) -> usize {
        self.state.num_slots() as usize
    }

    /// Recurrent-state slots no request holds.
    pub fn num_free_state_slots(&self) -> usize {
        self.state.num_free()
    }

    /// Fraction of the KV cache referenced by requests (vLLM's `kv_cache_usage_perc`, 0..1):
    /// used blocks over all blocks; with recurrent-state slots, bytes-weighted over both
    /// (`used_blocks * bytes_per_block + used_slots * bytes_per_slot` over the same with every
    /// block and slot), since both come out of the one KV budget, as vLLM's state blocks come
    /// out of its one page pool.
    pub fn usage(&self) -> f64 {
        let slots = self.config.state_slots;
        if !slots.is_enabled() {
            return self.pool.num_used_blocks() as f64 / self.pool.num_blocks() as f64;
        }
        let (block, slot) = (slots.bytes_per_block as f64, slots.bytes_per_slot as f64);
        let used = self.pool.num_used_blocks() as f64 * block + self.state.num_used() as f64 * slot;
        let total = self.pool.num_blocks() as f64 * block + f64::from(slots.num_slots) * slot;
        if total > 0.0 {
            used / total
        } else {
            0.0
        }
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
    /// no table holds a block twice, that a request's groups have tables of one length, that
    /// with recurrent layers exactly the requests holding tables hold a state slot each (no
    /// slot shared, none leaked), and the pools' own bookkeeping.
    pub fn verify(&self) -> Result<(), KvCacheError> {
        self.pool.verify()?;
        self.state.verify()?;
        let fail = |detail: String| Err(KvCacheError::InvariantViolated { detail });
        if self.config.state_slots.is_enabled() {
            if self.state.num_used() != self.tables.len() {
                return fail(format!(
                    "{} state slots held by {} requests with tables",
                    self.state.num_used(),
                    self.tables.len()
                ));
            }
            if let Some(request_id) = self
                .tables
                .keys()
                .find(|&&id| self.state.slot(id).is_none())
            {
                return fail(format!(
                    "request {request_id} holds tables but no state slot"
                ));
            }
        } else if self.state.num_used() > 0 {
            return fail("state slots held without recurrent layers".to_owned());
        }
        let mut owners = vec![0u32; self.pool.num_blocks()];
        for (request_id, tables) in &self.tables {
            if tables.len() != self.num_groups() {
                return fail(format!(
                    "request {request_id} has {} tables for {} groups",
                    tables.len(),
                    self.num_groups()
                ));
            }
            if tables
                .iter()
                .any(|table| table.block_ids.len() != tables[0].block_ids.len())
            {
                return fail(format!(
                    "request {request_id} has tables of different lengths"
                ));
            }
            for table in tables {
                if table.num_skipped > table.block_ids.len() {
                    return fail(format!(
                        "request {request_id} skips more blocks than it has"
                    ));
                }
                for &block in table.owned() {
                    match owners.get_mut(block as usize) {
                        Some(count) => *count += 1,
                        None => {
                            return fail(format!(
                                "request {request_id} holds unknown block {block}"
                            ))
                        }
                    }
                }
            }
            let mut seen: Vec<u32> = tables
                .iter()
                .flat_map(|t| t.owned().iter().copied())
                .collect();
            seen.sort_unstable();
            if seen.windows(2).any(|pair| pair[0] == pair[1]) {
                return fail(format!("request {request_id} holds a block twice"));
            }
        }
        for (block, &count) in owners.iter().enumerate() {
            let ref_count = self.pool.ref_count(block as u32);
            if ref_count != count {
                return fail(format!(
                    "block {block}: ref count {ref_count}, {count} owners"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod hybrid_tests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;
