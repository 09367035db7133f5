//! Per-group block accounting of the hybrid KV cache manager (one full-attention group and
//! two sliding-window groups over one pool).

// Groups index tables and hits alike.
#![allow(clippy::needless_range_loop)]

use super::*;
use crate::block_hash::BlockHashExtraKeys;

const BLOCK: usize = 4;
const WINDOW: usize = 6;

fn hybrid(num_blocks: u32, caching: bool) -> KvCacheManager {
    KvCacheManager::new(KvCacheConfig {
        num_blocks,
        block_size: BLOCK,
        enable_prefix_caching: caching,
        sliding_window: Some(WINDOW),
        groups: KvCacheGroups::Hybrid {
            full: 1,
            sliding: 2,
        },
        state_slots: crate::StateSlotConfig::none(),
    })
    .unwrap()
}

fn chain(tokens: &[u32]) -> BlockHashChain {
    let mut chain = BlockHashChain::new(BLOCK, BlockHashExtraKeys::default());
    chain.extend(tokens);
    chain
}

fn run_prefill(kv: &mut KvCacheManager, id: u64, tokens: &[u32]) -> ComputedBlocks {
    let hashes = chain(tokens);
    let hit = kv.get_computed_blocks(&hashes, tokens.len());
    kv.allocate_slots(RequestId(id), tokens.len(), Some(&hit))
        .unwrap();
    kv.cache_full_blocks(RequestId(id), &hashes, tokens, tokens.len());
    hit
}

fn accounting_holds(kv: &KvCacheManager) {
    kv.verify().unwrap();
    let owned: usize = kv.tables.keys().map(|&id| kv.num_owned_blocks(id)).sum();
    assert_eq!(
        owned,
        kv.num_used_blocks(),
        "no block shared in these tests"
    );
    assert_eq!(kv.num_used_blocks() + kv.num_free_blocks(), kv.num_blocks());
}

#[test]
fn configs_count_groups_windows_and_blocks() {
    let config = hybrid(100, false).config();
    assert_eq!(config.num_groups(), 3);
    assert_eq!(
        (0..3).map(|g| config.group_window(g)).collect::<Vec<_>>(),
        [None, Some(WINDOW), Some(WINDOW)]
    );
    assert_eq!(config.group_skipped_blocks(0, 100), 0);
    assert_eq!(config.group_skipped_blocks(1, 12), 1);
    // Window 6, 8-token steps: 250 full-group blocks plus 2 * (ceil(13 / 4) + 1).
    assert_eq!(config.max_blocks_per_request(1000, 8), 250 + 2 * 5);
    assert_eq!(config.max_blocks_per_request(12, 8), 3 * 3);
    // 100 blocks over 3 groups: 33 positions' blocks, 132 tokens.
    assert_eq!(config.num_tokens(), 33 * BLOCK);
    let bad = KvCacheConfig {
        sliding_window: None,
        ..config
    };
    assert!(KvCacheManager::new(bad).is_err());
}

#[test]
fn every_group_allocates_and_only_sliding_groups_release() {
    let mut kv = hybrid(12, false);
    kv.allocate_slots(RequestId(1), 12, None).unwrap();
    assert_eq!(kv.num_used_blocks(), 9);
    let tables = kv.block_tables(RequestId(1));
    assert_eq!(tables.len(), 3);
    assert!(tables.iter().all(|table| table.len() == 3));
    accounting_holds(&kv);
    // The query at 12 sees 7..=12: block 0 leaves both sliding groups, not the full one.
    kv.remove_skipped_blocks(RequestId(1), 12);
    assert_eq!(kv.group_num_skipped_blocks(RequestId(1), 0), 0);
    assert_eq!(kv.group_num_skipped_blocks(RequestId(1), 1), 1);
    assert_eq!(kv.group_num_skipped_blocks(RequestId(1), 2), 1);
    assert_eq!(kv.num_used_blocks(), 7);
    for group in 1..3 {
        let table = kv.group_block_table(RequestId(1), group).unwrap();
        assert_eq!(
            table[0], table[1],
            "placeholder points at the first held block"
        );
        assert_eq!(kv.ref_count(tables[group][0]), 0);
    }
    accounting_holds(&kv);
    // Growing allocates one block per group, all or nothing: 5 free, 3 needed, then 3 more
    // needed with 2 free.
    kv.allocate_slots(RequestId(1), 16, None).unwrap();
    assert_eq!(kv.num_free_blocks(), 2);
    assert_eq!(
        kv.allocate_slots(RequestId(1), 17, None),
        Err(KvCacheError::OutOfBlocks {
            needed: 3,
            available: 2
        })
    );
    assert!(kv
        .block_tables(RequestId(1))
        .iter()
        .all(|table| table.len() == 4));
    accounting_holds(&kv);
    // Truncation keeps every group at one length; free returns every held block.
    kv.truncate(RequestId(1), 12);
    assert!(kv
        .block_tables(RequestId(1))
        .iter()
        .all(|table| table.len() == 3));
    kv.free(RequestId(1));
    assert_eq!(kv.num_used_blocks(), 0);
    assert_eq!(kv.num_free_blocks(), 12);
    accounting_holds(&kv);
}

