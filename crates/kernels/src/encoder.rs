//! Encoder kernels: LayerNorm with bias, exact (erf) GELU, and bidirectional attention over
//! whole sequences. Encoders (BERT) keep no KV cache: every sequence of a step is complete,
//! so attention reads K and V straight from the step's QKV projection.
//!
//! Their linear layers run on [`PanelMatrix`] (`gemm.rs`, f32), [`Bf16PanelMatrix`]
//! (`bf16.rs`) or [`Int8PairMatrix`] (`pair.rs`, AMX). GELU and attention have AVX2 paths
//! bitwise equal to their scalar twins (`vector.rs`); LayerNorm is scalar (f64 sums). All
//! three split their work over the pool (LayerNorm by rows, GELU by chunks, attention by
//! (sequence, head) pairs), each piece's arithmetic independent of the others, so a
//! sequence's result does not depend on what it was batched with.

use std::cell::RefCell;

mod bf16;
mod gemm;
mod pair;
mod vector;

pub use bf16::{Bf16PanelMatrix, VDPBF16PS_ENV};
pub use gemm::PanelMatrix;
pub use pair::Int8PairMatrix;

use crate::simd::VectorOps;

use crate::pool::{SharedMut, ThreadPool};
use crate::KernelError;

/// Rows per pool task of [`layer_norm`].
const NORM_ROWS: usize = 32;
/// Values per pool task of [`gelu_erf_inplace`] (a multiple of the vector width).
const GELU_CHUNK: usize = 4096;

/// `out = (x - mean) / sqrt(var + eps) * weight + bias`, for each row of `weight.len()`
/// values, rows split over `pool`. Mean and (biased) variance are accumulated in f64 (as
/// PyTorch's CPU LayerNorm accumulates in a wider type), over eight lanes in a fixed order;
/// each row's result depends on that row alone.
pub fn layer_norm(
    pool: &ThreadPool,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    norm_rows(pool, x, None, weight, bias, eps, out)
}

/// [`layer_norm`] of `x + residual` (the post-norm residual connection), without writing the
/// sum: each row is added into a per-task buffer, then normed.
pub fn add_layer_norm(
    pool: &ThreadPool,
    x: &[f32],
    residual: &[f32],
    weight: &[f32],
    bias: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if residual.len() != x.len() {
        return Err(KernelError::LengthMismatch {
            what: "layer_norm residual",
            expected: x.len(),
            actual: residual.len(),
        });
    }
    norm_rows(pool, x, Some(residual), weight, bias, eps, out)
}

fn norm_rows(
    pool: &ThreadPool,
    x: &[f32],
    residual: Option<&[f32]>,
    weight: &[f32],
    bias: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let dim = weight.len();
    if dim == 0 || !x.len().is_multiple_of(dim) {
        return Err(KernelError::InvalidShape(
            "layer_norm input is not a whole number of rows of weight.len()",
        ));
    }
    for (what, expected, len) in [
        ("layer_norm bias", dim, bias.len()),
        ("layer_norm output", x.len(), out.len()),
    ] {
        if len != expected {
            return Err(KernelError::LengthMismatch {
                what,
                expected,
                actual: len,
            });
        }
    }
    let rows = x.len() / dim;
    let output = SharedMut::new(out);
    pool.parallel_for(rows.div_ceil(NORM_ROWS), &|task| {
        let first = task * NORM_ROWS;
        let count = NORM_ROWS.min(rows - first);
        // SAFETY: each task owns rows `first..first + count` of `out` (x.len() values, checked).
        let out = unsafe { output.slice_mut(first * dim, count * dim) };
        let range = first * dim..(first + count) * dim;
        let mut sum = Vec::new();
        let x = match residual {
            None => &x[range],
            Some(residual) => {
                sum.extend(
                    x[range.clone()]
                        .iter()
                        .zip(&residual[range])
                        .map(|(a, b)| a + b),
                );
                &sum[..]
            }
        };
        for (row, out_row) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            layer_norm_row(row, weight, bias, eps, out_row);
        }
    });
    Ok(())
}

