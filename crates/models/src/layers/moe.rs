//! The mixture-of-experts feed-forward block (Mixtral, Qwen3-MoE) and [`FeedForward`], the
//! choice between it and the dense gated MLP that a layer makes from its config.
//!
//! A router (`ffn_gate_inp`, `[experts, hidden]`) scores every expert per token; the softmax
//! of the scores picks the `experts_used` most probable experts (ties to the lower index) and
//! their probabilities, renormalized to sum to 1, weight the experts' outputs. That is
//! llama.cpp's `build_moe_ffn` for both families (`norm_w` always on for qwen3moe and llama),
//! and for Mixtral the same as HF's softmax over the top-k logits. Each expert is a SiLU-gated
//! MLP whose `[gate | up]` and `down` are ordinary stacked linear layers cut from the 3-D
//! `ffn_{gate,up,down}_exps` tensors, so every weight type and kernel of a dense layer serves
//! the experts unchanged.
//!
//! Tokens are grouped by expert: per step, each expert with routed rows gathers them and runs
//! once over the group, so its weights are read once per step rather than once per token.
//! Batch invariance holds by construction: the matmul kernels compute each row with an
//! arithmetic independent of how many rows they get (int8 activations are quantized per row
//! and block), and a row's weighted expert outputs are added to it in expert-index order,
//! whatever other rows share its experts.

use tokenmill_kernels::{silu_mul, softmax_inplace};

use super::{Activation, GatedMlp, Linear, LinearScratch, MlpBuffers, StackedLinear, Step};
use crate::config::{ModelConfig, MoeConfig};
use crate::error::{ModelError, Result};
use crate::loader::LayerTensors;

/// One routing choice of one token: the expert and its normalized weight.
#[derive(Debug, Clone, Copy, Default)]
struct Route {
    expert: u32,
    weight: f32,
}

/// A routed row of an expert's group: its position in the batch and its weight.
#[derive(Debug, Clone, Copy, Default)]
struct GroupRow {
    row: u32,
    weight: f32,
}

/// The MoE block's intermediates; grown to the largest step, never shrunk.
#[derive(Debug, Default)]
pub(crate) struct MoeBuffers {
    /// Router scores, then probabilities, `[n][experts]`.
    probs: Vec<f32>,
    /// Each row's chosen experts, `[n][experts_used]`.
    routes: Vec<Route>,
    /// Rows grouped by expert (rows ascending within a group), `[n * experts_used]`;
    /// expert `e`'s group is `grouped[starts[e]..starts[e + 1]]`.
    grouped: Vec<GroupRow>,
    starts: Vec<usize>,
    cursor: Vec<usize>,
    /// An expert's gathered input rows, `[rows][hidden]`.
    x: Vec<f32>,
    gate_up: Vec<f32>,
    activated: Vec<f32>,
    /// An expert's output rows before they are weighted into the block's output.
    expert_out: Vec<f32>,
}

impl MoeBuffers {
    /// Sizes the buffers for `n` tokens of a block shaped `moe` over `hidden`; only grows.
    pub fn prepare(&mut self, n: usize, hidden: usize, moe: MoeConfig) {
        let (experts, used, width) = (
            moe.num_experts,
            moe.experts_used,
            moe.expert_intermediate_size,
        );
        self.probs.resize(n * experts, 0.0);
        self.routes.resize(n * used, Route::default());
        self.grouped.resize(n * used, GroupRow::default());
        self.starts.resize(experts + 1, 0);
        self.cursor.resize(experts, 0);
        // A group holds each row at most once, so at most `n` rows.
        self.x.resize(n * hidden, 0.0);
        self.gate_up.resize(n * 2 * width, 0.0);
        self.activated.resize(n * width, 0.0);
        self.expert_out.resize(n * hidden, 0.0);
    }
}

/// One expert: a SiLU-gated MLP.
#[derive(Debug)]
struct Expert {
    /// `[gate | up]`, `[2 * width, hidden]`.
    gate_up: StackedLinear,
    /// `[hidden, width]`.
    down: StackedLinear,
}

#[derive(Debug)]
pub(crate) struct MoeBlock {
    /// `[experts, hidden]`.
    router: Linear,
    experts: Vec<Expert>,
    moe: MoeConfig,
    hidden: usize,
}

impl MoeBlock {
    /// Reads `ffn_gate_inp.weight` and the `ffn_{gate,up,down}_exps.weight` expert tensors.
    pub fn load(tensors: &LayerTensors<'_>, hidden: usize, moe: MoeConfig) -> Result<MoeBlock> {
        let (count, width) = (moe.num_experts, moe.expert_intermediate_size);
        let router = tensors.matrix("ffn_gate_inp.weight", count, hidden)?;
        let gate_up = tensors.expert_stacks(
            &[
                ("ffn_gate_exps.weight", width),
                ("ffn_up_exps.weight", width),
            ],
            hidden,
            count,
        )?;
        let down = tensors.expert_stacks(&[("ffn_down_exps.weight", hidden)], width, count)?;
        let experts = gate_up
            .into_iter()
            .zip(down)
            .map(|(gate_up, down)| Expert { gate_up, down })
            .collect();
        Ok(MoeBlock {
            router,
            experts,
            moe,
            hidden,
        })
    }

