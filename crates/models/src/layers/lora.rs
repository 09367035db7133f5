//! The LoRA update of a linear layer: after the base matmul over the whole batch, each
//! adapter's rows are gathered, multiplied by its stacked `A` (one product for all targets
//! that read the same input), scaled, multiplied by each target's `B`, and added to their
//! outputs. `x · Aᵀ` is the 16-bit float matmul, `· B` the kernels' untransposed axpy
//! (`QMatrix::add_untransposed`); neither's per-row arithmetic depends on how many rows it
//! gets or on the thread count, so a row's result depends only on its own input and its own
//! adapter.
//!
//! Threading: the products are small (rank 16), so a pool round trip per product would cost
//! more than it saves. Several adapters in a step run as one parallel task each, every task
//! running its products serially; a lone adapter runs on the caller, its products split over
//! the pool only when it has enough rows (prefill, a large batch) to pay for the dispatch.

use std::sync::Mutex;

use tokenmill_kernels::{MatmulScratch, ThreadPool};

use super::Step;
use crate::error::{ModelError, Result};
use crate::lora::{LoraGroup, LoraStack};

/// Rows of one adapter below which its products run on the calling thread alone.
const SERIAL_MAX_ROWS: usize = 8;

/// One adapter's gathered rows and intermediates; grown, never shrunk.
#[derive(Debug, Default)]
struct SlotScratch {
    rows: Vec<usize>,
    x: Vec<f32>,
    low_rank: Vec<f32>,
    part_x: Vec<f32>,
    /// `[part][row][out_features of the part]`.
    delta: Vec<f32>,
    matmul: MatmulScratch,
    failure: Option<ModelError>,
}

/// Per-slot scratch of the LoRA updates, reused by every linear layer of a step.
#[derive(Debug)]
pub(crate) struct LoraScratch {
    /// Indexed by slot − 1; a `Mutex` so each parallel task takes its own (never contended).
    slots: Vec<Mutex<SlotScratch>>,
    /// Slots (− 1) with rows in the current update.
    active: Vec<usize>,
    /// A one-thread pool: the kernels' calls run inline on the calling thread.
    serial: ThreadPool,
}

impl Default for LoraScratch {
    fn default() -> LoraScratch {
        LoraScratch {
            slots: Vec::new(),
            active: Vec::new(),
            serial: ThreadPool::new(1),
        }
    }
}

fn poisoned() -> ModelError {
    ModelError::InvalidBatch("a LoRA update task panicked".into())
}