#[test]
fn a_prefix_hit_is_one_every_group_serves() {
    // Request 1 holds 5 blocks a group; two blocks are left over.
    let mut kv = hybrid(17, true);
    let prompt: Vec<u32> = (0..17).collect();
    let hit = run_prefill(&mut kv, 1, &prompt);
    assert_eq!(hit.num_computed_tokens(), 0);
    let tables = kv.block_tables(RequestId(1));
    // The query at 17 sees 12..=17: blocks 0..3 of each sliding group go back, cached.
    kv.remove_skipped_blocks(RequestId(1), 17);
    assert_eq!(kv.num_cached_free_blocks(), 6);
    accounting_holds(&kv);
    // Request 2 (3 blocks) takes the two uncached blocks and evicts group 1's block 0.
    kv.allocate_slots(RequestId(2), 1, None).unwrap();
    assert_eq!(kv.num_evictions(), 1);
    // The same prompt plus one token: its first new query (at 16) sees 11..=16, so the
    // sliding groups need blocks 2 and 3 only; the full group serves all four.
    let mut longer = prompt.clone();
    longer.push(99);
    let hashes = chain(&longer);
    let hit = kv.get_computed_blocks(&hashes, longer.len());
    assert_eq!(hit.num_computed_tokens(), 16);
    assert_eq!(hit.group_block_ids(0), &tables[0][..4]);
    assert_eq!(hit.group_num_skipped_blocks(0), 0);
    for group in 1..3 {
        assert_eq!(hit.group_num_skipped_blocks(group), 2);
        assert_eq!(hit.group_block_ids(group), &tables[group][2..4]);
    }
    // Taking it: the full group's blocks and the sliding groups' blocks 3 are shared (ref
    // 2), their blocks 2 come back from the free queue; each group allocates one new block:
    // 3 new plus 2 revived = the 5 free blocks.
    assert_eq!(kv.num_free_blocks(), 5);
    kv.allocate_slots(RequestId(3), longer.len(), Some(&hit))
        .unwrap();
    for &block in &tables[0][..4] {
        assert_eq!(kv.ref_count(block), 2);
    }
    for group in 1..3 {
        assert_eq!(kv.ref_count(tables[group][2]), 1);
        assert_eq!(kv.ref_count(tables[group][3]), 2);
    }
    assert_eq!(kv.num_free_blocks(), 0);
    assert_eq!(
        kv.prefix_cache_stats(),
        PrefixCacheStats {
            queries: 17 + 18,
            hits: 16
        }
    );
    kv.verify().unwrap();
    for id in 1..=3 {
        kv.free(RequestId(id));
    }
    assert_eq!(kv.num_used_blocks(), 0);
    kv.verify().unwrap();
}

#[test]
fn a_group_missing_its_window_blocks_denies_the_hit() {
    let mut kv = hybrid(17, true);
    let prompt: Vec<u32> = (0..17).collect();
    run_prefill(&mut kv, 1, &prompt);
    kv.remove_skipped_blocks(RequestId(1), 17);
    kv.free(RequestId(1));
    // Free queue: the three uncached tail blocks and the two never used, then the sliding
    // groups' released blocks 0..3 (group 1, then group 2), then the rest, tail first.
    // Six blocks evict group 1's block 0, three more its blocks 1 and 2 and group 2's 0.
    kv.allocate_slots(RequestId(2), 8, None).unwrap();
    kv.allocate_slots(RequestId(3), 1, None).unwrap();
    assert_eq!(kv.num_evictions(), 4);
    // The full group holds all four blocks and group 2 blocks 1..4, but group 1 only block
    // 3: every hit length needs a block group 1 lost, so there is no hit at all.
    let mut longer = prompt.clone();
    longer.push(99);
    let hit = kv.get_computed_blocks(&chain(&longer), longer.len());
    assert_eq!(hit.num_computed_tokens(), 0);
    assert!(hit.group_block_ids(0).is_empty());
    // Admission without a hit allocates every group's blocks anew: 5 a group, 15 > 8 free.
    assert!(matches!(
        kv.allocate_slots(RequestId(4), longer.len(), Some(&hit)),
        Err(KvCacheError::OutOfBlocks { needed: 15, .. })
    ));
    accounting_holds(&kv);
}
