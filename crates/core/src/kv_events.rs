//! KV-cache events: what the prefix cache gained and lost, for routers that track which
//! replica holds which prefix (vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`).
//!
//! The [`crate::KvCacheManager`] records them only once [`crate::KvCacheManager::enable_events`]
//! was called; the engine drains them once per step and publishes them. Replaying every event
//! in order into a set (insert the stored hashes, delete the removed ones, empty it on a clear)
//! gives exactly the hashes the prefix cache holds. Only full blocks are ever reported.

use crate::block_hash::BlockHash;

/// One change to the set of cached block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Consecutive full blocks of one request became cached. `parent_block_hash` is the hash
    /// of the block before the first one (`None` for a sequence's first block); `token_ids`
    /// are the blocks' tokens, `block_size` per block, in order.
    BlockStored {
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: usize,
        /// The adapter the blocks were computed with (`None` for the base model).
        lora_id: Option<u32>,
    },
    /// Cached blocks were evicted (their block reused for other content) or reset.
    BlockRemoved { block_hashes: Vec<BlockHash> },
    /// Nothing is cached any more.
    AllBlocksCleared,
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;
    use crate::block_hash::{BlockHashChain, BlockHashExtraKeys};
    use crate::kv_cache_manager::{KvCacheConfig, KvCacheGroups, KvCacheManager};
    use crate::request::RequestId;

    const BLOCK: usize = 4;

    fn manager(num_blocks: u32) -> KvCacheManager {
        let mut kv = KvCacheManager::new(KvCacheConfig {
            num_blocks,
            block_size: BLOCK,
            enable_prefix_caching: true,
            sliding_window: None,
            groups: KvCacheGroups::Single,
            state_slots: crate::StateSlotConfig::none(),
        })
        .unwrap();
        kv.enable_events();
        kv
    }

    fn chain(tokens: &[u32], adapter_id: Option<u32>) -> BlockHashChain {
        let mut chain = BlockHashChain::new(
            BLOCK,
            BlockHashExtraKeys {
                cache_salt: None,
                adapter_id,
            },
        );
        chain.extend(tokens);
        chain
    }

    /// Admits `tokens` as request `id` and computes `computed` of them.
    fn prefill(kv: &mut KvCacheManager, id: u64, tokens: &[u32], computed: usize) {
        let hashes = chain(tokens, None);
        let hit = kv.get_computed_blocks(&hashes, tokens.len());
        kv.allocate_slots(RequestId(id), tokens.len(), Some(&hit))
            .unwrap();
        kv.cache_full_blocks(RequestId(id), &hashes, tokens, computed);
    }

    fn drain(kv: &mut KvCacheManager) -> Vec<KvCacheEvent> {
        let mut events = Vec::new();
        kv.drain_events(&mut events);
        events
    }

    /// What a subscriber rebuilds from the events.
    fn replay(set: &mut HashSet<BlockHash>, events: &[KvCacheEvent]) {
        for event in events {
            match event {
                KvCacheEvent::BlockStored { block_hashes, .. } => set.extend(block_hashes),
                KvCacheEvent::BlockRemoved { block_hashes } => {
                    for hash in block_hashes {
                        set.remove(hash);
                    }
                }
                KvCacheEvent::AllBlocksCleared => set.clear(),
            }
        }
    }

    #[test]
    fn nothing_is_logged_unless_enabled() {
        let mut kv = KvCacheManager::new(KvCacheConfig {
            num_blocks: 8,
            block_size: BLOCK,
            enable_prefix_caching: true,
            sliding_window: None,
            groups: KvCacheGroups::Single,
            state_slots: crate::StateSlotConfig::none(),
        })
        .unwrap();
        let tokens: Vec<u32> = (0..9).collect();
        kv.allocate_slots(RequestId(1), 9, None).unwrap();
        kv.cache_full_blocks(RequestId(1), &chain(&tokens, None), &tokens, 9);
        assert!(drain(&mut kv).is_empty());
    }

    #[test]
    fn stored_blocks_carry_their_tokens_and_chain_to_their_parent() {
        let mut kv = manager(8);
        let tokens: Vec<u32> = (100..114).collect();
        let hashes = chain(&tokens, None).hashes().to_vec();
        // A chunk of 6 tokens fills one block; the next chunk fills two more; the partial
        // last block is never reported.
        prefill(&mut kv, 1, &tokens, 6);
        kv.cache_full_blocks(RequestId(1), &chain(&tokens, None), &tokens, 14);
        assert_eq!(
            drain(&mut kv),
            vec![
                KvCacheEvent::BlockStored {
                    block_hashes: vec![hashes[0]],
                    parent_block_hash: None,
                    token_ids: (100..104).collect(),
                    block_size: BLOCK,
                    lora_id: None,
                },
                KvCacheEvent::BlockStored {
                    block_hashes: vec![hashes[1], hashes[2]],
                    parent_block_hash: Some(hashes[0]),
                    token_ids: (104..112).collect(),
                    block_size: BLOCK,
                    lora_id: None,
                },
            ]
        );
        // A second request hitting the cached prefix stores only its own new block.
        let mut longer = tokens[..12].to_vec();
        longer.extend([7, 7, 7, 7, 7]);
        prefill(&mut kv, 2, &longer, longer.len());
        let events = drain(&mut kv);
        assert_eq!(events.len(), 1);
        let KvCacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            ..
        } = &events[0]
        else {
            panic!("expected BlockStored, got {events:?}");
        };
        assert_eq!(block_hashes, &[chain(&longer, None).hashes()[3]]);
        assert_eq!(*parent_block_hash, Some(hashes[2]));
        assert_eq!(token_ids, &[7, 7, 7, 7]);
    }

    #[test]
    fn the_adapter_id_is_reported_as_lora_id() {
        let mut kv = manager(4);
        let tokens: Vec<u32> = (0..4).collect();
        let hashes = chain(&tokens, Some(3));
        kv.allocate_slots(RequestId(1), 5, None).unwrap();
        kv.cache_full_blocks(RequestId(1), &hashes, &tokens, 4);
        assert!(matches!(
            drain(&mut kv).as_slice(),
            [KvCacheEvent::BlockStored {
                lora_id: Some(3),
                ..
            }]
        ));
    }

    #[test]
    fn evictions_and_resets_are_logged() {
        let mut kv = manager(3);
        let tokens: Vec<u32> = (0..9).collect();
        prefill(&mut kv, 1, &tokens, 9);
        let hashes = chain(&tokens, None).hashes().to_vec();
        kv.free(RequestId(1));
        drain(&mut kv);
        // Three blocks needed: the free one and both cached ones, tail block evicted first.
        kv.allocate_slots(RequestId(2), 12, None).unwrap();
        assert_eq!(
            drain(&mut kv),
            vec![KvCacheEvent::BlockRemoved {
                block_hashes: vec![hashes[1], hashes[0]]
            }]
        );
        kv.free(RequestId(2));

        let mut kv = manager(8);
        prefill(&mut kv, 1, &tokens, 9);
        kv.free(RequestId(1));
        drain(&mut kv);
        kv.reset_prefix_cache();
        assert_eq!(drain(&mut kv), vec![KvCacheEvent::AllBlocksCleared]);

        // A reset that leaves blocks in use cached names only what it dropped.
        let other: Vec<u32> = (50..55).collect();
        prefill(&mut kv, 1, &tokens, 9);
        prefill(&mut kv, 2, &other, 5);
        kv.free(RequestId(1));
        drain(&mut kv);
        kv.reset_prefix_cache();
        let events = drain(&mut kv);
        let [KvCacheEvent::BlockRemoved { block_hashes }] = events.as_slice() else {
            panic!("expected one BlockRemoved, got {events:?}");
        };
        let removed: HashSet<BlockHash> = block_hashes.iter().copied().collect();
        assert_eq!(removed, hashes[..2].iter().copied().collect());
        assert_eq!(kv.cached_block_hashes().count(), 1);
    }

    /// One step of the random workload.
    #[derive(Debug, Clone)]
    enum Op {
        /// A new request with this prompt (tokens from a small alphabet, so prefixes repeat).
        Admit(Vec<u32>),
        /// Computes up to this many more tokens of the n-th live request.
        Compute(usize, usize),
        /// Appends generated tokens to the n-th live request.
        Append(usize, Vec<u32>),
        Free(usize),
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        let tokens = |max| proptest::collection::vec(0u32..3, 1..max);
        prop_oneof![
            3 => tokens(14).prop_map(Op::Admit),
            4 => (0usize..8, 1usize..10).prop_map(|(i, n)| Op::Compute(i, n)),
            2 => (0usize..8, tokens(6)).prop_map(|(i, t)| Op::Append(i, t)),
            2 => (0usize..8).prop_map(Op::Free),
            1 => Just(Op::Reset),
        ]
    }

    struct Live {
        id: RequestId,
        tokens: Vec<u32>,
        chain: BlockHashChain,
        computed: usize,
    }

    proptest! {
        /// Replaying the events reproduces exactly the set of cached hashes, after every
        /// operation of a random workload with sharing, eviction and resets.
        #[test]
        fn replayed_events_reproduce_the_cached_hashes(ops in proptest::collection::vec(op(), 1..60)) {
            let mut kv = manager(6);
            let mut live: Vec<Live> = Vec::new();
            let mut next_id = 0;
            let mut subscriber = HashSet::new();
            for op in ops {
                match op {
                    Op::Admit(tokens) => {
                        next_id += 1;
                        let id = RequestId(next_id);
                        let chain = chain(&tokens, None);
                        let hit = kv.get_computed_blocks(&chain, tokens.len());
                        if kv.allocate_slots(id, tokens.len(), Some(&hit)).is_ok() {
                            let computed = hit.num_computed_tokens();
                            live.push(Live { id, tokens, chain, computed });
                        }
                    }
                    Op::Compute(i, n) if !live.is_empty() => {
                        let count = live.len();
                        let request = &mut live[i % count];
                        request.computed = (request.computed + n).min(request.tokens.len());
                        kv.cache_full_blocks(request.id, &request.chain, &request.tokens, request.computed);
                    }
                    Op::Append(i, more) if !live.is_empty() => {
                        let count = live.len();
                        let request = &mut live[i % count];
                        let len = request.tokens.len() + more.len();
                        if kv.allocate_slots(request.id, len, None).is_ok() {
                            request.tokens.extend(more);
                            request.chain.extend(&request.tokens);
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let request = live.remove(i % live.len());
                        kv.free(request.id);
                    }
                    Op::Reset => {
                        kv.reset_prefix_cache();
                    }
                    _ => {}
                }
                let mut events = Vec::new();
                kv.drain_events(&mut events);
                replay(&mut subscriber, &events);
                let cached: HashSet<BlockHash> = kv.cached_block_hashes().collect();
                prop_assert_eq!(&subscriber, &cached);
                kv.verify().unwrap();
            }
        }
    }
}
