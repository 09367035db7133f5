//! The mixture-of-experts feed-forward block (Mixtral, Qwen3-MoE, Gemma 4) and
//! [`FeedForward`], the choice between it and the dense gated MLP that a layer makes from its
//! config.
//!
//! A router (`ffn_gate_inp`, `[experts, hidden]`) scores every expert per token; the softmax
//! of the scores picks the `experts_used` most probable experts (ties to the lower index) and
//! their probabilities, renormalized to sum to 1, weight the experts' outputs. That is
//! llama.cpp's `build_moe_ffn` for both families (`norm_w` always on for qwen3moe and llama),
//! and for Mixtral the same as HF's softmax over the top-k logits. Gemma 4's router
//! ([`Routing::Scaled`]) scores a normed, scaled copy of its input instead and multiplies
//! each pick's weight by a scale of its expert. Each expert is a gated MLP (SiLU, or Gemma's
//! GELU-tanh) whose `[gate | up]` and `down` are ordinary stacked linear layers cut from the
//! 3-D `ffn_{gate,up,down}_exps` (or fused `ffn_gate_up_exps`) tensors, so every weight type
//! and kernel of a dense layer serves the experts unchanged.
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

use tokenmill_kernels::{add_inplace, gated_rows, softmax_inplace, QMatrix, Segments};

use super::linear::matmul_segments;
use super::{
    Activation, GatedMlp, Linear, LinearScratch, MlpBuffers, RmsNorm, StackedLinear, Step,
};
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
    /// The router's normed input (Gemma 4's [`Routing::Scaled`] only), `[n][hidden]`.
    router_input: Vec<f32>,
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

/// How a family's router turns a token into expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routing {
    /// The scores are of the block's input; the picks' renormalized probabilities weight
    /// them (Mixtral, Qwen3-MoE).
    Softmax,
    /// Gemma 4's: the scores are of `rms_norm(x) * scale / sqrt(hidden)` (a norm without
    /// weight, then `ffn_gate_inp.scale`, HF `router.scale`), and each pick's renormalized
    /// probability is multiplied by its expert's `ffn_down_exps.scale` (HF
    /// `router.per_expert_scale`; llama.cpp scales the expert's output by it, the same
    /// product).
    Scaled,
}

/// The loaded router: its projection and, for [`Routing::Scaled`], its two scales.
#[derive(Debug)]
struct Router {
    /// `[experts, hidden]`.
    proj: Linear,
    /// `[experts]`, added to the scores (gpt-oss).
    bias: Option<Vec<f32>>,
    /// The norm of the router's input, its weight `scale / sqrt(hidden)` (folded at load).
    input_norm: Option<RmsNorm>,
    /// Each expert's weight multiplier, `[experts]`.
    per_expert_scale: Option<Vec<f32>>,
}

impl Router {
    fn load(
        tensors: &LayerTensors<'_>,
        config: &ModelConfig,
        experts: usize,
        routing: Routing,
    ) -> Result<Router> {
        let hidden = config.hidden_size;
        let proj = tensors.matrix("ffn_gate_inp.weight", experts, hidden)?;
        let bias = config
            .expert_bias
            .then(|| tensors.vector("ffn_gate_inp.bias", experts))
            .transpose()?;
        Ok(match routing {
            Routing::Softmax => Router {
                proj,
                bias,
                input_norm: None,
                per_expert_scale: None,
            },
            Routing::Scaled => {
                let root = (hidden as f32).powf(-0.5);
                let mut weight = tensors.vector("ffn_gate_inp.scale", hidden)?;
                weight.iter_mut().for_each(|w| *w *= root);
                Router {
                    proj,
                    bias,
                    input_norm: Some(RmsNorm::new(weight, config.rms_norm_eps)),
                    per_expert_scale: Some(tensors.vector("ffn_down_exps.scale", experts)?),
                }
            }
        })
    }
}

#[derive(Debug)]
pub(crate) struct MoeBlock {
    router: Router,
    /// Each expert's `[gate | up]`, `[2 * width, hidden]`.
    gate_up: ExpertLinears,
    /// Each expert's `[hidden, width]`.
    down: ExpertLinears,
    /// gpt-oss's expert biases: `[experts][2 * width]` (`[gate | up]`) and
    /// `[experts][hidden]`.
    biases: Option<(Vec<f32>, Vec<f32>)>,
    activation: Activation,
    moe: MoeConfig,
    hidden: usize,
}

