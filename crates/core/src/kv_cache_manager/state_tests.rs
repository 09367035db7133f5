//! Recurrent-state slots in the KV manager: taken with a request's first blocks, all or
//! nothing, released with them, weighed into usage, and no prefix cache beside them.

use super::*;
use crate::block_hash::BlockHashExtraKeys;
use crate::state_slots::StateSlotConfig;

const BLOCK: usize = 4;

fn manager(num_blocks: u32, num_slots: u32, caching: bool) -> KvCacheManager {
    KvCacheManager::new(KvCacheConfig {
        num_blocks,
        block_size: BLOCK,
        enable_prefix_caching: caching,
        sliding_window: None,
        groups: KvCacheGroups::Single,
        state_slots: StateSlotConfig {
            num_slots,
            bytes_per_slot: 300,
            bytes_per_block: 100,
        },
    })
    .unwrap()
}

fn chain(tokens: &[u32]) -> BlockHashChain {
    let mut chain = BlockHashChain::new(BLOCK, BlockHashExtraKeys::default());
    chain.extend(tokens);
    chain
}

#[test]
fn a_request_takes_one_slot_with_its_first_blocks_and_frees_it_with_them() {
    let mut kv = manager(8, 2, false);
    kv.allocate_slots(RequestId(1), 5, None).unwrap();
    assert_eq!(kv.state_slot(RequestId(1)), Some(0));
    // Growing the tables takes no second slot.
    kv.allocate_slots(RequestId(1), 9, None).unwrap();
    assert_eq!(kv.state_slot(RequestId(1)), Some(0));
    assert_eq!(kv.num_free_state_slots(), 1);
    kv.allocate_slots(RequestId(2), 1, None).unwrap();
    assert_eq!(kv.state_slot(RequestId(2)), Some(1));
    kv.verify().unwrap();
    kv.free(RequestId(1));
    assert_eq!(kv.state_slot(RequestId(1)), None);
    assert_eq!(kv.num_free_state_slots(), 1);
    // The freed slot goes to the next request.
    kv.allocate_slots(RequestId(3), 1, None).unwrap();
    assert_eq!(kv.state_slot(RequestId(3)), Some(0));
    kv.free(RequestId(2));
    kv.free(RequestId(3));
    assert_eq!(kv.num_free_state_slots(), 2);
    assert_eq!(kv.usage(), 0.0);
    kv.verify().unwrap();
}

#[test]
fn admission_is_all_or_nothing_over_blocks_and_slots() {
    // Out of slots: no block is taken either.
    let mut kv = manager(8, 1, false);
    kv.allocate_slots(RequestId(1), 4, None).unwrap();
    assert_eq!(
        kv.allocate_slots(RequestId(2), 4, None),
        Err(KvCacheError::OutOfStateSlots { num_slots: 1 })
    );
    assert_eq!(kv.num_used_blocks(), 1);
    assert_eq!(kv.block_table(RequestId(2)), None);
    kv.verify().unwrap();
    // Out of blocks: no slot is taken either.
    let mut kv = manager(2, 2, false);
    assert!(matches!(
        kv.allocate_slots(RequestId(1), 12, None),
        Err(KvCacheError::OutOfBlocks { .. })
    ));
    assert_eq!(kv.num_free_state_slots(), 2);
    assert_eq!(kv.state_slot(RequestId(1)), None);
    kv.verify().unwrap();
}

#[test]
fn usage_weighs_slots_and_blocks_by_their_bytes() {
    // 8 blocks of 100 bytes and 2 slots of 300: 1,400 bytes in all.
    let mut kv = manager(8, 2, false);
    kv.allocate_slots(RequestId(1), 8, None).unwrap();
    assert!((kv.usage() - (2.0 * 100.0 + 300.0) / 1400.0).abs() < 1e-12);
    kv.free(RequestId(1));
    assert_eq!(kv.usage(), 0.0);
}

#[test]
fn no_prefix_hit_and_nothing_cached_beside_recurrent_state() {
    let mut kv = manager(8, 2, true);
    assert!(!kv.config().prefix_caching_active());
    let prompt: Vec<u32> = (0..9).collect();
    let hashes = chain(&prompt);
    kv.allocate_slots(RequestId(1), prompt.len(), None).unwrap();
    kv.cache_full_blocks(RequestId(1), &hashes, &prompt, prompt.len());
    kv.free(RequestId(1));
    assert_eq!(kv.num_cached_free_blocks(), 0);
    let hit = kv.get_computed_blocks(&hashes, prompt.len());
    assert_eq!(hit.num_computed_tokens(), 0);
    // The same pool without recurrent state hits.
    let mut plain = KvCacheManager::new(KvCacheConfig {
        state_slots: StateSlotConfig::none(),
        ..kv.config()
    })
    .unwrap();
    assert!(plain.config().prefix_caching_active());
    plain
        .allocate_slots(RequestId(1), prompt.len(), None)
        .unwrap();
    plain.cache_full_blocks(RequestId(1), &hashes, &prompt, prompt.len());
    plain.free(RequestId(1));
    assert_eq!(
        plain
            .get_computed_blocks(&hashes, prompt.len())
            .num_computed_tokens(),
        8
    );
    assert_eq!(plain.state_slot(RequestId(1)), None);
    assert_eq!(plain.num_state_slots(), 0);
}

#[test]
fn slots_without_weights_are_refused() {
    let config = KvCacheConfig {
        state_slots: StateSlotConfig {
            num_slots: 2,
            bytes_per_slot: 0,
            bytes_per_block: 100,
        },
        ..manager(8, 0, false).config()
    };
    assert!(matches!(
        KvCacheManager::new(config),
        Err(KvCacheError::InvalidConfig { .. })
    ));
}
