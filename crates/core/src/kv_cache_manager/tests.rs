use super::*;
use crate::block_hash::BlockHashExtraKeys;

const BLOCK: usize = 4;

fn manager(num_blocks: u32, caching: bool) -> KvCacheManager {
    KvCacheManager::new(KvCacheConfig {
        num_blocks,
        block_size: BLOCK,
        enable_prefix_caching: caching,
        sliding_window: None,
        groups: KvCacheGroups::Single,
        state_slots: crate::StateSlotConfig::none(),
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