impl LoraScratch {
    /// Adds every adapter's update for `group` of `layer` to `out` (`[n][out_width]`, the
    /// group's fused output row) for input `x` (`[n][in_features]`). Nothing happens when no
    /// token of the step uses an adapter.
    pub fn apply(
        &mut self,
        step: &Step<'_>,
        layer: usize,
        group: LoraGroup,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let lora = &step.batch.lora;
        if !lora.is_active() {
            return Ok(());
        }
        let n = step.num_tokens();
        let out_width = out.len().checked_div(n).unwrap_or(0);
        while self.slots.len() < lora.adapters.len() {
            self.slots.push(Mutex::default());
        }
        self.active.clear();
        for (index, adapter) in lora.adapters.iter().enumerate() {
            let Some(stack) = adapter.stack(layer, group) else {
                continue;
            };
            let in_features = stack.a.in_features();
            let fits = x.len() == n * in_features
                && out.len() == n * out_width
                && stack
                    .parts
                    .iter()
                    .all(|part| part.column + part.b.in_features() <= out_width);
            if !fits {
                return Err(ModelError::InvalidBatch(format!(
                    "LoRA {group:?} update of layer {layer} does not fit the layer's shape"
                )));
            }
            let slot = self.slots[index].get_mut().map_err(|_| poisoned())?;
            slot.rows.clear();
            slot.rows.extend(
                lora.slots
                    .iter()
                    .enumerate()
                    .filter(|&(_, &s)| s as usize == index + 1)
                    .map(|(row, _)| row),
            );
            if !slot.rows.is_empty() {
                self.active.push(index);
            }
        }
        let (slots, active, serial) = (&self.slots, &self.active, &self.serial);
        let stack_of = |index: usize| lora.adapters[index].stack(layer, group);
        let scale_of = |index: usize| lora.adapters[index].scale();
        match active.as_slice() {
            [] => return Ok(()),
            &[index] => {
                let slot = &mut *slots[index].lock().map_err(|_| poisoned())?;
                let pool = if slot.rows.len() > SERIAL_MAX_ROWS {
                    step.pool
                } else {
                    serial
                };
                if let Some(stack) = stack_of(index) {
                    slot.compute(pool, stack, scale_of(index), x)?;
                }
            }
            _ => step.pool.parallel_for(active.len(), &|task| {
                let index = active[task];
                // A poisoned lock is reported after the loop; a stack is always present here.
                if let (Ok(mut slot), Some(stack)) = (slots[index].lock(), stack_of(index)) {
                    if let Err(error) = slot.compute(serial, stack, scale_of(index), x) {
                        slot.failure = Some(error);
                    }
                }
            }),
        }
        for &index in active {
            let slot = &mut *slots[index].lock().map_err(|_| poisoned())?;
            if let Some(error) = slot.failure.take() {
                return Err(error);
            }
            if let Some(stack) = stack_of(index) {
                slot.add_to(stack, out, out_width);
            }
        }
        Ok(())
    }
}

impl SlotScratch {
    /// `delta = scale · (x[rows] · Aᵀ)[ranks] · Bᵀ` for every part of `stack` (`x · Aᵀ` on
    /// `pool`, the `B` axpys on this thread).
    fn compute(
        &mut self,
        pool: &ThreadPool,
        stack: &LoraStack,
        scale: f32,
        x: &[f32],
    ) -> Result<()> {
        let in_features = stack.a.in_features();
        let stacked_rank = stack.a.out_features();
        let m = self.rows.len();
        self.x.clear();
        for &row in &self.rows {
            self.x
                .extend_from_slice(&x[row * in_features..(row + 1) * in_features]);
        }
        self.low_rank.clear();
        self.low_rank.resize(m * stacked_rank, 0.0);
        stack
            .a
            .matmul(pool, &self.x, m, &mut self.low_rank, &mut self.matmul)?;
        self.low_rank.iter_mut().for_each(|value| *value *= scale);
        let total: usize = stack.parts.iter().map(|p| m * p.b.in_features()).sum();
        self.delta.clear();
        self.delta.resize(total, 0.0);
        let mut offset = 0;
        for part in &stack.parts {
            let size = m * part.b.in_features();
            let delta = &mut self.delta[offset..offset + size];
            offset += size;
            let input = if part.ranks.len() == stacked_rank {
                &self.low_rank
            } else {
                self.part_x.clear();
                for row in self.low_rank.chunks_exact(stacked_rank) {
                    self.part_x.extend_from_slice(&row[part.ranks.clone()]);
                }
                &self.part_x
            };
            part.b.add_untransposed(input, m, delta)?;
        }
        Ok(())
    }

    /// Adds the computed deltas to the slot's rows of `out` (`[n][out_width]`).
    fn add_to(&self, stack: &LoraStack, out: &mut [f32], out_width: usize) {
        let mut offset = 0;
        for part in &stack.parts {
            let width = part.b.in_features();
            let size = self.rows.len() * width;
            let deltas = self.delta[offset..offset + size].chunks_exact(width);
            offset += size;
            for (&row, delta) in self.rows.iter().zip(deltas) {
                let start = row * out_width + part.column;
                for (value, d) in out[start..start + width].iter_mut().zip(delta) {
                    *value += d;
                }
            }
        }
    }
}
