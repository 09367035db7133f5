//! The Gated DeltaNet block (Qwen3.5 / Qwen3-Next linear attention): one stacked input
//! projection `[qkv | z | b | a]`, the causal depthwise convolution of `qkv` with SiLU (its
//! window of past inputs in the sequence's state slot), L2-normalised q/k, the decay
//! `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`, the gated delta rule
//! over each value head's recurrent state (`tokenmill_kernels::gated_delta_rule`), the
//! gated RMSNorm `norm(o) * silu(z)` per head and the output projection.
//!
//! Every sequence runs its tokens in order from the state its slot holds (zeroed by the model
//! for a run that starts at position 0), token by token: the result is the same bits whether
//! the prompt comes alone, batched with others or in chunks split anywhere.

use tokenmill_kernels::{
    causal_conv1d_silu, gated_delta_rule, l2_normalize_rows, sigmoid, silu, softplus,
    DeltaRuleInputs, DeltaRuleSeq,
};

use super::{Linear, LinearScratch, RmsNorm, StackedLinear, Step};
use crate::config::LinearAttentionConfig;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCacheStorage;
use crate::loader::{LayerTensors, TensorNaming};

/// The L2 norm's epsilon on q and k (HF's `l2norm`, the FLA kernels).
const L2_NORM_EPS: f32 = 1e-6;

/// One Gated DeltaNet layer's weights.
#[derive(Debug)]
pub(crate) struct GatedDeltaNet {
    config: LinearAttentionConfig,
    /// `[qkv (conv_dim) | z (value_dim) | b (num_v_heads) | a (num_v_heads)]`.
    in_proj: StackedLinear,
    /// `[conv_dim][conv_kernel]`.
    conv_weight: Vec<f32>,
    /// Per value head: `dt_bias` and `-exp(A_log)`.
    dt_bias: Vec<f32>,
    neg_a: Vec<f32>,
    /// The per-head norm of the output (`head_v_dim` wide, a plain weight).
    norm: RmsNorm,
    out_proj: Linear,
}

/// The block's intermediates for `n` tokens.
#[derive(Debug, Default)]
pub(crate) struct DeltaNetBuffers {
    /// The stacked projection, `[n][conv_dim + value_dim + 2 * num_v_heads]`.
    proj: Vec<f32>,
    /// The convolution's input and output, `[n][conv_dim]`.
    mixed: Vec<f32>,
    conv: Vec<f32>,
    /// Normalised q and k, `[n][key_dim]`; v, `[n][value_dim]`.
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// `exp(g)` and `beta`, `[n][num_v_heads]`.
    decay: Vec<f32>,
    beta: Vec<f32>,
    /// The recurrence's output, head-major `[num_v_heads][n][head_v_dim]`.
    core: Vec<f32>,
    /// The gated norm's output, `[n][value_dim]`.
    gated: Vec<f32>,
    /// Per sequence of the step: its first row and length.
    seqs: Vec<DeltaRuleSeq>,
}

impl DeltaNetBuffers {
    /// Sizes the buffers for `n` tokens of `config`'s layers; only grows capacity.
    pub fn prepare(&mut self, n: usize, config: &LinearAttentionConfig) {
        let shape = config.shape();
        let (key_dim, value_dim, heads) = (shape.key_dim(), shape.value_dim(), config.num_v_heads);
        let conv_dim = config.conv_dim();
        let sizes: [(&mut Vec<f32>, usize); 10] = [
            (&mut self.proj, n * (conv_dim + value_dim + 2 * heads)),
            (&mut self.mixed, n * conv_dim),
            (&mut self.conv, n * conv_dim),
            (&mut self.q, n * key_dim),
            (&mut self.k, n * key_dim),
            (&mut self.v, n * value_dim),
            (&mut self.decay, n * heads),
            (&mut self.beta, n * heads),
            (&mut self.core, n * value_dim),
            (&mut self.gated, n * value_dim),
        ];
        for (buffer, len) in sizes {
            buffer.resize(len, 0.0);
        }
    }
}

impl GatedDeltaNet {
    /// Reads the layer's tensors by their GGUF names (`attn_qkv`, `attn_gate`, `ssm_beta`,
    /// `ssm_alpha`, `ssm_conv1d`, `ssm_dt.bias`, `ssm_a`, `ssm_norm`, `ssm_out`); HF's
    /// `A_log` becomes GGUF's `-exp(A_log)` here.
    pub fn load(
        tensors: &LayerTensors<'_>,
        naming: TensorNaming,
        config: LinearAttentionConfig,
        hidden: usize,
        eps: f32,
    ) -> Result<GatedDeltaNet> {
        let shape = config.shape();
        let (value_dim, heads, conv_dim) =
            (shape.value_dim(), config.num_v_heads, config.conv_dim());
        let in_proj = tensors.stacked(
            &[
                ("attn_qkv.weight", conv_dim),
                ("attn_gate.weight", value_dim),
                ("ssm_beta.weight", heads),
                ("ssm_alpha.weight", heads),
            ],
            hidden,
        )?;
        let mut neg_a = tensors.vector("ssm_a", heads)?;
        if naming != TensorNaming::Gguf {
            neg_a.iter_mut().for_each(|a| *a = -a.exp());
        }
        Ok(GatedDeltaNet {
            config,
            in_proj,
            conv_weight: tensors.values("ssm_conv1d.weight", &[conv_dim, config.conv_kernel])?,
            dt_bias: tensors.vector("ssm_dt.bias", heads)?,
            neg_a,
            norm: RmsNorm::new(tensors.vector("ssm_norm.weight", config.head_v_dim)?, eps),
            out_proj: tensors.matrix("ssm_out.weight", hidden, value_dim)?,
        })
    }