fn layer_norm_row(row: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let dim = row.len();
    let mean = lane_sum(row, f64::from) / dim as f64;
    let variance = lane_sum(row, |v| {
        let d = f64::from(v) - mean;
        d * d
    }) / dim as f64;
    let inverse = 1.0 / (variance + f64::from(eps)).sqrt();
    for (((o, &v), &w), &b) in out.iter_mut().zip(row).zip(weight).zip(bias) {
        *o = ((f64::from(v) - mean) * inverse) as f32 * w + b;
    }
}

/// `x = gelu(x) = 0.5 x (1 + erf(x / sqrt 2))` in place, chunks split over `pool`: BERT's
/// `gelu` (PyTorch's exact GELU, not the tanh approximation of [`crate::gelu_tanh_mul`]),
/// through an `erfc` approximation good to 3e-7 absolute (`vector.rs`), eight values at a
/// time with AVX2 (bitwise the scalar twin, so the chunking changes nothing).
pub fn gelu_erf_inplace(pool: &ThreadPool, x: &mut [f32]) {
    let ops = VectorOps::detect();
    let len = x.len();
    let values = SharedMut::new(x);
    pool.parallel_for(len.div_ceil(GELU_CHUNK), &|task| {
        let start = task * GELU_CHUNK;
        // SAFETY: each task owns its chunk of `x`.
        let chunk = unsafe { values.slice_mut(start, GELU_CHUNK.min(len - start)) };
        vector::gelu(ops, chunk);
    });
}

/// One sequence of an encoder batch: `len` consecutive rows from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderSeq {
    /// First row of the sequence in the flattened batch.
    pub start: usize,
    /// Rows (tokens) in the sequence.
    pub len: usize,
}

/// Shapes of [`bidirectional_attention`]: `heads` heads of `head_dim` each; Q, K and V sit
/// side by side in each row of the fused projection (`[q | k | v]`, `3 * heads * head_dim`).
#[derive(Debug, Clone, Copy)]
pub struct EncoderAttentionShape {
    /// Attention heads (K/V heads equal query heads in encoders).
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Multiplies every score (`1 / sqrt(head_dim)` in BERT).
    pub scale: f32,
}

/// Per-thread attention scratch, grown to the longest sequence seen and then reused.
#[derive(Default)]
struct AttentionScratch {
    /// One head's keys transposed, `[head_dim][padded len]`, so a query scores eight keys
    /// per vector step with no reduction across lanes.
    keys_t: Vec<f32>,
    /// One query row's scores, then its probabilities.
    scores: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<AttentionScratch> = RefCell::new(AttentionScratch::default());
}