    pub fn storage_bytes(&self) -> usize {
        self.router.storage_bytes()
            + self
                .experts
                .iter()
                .map(|e| e.gate_up.storage_bytes() + e.down.storage_bytes())
                .sum::<usize>()
    }

    /// Bytes one token reads: the router and `experts_used` experts (of average size).
    pub fn decode_bytes(&self) -> usize {
        let experts = self.storage_bytes() - self.router.storage_bytes();
        self.router.storage_bytes() + experts / self.moe.num_experts * self.moe.experts_used
    }

    /// `out[n][hidden]` for `x[n][hidden]`. No LoRA hook: adapters with MLP targets are
    /// refused when loaded against a mixture-of-experts base (`LoraError::ExpertTarget`).
    pub fn forward(
        &self,
        step: &Step<'_>,
        layer: usize,
        x: &[f32],
        buffers: &mut MoeBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (n, hidden) = (step.num_tokens(), self.hidden);
        let experts = self.moe.num_experts;
        if x.len() != n * hidden || out.len() != n * hidden || buffers.probs.len() < n * experts {
            return Err(ModelError::InvalidBatch(format!(
                "MoE block of layer {layer}: buffers not prepared for {n} tokens"
            )));
        }
        let probs = &mut buffers.probs[..n * experts];
        self.router.forward(step.pool, x, n, probs, scratch)?;
        let routes = &mut buffers.routes[..n * self.moe.experts_used];
        for (row, chosen) in probs
            .chunks_exact_mut(experts)
            .zip(routes.chunks_exact_mut(self.moe.experts_used))
        {
            route(row, chosen);
        }
        group_by_expert(
            routes,
            self.moe.experts_used,
            &mut buffers.starts[..=experts],
            &mut buffers.cursor[..experts],
            &mut buffers.grouped[..routes.len()],
        );
        out.fill(0.0);
        for (expert, weights) in self.experts.iter().enumerate() {
            let group = &buffers.grouped[buffers.starts[expert]..buffers.starts[expert + 1]];
            if group.is_empty() {
                continue;
            }
            let m = group.len();
            let width = self.moe.expert_intermediate_size;
            let gathered = &mut buffers.x[..m * hidden];
            for (dst, member) in gathered.chunks_exact_mut(hidden).zip(group) {
                let row = member.row as usize;
                dst.copy_from_slice(&x[row * hidden..(row + 1) * hidden]);
            }
            let gate_up = &mut buffers.gate_up[..m * 2 * width];
            weights
                .gate_up
                .forward(step.pool, gathered, m, gate_up, scratch)?;
            let activated = &mut buffers.activated[..m * width];
            for (pair, dst) in gate_up
                .chunks_exact_mut(2 * width)
                .zip(activated.chunks_exact_mut(width))
            {
                let (gate, up) = pair.split_at_mut(width);
                silu_mul(gate, up)?;
                dst.copy_from_slice(gate);
            }
            let expert_out = &mut buffers.expert_out[..m * hidden];
            weights
                .down
                .forward(step.pool, activated, m, expert_out, scratch)?;
            for (member, y) in group.iter().zip(expert_out.chunks_exact(hidden)) {
                let row = member.row as usize;
                for (o, &v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(y) {
                    *o += member.weight * v;
                }
            }
        }
        Ok(())
    }
}

/// Turns one row of router scores into probabilities in place and writes the
/// `chosen.len()` most probable experts (ties to the lower index), their probabilities
/// renormalized to sum to 1.
fn route(probs: &mut [f32], chosen: &mut [Route]) {
    softmax_inplace(probs);
    let mut sum = 0.0f32;
    for slot in 0..chosen.len() {
        let taken = &chosen[..slot];
        let mut best: Option<(usize, f32)> = None;
        for (expert, &p) in probs.iter().enumerate() {
            if taken.iter().any(|r| r.expert as usize == expert) {
                continue;
            }
            if best.is_none_or(|(_, q)| p > q) {
                best = Some((expert, p));
            }
        }
        let (expert, p) = best.unwrap_or((0, 0.0));
        chosen[slot] = Route {
            expert: expert as u32,
            weight: p,
        };
        sum += p;
    }
    for r in chosen.iter_mut() {
        r.weight /= sum;
    }
}

/// Counting sort of the step's routes (`used` per row) by expert: afterwards
/// `grouped[starts[e]..starts[e + 1]]` are expert `e`'s rows, ascending. `starts` has one
/// entry per expert and one more, `cursor` one per expert.
fn group_by_expert(
    routes: &[Route],
    used: usize,
    starts: &mut [usize],
    cursor: &mut [usize],
    grouped: &mut [GroupRow],
) {
    starts.fill(0);
    for r in routes {
        starts[r.expert as usize + 1] += 1;
    }
    for e in 1..starts.len() {
        starts[e] += starts[e - 1];
    }
    cursor.copy_from_slice(&starts[..cursor.len()]);
    for (row, chosen) in routes.chunks_exact(used).enumerate() {
        for r in chosen {
            let slot = &mut cursor[r.expert as usize];
            grouped[*slot] = GroupRow {
                row: row as u32,
                weight: r.weight,
            };
            *slot += 1;
        }
    }
}

/// A layer's feed-forward block: the dense gated MLP or a mixture of experts, as the config
/// says. Like the weight type, this is a choice of block, not of family.
#[derive(Debug)]
pub(crate) enum FeedForward {
    Dense(GatedMlp),
    Moe(MoeBlock),
}

impl FeedForward {
    /// Reads layer `tensors`' SiLU-gated FFN: experts when `config.moe` says so.
    pub fn load(tensors: &LayerTensors<'_>, config: &ModelConfig) -> Result<FeedForward> {
        let hidden = config.hidden_size;
        Ok(match config.moe {
            Some(moe) => FeedForward::Moe(MoeBlock::load(tensors, hidden, moe)?),
            None => FeedForward::Dense(GatedMlp::load(
                tensors,
                hidden,
                config.intermediate_size,
                Activation::Silu,
            )?),
        })
    }

