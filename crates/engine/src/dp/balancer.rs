//! Which data-parallel engine a request goes to: the least loaded one, unless an engine
//! that recently served the same prompt prefix is nearly as idle (its prefix cache likely
//! still holds those blocks, so the prefill is skipped there).
//!
//! Load is the engine's requests in flight (submitted and not finished: vLLM's waiting plus
//! running, counted at submission so a burst does not all land on the engine whose last step
//! looked idlest). Prefixes are the prompt's full-block hash chain, the same hashes the KV
//! manager keys its prefix cache by (LoRA adapter and cache salt in the extra keys), so two
//! prompts share a routing key exactly when they could share cached blocks.

use std::collections::HashMap;

use tokenmill_core::{BlockHashChain, BlockHashExtraKeys};

/// How many more in-flight requests than the least loaded engine the prefix's engine may
/// have and still be preferred.
pub const LOCALITY_SLACK: usize = 2;

/// Leading full blocks of a prompt that are hashed for routing (longer prefixes route as
/// their first blocks do).
pub const ROUTING_BLOCKS: usize = 32;

/// Prefix entries remembered per generation; two generations are kept, so the table holds
/// between this many and twice this many of the most recent prefixes.
const TABLE_GENERATION: usize = 1 << 15;

/// The engine for a request, given each engine's load and the engine that served its prefix
/// most recently (if any): that engine when its load is within `slack` of the least loaded,
/// else the least loaded, ties to the lowest rank. `loads` must not be empty.
pub fn choose_engine(loads: &[usize], preferred: Option<usize>, slack: usize) -> usize {
    let (least, least_load) = loads
        .iter()
        .copied()
        .enumerate()
        .min_by_key(|&(rank, load)| (load, rank))
        .unwrap_or((0, 0));
    match preferred.and_then(|rank| Some((rank, *loads.get(rank)?))) {
        Some((rank, load)) if load <= least_load.saturating_add(slack) => rank,
        _ => least,
    }
}

/// The prefix → engine memory behind [`choose_engine`]: plain data, no clock, so routing is
/// a deterministic function of the requests seen.
#[derive(Debug)]
pub struct PrefixBalancer {
    block_size: usize,
    /// Off when prefix caching is off (no engine keeps a prefix, so load alone decides).
    locality: bool,
    recent: HashMap<u128, usize>,
    older: HashMap<u128, usize>,
}

impl PrefixBalancer {
    pub fn new(block_size: usize, locality: bool) -> PrefixBalancer {
        PrefixBalancer {
            block_size,
            locality,
            recent: HashMap::new(),
            older: HashMap::new(),
        }
    }

    /// Picks the engine for a prompt and remembers that it now serves the prompt's prefixes.
    pub fn route(
        &mut self,
        prompt: &[u32],
        extra_keys: BlockHashExtraKeys,
        loads: &[usize],
    ) -> usize {
        if !self.locality || self.block_size == 0 {
            return choose_engine(loads, None, 0);
        }
        let head = prompt.len().min(ROUTING_BLOCKS * self.block_size);
        let mut chain = BlockHashChain::new(self.block_size, extra_keys);
        chain.extend(&prompt[..head]);
        // The longest prefix some engine served is the one worth following.
        let preferred = chain.hashes().iter().rev().find_map(|hash| {
            self.recent
                .get(&hash.0)
                .or_else(|| self.older.get(&hash.0))
                .copied()
        });
        let rank = choose_engine(loads, preferred, LOCALITY_SLACK);
        for hash in chain.hashes() {
            self.remember(hash.0, rank);
        }
        rank
    }

