//! A paged "model" for driving the scheduler without tensors: its KV cache stores, per slot,
//! the token and position written there (and the writer's cache salt), and its greedy
//! "sampler" hashes the whole sequence it reads back through the block table. So a wrong
//! block table, position or prefix-cache hit changes what is read back, and with it the
//! sampled tokens, exactly as it would corrupt a real model's attention. With a sliding window
//! `w` the "model" reads back, and hashes, only the last `w` positions before each sampled
//! token, as a sliding-window attention sees them; released blocks are then never read. With
//! KV cache groups (a hybrid model) every group's table is written and read back on its own,
//! each with its group's window, the slots remembering their group so a block two groups
//! shared would show; the sample hashes what group 0 reads.
//!
//! With recurrent-state slots (a hybrid model's recurrent layers) the "model" also keeps,
//! per slot, a running hash of the tokens fed to it, its owner and how many positions it has
//! seen: a run at position 0 resets the slot, any other must find there its own state after
//! exactly the positions before the run (else the step fails: a stale, shared or un-reset
//! slot), and the sample comes from the state's hash, the same function of the sequence as
//! the read-back hash, so a wrong state also changes the tokens.

#![allow(dead_code)]

pub mod driver;

use std::collections::HashMap;

use tokenmill_core::{RequestId, ScheduleKind, ScheduledRequest, SchedulerOutput};

pub const VOCAB: u32 = 64;
pub const EOS: u32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotContent {
    token: u32,
    position: usize,
    salt: Option<u8>,
    group: usize,
}

pub struct PagedTokenExecutor {
    block_size: usize,
    slots: Vec<Option<SlotContent>>,
    /// Every how many sequence hashes one is turned into EOS (0: never).
    eos_every: u64,
    /// The "model"'s sliding window per KV cache group: a query at `p` reads positions
    /// `(p - w, p]` only.
    windows: Vec<Option<usize>>,
    /// Recurrent-state slots (`None`: a model without recurrent layers).
    states: Option<Vec<Option<SlotState>>>,
}

/// What one recurrent-state slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotState {
    owner: RequestId,
    /// Positions folded in so far.
    num_positions: usize,
    /// FNV-1a of those tokens.
    hash: u64,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Folds `tokens` into an FNV-1a hash.