    pub fn storage_bytes(&self) -> usize {
        self.in_proj.storage_bytes() + self.out_proj.storage_bytes()
    }

    /// Runs every token of `x[n][hidden]` through the layer, each sequence from and into its
    /// state slot of recurrent layer `layer` of `kv`, and leaves the projected result in
    /// `out[n][hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        step: &Step<'_>,
        layer: usize,
        kv: &mut KvCacheStorage,
        x: &[f32],
        b: &mut DeltaNetBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (pool, batch, n) = (step.pool, step.batch, step.num_tokens());
        let config = &self.config;
        let shape = config.shape();
        let (key_dim, value_dim, heads) = (shape.key_dim(), shape.value_dim(), config.num_v_heads);
        let (dk, dv, conv_dim) = (config.head_k_dim, config.head_v_dim, config.conv_dim());
        let width = conv_dim + value_dim + 2 * heads;
        if b.proj.len() < n * width || b.core.len() < n * value_dim {
            return Err(ModelError::InvalidBatch(format!(
                "Gated DeltaNet buffers not prepared for {n} tokens"
            )));
        }
        self.in_proj.forward(pool, x, n, &mut b.proj, scratch)?;
        let proj = &b.proj[..n * width];
        for (row, mixed) in proj
            .chunks_exact(width)
            .zip(b.mixed.chunks_exact_mut(conv_dim))
        {
            mixed.copy_from_slice(&row[..conv_dim]);
        }
        b.seqs.clear();
        b.seqs.extend(batch.seqs.iter().map(|seq| DeltaRuleSeq {
            start: seq.query_start,
            len: seq.query_len,
        }));
        let slots = kv
            .state_mut()
            .slots_mut(layer, &batch.state_slots)
            .ok_or_else(|| {
                ModelError::InvalidBatch(format!(
                    "recurrent layer {layer}: a state slot is out of range or named twice"
                ))
            })?;
        let mut states = Vec::with_capacity(slots.len());
        for (seq, (window, state)) in b.seqs.iter().zip(slots) {
            let rows = seq.start * conv_dim..(seq.start + seq.len) * conv_dim;
            causal_conv1d_silu(
                &b.mixed[rows.clone()],
                &self.conv_weight,
                window,
                &mut b.conv[rows],
            )?;
            states.push(state);
        }
        let scale = 1.0 / (dk as f32).sqrt();
        for (t, conv) in b.conv[..n * conv_dim].chunks_exact(conv_dim).enumerate() {
            let q = &mut b.q[t * key_dim..(t + 1) * key_dim];
            q.copy_from_slice(&conv[..key_dim]);
            l2_normalize_rows(q, dk, L2_NORM_EPS, scale);
            let k = &mut b.k[t * key_dim..(t + 1) * key_dim];
            k.copy_from_slice(&conv[key_dim..2 * key_dim]);
            l2_normalize_rows(k, dk, L2_NORM_EPS, 1.0);
            b.v[t * value_dim..(t + 1) * value_dim].copy_from_slice(&conv[2 * key_dim..]);
            let gates = &proj[t * width + conv_dim + value_dim..(t + 1) * width];
            let (beta_in, alpha_in) = gates.split_at(heads);
            for h in 0..heads {
                b.beta[t * heads + h] = sigmoid(beta_in[h]);
                let g = self.neg_a[h] * softplus(alpha_in[h] + self.dt_bias[h]);
                b.decay[t * heads + h] = g.exp();
            }
        }
        let inputs = DeltaRuleInputs {
            q: &b.q[..n * key_dim],
            k: &b.k[..n * key_dim],
            v: &b.v[..n * value_dim],
            decay: &b.decay[..n * heads],
            beta: &b.beta[..n * heads],
        };
        gated_delta_rule(
            pool,
            &shape,
            inputs,
            &b.seqs,
            states,
            &mut b.core[..n * value_dim],
        )?;
        // norm(o) * silu(z), per token and head, back in token-major order.
        for (t, (row, gated)) in proj
            .chunks_exact(width)
            .zip(b.gated.chunks_exact_mut(value_dim))
            .enumerate()
        {
            let z = &row[conv_dim..conv_dim + value_dim];
            for h in 0..heads {
                let core = &b.core[(h * n + t) * dv..(h * n + t + 1) * dv];
                let gated = &mut gated[h * dv..(h + 1) * dv];
                self.norm.forward(core, gated)?;
                for (g, &z) in gated.iter_mut().zip(&z[h * dv..(h + 1) * dv]) {
                    *g *= silu(z);
                }
            }
        }
        self.out_proj
            .forward(pool, &b.gated[..n * value_dim], n, out, scratch)
    }
}