    fn remember(&mut self, hash: u128, rank: usize) {
        if self.recent.len() >= TABLE_GENERATION && !self.recent.contains_key(&hash) {
            self.older = std::mem::take(&mut self.recent);
        }
        self.recent.insert(hash, rank);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_engine_wins_ties_to_the_lowest_rank() {
        assert_eq!(choose_engine(&[3, 1, 2], None, LOCALITY_SLACK), 1);
        assert_eq!(choose_engine(&[2, 1, 1], None, LOCALITY_SLACK), 1);
        assert_eq!(choose_engine(&[0, 0], None, 0), 0);
        assert_eq!(choose_engine(&[4], None, 0), 0);
    }

    #[test]
    fn the_prefix_engine_is_kept_within_the_slack_only() {
        assert_eq!(choose_engine(&[0, 2], Some(1), 2), 1, "within the slack");
        assert_eq!(
            choose_engine(&[0, 3], Some(1), 2),
            0,
            "too busy: least loaded"
        );
        assert_eq!(
            choose_engine(&[5, 5], Some(1), 0),
            1,
            "equal load: the prefix wins"
        );
        assert_eq!(
            choose_engine(&[1, 0], Some(7), 2),
            1,
            "an unknown rank is ignored"
        );
    }

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn a_repeated_prefix_follows_its_engine() {
        let mut balancer = PrefixBalancer::new(4, true);
        let keys = BlockHashExtraKeys::default();
        let a = prompt(1, 12);
        let b = prompt(2, 12);
        assert_eq!(balancer.route(&a, keys.clone(), &[0, 0]), 0);
        // `a` still runs on engine 0: `b` goes to the idle engine 1.
        assert_eq!(balancer.route(&b, keys.clone(), &[1, 0]), 1);
        // `a` again, with a different tail: back to engine 0 although engine 1 is as idle.
        let mut a_longer = a.clone();
        a_longer.extend([7, 7, 7, 7, 7]);
        assert_eq!(balancer.route(&a_longer, keys.clone(), &[1, 1]), 0);
        assert_eq!(balancer.route(&b, keys.clone(), &[0, 0]), 1);
        // Engine 0 is swamped: `a` moves to engine 1, which then owns the prefix.
        assert_eq!(balancer.route(&a, keys.clone(), &[9, 0]), 1);
        assert_eq!(balancer.route(&a, keys, &[0, 1]), 1);
    }

    #[test]
    fn the_adapter_and_salt_are_part_of_the_prefix() {
        let mut balancer = PrefixBalancer::new(4, true);
        let a = prompt(1, 8);
        let plain = BlockHashExtraKeys::default();
        let adapter = BlockHashExtraKeys {
            cache_salt: None,
            adapter_id: Some(3),
        };
        assert_eq!(balancer.route(&a, plain.clone(), &[0, 0]), 0);
        // Same tokens under an adapter share no cached blocks: load decides.
        assert_eq!(balancer.route(&a, adapter.clone(), &[1, 0]), 1);
        assert_eq!(balancer.route(&a, plain, &[1, 1]), 0);
        assert_eq!(balancer.route(&a, adapter, &[1, 1]), 1);
    }

    #[test]
    fn prompts_shorter_than_a_block_and_disabled_locality_go_by_load() {
        let mut balancer = PrefixBalancer::new(16, true);
        let short = prompt(1, 15);
        assert_eq!(balancer.route(&short, Default::default(), &[0, 0]), 0);
        assert_eq!(balancer.route(&short, Default::default(), &[1, 0]), 1);
        let mut off = PrefixBalancer::new(4, false);
        let a = prompt(1, 8);
        assert_eq!(off.route(&a, Default::default(), &[0, 0]), 0);
        assert_eq!(off.route(&a, Default::default(), &[1, 0]), 1);
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_the_recent_generation() {
        let mut balancer = PrefixBalancer::new(1, true);
        for i in 0..(3 * TABLE_GENERATION as u32) {
            balancer.remember(u128::from(i), 1);
        }
        assert!(balancer.recent.len() + balancer.older.len() <= 2 * TABLE_GENERATION);
        let last = 3 * TABLE_GENERATION as u32 - 1;
        assert_eq!(balancer.recent.get(&u128::from(last)), Some(&1));
    }
}
