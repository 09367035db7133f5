//! The LoRA update of a linear layer: after the base matmul over the whole batch, each
//! adapter's rows are gathered, multiplied by its `A` then `B·scale` (the f32 kernel, whose
//! per-row arithmetic does not depend on how many rows it gets), and added to their outputs.
//! A row's result therefore depends only on its own input and its own adapter.

use tokenmill_kernels::MatmulScratch;

use super::Step;
use crate::error::{ModelError, Result};
use crate::lora::LoraTarget;

/// Where an update lands: layer, target, and the target's columns in an output row of
/// `out_width` (a fused `[q | k | v]` row holds three targets).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoraSite {
    pub layer: usize,
    pub target: LoraTarget,
    pub out_width: usize,
    pub column: usize,
}

/// Gathered rows and intermediates of one adapter's update; grown, never shrunk.
#[derive(Debug, Default)]
pub(crate) struct LoraScratch {
    rows: Vec<usize>,
    x: Vec<f32>,
    low_rank: Vec<f32>,
    delta: Vec<f32>,
    matmul: MatmulScratch,
}

impl LoraScratch {
    /// Adds every adapter's update at `site` to `out` (`[n][site.out_width]`) for input `x`
    /// (`[n][in_features]`). Nothing happens when no token of the step uses an adapter.
    pub fn apply(
        &mut self,
        step: &Step<'_>,
        site: LoraSite,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let lora = &step.batch.lora;
        if !lora.is_active() {
            return Ok(());
        }
        let n = step.num_tokens();
        for (index, adapter) in lora.adapters.iter().enumerate() {
            let Some(pair) = adapter.pair(site.layer, site.target) else {
                continue;
            };
            let slot = index + 1;
            self.rows.clear();
            self.rows.extend(
                lora.slots
                    .iter()
                    .enumerate()
                    .filter(|&(_, &s)| s as usize == slot)
                    .map(|(row, _)| row),
            );
            if self.rows.is_empty() {
                continue;
            }
            let (in_features, rank) = (pair.a.in_features(), pair.a.out_features());
            let out_features = pair.b.out_features();
            if x.len() != n * in_features
                || out.len() != n * site.out_width
                || site.column + out_features > site.out_width
            {
                return Err(ModelError::InvalidBatch(format!(
                    "LoRA {:?} update of layer {} does not fit the layer's shape",
                    site.target, site.layer
                )));
            }
            let m = self.rows.len();
            self.x.clear();
            for &row in &self.rows {
                self.x
                    .extend_from_slice(&x[row * in_features..(row + 1) * in_features]);
            }
            self.low_rank.clear();
            self.low_rank.resize(m * rank, 0.0);
            pair.a
                .matmul(step.pool, &self.x, m, &mut self.low_rank, &mut self.matmul)?;
            self.delta.clear();
            self.delta.resize(m * out_features, 0.0);
            pair.b.matmul(
                step.pool,
                &self.low_rank,
                m,
                &mut self.delta,
                &mut self.matmul,
            )?;
            for (&row, delta) in self.rows.iter().zip(self.delta.chunks_exact(out_features)) {
                let start = row * site.out_width + site.column;
                for (value, d) in out[start..start + out_features].iter_mut().zip(delta) {
                    *value += d;
                }
            }
        }
        Ok(())
    }
}