impl MoeBlock {
    /// Reads the router (`ffn_gate_inp.weight`, and `routing`'s scales) and the experts:
    /// `ffn_gate_up_exps.weight` where the file fuses gate and up (Gemma 4), else
    /// `ffn_{gate,up}_exps.weight`, and `ffn_down_exps.weight`; each expert's gate is
    /// activated with `activation`.
    pub fn load(
        tensors: &LayerTensors<'_>,
        config: &ModelConfig,
        moe: MoeConfig,
        routing: Routing,
        activation: Activation,
    ) -> Result<MoeBlock> {
        let (count, width, hidden) = (
            moe.num_experts,
            moe.expert_intermediate_size,
            config.hidden_size,
        );
        let gate_up_parts: &[(&str, usize)] = if tensors.contains(FUSED_GATE_UP_EXPERTS) {
            &[(FUSED_GATE_UP_EXPERTS, 2 * width)]
        } else {
            &[
                ("ffn_gate_exps.weight", width),
                ("ffn_up_exps.weight", width),
            ]
        };
        let gate_up = tensors.expert_stacks(gate_up_parts, hidden, count)?;
        let down = tensors.expert_stacks(&[("ffn_down_exps.weight", hidden)], width, count)?;
        let biases = if config.expert_bias {
            let gate = tensors.values("ffn_gate_exps.bias", &[count, width])?;
            let up = tensors.values("ffn_up_exps.bias", &[count, width])?;
            let gate_up = gate
                .chunks_exact(width)
                .zip(up.chunks_exact(width))
                .flat_map(|(gate, up)| gate.iter().chain(up).copied())
                .collect();
            Some((
                gate_up,
                tensors.values("ffn_down_exps.bias", &[count, hidden])?,
            ))
        } else {
            None
        };
        Ok(MoeBlock {
            router: Router::load(tensors, config, count, routing)?,
            gate_up: ExpertLinears::new(gate_up),
            down: ExpertLinears::new(down),
            biases,
            activation,
            moe,
            hidden,
        })
    }

    pub fn storage_bytes(&self) -> usize {
        self.router.proj.storage_bytes() + self.gate_up.storage_bytes() + self.down.storage_bytes()
    }

    /// Bytes one token reads: the router and `experts_used` experts (of average size).
    pub fn decode_bytes(&self) -> usize {
        let router = self.router.proj.storage_bytes();
        let experts = self.storage_bytes() - router;
        router + experts / self.moe.num_experts * self.moe.experts_used
    }

    /// `out[n][hidden]` for `x[n][hidden]`, routed by `x` itself ([`MoeBlock::route`], then
    /// [`MoeBlock::experts`]).
    pub fn forward(
        &self,
        step: &Step<'_>,
        layer: usize,
        x: &[f32],
        buffers: &mut MoeBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        self.route(step, layer, x, buffers, scratch)?;
        self.experts(step, layer, x, buffers, scratch, out)
    }

    /// Picks every token's experts and their weights from `router_input` (`[n][hidden]`)
    /// into `buffers`, for the next [`MoeBlock::experts`] of the step. Gemma 4 routes by the
    /// residual stream but runs its experts on a normed copy of it.
    pub fn route(
        &self,
        step: &Step<'_>,
        layer: usize,
        router_input: &[f32],
        buffers: &mut MoeBuffers,
        scratch: &mut LinearScratch,
    ) -> Result<()> {
        let (n, hidden) = (step.num_tokens(), self.hidden);
        let (experts, used) = (self.moe.num_experts, self.moe.experts_used);
        if router_input.len() != n * hidden
            || buffers.probs.len() < n * experts
            || buffers.routes.len() < n * used
        {
            return Err(not_prepared(layer, n));
        }
        let probs = &mut buffers.probs[..n * experts];
        let x = match &self.router.input_norm {
            Some(norm) => {
                // Grown once to the largest step, like the buffers `prepare` sizes.
                if buffers.router_input.len() < n * hidden {
                    buffers.router_input.resize(n * hidden, 0.0);
                }
                let normed = &mut buffers.router_input[..n * hidden];
                norm.forward_rows(step.pool, router_input, normed)?;
                &*normed
            }
            None => router_input,
        };
        self.router.proj.forward(step.pool, x, n, probs, scratch)?;
        if let Some(bias) = &self.router.bias {
            for row in probs.chunks_exact_mut(experts) {
                add_inplace(row, bias)?;
            }
        }
        let routes = &mut buffers.routes[..n * used];
        for (row, chosen) in probs
            .chunks_exact_mut(experts)
            .zip(routes.chunks_exact_mut(used))
        {
            route(row, chosen, self.router.per_expert_scale.as_deref());
        }
        Ok(())
    }