fn fnv_extend(mut hash: u64, tokens: &[u32]) -> u64 {
    for &token in tokens {
        for byte in token.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The greedy token after a sequence whose FNV-1a hash is `hash`.
fn token_from_hash(mut hash: u64, eos_every: u64) -> u32 {
    hash ^= hash >> 29;
    if eos_every > 0 && hash.is_multiple_of(eos_every) {
        EOS
    } else {
        1 + (hash % u64::from(VOCAB - 1)) as u32
    }
}

/// FNV-1a over the sequence: a pure function of the tokens, like greedy decoding.
pub fn next_token(sequence: &[u32], eos_every: u64) -> u32 {
    token_from_hash(fnv_extend(FNV_OFFSET, sequence), eos_every)
}

impl PagedTokenExecutor {
    pub fn new(num_blocks: u32, block_size: usize, eos_every: u64) -> Self {
        Self {
            block_size,
            slots: vec![None; num_blocks as usize * block_size],
            eos_every,
            windows: vec![None],
            states: None,
        }
    }

    /// The same executor with `num_slots` recurrent-state slots (0: none).
    pub fn with_state_slots(mut self, num_slots: u32) -> Self {
        self.states = (num_slots > 0).then(|| vec![None; num_slots as usize]);
        self
    }

    /// Advances the request's recurrent state over this step's fed tokens (drafts are never
    /// scheduled with state slots) and returns its hash; checks the slot first.
    fn advance_state(&mut self, scheduled: &ScheduledRequest) -> Result<Option<u64>, String> {
        let Some(states) = &mut self.states else {
            return match scheduled.state_slot {
                None => Ok(None),
                Some(slot) => Err(format!(
                    "request {} got state slot {slot} without recurrent layers",
                    scheduled.request_id
                )),
            };
        };
        let id = scheduled.request_id;
        let slot = scheduled
            .state_slot
            .ok_or_else(|| format!("request {id} scheduled without a state slot"))?;
        let state = states
            .get_mut(slot as usize)
            .ok_or_else(|| format!("request {id}: state slot {slot} out of range"))?;
        if !scheduled.draft_token_ids.is_empty() {
            return Err(format!(
                "request {id}: drafts scheduled with a recurrent state"
            ));
        }
        let start = scheduled.start_position;
        let before = if start == 0 {
            FNV_OFFSET
        } else {
            match *state {
                Some(held) if held.owner == id && held.num_positions == start => held.hash,
                other => {
                    return Err(format!(
                        "request {id} continues at position {start} from state slot {slot} \
                         holding {other:?}"
                    ))
                }
            }
        };
        let hash = fnv_extend(before, &scheduled.token_ids);
        *state = Some(SlotState {
            owner: id,
            num_positions: start + scheduled.token_ids.len(),
            hash,
        });
        Ok(Some(hash))
    }

    /// The same executor with one group whose "model" has a sliding window of `window`
    /// positions.
    pub fn with_window(self, window: Option<usize>) -> Self {
        self.with_group_windows(vec![window])
    }

    /// The same executor with one group per entry of `windows`, each with that window.
    pub fn with_group_windows(mut self, windows: Vec<Option<usize>>) -> Self {
        self.windows = windows;
        self
    }

    /// First position a query at `position` reads in group `group`.
    fn first_visible(&self, group: usize, position: usize) -> usize {
        self.windows[group].map_or(0, |window| (position + 1).saturating_sub(window))
    }

    fn table(scheduled: &ScheduledRequest, group: usize) -> Result<&[u32], String> {
        scheduled
            .block_tables
            .get(group)
            .map(Vec::as_slice)
            .ok_or_else(|| {
                format!(
                    "request {} has no table of group {group}",
                    scheduled.request_id
                )
            })
    }

    /// Reads `group`'s window of `..end` through its table and checks it against `tokens`;
    /// returns what was read.
    fn read_checked(
        &self,
        scheduled: &ScheduledRequest,
        group: usize,
        end: usize,
        tokens: &[u32],
        salt: Option<u8>,
    ) -> Result<Vec<u32>, String> {
        let first = self.first_visible(group, end - 1);
        let read = self.read(Self::table(scheduled, group)?, group, first..end, salt)?;
        if read[..] != tokens[first..end] {
            return Err(format!(
                "request {}: group {group}'s KV holds {read:?}, sequence is {tokens:?}",
                scheduled.request_id
            ));
        }
        Ok(read)
    }

    fn slot(&self, block_table: &[u32], position: usize) -> Result<usize, String> {
        let block = block_table
            .get(position / self.block_size)
            .ok_or_else(|| format!("position {position} beyond block table {block_table:?}"))?;
        Ok(*block as usize * self.block_size + position % self.block_size)
    }

    fn read(
        &self,
        block_table: &[u32],
        group: usize,
        range: std::ops::Range<usize>,
        salt: Option<u8>,
    ) -> Result<Vec<u32>, String> {
        let mut tokens = Vec::with_capacity(range.len());
        for position in range {
            let slot = self.slot(block_table, position)?;
            match self.slots[slot] {
                Some(content)
                    if content.position == position
                        && content.salt == salt
                        && content.group == group =>
                {
                    tokens.push(content.token)
                }
                other => {
                    return Err(format!(
                        "group {group}'s slot for position {position} holds {other:?} (salt \
                         {salt:?})"
                    ))
                }
            }
        }
        Ok(tokens)
    }

    /// Runs one step. `truth` gives each request's true token sequence (prompt + output) and
    /// salt as the scheduler knows it before the step. Checks that prefix-cache hits hold
    /// exactly those tokens, writes the fed tokens, reads every sequence back through its block
    /// table, and samples from what was read.
    pub fn execute(
        &mut self,
        output: &SchedulerOutput,
        truth: &HashMap<RequestId, (Vec<u32>, Option<u8>)>,
    ) -> Result<Vec<(RequestId, Vec<u32>)>, String> {
        for scheduled in &output.scheduled {
            let (tokens, salt) = truth
                .get(&scheduled.request_id)
                .ok_or_else(|| format!("unknown request {}", scheduled.request_id))?;
            for group in 0..self.windows.len() {
                let table = Self::table(scheduled, group)?;
                if scheduled.kind != ScheduleKind::Continuing && scheduled.num_cached_tokens > 0 {
                    // What the first new query reads of the hit.
                    let cached = scheduled.num_cached_tokens;
                    let first = self.first_visible(group, cached);
                    let hit = self.read(table, group, first..cached, *salt)?;
                    if hit[..] != tokens[first..cached] {
                        return Err(format!(
                            "request {}: group {group}'s prefix hit holds {hit:?}, prompt is \
                             {tokens:?}",
                            scheduled.request_id
                        ));
                    }
                }
                for (offset, &token) in scheduled.token_ids.iter().enumerate() {
                    let position = scheduled.start_position + offset;
                    let slot = self.slot(table, position)?;
                    self.slots[slot] = Some(SlotContent {
                        token,
                        position,
                        salt: *salt,
                        group,
                    });
                }
            }
        }
        let mut sampled = Vec::new();
        let mut state_hashes = HashMap::new();
        for scheduled in &output.scheduled {
            if let Some(hash) = self.advance_state(scheduled)? {
                state_hashes.insert(scheduled.request_id, hash);
            }
        }
        for scheduled in &output.scheduled {
            let (tokens, salt) = &truth[&scheduled.request_id];
            let drafts = &scheduled.draft_token_ids;
            let end = scheduled.start_position + scheduled.token_ids.len() - drafts.len();
            let mut sequence = self.read_checked(scheduled, 0, end, tokens, *salt)?;
            for group in 1..self.windows.len() {
                self.read_checked(scheduled, group, end, tokens, *salt)?;
            }
            if !scheduled.samples {
                continue;
            }
            // Speculative verification: each draft is checked against the "model" reading
            // the sequence (drafts before it included) back through the block tables.
            if let Some(&hash) = state_hashes.get(&scheduled.request_id) {
                // The recurrent layers' view: what the state saw, not what the KV holds.
                sampled.push((
                    scheduled.request_id,
                    vec![token_from_hash(hash, self.eos_every)],
                ));
                continue;
            }
            let mut run = Vec::new();
            loop {
                let token = next_token(&sequence, self.eos_every);
                run.push(token);
                if drafts.get(run.len() - 1) != Some(&token) {
                    break;
                }
                let last = end + run.len();
                let mut fed = tokens[..end].to_vec();
                fed.extend_from_slice(&drafts[..run.len()]);
                sequence = self.read_checked(scheduled, 0, last, &fed, *salt)?;
                for group in 1..self.windows.len() {
                    self.read_checked(scheduled, group, last, &fed, *salt)?;
                }
            }
            sampled.push((scheduled.request_id, run));
        }
        Ok(sampled)
    }
}
