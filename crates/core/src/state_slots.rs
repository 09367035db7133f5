//! Recurrent-state slots: the fixed-size per-sequence state that hybrid models' recurrent
//! layers (Gated DeltaNet, Mamba-2, short convolutions) keep instead of paged K/V.
//!
//! vLLM's hybrid KV cache manager gives each request one state block per recurrent group
//! beside its block tables; here the model's recurrent layers form one group, so a request
//! holds one slot ([`StateSlotPool`]). The [`crate::KvCacheManager`] owns the pool and ties a
//! slot's life to the request's block tables: the slot is taken with the request's first
//! blocks (admission needs a free slot as well as its blocks, all or nothing), kept while the
//! request runs, and released with its blocks on every exit path (finish, abort, preemption).
//! A preempted request recomputes from position 0, where the model resets the slot, so a slot
//! never carries one request's state into another's.
//!
//! Rules that follow from a state holding exactly the positions before the next run:
//! - no prefix-cache hits while there are state slots: a hit would skip positions the state
//!   has not seen (vLLM checkpoints the state at block boundaries; until tokenmill does, a
//!   request recomputes its prompt; [`crate::KvCacheConfig::prefix_caching_active`]);
//! - no speculative drafts: a rejected draft's update cannot be rolled back out of the state
//!   ([`crate::Scheduler::set_draft_token_ids`] refuses them).

use std::collections::{BTreeSet, HashMap};

use crate::error::KvCacheError;
use crate::request::RequestId;

/// How many recurrent-state slots there are, and what one weighs against a KV block (for
/// [`crate::KvCacheManager::usage`]). The default, no slots, is a model without recurrent
/// layers: nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateSlotConfig {
    pub num_slots: u32,
    /// Bytes of one slot over all recurrent layers.
    pub bytes_per_slot: u64,
    /// Bytes of one KV block over all attention layers.
    pub bytes_per_block: u64,
}

impl StateSlotConfig {
    /// No slots (a pure transformer).
    pub fn none() -> StateSlotConfig {
        StateSlotConfig::default()
    }

    pub fn is_enabled(&self) -> bool {
        self.num_slots > 0
    }

    /// Why this cannot be managed, if it cannot.
    pub(crate) fn invalid_reason(&self) -> Option<String> {
        if self.is_enabled() && (self.bytes_per_slot == 0 || self.bytes_per_block == 0) {
            return Some(
                "state slots need their bytes and the block's bytes to weigh them in KV usage"
                    .to_owned(),
            );
        }
        None
    }
}

/// Slot ids `0..num_slots`, each held by at most one request.
#[derive(Debug, Clone, Default)]
pub struct StateSlotPool {
    /// Free slots; the lowest is handed out first, so slot ids are deterministic.
    free: BTreeSet<u32>,
    holders: HashMap<RequestId, u32>,
    num_slots: u32,
}

impl StateSlotPool {
    pub fn new(num_slots: u32) -> StateSlotPool {
        StateSlotPool {
            free: (0..num_slots).collect(),
            holders: HashMap::new(),
            num_slots,
        }
    }

    pub fn num_slots(&self) -> u32 {
        self.num_slots
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_used(&self) -> usize {
        self.holders.len()
    }

    /// The slot `request_id` holds.
    pub fn slot(&self, request_id: RequestId) -> Option<u32> {
        self.holders.get(&request_id).copied()
    }

    /// Gives `request_id` the lowest free slot; its own if it already holds one.
    pub fn allocate(&mut self, request_id: RequestId) -> Result<u32, KvCacheError> {
        if let Some(slot) = self.slot(request_id) {
            return Ok(slot);
        }
        let slot = self.free.pop_first().ok_or(KvCacheError::OutOfStateSlots {
            num_slots: self.num_slots,
        })?;
        self.holders.insert(request_id, slot);
        Ok(slot)
    }

    /// Releases `request_id`'s slot, if it holds one.
    pub fn free(&mut self, request_id: RequestId) -> Option<u32> {
        let slot = self.holders.remove(&request_id)?;
        self.free.insert(slot);
        Some(slot)
    }

    /// Every slot is free or held by exactly one request, never both, and in range.
    pub fn verify(&self) -> Result<(), KvCacheError> {
        let fail = |detail: String| Err(KvCacheError::InvariantViolated { detail });
        let mut owners = vec![0u32; self.num_slots as usize];
        for (request_id, &slot) in &self.holders {
            let Some(count) = owners.get_mut(slot as usize) else {
                return fail(format!(
                    "request {request_id} holds unknown state slot {slot}"
                ));
            };
            *count += 1;
            if self.free.contains(&slot) {
                return fail(format!("state slot {slot} is held and free"));
            }
        }
        if let Some(slot) = owners.iter().position(|&count| count > 1) {
            return fail(format!(
                "state slot {slot} is held by {} requests",
                owners[slot]
            ));
        }
        if self.free.len() + self.holders.len() != self.num_slots as usize
            || self.free.iter().any(|&slot| slot >= self.num_slots)
        {
            return fail(format!(
                "state slots: {} free + {} held != {}",
                self.free.len(),
                self.holders.len(),
                self.num_slots
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_lowest_first_and_come_back_on_free() {
        let mut pool = StateSlotPool::new(2);
        assert_eq!(pool.allocate(RequestId(7)), Ok(0));
        assert_eq!(
            pool.allocate(RequestId(7)),
            Ok(0),
            "a holder keeps its slot"
        );
        assert_eq!(pool.allocate(RequestId(8)), Ok(1));
        assert_eq!(
            pool.allocate(RequestId(9)),
            Err(KvCacheError::OutOfStateSlots { num_slots: 2 })
        );
        pool.verify().unwrap();
        assert_eq!(pool.free(RequestId(7)), Some(0));
        assert_eq!(pool.free(RequestId(7)), None);
        assert_eq!((pool.num_free(), pool.num_used()), (1, 1));
        assert_eq!(pool.allocate(RequestId(9)), Ok(0));
        assert_eq!(pool.slot(RequestId(9)), Some(0));
        assert_eq!(pool.slot(RequestId(7)), None);
        pool.verify().unwrap();
    }

    #[test]
    fn verify_catches_an_aliased_slot() {
        let mut pool = StateSlotPool::new(2);
        pool.allocate(RequestId(1)).unwrap();
        pool.holders.insert(RequestId(2), 0);
        assert!(pool.verify().is_err());
    }

    #[test]
    fn enabled_slots_need_their_weights() {
        assert_eq!(StateSlotConfig::none().invalid_reason(), None);
        let unweighted = StateSlotConfig {
            num_slots: 2,
            ..StateSlotConfig::none()
        };
        assert!(unweighted.invalid_reason().is_some());
    }
}
