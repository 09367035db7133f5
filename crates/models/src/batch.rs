//! The flattened, variable-length batch a forward step consumes.

use std::sync::Arc;

use tokenmill_kernels::AttentionSeq;

use crate::error::{ModelError, Result};
use crate::lora::{LoraAdapter, LoraBatch};

/// All tokens scheduled this step, from all sequences, concatenated.
///
/// Each sequence contributes a contiguous run of tokens (a prefill chunk or one decode token)
/// and an [`AttentionSeq`] describing where its run starts, how much context it attends to and
/// where its block table lives in `block_tables`. `logits_indices` lists the rows that need
/// logits (usually the last token of each sequence that samples this step); the forward pass
/// computes the output head for those rows only, in that order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchInput {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    /// KV-cache slot (`block_id * block_size + offset`) each token's K/V is written to.
    pub slot_mapping: Vec<u32>,
    pub seqs: Vec<AttentionSeq>,
    /// Block tables of all sequences, concatenated.
    pub block_tables: Vec<u32>,
    /// KV cache groups 1.. of a hybrid model (`slot_mapping` and `block_tables` are group
    /// 0's): each group's own slots and tables, laid out as group 0's, so the `seqs` serve
    /// them all.
    pub other_groups: Vec<GroupTables>,
    pub logits_indices: Vec<u32>,
    /// Per entry of `seqs`, the recurrent-state slot of that sequence
    /// ([`crate::StateCacheStorage`]); empty for a model without recurrent layers. A sequence
    /// whose run starts at position 0 starts from a zero state (the model resets its slot);
    /// any other continues from the state its slot holds, which must be the state after
    /// exactly the positions before its run.
    pub state_slots: Vec<u32>,
    /// The step's LoRA adapters and each token's slot (0: the base model).
    pub lora: LoraBatch,
}

/// One KV cache group's slots and block tables (see [`BatchInput::other_groups`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupTables {
    pub slot_mapping: Vec<u32>,
    pub block_tables: Vec<u32>,
}

