//! The building blocks model families compose: linear layers, norms, RoPE, the attention
//! block and the gated MLP, plus the [`Workspace`] their activations live in.
//!
//! Each block owns its weights and borrows named buffers from the workspace; there is no
//! general tensor type. Shapes are plain `usize`s and every buffer is sized by a `prepare`
//! before the step, so a steady-state step allocates nothing and every row is computed the
//! same way whatever else is in the batch (the batch-invariance invariant).

mod attention;
mod gated_delta_net;
mod head;
mod linear;
mod lora;
mod mlp;
mod moe;
mod norm;
mod per_layer;
mod rope;

pub(crate) use attention::{AttentionBlock, AttentionBuffers, AttentionOptions, AttentionShape};
pub(crate) use gated_delta_net::{DeltaNetBuffers, GatedDeltaNet};
pub(crate) use head::EmbeddingAndHead;
pub(crate) use linear::{embed, Linear, LinearScratch, RowBytes, RowTable, StackedLinear};
pub(crate) use mlp::{Activation, GatedMlp, MlpBuffers};
pub(crate) use moe::{FeedForward, MoeBlock, MoeBuffers, Routing};
pub(crate) use norm::{LayerNorm, RmsNorm};
pub(crate) use per_layer::{compact_rows, PerLayerBuffers, PerLayerEmbeddings, PerLayerGate};
pub(crate) use rope::Rope;

use tokenmill_kernels::{add_rows, ThreadPool};

use crate::batch::BatchInput;
use crate::error::Result;

/// What every block of one step reads: the compute pool and the flattened batch.
#[derive(Clone, Copy)]
pub(crate) struct Step<'a> {
    pub pool: &'a ThreadPool,
    pub batch: &'a BatchInput,
}

impl Step<'_> {
    /// Tokens in the batch (rows of every activation buffer).
    pub fn num_tokens(&self) -> usize {
        self.batch.num_tokens()
    }
}

/// Activation buffers for a forward pass, grown to the largest batch seen and then reused, so
/// steady-state decoding allocates nothing. The residual stream and the head's rows are here;
/// each block's intermediates are in its own buffer struct, so a family with other blocks
/// adds a field rather than reusing one for two purposes.
#[derive(Debug, Default)]
pub struct Workspace {
    /// The residual stream, `[n][hidden]`.
    pub(crate) hidden: Vec<f32>,
    /// A norm's output: the input of the next block, `[n][hidden]`.
    pub(crate) normed: Vec<f32>,
    /// A block's output before it is added to the residual stream, `[n][hidden]`.
    pub(crate) projected: Vec<f32>,
    /// The rows that produce logits, before and after the final norm, `[rows][hidden]`.
    pub(crate) selected: Vec<f32>,
    pub(crate) selected_normed: Vec<f32>,
    pub(crate) attention: AttentionBuffers,
    pub(crate) mlp: MlpBuffers,
    pub(crate) moe: MoeBuffers,
    /// Gated DeltaNet layers' intermediates (hybrid models only).
    pub(crate) delta_net: DeltaNetBuffers,
    /// Per-layer embeddings' intermediates (Gemma 4 only).
    pub(crate) per_layer: PerLayerBuffers,
    /// The routed experts' output where a layer also has a dense MLP (Gemma 4's mixture of
    /// experts), `[n][hidden]`; sized by such a model only.
    pub(crate) routed: Vec<f32>,
    pub(crate) linear: LinearScratch,
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace::default()
    }

    /// Sizes the residual-stream buffers for `n` tokens of width `hidden` and `rows` logits
    /// rows; only grows capacity. Block buffers are prepared by their blocks' owners.
    pub(crate) fn prepare_residual(&mut self, n: usize, rows: usize, hidden: usize) {
        let sizes: [(&mut Vec<f32>, usize); 5] = [
            (&mut self.hidden, n * hidden),
            (&mut self.normed, n * hidden),
            (&mut self.projected, n * hidden),
            (&mut self.selected, rows * hidden),
            (&mut self.selected_normed, rows * hidden),
        ];
        for (buffer, len) in sizes {
            buffer.resize(len, 0.0);
        }
    }

    /// Sizes [`Workspace::routed`] for `n` tokens of width `hidden`; only grows capacity.
    pub(crate) fn prepare_routed(&mut self, n: usize, hidden: usize) {
        self.routed.resize(n * hidden, 0.0);
    }

    /// Adds the last block's output to the residual stream, rows split over `pool`.
    pub(crate) fn add_residual(&mut self, pool: &ThreadPool, hidden: usize) -> Result<()> {
        add_rows(pool, &mut self.hidden, &self.projected, hidden)?;
        Ok(())
    }

    /// Adds the last block's output to the residual stream and norms the sum with `norm` into
    /// `normed` (the next block's input), in one pass, rows split over `pool`.
    pub(crate) fn add_residual_and_norm(
        &mut self,
        pool: &ThreadPool,
        norm: &RmsNorm,
    ) -> Result<()> {
        norm.add_forward_rows(pool, &mut self.hidden, &self.projected, &mut self.normed)
    }

    /// Norms the last block's output with `norm` and adds the result to the residual stream
    /// (Gemma's post-attention and post-MLP norms), rows split over `pool`.
    pub(crate) fn add_normed_residual(&mut self, pool: &ThreadPool, norm: &RmsNorm) -> Result<()> {
        norm.forward_rows(pool, &self.projected, &mut self.normed)?;
        add_rows(pool, &mut self.hidden, &self.normed, norm.width())?;
        Ok(())
    }

    /// The logits of the batch's `logits_indices` rows: gathers them, applies the final
    /// norm, and projects with `head` into `logits` (`[rows][vocab]`).
    pub(crate) fn final_logits(
        &mut self,
        step: &Step<'_>,
        norm: &RmsNorm,
        head: &Linear,
        hidden: usize,
        vocab: usize,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let indices = &step.batch.logits_indices;
        for (out, &index) in self.selected.chunks_exact_mut(hidden).zip(indices) {
            let index = index as usize;
            out.copy_from_slice(&self.hidden[index * hidden..(index + 1) * hidden]);
        }
        norm.forward(&self.selected, &mut self.selected_normed)?;
        let rows = indices.len();
        // No zeroing: the head's matmul writes every element of its output (the kernels'
        // tests fill outputs with NaN first and compare every element), so `resize` only
        // fills growth. A 16-row verification step zeroed 3 MB here on the calling thread.
        logits.resize(rows * vocab, 0.0);
        if rows > 0 {
            head.forward(
                step.pool,
                &self.selected_normed,
                rows,
                logits,
                &mut self.linear,
            )?;
        }
        Ok(())
    }
}
