//! A paged "model" for driving the scheduler without tensors: its KV cache stores, per slot,
//! the token and position written there (and the writer's cache salt), and its greedy
//! "sampler" hashes the whole sequence it reads back through the block table. So a wrong
//! block table, position or prefix-cache hit changes what is read back, and with it the
//! sampled tokens, exactly as it would corrupt a real model's attention.

#![allow(dead_code)]

pub mod driver;

use std::collections::HashMap;

use tokenmill_core::{RequestId, ScheduleKind, SchedulerOutput};

pub const VOCAB: u32 = 64;
pub const EOS: u32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotContent {
    token: u32,
    position: usize,
    salt: Option<u8>,
}

pub struct PagedTokenExecutor {
    block_size: usize,
    slots: Vec<Option<SlotContent>>,
    /// Every how many sequence hashes one is turned into EOS (0: never).
    eos_every: u64,
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
        }
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
        range: std::ops::Range<usize>,
        salt: Option<u8>,
    ) -> Result<Vec<u32>, String> {
        let mut tokens = Vec::with_capacity(range.len());
        for position in range {
            let slot = self.slot(block_table, position)?;
            match self.slots[slot] {
                Some(content) if content.position == position && content.salt == salt => {
                    tokens.push(content.token)
                }
                other => {
                    return Err(format!(
                        "slot for position {position} holds {other:?} (salt {salt:?})"
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
            if scheduled.kind != ScheduleKind::Continuing && scheduled.num_cached_tokens > 0 {
                let hit = self.read(
                    &scheduled.block_table,
                    0..scheduled.num_cached_tokens,
                    *salt,
                )?;
                if hit[..] != tokens[..scheduled.num_cached_tokens] {
                    return Err(format!(
                        "request {}: prefix hit holds {hit:?}, prompt is {tokens:?}",
                        scheduled.request_id
                    ));
                }
            }
            for (offset, &token) in scheduled.token_ids.iter().enumerate() {
                let position = scheduled.start_position + offset;
                let slot = self.slot(&scheduled.block_table, position)?;
                self.slots[slot] = Some(SlotContent {
                    token,
                    position,
                    salt: *salt,
                });
            }
        }
        let mut sampled = Vec::new();
        for scheduled in &output.scheduled {
            let (tokens, salt) = &truth[&scheduled.request_id];
            let drafts = &scheduled.draft_token_ids;
            let end = scheduled.start_position + scheduled.token_ids.len() - drafts.len();
            let mut sequence = self.read(&scheduled.block_table, 0..end, *salt)?;
            if sequence[..] != tokens[..end] {
                return Err(format!(
                    "request {}: KV holds {sequence:?}, sequence is {tokens:?}",
                    scheduled.request_id
                ));
            }
            if !scheduled.samples {
                continue;
            }
            // Speculative verification: each draft is checked against the "model" reading
            // the sequence (drafts before it included) back through the block table.
            let mut run = Vec::new();
            loop {
                let token = next_token(&sequence, self.eos_every);
                run.push(token);
                if drafts.get(run.len() - 1) != Some(&token) {
                    break;
                }
                sequence = self.read(&scheduled.block_table, 0..end + run.len(), *salt)?;
            }
            sampled.push((scheduled.request_id, run));
        }
        Ok(sampled)
    }
}