impl BatchInput {
    /// Empties the batch, keeping its allocations for the next step.
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.seqs.clear();
        self.block_tables.clear();
        self.other_groups.clear();
        self.logits_indices.clear();
        self.state_slots.clear();
        self.lora.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Appends one sequence's new tokens, which occupy positions
    /// `start_position..start_position + tokens.len()`; the tokens before `start_position`
    /// must already be in the cache blocks named by `block_table`. With `wants_logits`, the
    /// last new token's row is added to `logits_indices`.
    pub fn add_sequence(
        &mut self,
        tokens: &[u32],
        start_position: usize,
        block_table: &[u32],
        block_size: usize,
        wants_logits: bool,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::InvalidBatch(
                "a sequence needs at least one new token".into(),
            ));
        }
        if block_size == 0 {
            return Err(ModelError::InvalidBatch(
                "block size must be positive".into(),
            ));
        }
        let context_len = start_position + tokens.len();
        let num_blocks = context_len.div_ceil(block_size);
        if block_table.len() < num_blocks {
            return Err(ModelError::InvalidBatch(format!(
                "{context_len} tokens need {num_blocks} blocks of {block_size}, block table has {}",
                block_table.len()
            )));
        }
        let to_u32 = |value: usize, what: &str| {
            u32::try_from(value)
                .map_err(|_| ModelError::InvalidBatch(format!("{what} {value} exceeds u32")))
        };
        let query_start = self.token_ids.len();
        for position in start_position..context_len {
            let block = block_table[position / block_size] as usize;
            let slot = block * block_size + position % block_size;
            self.positions.push(to_u32(position, "position")?);
            self.slot_mapping.push(to_u32(slot, "slot")?);
        }
        self.token_ids.extend_from_slice(tokens);
        if wants_logits {
            self.logits_indices
                .push(to_u32(self.token_ids.len() - 1, "logits row")?);
        }
        self.seqs.push(AttentionSeq {
            query_start,
            query_len: tokens.len(),
            context_len,
            block_table_start: self.block_tables.len(),
            num_blocks,
        });
        self.block_tables
            .extend_from_slice(&block_table[..num_blocks]);
        self.lora.slots.resize(self.token_ids.len(), 0);
        Ok(())
    }

    /// [`Self::add_sequence`] for a hybrid model: one block table per KV cache group, all
    /// covering the sequence (group 0's first). Every sequence of a batch names the same
    /// number of groups.
    pub fn add_sequence_grouped<T: AsRef<[u32]>>(
        &mut self,
        tokens: &[u32],
        start_position: usize,
        block_tables: &[T],
        block_size: usize,
        wants_logits: bool,
    ) -> Result<()> {
        let Some((first, rest)) = block_tables.split_first() else {
            return Err(ModelError::InvalidBatch(
                "a sequence needs a block table".into(),
            ));
        };
        if !self.seqs.is_empty() && rest.len() != self.other_groups.len() {
            return Err(ModelError::InvalidBatch(format!(
                "a sequence names {} KV cache groups, the batch {}",
                block_tables.len(),
                self.other_groups.len() + 1
            )));
        }
        let context_len = start_position + tokens.len();
        let num_blocks = context_len.div_ceil(block_size.max(1));
        if let Some(short) = rest.iter().find(|table| table.as_ref().len() < num_blocks) {
            return Err(ModelError::InvalidBatch(format!(
                "{context_len} tokens need {num_blocks} blocks of {block_size}, a group's block \
                 table has {}",
                short.as_ref().len()
            )));
        }
        self.add_sequence(
            tokens,
            start_position,
            first.as_ref(),
            block_size,
            wants_logits,
        )?;
        self.other_groups
            .resize_with(rest.len(), GroupTables::default);
        for (group, table) in self.other_groups.iter_mut().zip(rest) {
            let table = table.as_ref();
            for position in start_position..context_len {
                let block = table[position / block_size] as usize;
                let slot = block * block_size + position % block_size;
                group.slot_mapping.push(
                    u32::try_from(slot).map_err(|_| {
                        ModelError::InvalidBatch(format!("slot {slot} exceeds u32"))
                    })?,
                );
            }
            group.block_tables.extend_from_slice(&table[..num_blocks]);
        }
        Ok(())
    }

    /// KV cache group `group`'s slot mapping and block tables (group 0: the batch's own).
    pub fn group_tables(&self, group: usize) -> Option<(&[u32], &[u32])> {
        match group {
            0 => Some((&self.slot_mapping, &self.block_tables)),
            _ => self
                .other_groups
                .get(group - 1)
                .map(|g| (g.slot_mapping.as_slice(), g.block_tables.as_slice())),
        }
    }

    /// Runs the last added sequence's tokens through `adapter` (its LoRA updates are added
    /// to those rows only).
    pub fn set_last_sequence_adapter(&mut self, adapter: &Arc<LoraAdapter>) -> Result<()> {
        let Some(seq) = self.seqs.last() else {
            return Err(ModelError::InvalidBatch(
                "no sequence to attach an adapter to".into(),
            ));
        };
        let range = seq.query_start..seq.query_start + seq.query_len;
        let slot = self
            .lora
            .slot_of(adapter)
            .ok_or_else(|| ModelError::InvalidBatch("too many LoRA adapters in one step".into()))?;
        self.lora.slots.resize(self.token_ids.len(), 0);
        self.lora.slots[range].fill(slot);
        Ok(())
    }

    /// The part of the batch the output rows still depend on once no later layer writes the
    /// cache (Gemma 4's KV-shared layers): each sequence's tokens from its first logits row
    /// to its end (a suffix, so each stays a contiguous run that attends to the cache as a
    /// later chunk would), and no token of a sequence without logits rows. Returns that batch
    /// and, per kept row, its row in `self`; `None` when every row is kept.
    pub fn logits_suffix(&self) -> Option<(BatchInput, Vec<usize>)> {
        let mut first = vec![usize::MAX; self.seqs.len()];
        for &row in &self.logits_indices {
            let row = row as usize;
            // The sequence holding `row`: the last one starting at or before it.
            let seq = self.seqs.partition_point(|s| s.query_start <= row);
            let index = seq.checked_sub(1)?;
            let holder = &self.seqs[index];
            if row >= holder.query_start + holder.query_len {
                return None;
            }
            first[index] = first[index].min(row);
        }
        let kept_count: usize = self
            .seqs
            .iter()
            .zip(&first)
            .filter(|(_, &from)| from != usize::MAX)
            .map(|(s, &from)| s.query_start + s.query_len - from)
            .sum();
        if kept_count == self.num_tokens() {
            return None;
        }
        let mut out = BatchInput {
            block_tables: self.block_tables.clone(),
            other_groups: self
                .other_groups
                .iter()
                .map(|group| GroupTables {
                    slot_mapping: Vec::with_capacity(kept_count),
                    block_tables: group.block_tables.clone(),
                })
                .collect(),
            lora: LoraBatch {
                adapters: self.lora.adapters.clone(),
                slots: Vec::with_capacity(kept_count),
            },
            ..BatchInput::default()
        };
        let mut rows = Vec::with_capacity(kept_count);
        for (index, (seq, &from)) in self.seqs.iter().zip(&first).enumerate() {
            if from == usize::MAX {
                continue;
            }
            let end = seq.query_start + seq.query_len;
            let query_start = rows.len();
            rows.extend(from..end);
            out.seqs.push(AttentionSeq {
                query_start,
                query_len: end - from,
                ..*seq
            });
            if let Some(&slot) = self.state_slots.get(index) {
                out.state_slots.push(slot);
            }
        }
        for &row in &rows {
            out.token_ids.push(self.token_ids[row]);
            out.positions.push(self.positions[row]);
            out.slot_mapping.push(self.slot_mapping[row]);
            for (to, from) in out.other_groups.iter_mut().zip(&self.other_groups) {
                to.slot_mapping.push(from.slot_mapping[row]);
            }
            out.lora
                .slots
                .push(self.lora.slots.get(row).copied().unwrap_or(0));
        }
        // Each logits row maps to its place among the kept rows (which ascend).
        for &row in &self.logits_indices {
            let kept = rows.binary_search(&(row as usize)).ok()?;
            out.logits_indices.push(u32::try_from(kept).ok()?);
        }
        Some((out, rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computes_positions_slots_and_block_tables() {
        let mut batch = BatchInput::default();
        // A 5-token prefill chunk starting at position 3 in blocks [7, 2] of size 4.
        batch
            .add_sequence(&[10, 11, 12, 13, 14], 3, &[7, 2, 9], 4, false)
            .unwrap();
        // A decode token at position 4 in blocks [5, 6].
        batch.add_sequence(&[20], 4, &[5, 6], 4, true).unwrap();
        assert_eq!(batch.positions, vec![3, 4, 5, 6, 7, 4]);
        assert_eq!(batch.slot_mapping, vec![31, 8, 9, 10, 11, 24]);
        assert_eq!(batch.block_tables, vec![7, 2, 5, 6]);
        assert_eq!(batch.logits_indices, vec![5]);
        assert_eq!(batch.seqs[0].context_len, 8);
        assert_eq!(batch.seqs[0].num_blocks, 2);
        assert_eq!(batch.seqs[1].query_start, 5);
        assert_eq!(batch.seqs[1].block_table_start, 2);
        assert_eq!(batch.seqs[1].num_blocks, 2);
    }

    #[test]
    fn logits_suffix_keeps_each_sequence_from_its_first_logits_row() {
        let mut batch = BatchInput::default();
        // A prefill chunk with no logits, a prompt whose last token samples, a decode token.
        batch.add_sequence(&[1, 2, 3], 0, &[4], 4, false).unwrap();
        batch
            .add_sequence(&[5, 6, 7, 8], 2, &[1, 2], 4, true)
            .unwrap();
        batch.add_sequence(&[9], 6, &[3, 8], 4, true).unwrap();
        batch.other_groups.push(GroupTables {
            slot_mapping: vec![100, 101, 102, 103, 104, 105, 106, 107],
            block_tables: vec![0; 5],
        });
        batch.lora.slots = vec![0, 0, 0, 1, 1, 1, 1, 0];
        let (suffix, rows) = batch.logits_suffix().unwrap();
        assert_eq!(rows, vec![6, 7]);
        assert_eq!(suffix.token_ids, vec![8, 9]);
        assert_eq!(suffix.positions, vec![5, 6]);
        assert_eq!(
            suffix.slot_mapping,
            vec![batch.slot_mapping[6], batch.slot_mapping[7]]
        );
        assert_eq!(suffix.other_groups[0].slot_mapping, vec![106, 107]);
        assert_eq!(suffix.lora.slots, vec![1, 0]);
        assert_eq!(suffix.logits_indices, vec![0, 1]);
        assert_eq!(suffix.seqs.len(), 2);
        assert_eq!(
            (suffix.seqs[0].query_start, suffix.seqs[0].query_len),
            (0, 1)
        );
        assert_eq!(suffix.seqs[0].context_len, batch.seqs[1].context_len);
        assert_eq!(
            suffix.seqs[0].block_table_start,
            batch.seqs[1].block_table_start
        );
        assert_eq!(
            (suffix.seqs[1].query_start, suffix.seqs[1].query_len),
            (1, 1)
        );

        // Prompt logprobs: every row of the prompt from its first logits row on stays.
        batch.logits_indices = vec![4, 5, 6, 7];
        let (suffix, rows) = batch.logits_suffix().unwrap();
        assert_eq!(rows, vec![4, 5, 6, 7]);
        assert_eq!(suffix.logits_indices, vec![0, 1, 2, 3]);
        assert_eq!(suffix.seqs[0].query_len, 3);

        // Nothing to drop: no pruned batch.
        let mut decode = BatchInput::default();
        decode.add_sequence(&[1], 3, &[0], 4, true).unwrap();
        decode.add_sequence(&[2], 5, &[1, 2], 4, true).unwrap();
        assert!(decode.logits_suffix().is_none());

        // No logits at all: every row goes.
        let mut chunk = BatchInput::default();
        chunk.add_sequence(&[1, 2], 0, &[0], 4, false).unwrap();
        let (suffix, rows) = chunk.logits_suffix().unwrap();
        assert!(rows.is_empty() && suffix.is_empty() && suffix.seqs.is_empty());
    }

    #[test]
    fn rejects_a_short_block_table() {
        let mut batch = BatchInput::default();
        let error = batch
            .add_sequence(&[1, 2, 3], 2, &[0], 4, true)
            .unwrap_err();
        assert!(error.to_string().contains("need 2 blocks"), "{error}");
    }
}