    /// `out[n][hidden]`: each row of `x[n][hidden]` through the experts the last
    /// [`MoeBlock::route`] picked for it, weighted. No LoRA hook: adapters with MLP targets
    /// are refused when loaded against a mixture-of-experts base (`LoraError::ExpertTarget`).
    pub fn experts(
        &self,
        step: &Step<'_>,
        layer: usize,
        x: &[f32],
        buffers: &mut MoeBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (n, hidden) = (step.num_tokens(), self.hidden);
        if x.len() != n * hidden
            || out.len() != n * hidden
            || buffers.grouped.len() < n.min(WINDOW) * self.moe.experts_used
        {
            return Err(not_prepared(layer, n));
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
        if let Some((gate_up_bias, _)) = &self.biases {
            add_expert_bias(starts, gate_up_bias, gate_up)?;
        }
        let activated = &mut buffers.activated[..routed * width];
        gated_rows(step.pool, self.activation, gate_up, activated, width)?;
        let expert_out = &mut buffers.expert_out[..routed * hidden];
        self.down.forward(
            step,
            starts,
            (width, hidden),
            activated,
            expert_out,
            scratch,
        )?;
        if let Some((_, down_bias)) = &self.biases {
            add_expert_bias(starts, down_bias, expert_out)?;
        }
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

/// The fused `[gate | up]` of every expert, `[experts, 2 * width, hidden]` (Gemma 4's
/// converter writes it; HF `experts.gate_up_proj`).
const FUSED_GATE_UP_EXPERTS: &str = "ffn_gate_up_exps.weight";

/// Adds expert `e`'s row of `bias` (`[experts][width]`) to each of its rows
/// `starts[e]..starts[e + 1]` of `rows` (`[routed][width]`).
fn add_expert_bias(starts: &[usize], bias: &[f32], rows: &mut [f32]) -> Result<()> {
    let experts = starts.len() - 1;
    let width = bias.len() / experts.max(1);
    for (expert, bounds) in starts.windows(2).enumerate() {
        let expert_bias = &bias[expert * width..(expert + 1) * width];
        for row in rows[bounds[0] * width..bounds[1] * width].chunks_exact_mut(width) {
            add_inplace(row, expert_bias)?;
        }
    }
    Ok(())
}

fn not_prepared(layer: usize, n: usize) -> ModelError {
    ModelError::InvalidBatch(format!(
        "MoE block of layer {layer}: buffers not prepared for {n} tokens"
    ))
}

/// Turns one row of router scores into probabilities in place and writes the
/// `chosen.len()` most probable experts (ties to the lower index), their probabilities
/// renormalized to sum to 1, then (Gemma 4) each multiplied by its expert's entry of
/// `per_expert_scale`.
fn route(probs: &mut [f32], chosen: &mut [Route], per_expert_scale: Option<&[f32]>) {
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
        if let Some(scales) = per_expert_scale {
            r.weight *= scales[r.expert as usize];
        }
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
    /// Reads layer `tensors`' SiLU-gated FFN: experts when `config.moe` says so (gpt-oss's
    /// with biases and the clamped SwiGLU when the config says so).
    pub fn load(tensors: &LayerTensors<'_>, config: &ModelConfig) -> Result<FeedForward> {
        let hidden = config.hidden_size;
        let expert_activation = match config.clamped_swiglu {
            Some(clamp) => Activation::SwigluOai {
                alpha: clamp.alpha,
                limit: clamp.limit,
            },
            None => Activation::Silu,
        };
        Ok(match config.moe {
            Some(moe) => FeedForward::Moe(MoeBlock::load(
                tensors,
                config,
                moe,
                Routing::Softmax,
                expert_activation,
            )?),
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
        scaled_routes(logits, used, None)
    }

    fn scaled_routes(logits: &[f32], used: usize, scales: Option<&[f32]>) -> Vec<(u32, f32)> {
        let mut probs = logits.to_vec();
        let mut chosen = vec![Route::default(); used];
        route(&mut probs, &mut chosen, scales);
        chosen.iter().map(|r| (r.expert, r.weight)).collect()
    }

    /// Gemma 4's per-expert scales multiply the renormalized weights; they do not change
    /// which experts are picked (HF's `top_k_weights * per_expert_scale[top_k_index]`).
    #[test]
    fn per_expert_scales_multiply_the_renormalized_weights() {
        let logits = [0.5, 2.0, -1.0, 1.0];
        let scales = [10.0, 0.5, 3.0, 2.0];
        let plain = routes(&logits, 2);
        let scaled = scaled_routes(&logits, 2, Some(&scales));
        assert_eq!((scaled[0].0, scaled[1].0), (plain[0].0, plain[1].0));
        assert_eq!(scaled[0].1, plain[0].1 * 0.5);
        assert_eq!(scaled[1].1, plain[1].1 * 2.0);
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
