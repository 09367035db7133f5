//! The attention block: QKV projection (optional bias), optional per-head QK-norm, RoPE, the
//! paged KV write, paged attention over each sequence's cached context (optionally within a
//! sliding window), and the output projection.

use tokenmill_kernels::{
    add_inplace, paged_attention_with_sinks, sigmoid, write_kv, AttentionParams,
};

use super::{Linear, LinearScratch, RmsNorm, Rope, StackedLinear, Step};
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCacheStorage, LayerKvLayout};
use crate::loader::LayerTensors;
use crate::lora::LoraGroup;

/// Token rows per pool task of the attention input's preparation (split, bias, QK-norm, RoPE);
/// a batch of at most this many runs on the calling thread.
const PREPARE_ROWS: usize = 32;

/// Heads of one attention block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    /// The shape of `config`'s attention layers (its sliding layers' where the full-attention
    /// layers have their own: [`Self::of_layer`]).
    pub fn of(config: &crate::config::ModelConfig) -> AttentionShape {
        AttentionShape {
            num_heads: config.num_heads,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        }
    }

    /// The shape of layer `layer` (Gemma 4's global layers have wider heads).
    pub fn of_layer(config: &crate::config::ModelConfig, layer: usize) -> AttentionShape {
        let (num_kv_heads, head_dim) = config.layer_kv_geometry(layer);
        AttentionShape {
            num_heads: config.num_heads,
            num_kv_heads,
            head_dim,
        }
    }

    /// A shape whose buffers fit every layer of `config`.
    pub fn widest(config: &crate::config::ModelConfig) -> AttentionShape {
        (0..config.num_layers)
            .map(|layer| AttentionShape::of_layer(config, layer))
            .fold(AttentionShape::of(config), |wide, shape| AttentionShape {
                num_heads: wide.num_heads.max(shape.num_heads),
                num_kv_heads: wide.num_kv_heads.max(shape.num_kv_heads),
                head_dim: wide.head_dim.max(shape.head_dim),
            })
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// What the KV cache keeps for a layer of this shape attending to the last
    /// `sliding_window` positions (`None`: the whole context).
    pub fn kv_layout(&self, sliding_window: Option<usize>) -> LayerKvLayout {
        LayerKvLayout {
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            sliding_window,
        }
    }
}

/// What distinguishes one family's attention block from another's, besides its shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AttentionOptions {
    /// Q, K and V projections carry a bias (Qwen2).
    pub bias: bool,
    /// `Some(eps)`: per-head RMSNorm on Q and K before RoPE (`attn_q_norm`/`attn_k_norm`,
    /// `head_dim` wide; Qwen3, Gemma 3).
    pub qk_norm: Option<f32>,
    /// Score scale (`head_dim^-1/2` unless the family says otherwise).
    pub scale: f32,
    /// `Some(w)`: the layer attends to the last `w` positions only.
    pub sliding_window: Option<usize>,
    /// The query projection also yields a per-head output gate (Qwen3.5, Qwen3-Next): each
    /// head's rows are `[query | gate]`, and the attention output is multiplied by
    /// `sigmoid(gate)` before the output projection.
    pub output_gate: bool,
    /// The layer has no V projection: V is K's projection (Gemma 4's global layers).
    pub values_from_keys: bool,
    /// `Some(eps)`: V is RMS-normed per head, without a weight, before it is cached (Gemma 4).
    pub value_norm: Option<f32>,
    /// `Some(l)`: the layer computes no K/V and attends over cache layer `l`'s (Gemma 4's
    /// KV-shared layers); `None`: it writes and reads the cache layer its caller names.
    pub shared_kv_layer: Option<usize>,
    /// A learned sink logit per query head joins each softmax (`attn_sinks.weight`: gpt-oss).
    pub sinks: bool,
    /// The output projection carries a bias (`attn_output.bias`: gpt-oss).
    pub output_bias: bool,
}

impl AttentionOptions {
    /// The options `config` gives layer `layer`.
    pub fn for_layer(config: &crate::config::ModelConfig, layer: usize) -> AttentionOptions {
        let sliding_window = config.layer_sliding_window(layer);
        let source = config.kv_source_layer(layer);
        AttentionOptions {
            bias: config.attention_bias,
            qk_norm: config.qk_norm.then_some(config.rms_norm_eps),
            scale: config.attention_scale(),
            sliding_window,
            output_gate: config.attention_output_gate,
            values_from_keys: sliding_window.is_none()
                && config
                    .full_attention
                    .is_some_and(|full| full.values_are_keys),
            value_norm: config.value_norm.then_some(config.rms_norm_eps),
            shared_kv_layer: (source != layer).then_some(source),
            sinks: config.attention_sinks,
            output_bias: config.attention_output_bias,
        }
    }
}

