//! The gated feed-forward block: `down(act(gate(x)) * up(x))`.

use tokenmill_kernels::gated_rows;

use super::{Linear, LinearScratch, StackedLinear, Step};
use crate::error::Result;
use crate::loader::{LayerTensors, FUSED_GATE_UP};
use crate::lora::LoraGroup;

/// The gate's activation, each a fused `act(gate) * up` kernel (GELU: the tanh approximation,
/// Gemma's `gelu_pytorch_tanh`).
pub(crate) use tokenmill_kernels::GateActivation as Activation;

/// The MLP's intermediates, `[n][..]` each.
#[derive(Debug, Default)]
pub(crate) struct MlpBuffers {
    gate_up: Vec<f32>,
    activated: Vec<f32>,
}

impl MlpBuffers {
    /// Sizes the buffers for `n` tokens of an MLP `intermediate` wide; only grows capacity.
    pub fn prepare(&mut self, n: usize, intermediate: usize) {
        self.gate_up.resize(n * 2 * intermediate, 0.0);
        self.activated.resize(n * intermediate, 0.0);
    }
}

#[derive(Debug)]
pub(crate) struct GatedMlp {
    /// `[gate | up]`.
    gate_up: StackedLinear,
    down: Linear,
    intermediate: usize,
    activation: Activation,
}

impl GatedMlp {
    /// Reads `ffn_gate.weight`, `ffn_up.weight` (or Phi-3's fused gate/up) and
    /// `ffn_down.weight`.
    pub fn load(
        tensors: &LayerTensors<'_>,
        hidden: usize,
        intermediate: usize,
        activation: Activation,
    ) -> Result<GatedMlp> {
        // Phi-3 has no `ffn_gate`: its fused projection's rows are already `[gate | up]`.
        let gate_up = if tensors.contains("ffn_gate.weight") {
            tensors.stacked(
                &[
                    ("ffn_gate.weight", intermediate),
                    ("ffn_up.weight", intermediate),
                ],
                hidden,
            )?
        } else {
            tensors.stacked(&[(FUSED_GATE_UP, 2 * intermediate)], hidden)?
        };
        Ok(GatedMlp {
            gate_up,
            down: tensors.matrix("ffn_down.weight", hidden, intermediate)?,
            intermediate,
            activation,
        })
    }

    pub fn storage_bytes(&self) -> usize {
        self.gate_up.storage_bytes() + self.down.storage_bytes()
    }

    /// `out[n][hidden]` for `x[n][hidden]`, with layer `layer`'s LoRA updates.
    pub fn forward(
        &self,
        step: &Step<'_>,
        layer: usize,
        x: &[f32],
        buffers: &mut MlpBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (pool, n, intermediate) = (step.pool, step.num_tokens(), self.intermediate);
        // The buffers fit the widest layer (Gemma 4's double-wide MLPs); this one uses the
        // first `n` rows of its own width.
        let (Some(gate_up), Some(activated)) = (
            buffers.gate_up.get_mut(..n * 2 * intermediate),
            buffers.activated.get_mut(..n * intermediate),
        ) else {
            return Err(crate::error::ModelError::InvalidBatch(format!(
                "MLP buffers not prepared for {n} tokens of width {intermediate}"
            )));
        };
        self.gate_up.forward(pool, x, n, gate_up, scratch)?;
        scratch
            .lora
            .apply(step, layer, LoraGroup::GateUp, x, gate_up)?;
        gated_rows(pool, self.activation, gate_up, activated, intermediate)?;
        self.down.forward(pool, activated, n, out, scratch)?;
        scratch
            .lora
            .apply(step, layer, LoraGroup::Down, activated, out)
    }
}