/// Full (non-causal) softmax attention within each sequence: every token attends to every
/// token of its own sequence. `qkv` is `[n][3 * hidden]`, `out` is `[n][hidden]`; rows no
/// sequence covers are left as they were.
pub fn bidirectional_attention(
    pool: &ThreadPool,
    qkv: &[f32],
    seqs: &[EncoderSeq],
    shape: EncoderAttentionShape,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let hidden = shape.heads * shape.head_dim;
    if hidden == 0 || !qkv.len().is_multiple_of(3 * hidden) {
        return Err(KernelError::InvalidShape(
            "bidirectional_attention qkv is not a whole number of [q | k | v] rows",
        ));
    }
    let n = qkv.len() / (3 * hidden);
    if out.len() != n * hidden {
        return Err(KernelError::LengthMismatch {
            what: "bidirectional_attention output",
            expected: n * hidden,
            actual: out.len(),
        });
    }
    for seq in seqs {
        if seq.start.checked_add(seq.len).is_none_or(|end| end > n) {
            return Err(KernelError::IndexOutOfRange {
                what: "encoder sequence end",
                index: seq.start.saturating_add(seq.len),
                len: n,
            });
        }
    }
    // Sequences must not overlap, or two tasks would write the same rows.
    let mut sorted: Vec<(usize, usize)> = seqs.iter().map(|s| (s.start, s.len)).collect();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(KernelError::InvalidShape(
            "bidirectional_attention sequences overlap",
        ));
    }
    let shared = SharedMut::new(out);
    let tasks = seqs.len() * shape.heads;
    let ops = VectorOps::detect();
    pool.parallel_for(tasks, &|task| {
        let seq = seqs[task / shape.heads];
        let head = task % shape.heads;
        SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            // SAFETY: task (sequence, head) is the only writer of columns
            // `head * head_dim..+head_dim` of its sequence's rows; sequences were checked not
            // to overlap and to lie within `out`, which outlives `parallel_for`.
            let rows = |i: usize| unsafe {
                shared.slice_mut(
                    (seq.start + i) * hidden + head * shape.head_dim,
                    shape.head_dim,
                )
            };
            attend_head(ops, qkv, seq, head, shape, scratch, rows);
        });
    });
    Ok(())
}

/// Every query row of one (sequence, head): scores against every key of the sequence,
/// softmax, weighted sum of the values. `dst(i)` is the output of the sequence's row `i`.
fn attend_head<'o>(
    ops: VectorOps,
    qkv: &[f32],
    seq: EncoderSeq,
    head: usize,
    shape: EncoderAttentionShape,
    scratch: &mut AttentionScratch,
    dst: impl Fn(usize) -> &'o mut [f32],
) {
    let (hidden, head_dim) = (shape.heads * shape.head_dim, shape.head_dim);
    let stride = 3 * hidden;
    let column = head * head_dim;
    let padded = seq.len.next_multiple_of(8);
    if scratch.keys_t.len() < head_dim * padded {
        scratch.keys_t.resize(head_dim * padded, 0.0);
    }
    if scratch.scores.len() < padded {
        scratch.scores.resize(padded, 0.0);
    }
    let keys_t = &mut scratch.keys_t[..head_dim * padded];
    for j in 0..seq.len {
        let key = (seq.start + j) * stride + hidden + column;
        for (d, &k) in qkv[key..key + head_dim].iter().enumerate() {
            keys_t[d * padded + j] = k;
        }
    }
    // Scores and their exponentials are computed for all `padded` columns, so the vector
    // paths cover every key with no scalar tail (each column is its own chain, so the real
    // keys' values do not change); the padding columns are zero keys and are never read.
    for row in keys_t.chunks_exact_mut(padded) {
        row[seq.len..].fill(0.0);
    }
    let values = &qkv[seq.start * stride + 2 * hidden + column..];
    let scores = &mut scratch.scores[..padded];
    for i in 0..seq.len {
        let query = (seq.start + i) * stride + column;
        vector::key_scores(ops, &qkv[query..query + head_dim], keys_t, padded, scores);
        for score in &mut scores[..seq.len] {
            *score *= shape.scale;
        }
        let max = lane_max(&scores[..seq.len]);
        vector::exp_shifted(ops, scores, max);
        let weights = &scores[..seq.len];
        let inverse = 1.0 / lane_sum(weights, |v| v);
        let out = dst(i);
        vector::weighted_values(ops, weights, values, stride, out);
        out.iter_mut().for_each(|d| *d *= inverse);
    }
}

/// Lanes of [`lane_max`] and [`lane_sum`]: eight independent chains the compiler keeps in
/// one vector register, instead of one chain through every value.
const LANES: usize = 8;

/// The largest value (NaN ignored, as `f32::max` does; exact in any order, so the same as a
/// sequential fold).
fn lane_max(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    lanes.iter().fold(tail, |m, &v| m.max(v))
}