/// The attention block's intermediates, `[n][..]` each.
#[derive(Debug, Default)]
pub(crate) struct AttentionBuffers {
    qkv: Vec<f32>,
    q: Vec<f32>,
    /// The output gate's pre-activations (`[n][q_dim]`) when the block has one.
    gate: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    out: Vec<f32>,
}

impl AttentionBuffers {
    /// Sizes the buffers for `n` tokens of `shape` (with room for an output gate); only
    /// grows capacity.
    pub fn prepare(&mut self, n: usize, shape: AttentionShape) {
        let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
        let sizes: [(&mut Vec<f32>, usize); 6] = [
            (&mut self.qkv, n * (2 * q_dim + 2 * kv_dim)),
            (&mut self.q, n * q_dim),
            (&mut self.gate, n * q_dim),
            (&mut self.k, n * kv_dim),
            (&mut self.v, n * kv_dim),
            (&mut self.out, n * q_dim),
        ];
        for (buffer, len) in sizes {
            buffer.resize(len, 0.0);
        }
    }
}

/// Multi-head (grouped-query) self-attention over the paged KV cache.
#[derive(Debug)]
pub(crate) struct AttentionBlock {
    shape: AttentionShape,
    /// `[q | k | v]` projections.
    qkv: StackedLinear,
    /// `[q_dim + 2 * kv_dim]`, for Qwen2-style attention bias.
    qkv_bias: Option<Vec<f32>>,
    /// Per-head norms of Q and K (`head_dim` wide each).
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    output: Linear,
    scale: f32,
    sliding_window: Option<usize>,
    output_gate: bool,
    /// The projection is `[q | k]` and V starts as a copy of K.
    values_from_keys: bool,
    /// A weightless (all-ones) per-head RMSNorm of V.
    value_norm: Option<RmsNorm>,
    /// The projection is Q alone; K/V are read from this cache layer.
    shared_kv_layer: Option<usize>,
    /// Per query head, the attention sink's logit.
    sinks: Option<Vec<f32>>,
    /// `[hidden]`, added after the output projection.
    output_bias: Option<Vec<f32>>,
}

impl AttentionBlock {
    /// Reads `attn_{q,k,v}.weight` (or the fused `attn_qkv.weight`), their biases and `attn_{q,k}_norm.weight` when the
    /// options ask for them, and `attn_output.weight`.
    pub fn load(
        tensors: &LayerTensors<'_>,
        shape: AttentionShape,
        hidden: usize,
        options: AttentionOptions,
    ) -> Result<AttentionBlock> {
        let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
        // With an output gate the query projection is twice as tall (each head `[q | gate]`).
        let q_rows = if options.output_gate {
            2 * q_dim
        } else {
            q_dim
        };
        // Phi-3 stores the three as one fused `attn_qkv` whose rows are already `[q | k | v]`.
        let qkv = if options.shared_kv_layer.is_some() {
            tensors.stacked(&[("attn_q.weight", q_rows)], hidden)?
        } else if options.values_from_keys {
            tensors.stacked(
                &[("attn_q.weight", q_rows), ("attn_k.weight", kv_dim)],
                hidden,
            )?
        } else if tensors.contains("attn_qkv.weight") {
            tensors.stacked(&[("attn_qkv.weight", q_rows + 2 * kv_dim)], hidden)?
        } else {
            tensors.stacked(
                &[
                    ("attn_q.weight", q_rows),
                    ("attn_k.weight", kv_dim),
                    ("attn_v.weight", kv_dim),
                ],
                hidden,
            )?
        };
        let qkv_bias = if options.bias {
            let mut values = tensors.vector("attn_q.bias", q_dim)?;
            values.extend(tensors.vector("attn_k.bias", kv_dim)?);
            values.extend(tensors.vector("attn_v.bias", kv_dim)?);
            Some(values)
        } else {
            None
        };
        let qk_norm = match options.qk_norm {
            // A KV-shared layer norms only its queries; its K norm is never applied.
            Some(eps) => Some((
                tensors.rms_norm("attn_q_norm.weight", shape.head_dim, eps)?,
                if options.shared_kv_layer.is_some() {
                    RmsNorm::new(vec![1.0; shape.head_dim], eps)
                } else {
                    tensors.rms_norm("attn_k_norm.weight", shape.head_dim, eps)?
                },
            )),
            None => None,
        };
        if options.bias && (options.values_from_keys || options.shared_kv_layer.is_some()) {
            return Err(ModelError::InvalidMetadata {
                key: "attention_bias".into(),
                message: "attention biases with values shared from keys or another layer".into(),
            });
        }
        Ok(AttentionBlock {
            shape,
            qkv,
            qkv_bias,
            qk_norm,
            output: tensors.matrix("attn_output.weight", hidden, q_dim)?,
            scale: options.scale,
            sliding_window: options.sliding_window,
            output_gate: options.output_gate,
            values_from_keys: options.values_from_keys,
            value_norm: options
                .value_norm
                .map(|eps| RmsNorm::new(vec![1.0; shape.head_dim], eps)),
            shared_kv_layer: options.shared_kv_layer,
            sinks: options
                .sinks
                .then(|| tensors.vector("attn_sinks.weight", shape.num_heads))
                .transpose()?,
            output_bias: options
                .output_bias
                .then(|| tensors.vector("attn_output.bias", hidden))
                .transpose()?,
        })
    }