    pub fn storage_bytes(&self) -> usize {
        match self {
            FeedForward::Dense(mlp) => mlp.storage_bytes(),
            FeedForward::Moe(moe) => moe.storage_bytes(),
        }
    }

    /// Bytes one decode token reads.
    pub fn decode_bytes(&self) -> usize {
        match self {
            FeedForward::Dense(mlp) => mlp.storage_bytes(),
            FeedForward::Moe(moe) => moe.decode_bytes(),
        }
    }

    /// Sizes the buffers of `config`'s FFN for `n` tokens; only grows.
    pub fn prepare(config: &ModelConfig, n: usize, mlp: &mut MlpBuffers, moe: &mut MoeBuffers) {
        match config.moe {
            Some(shape) => moe.prepare(n, config.hidden_size, shape),
            None => mlp.prepare(n, config.intermediate_size),
        }
    }

    /// `out[n][hidden]` for `x[n][hidden]` (layer `layer`, for LoRA).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        step: &Step<'_>,
        layer: usize,
        x: &[f32],
        mlp: &mut MlpBuffers,
        moe: &mut MoeBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        match self {
            FeedForward::Dense(block) => block.forward(step, layer, x, mlp, scratch, out),
            FeedForward::Moe(block) => block.forward(step, layer, x, moe, scratch, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(logits: &[f32], used: usize) -> Vec<(u32, f32)> {
        let mut probs = logits.to_vec();
        let mut chosen = vec![Route::default(); used];
        route(&mut probs, &mut chosen);
        chosen.iter().map(|r| (r.expert, r.weight)).collect()
    }

    #[test]
    fn routing_picks_the_most_probable_experts_with_renormalized_weights() {
        let chosen = routes(&[0.5, 2.0, -1.0, 1.0], 2);
        assert_eq!(chosen[0].0, 1);
        assert_eq!(chosen[1].0, 3);
        // The renormalized softmax of the top two is the softmax of their logits.
        let expected = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((chosen[0].1 - expected).abs() < 1e-6);
        assert!((chosen[0].1 + chosen[1].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn routing_ties_go_to_the_lower_expert() {
        let chosen = routes(&[1.0, 3.0, 3.0, 3.0], 2);
        assert_eq!((chosen[0].0, chosen[1].0), (1, 2));
        assert_eq!(chosen[0].1, 0.5);
        assert_eq!(
            routes(&[0.0; 4], 4).iter().map(|r| r.0).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn grouping_lists_each_experts_rows_in_row_order() {
        let pick = |expert, weight| Route { expert, weight };
        // Three rows, two experts each, over four experts.
        let routes = [
            pick(2, 0.6),
            pick(0, 0.4),
            pick(0, 0.7),
            pick(3, 0.3),
            pick(2, 0.5),
            pick(0, 0.5),
        ];
        let (mut starts, mut cursor) = (vec![0; 5], vec![0; 4]);
        let mut grouped = vec![GroupRow::default(); 6];
        group_by_expert(&routes, 2, &mut starts, &mut cursor, &mut grouped);
        assert_eq!(starts, [0, 3, 3, 5, 6]);
        let rows: Vec<(u32, f32)> = grouped.iter().map(|g| (g.row, g.weight)).collect();
        assert_eq!(
            rows,
            [(0, 0.4), (1, 0.7), (2, 0.5), (0, 0.6), (2, 0.5), (1, 0.3)]
        );
    }
}