/// `Σ term(v)` over `values` in a fixed order: term `i` into lane `i % 8` (whole groups of
/// eight), the lanes added pairwise (0+4, 1+5, 2+6, 3+7, then 0+2, 1+3, then 0+1), then the
/// tail's terms in order. Plain IEEE operations (f32 or f64 per `T`), so every host gets the
/// same bits, with eight chains instead of one.
fn lane_sum<T>(values: &[f32], term: impl Fn(f32) -> T) -> T
where
    T: Copy + Default + std::ops::Add<Output = T>,
{
    let mut lanes = [T::default(); LANES];
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = *lane + term(v);
        }
    }
    for half in [4, 2, 1] {
        for i in 0..half {
            lanes[i] = lanes[i] + lanes[i + half];
        }
    }
    chunks
        .remainder()
        .iter()
        .fold(lanes[0], |sum, &v| sum + term(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_reductions_match_their_definition() {
        let values: Vec<f32> = (0..29)
            .map(|i| ((i * 7919) % 97) as f32 * 0.37 - 11.0)
            .collect();
        assert_eq!(
            lane_max(&values),
            values.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
        );
        let mut lanes = [0.0f32; 8];
        for (i, &v) in values[..24].iter().enumerate() {
            lanes[i % 8] += v;
        }
        let pairs = [
            lanes[0] + lanes[4],
            lanes[1] + lanes[5],
            lanes[2] + lanes[6],
            lanes[3] + lanes[7],
        ];
        let expected = ((pairs[0] + pairs[2]) + (pairs[1] + pairs[3]))
            + values[24]
            + values[25]
            + values[26]
            + values[27]
            + values[28];
        assert_eq!(lane_sum(&values, |v| v).to_bits(), expected.to_bits());
        assert_eq!(lane_max(&[f32::NAN, 1.0]), 1.0);
        assert_eq!(lane_sum(&[], |v| v), 0.0);
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed as f32 * 1.3).sin() * 1.7)
            .collect()
    }

    #[test]
    fn layer_norm_matches_f64_reference() {
        let (dim, rows) = (24, 3);
        let x = values(dim * rows, 1);
        let weight = values(dim, 2);
        let bias = values(dim, 3);
        let mut out = vec![0.0; x.len()];
        layer_norm(&ThreadPool::new(2), &x, &weight, &bias, 1e-12, &mut out).unwrap();
        for (row, out_row) in x.chunks(dim).zip(out.chunks(dim)) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
            for i in 0..dim {
                let expected = (row[i] as f64 - mean) / (var + 1e-12).sqrt() * weight[i] as f64
                    + bias[i] as f64;
                assert!((out_row[i] as f64 - expected).abs() < 1e-5, "{i}");
            }
        }
        let mut short = vec![0.0; 3];
        let pool = ThreadPool::new(1);
        assert!(layer_norm(&pool, &x, &weight, &bias[..3], 1e-12, &mut out).is_err());
        assert!(layer_norm(&pool, &x, &weight, &bias, 1e-12, &mut short).is_err());
    }

    #[test]
    fn add_layer_norm_is_the_norm_of_the_sum() {
        let (dim, rows) = (40, 70);
        let (x, residual) = (values(dim * rows, 4), values(dim * rows, 5));
        let (weight, bias) = (values(dim, 6), values(dim, 7));
        let pool = ThreadPool::new(2);
        let sum: Vec<f32> = x.iter().zip(&residual).map(|(a, b)| a + b).collect();
        let mut expected = vec![0.0; x.len()];
        layer_norm(&pool, &sum, &weight, &bias, 1e-12, &mut expected).unwrap();
        let mut fused = vec![0.0; x.len()];
        add_layer_norm(&pool, &x, &residual, &weight, &bias, 1e-12, &mut fused).unwrap();
        assert_eq!(fused, expected);
        assert!(
            add_layer_norm(&pool, &x, &residual[1..], &weight, &bias, 1e-12, &mut fused).is_err()
        );
    }

    #[test]
    fn gelu_erf_known_values() {
        // gelu(x) = x * Phi(x): Phi(1) = 0.841344746, Phi(-1) = 0.158655254, Phi(2) = 0.977249868.
        let mut x = [0.0f32, 1.0, -1.0, 2.0, -6.0, 10.0];
        gelu_erf_inplace(&ThreadPool::new(2), &mut x);
        let expected = [
            0.0f32,
            0.841_344_7,
            -0.158_655_25,
            1.954_499_7,
            -5.9e-9,
            10.0,
        ];
        for (got, want) in x.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    /// Naive f64 attention per (sequence, head), materialized softmax.
    fn reference(qkv: &[f32], seqs: &[EncoderSeq], heads: usize, head_dim: usize) -> Vec<f64> {
        let hidden = heads * head_dim;
        let n = qkv.len() / (3 * hidden);
        let mut out = vec![0.0f64; n * hidden];
        let at = |row: usize, part: usize, head: usize, d: usize| {
            qkv[row * 3 * hidden + part * hidden + head * head_dim + d] as f64
        };
        let scale = 1.0 / (head_dim as f64).sqrt();
        for seq in seqs {
            for head in 0..heads {
                for i in seq.start..seq.start + seq.len {
                    let scores: Vec<f64> = (seq.start..seq.start + seq.len)
                        .map(|j| {
                            (0..head_dim)
                                .map(|d| at(i, 0, head, d) * at(j, 1, head, d))
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for d in 0..head_dim {
                        out[i * hidden + head * head_dim + d] = (seq.start..seq.start + seq.len)
                            .zip(&weights)
                            .map(|(j, w)| w * at(j, 2, head, d))
                            .sum::<f64>()
                            / total;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn bidirectional_attention_matches_reference_and_is_batch_invariant() {
        let (heads, head_dim) = (3, 8);
        let hidden = heads * head_dim;
        let seqs = [
            EncoderSeq { start: 0, len: 5 },
            EncoderSeq { start: 5, len: 1 },
            EncoderSeq { start: 6, len: 11 },
        ];
        let n = 17;
        let qkv = values(n * 3 * hidden, 4);
        let shape = EncoderAttentionShape {
            heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let pool = ThreadPool::new(3);
        let mut out = vec![0.0; n * hidden];
        bidirectional_attention(&pool, &qkv, &seqs, shape, &mut out).unwrap();
        let expected = reference(&qkv, &seqs, heads, head_dim);
        for (got, want) in out.iter().zip(&expected) {
            assert!((*got as f64 - want).abs() < 1e-5, "{got} vs {want}");
        }
        // The last sequence alone, at row 0, single-threaded: bitwise the same rows.
        let alone_qkv = &qkv[6 * 3 * hidden..];
        let mut alone = vec![0.0; 11 * hidden];
        let single = ThreadPool::new(1);
        let seq = [EncoderSeq { start: 0, len: 11 }];
        bidirectional_attention(&single, alone_qkv, &seq, shape, &mut alone).unwrap();
        assert_eq!(alone, out[6 * hidden..]);
    }

    #[test]
    fn bidirectional_attention_rejects_bad_sequences() {
        let shape = EncoderAttentionShape {
            heads: 1,
            head_dim: 2,
            scale: 1.0,
        };
        let pool = ThreadPool::new(1);
        let qkv = vec![0.0; 4 * 6];
        let mut out = vec![0.0; 4 * 2];
        let past_end = [EncoderSeq { start: 2, len: 3 }];
        assert!(bidirectional_attention(&pool, &qkv, &past_end, shape, &mut out).is_err());
        let overlap = [
            EncoderSeq { start: 0, len: 3 },
            EncoderSeq { start: 2, len: 2 },
        ];
        assert!(bidirectional_attention(&pool, &qkv, &overlap, shape, &mut out).is_err());
    }
}
