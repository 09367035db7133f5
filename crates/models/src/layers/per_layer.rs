//! Per-layer embeddings (Gemma 4's PLE): besides the token embedding, a table gives each
//! token a small vector per layer, mixed with a projection of the embedding, and each layer
//! gates its own into its output. The table is as big as the rest of a small model, so it is
//! kept in the file's type and read a row per token ([`RowTable`]), never repacked.

use super::{Activation, Linear, RmsNorm, RowTable, Step, Workspace};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::loader::{LayerTensors, WeightReader};

/// Gemma 4's per-layer embeddings (PLE): for each token, `layers` vectors of `width`, each
/// `(norm(proj(embedding) / sqrt(hidden)) + table[token] * sqrt(width)) / sqrt(2)`.
#[derive(Debug)]
pub(crate) struct PerLayerEmbeddings {
    /// `[vocab][layers * width]`, read a row per token.
    table: RowTable,
    /// `[layers * width][hidden]`.
    projection: Linear,
    /// `width` wide, applied to each layer's slice of the projection.
    norm: RmsNorm,
    width: usize,
    layers: usize,
    hidden: usize,
}

/// What one layer does with its per-layer embedding:
/// `x += post_norm(proj(gelu(gate(x)) * ple))`.
#[derive(Debug)]
pub(crate) struct PerLayerGate {
    /// `[width][hidden]`.
    gate: Linear,
    /// `[hidden][width]`.
    projection: Linear,
    post_norm: RmsNorm,
    width: usize,
}

/// The per-layer embeddings' intermediates.
#[derive(Debug, Default)]
pub(crate) struct PerLayerBuffers {
    /// `[n][layers][width]`: every token's per-layer inputs for this step.
    inputs: Vec<f32>,
    /// `[n][layers * width]`: the projection before its norm.
    projected: Vec<f32>,
    /// One token's table row, `[layers * width]`.
    row: Vec<f32>,
    /// `[n][2 * width]`: a layer's gate and its per-layer input, side by side.
    gate_up: Vec<f32>,
    /// `[n][width]`.
    activated: Vec<f32>,
}

impl PerLayerEmbeddings {
    pub fn load(reader: &WeightReader<'_>, config: &ModelConfig, width: usize) -> Result<Self> {
        let (layers, hidden) = (config.num_layers, config.hidden_size);
        Ok(PerLayerEmbeddings {
            table: reader.row_table(
                "per_layer_token_embd.weight",
                config.vocab_size,
                layers * width,
            )?,
            projection: reader.matrix("per_layer_model_proj.weight", layers * width, hidden)?,
            norm: reader.rms_norm("per_layer_proj_norm.weight", width, config.rms_norm_eps)?,
            width,
            layers,
            hidden,
        })
    }

    /// Bytes of the table and the projection.
    pub fn storage_bytes(&self) -> usize {
        self.table.storage_bytes() + self.projection.storage_bytes()
    }

    /// Bytes a decode step reads whole: the projection (the table is read a row per token).
    pub fn decode_bytes(&self) -> usize {
        self.projection.storage_bytes()
    }

    pub fn prepare(&self, buffers: &mut PerLayerBuffers, n: usize) {
        let all = self.layers * self.width;
        buffers.inputs.resize(n * all, 0.0);
        buffers.projected.resize(n * all, 0.0);
        buffers.row.resize(all, 0.0);
        buffers.gate_up.resize(n * 2 * self.width, 0.0);
        buffers.activated.resize(n * self.width, 0.0);
    }

    /// Moves the per-layer inputs of `rows` (ascending, rows of this step) to the front, in
    /// order: row `rows[i]`'s become row `i`'s (see [`BatchInput::logits_suffix`](crate::BatchInput::logits_suffix)).
    pub fn keep_rows(&self, buffers: &mut PerLayerBuffers, rows: &[usize]) {
        compact_rows(&mut buffers.inputs, self.layers * self.width, rows);
    }

    /// Every token's per-layer inputs into `ws.per_layer.inputs`, from the scaled embeddings
    /// in `ws.hidden`.
    pub fn inputs(&self, step: &Step<'_>, ws: &mut Workspace) -> Result<()> {
        let n = step.num_tokens();
        let (hidden, width) = (self.hidden, self.width);
        let all = self.layers * width;
        let b = &mut ws.per_layer;
        let projected = &mut b.projected[..n * all];
        self.projection.forward(
            step.pool,
            &ws.hidden[..n * hidden],
            n,
            projected,
            &mut ws.linear,
        )?;
        let projection_scale = 1.0 / (hidden as f32).sqrt();
        projected.iter_mut().for_each(|v| *v *= projection_scale);
        let inputs = &mut b.inputs[..n * all];
        self.norm.forward(projected, inputs)?;
        let (table_scale, input_scale) = ((width as f32).sqrt(), std::f32::consts::FRAC_1_SQRT_2);
        for (token_inputs, &token) in inputs.chunks_exact_mut(all).zip(&step.batch.token_ids) {
            self.table.row_to_f32(token as usize, &mut b.row)?;
            for (value, &row) in token_inputs.iter_mut().zip(&b.row) {
                *value = (*value + row * table_scale) * input_scale;
            }
        }
        Ok(())
    }
}

impl PerLayerGate {
    pub fn load(tensors: &LayerTensors<'_>, config: &ModelConfig, width: usize) -> Result<Self> {
        let hidden = config.hidden_size;
        Ok(PerLayerGate {
            gate: tensors.matrix("inp_gate.weight", width, hidden)?,
            projection: tensors.matrix("proj.weight", hidden, width)?,
            post_norm: tensors.rms_norm("post_norm.weight", hidden, config.rms_norm_eps)?,
            width,
        })
    }

    pub fn storage_bytes(&self) -> usize {
        self.gate.storage_bytes() + self.projection.storage_bytes()
    }

    /// `x += post_norm(proj(gelu(gate(x)) * inputs[layer]))` on the residual stream.
    pub fn forward(
        &self,
        step: &Step<'_>,
        layer: usize,
        layers: usize,
        ws: &mut Workspace,
    ) -> Result<()> {
        let n = step.num_tokens();
        let hidden = self.post_norm.width();
        let width = self.width;
        let b = &mut ws.per_layer;
        let gate_up = &mut b.gate_up[..n * 2 * width];
        let gate = &mut b.activated[..n * width];
        self.gate
            .forward(step.pool, &ws.hidden[..n * hidden], n, gate, &mut ws.linear)?;
        for (token, pair) in gate_up.chunks_exact_mut(2 * width).enumerate() {
            let (g, up) = pair.split_at_mut(width);
            g.copy_from_slice(&gate[token * width..(token + 1) * width]);
            let from = (token * layers + layer) * width;
            up.copy_from_slice(&b.inputs[from..from + width]);
        }
        tokenmill_kernels::gated_rows(step.pool, Activation::GeluTanh, gate_up, gate, width)?;
        self.projection.forward(
            step.pool,
            gate,
            n,
            &mut ws.projected[..n * hidden],
            &mut ws.linear,
        )?;
        ws.add_normed_residual(step.pool, &self.post_norm)
    }
}

/// Moves the `width`-wide rows `rows` (ascending) of `buffer` to its front, in order. Row
/// `rows[i] >= i`, so each copy reads a row no earlier copy has overwritten.
pub(crate) fn compact_rows(buffer: &mut [f32], width: usize, rows: &[usize]) {
    for (to, &from) in rows.iter().enumerate() {
        if to != from {
            buffer.copy_within(from * width..(from + 1) * width, to * width);
        }
    }
}
