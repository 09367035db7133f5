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
}

/// FNV-1a over the sequence: a pure function of the tokens, like greedy decoding.
pub fn next_token(sequence: &[u32], eos_every: u64) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &token in sequence {
        for byte in token.to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash ^= hash >> 29;
    if eos_every > 0 && hash.is_multiple_of(eos_every) {
        EOS
    } else {
        1 + (hash % u64::from(VOCAB - 1)) as u32
    }
}

impl PagedTokenExecutor {
    pub fn new(num_blocks: u32, block_size: usize, eos_every: u64) -> Self {
        Self {
            block_size,
            slots: vec![None; num_blocks as usize * block_size],
            eos_every,
            windows: vec![None],
        }
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