    /// Width of one token's fused projection: `[q | k | v]` (`[q | k]` when V is K's, `[q]`
    /// when the layer reads another's K/V).
    fn qkv_width(&self) -> usize {
        self.q_rows() + self.projected_kv_dims()
    }

    /// Rows of the query projection (twice `q_dim` with an output gate).
    fn q_rows(&self) -> usize {
        let q_dim = self.shape.q_dim();
        if self.output_gate {
            2 * q_dim
        } else {
            q_dim
        }
    }

    /// Rows of the K and V projections together.
    fn projected_kv_dims(&self) -> usize {
        let kv_dim = self.shape.kv_dim();
        match (self.shared_kv_layer, self.values_from_keys) {
            (Some(_), _) => 0,
            (None, true) => kv_dim,
            (None, false) => 2 * kv_dim,
        }
    }

    pub fn storage_bytes(&self) -> usize {
        self.qkv.storage_bytes() + self.output.storage_bytes()
    }

    /// Rows of the fused QKV projection ([`Self::qkv_width`] each) into `q`, `k` and `v`
    /// (and each head's output gate into `gate`, when the block has one), with the bias
    /// added, per-head QK-norm (through `scratch`, at least `q`'s length) and RoPE at
    /// `positions` (one per row) applied.
    fn prepare_rows(
        &self,
        rope: &Rope,
        qkv: &[f32],
        positions: &[u32],
        [q, k, v, gate]: [&mut [f32]; 4],
        scratch: &mut [f32],
    ) -> Result<()> {
        let shape = self.shape;
        let (q_dim, kv_dim, head_dim) = (shape.q_dim(), shape.kv_dim(), shape.head_dim);
        let q_rows = self.q_rows();
        let projects_kv = self.shared_kv_layer.is_none();
        for ((((row, q), k), v), gate) in qkv
            .chunks_exact(self.qkv_width())
            .zip(q.chunks_exact_mut(q_dim))
            .zip(k.chunks_exact_mut(kv_dim))
            .zip(v.chunks_exact_mut(kv_dim))
            .zip(gate.chunks_exact_mut(q_dim))
        {
            let (q_row, rest) = row.split_at(q_rows);
            let (k_row, v_row) = rest.split_at(rest.len().min(kv_dim));
            if self.output_gate {
                for ((pair, q), gate) in q_row
                    .chunks_exact(2 * head_dim)
                    .zip(q.chunks_exact_mut(head_dim))
                    .zip(gate.chunks_exact_mut(head_dim))
                {
                    let (query, head_gate) = pair.split_at(head_dim);
                    q.copy_from_slice(query);
                    gate.copy_from_slice(head_gate);
                }
            } else {
                q.copy_from_slice(q_row);
            }
            if !projects_kv {
                continue;
            }
            k.copy_from_slice(k_row);
            if self.values_from_keys {
                v.copy_from_slice(k_row);
            } else {
                v.copy_from_slice(v_row);
            }
        }
        if let Some(bias) = &self.qkv_bias {
            let (q_bias, rest) = bias.split_at(q_dim);
            let (k_bias, v_bias) = rest.split_at(kv_dim);
            for (rows, bias, width) in [
                (&mut *q, q_bias, q_dim),
                (&mut *k, k_bias, kv_dim),
                (&mut *v, v_bias, kv_dim),
            ] {
                for row in rows.chunks_exact_mut(width) {
                    add_inplace(row, bias)?;
                }
            }
        }
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            // Each head's row is normed on its own: the weight is one head wide. The bias (if
            // any) came first, as in the checkpoints' reference code.
            q_norm.forward_in_place(q, scratch)?;
            if projects_kv {
                k_norm.forward_in_place(k, scratch)?;
            }
        }
        if let (Some(v_norm), true) = (&self.value_norm, projects_kv) {
            v_norm.forward_in_place(v, scratch)?;
        }
        rope.apply(q, shape.num_heads, shape.head_dim, positions)?;
        if projects_kv {
            rope.apply(k, shape.num_kv_heads, shape.head_dim, positions)?;
        }
        Ok(())
    }

    /// Attends every token of `x[n][hidden]` over its sequence's cached context (after
    /// writing this step's K/V into layer `layer` of `kv`) and leaves the projected result in
    /// `out[n][hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        step: &Step<'_>,
        rope: &Rope,
        layer: usize,
        kv: &mut KvCacheStorage,
        x: &[f32],
        buffers: &mut AttentionBuffers,
        scratch: &mut LinearScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let (pool, batch, n) = (step.pool, step.batch, step.num_tokens());
        let shape = self.shape;
        let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
        let b = buffers;
        // Row by row (split over the pool): Q, K and V out of the fused projection, their
        // bias, per-head QK-norm and RoPE. `b.out` is the norms' scratch until attention.
        let width = self.qkv_width();
        let Some(projected) = b.qkv.get_mut(..n * width) else {
            return Err(ModelError::InvalidBatch(format!(
                "attention buffers not prepared for {n} tokens"
            )));
        };
        self.qkv.forward(pool, x, n, projected, scratch)?;
        scratch
            .lora
            .apply(step, layer, LoraGroup::Qkv, x, projected)?;
        let (Some(qkv), Some(positions)) = (b.qkv.get(..n * width), batch.positions.get(..n))
        else {
            return Err(ModelError::InvalidBatch(format!(
                "{n} tokens but a shorter QKV projection or position list"
            )));
        };
        for (buffer, len) in [
            (&b.q, q_dim),
            (&b.k, kv_dim),
            (&b.v, kv_dim),
            (&b.gate, q_dim),
            (&b.out, q_dim),
        ] {
            if buffer.len() < n * len {
                return Err(ModelError::InvalidBatch(format!(
                    "attention buffers not prepared for {n} tokens"
                )));
            }
        }
        let failed = std::sync::Mutex::new(None);
        pool.for_row_chunks(
            n,
            PREPARE_ROWS,
            [&mut b.q, &mut b.k, &mut b.v, &mut b.gate, &mut b.out],
            [q_dim, kv_dim, kv_dim, q_dim, q_dim],
            &|first, rows, [q, k, v, gate, scratch]| {
                let prepared = self.prepare_rows(
                    rope,
                    &qkv[first * width..(first + rows) * width],
                    &positions[first..first + rows],
                    [q, k, v, gate],
                    scratch,
                );
                if let Err(err) = prepared {
                    if let Ok(mut slot) = failed.lock() {
                        slot.get_or_insert(err);
                    }
                }
            },
        );
        if let Some(err) = failed.into_inner().ok().flatten() {
            return Err(err);
        }
        let block_size = kv.block_size();
        let cache_layer = self.shared_kv_layer.unwrap_or(layer);
        let (group, key_cache, value_cache) = kv.layer_mut(cache_layer).ok_or_else(|| {
            ModelError::InvalidBatch(format!("KV cache has no layer {cache_layer}"))
        })?;
        let (slot_mapping, block_tables) = batch.group_tables(group).ok_or_else(|| {
            ModelError::InvalidBatch(format!(
                "the batch has no block tables of KV cache group {group}"
            ))
        })?;
        if slot_mapping.len() != n {
            return Err(ModelError::InvalidBatch(format!(
                "{n} tokens but {} slots in KV cache group {group}",
                slot_mapping.len()
            )));
        }
        if self.shared_kv_layer.is_none() {
            write_kv(
                &b.k[..n * kv_dim],
                &b.v[..n * kv_dim],
                slot_mapping,
                kv_dim,
                key_cache.as_slice_mut(),
                value_cache.as_slice_mut(),
            )?;
        }
        let params = AttentionParams {
            num_heads: shape.num_heads,
            num_kv_heads: shape.num_kv_heads,
            head_dim: shape.head_dim,
            block_size,
            scale: self.scale,
            sliding_window: self.sliding_window,
        };
        // The buffers fit the widest layer (Gemma 4's global heads); this layer uses the
        // first `n` rows of its own width.
        let attended = &mut b.out[..n * q_dim];
        paged_attention_with_sinks(
            pool,
            &params,
            self.sinks.as_deref(),
            &b.q[..n * q_dim],
            key_cache.as_slice(),
            value_cache.as_slice(),
            &batch.seqs,
            block_tables,
            attended,
        )?;
        if self.output_gate {
            for (o, &g) in attended.iter_mut().zip(&b.gate) {
                *o *= sigmoid(g);
            }
        }
        self.output.forward(pool, attended, n, out, scratch)?;
        if let Some(bias) = &self.output_bias {
            let rows = out.get_mut(..n * bias.len()).ok_or_else(|| {
                ModelError::InvalidBatch(format!("attention output not sized for {n} tokens"))
            })?;
            for row in rows.chunks_exact_mut(bias.len()) {
                add_inplace(row, bias)?;
            }
        }
        scratch.lora.apply(step, layer, LoraGroup::O, attended, out)
    }
}
