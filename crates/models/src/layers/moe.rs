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
//! Tokens are grouped by expert: per step (per window of [`WINDOW`] tokens, which bounds the
//! intermediates), the routed rows are gathered expert by expert into one buffer and every
//! expert runs once over its run of rows, so its weights are read once per step rather than
//! once per token. All experts' `[gate | up]` products go through one segmented matmul
//! (`QMatrix::matmul_segments`), and so do their `down` products: the small experts a decode
//! step picks share one parallel region, their threads splitting the work across experts,
//! instead of one fork-join per expert and projection.
//! Batch invariance holds by construction: the matmul kernels compute each row with an
//! arithmetic independent of how many rows they get and of the other segments (int8
//! activations are quantized per row and block), and a row's weighted expert outputs are
//! added to it in expert-index order, whatever other rows share its experts.

use tokenmill_kernels::{silu_mul, softmax_inplace, QMatrix, Segments};

use super::linear::matmul_segments;
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

/// Tokens whose routed rows are gathered and multiplied together: a whole default step
/// (`--max-num-batched-tokens` 512); longer steps run in windows of this many tokens, so the
/// gathered intermediates stay at `WINDOW × experts_used` rows.
const WINDOW: usize = 512;

/// The MoE block's intermediates; grown to the largest step, never shrunk.
#[derive(Debug, Default)]
pub(crate) struct MoeBuffers {
    /// Router scores, then probabilities, `[n][experts]`.
    probs: Vec<f32>,
    /// Each row's chosen experts, `[n][experts_used]`.
    routes: Vec<Route>,
    /// A window's routed rows grouped by expert (rows ascending within a group),
    /// `[window * experts_used]`; expert `e`'s group is `grouped[starts[e]..starts[e + 1]]`.
    grouped: Vec<GroupRow>,
    starts: Vec<usize>,
    cursor: Vec<usize>,
    /// The gathered input rows, in `grouped` order, `[window * experts_used][hidden]`.
    x: Vec<f32>,
    gate_up: Vec<f32>,
    activated: Vec<f32>,
    /// The experts' output rows, in `grouped` order, before they are weighted into the
    /// block's output.
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
        let routed = n.min(WINDOW) * used;
        self.grouped.resize(routed, GroupRow::default());
        self.starts.resize(experts + 1, 0);
        self.cursor.resize(experts, 0);
        self.x.resize(routed * hidden, 0.0);
        self.gate_up.resize(routed * 2 * width, 0.0);
        self.activated.resize(routed * width, 0.0);
        self.expert_out.resize(routed * hidden, 0.0);
    }
}

/// One projection of every expert (`[gate | up]` or `down`): one matrix per expert where the
/// expert's parts have one type (fused at load, the usual case), which the segmented matmul
/// takes; otherwise (an HF checkpoint mixing types across gate and up) one stack each, run
/// expert by expert.
#[derive(Debug)]
enum ExpertLinears {
    Fused(Vec<QMatrix>),
    Stacked(Vec<StackedLinear>),
}

impl ExpertLinears {
    fn new(stacks: Vec<StackedLinear>) -> ExpertLinears {
        if !stacks.iter().all(StackedLinear::is_single) {
            return ExpertLinears::Stacked(stacks);
        }
        ExpertLinears::Fused(
            stacks
                .into_iter()
                .filter_map(|stack| stack.into_single().ok())
                .collect(),
        )
    }

    fn storage_bytes(&self) -> usize {
        match self {
            ExpertLinears::Fused(matrices) => matrices.iter().map(QMatrix::storage_bytes).sum(),
            ExpertLinears::Stacked(stacks) => stacks.iter().map(StackedLinear::storage_bytes).sum(),
        }
    }

    /// `out[r] = x[r] · W(e)ᵀ` for expert `e`'s rows `starts[e]..starts[e + 1]`, every expert
    /// (`x` is `[rows][k]`, `out` `[rows][m]`).
    fn forward(
        &self,
        step: &Step<'_>,
        starts: &[usize],
        (k, m): (usize, usize),
        x: &[f32],
        out: &mut [f32],
        scratch: &mut LinearScratch,
    ) -> Result<()> {
        match self {
            ExpertLinears::Fused(matrices) => {
                let segments = Segments {
                    starts,
                    weight: &|e| &matrices[e],
                };
                matmul_segments(step.pool, segments, x, out, scratch)
            }
            ExpertLinears::Stacked(stacks) => {
                for (stack, bounds) in stacks.iter().zip(starts.windows(2)) {
                    let (first, last) = (bounds[0], bounds[1]);
                    if first == last {
                        continue;
                    }
                    stack.forward(
                        step.pool,
                        &x[first * k..last * k],
                        last - first,
                        &mut out[first * m..last * m],
                        scratch,
                    )?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct MoeBlock {
    /// `[experts, hidden]`.
    router: Linear,
    /// Each expert's `[gate | up]`, `[2 * width, hidden]`.
    gate_up: ExpertLinears,
    /// Each expert's `[hidden, width]`.
    down: ExpertLinears,
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
        Ok(MoeBlock {
            router,
            gate_up: ExpertLinears::new(gate_up),
            down: ExpertLinears::new(down),
            moe,
            hidden,
        })
    }

    pub fn storage_bytes(&self) -> usize {
        self.router.storage_bytes() + self.gate_up.storage_bytes() + self.down.storage_bytes()
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
        let (experts, used) = (self.moe.num_experts, self.moe.experts_used);
        if x.len() != n * hidden
            || out.len() != n * hidden
            || buffers.probs.len() < n * experts
            || buffers.grouped.len() < n.min(WINDOW) * used
        {
            return Err(ModelError::InvalidBatch(format!(
                "MoE block of layer {layer}: buffers not prepared for {n} tokens"
            )));
        }
        let probs = &mut buffers.probs[..n * experts];
        self.router.forward(step.pool, x, n, probs, scratch)?;
        let routes = &mut buffers.routes[..n * used];
        for (row, chosen) in probs
            .chunks_exact_mut(experts)
            .zip(routes.chunks_exact_mut(used))
        {
            route(row, chosen);
        }
        out.fill(0.0);
        for first in (0..n).step_by(WINDOW) {
            self.forward_window(
                step,
                first..(first + WINDOW).min(n),
                x,
                buffers,
                scratch,
                out,
            )?;
        }
        Ok(())
    }

    /// Tokens `tokens` of the step (routed already): their rows gathered by expert, every
    /// expert's MLP over its rows, the weighted outputs added to `out`.
    fn forward_window(
        &self,
        step: &Step<'_>,
        tokens: std::ops::Range<usize>,
        x: &[f32],
        buffers: &mut MoeBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (hidden, experts, used) = (self.hidden, self.moe.num_experts, self.moe.experts_used);
        let width = self.moe.expert_intermediate_size;
        let routed = tokens.len() * used;
        let grouped = &mut buffers.grouped[..routed];
        group_by_expert(
            &buffers.routes[tokens.start * used..tokens.end * used],
            used,
            &mut buffers.starts[..=experts],
            &mut buffers.cursor[..experts],
            grouped,
        );
        let starts = &buffers.starts[..=experts];
        let gathered = &mut buffers.x[..routed * hidden];
        for (dst, member) in gathered.chunks_exact_mut(hidden).zip(grouped.iter()) {
            let row = tokens.start + member.row as usize;
            dst.copy_from_slice(&x[row * hidden..(row + 1) * hidden]);
        }
        let gate_up = &mut buffers.gate_up[..routed * 2 * width];
        self.gate_up.forward(
            step,
            starts,
            (hidden, 2 * width),
            gathered,
            gate_up,
            scratch,
        )?;
        let activated = &mut buffers.activated[..routed * width];
        for (pair, dst) in gate_up
            .chunks_exact_mut(2 * width)
            .zip(activated.chunks_exact_mut(width))
        {
            let (gate, up) = pair.split_at_mut(width);
            silu_mul(gate, up)?;
            dst.copy_from_slice(gate);
        }
        let expert_out = &mut buffers.expert_out[..routed * hidden];
        self.down.forward(
            step,
            starts,
            (width, hidden),
            activated,
            expert_out,
            scratch,
        )?;
        // `grouped` is in expert order, so each row gets its experts' outputs added in
        // expert-index order.
        for (member, y) in grouped.iter().zip(expert_out.chunks_exact(hidden)) {
            let row = tokens.start + member.row as usize;
            for (o, &v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(y) {
                *o += member.weight * v;
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
