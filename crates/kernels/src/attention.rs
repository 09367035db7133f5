//! Paged KV cache writes and causal paged attention over a flattened batch of sequences.
//!
//! Cache layout per layer (K and V alike): `[num_blocks][block_size][num_kv_heads][head_dim]`
//! f32, so a token's K row for all kv heads sits at `slot * kv_dim` with
//! `slot = block_id * block_size + offset_in_block` and `kv_dim = num_kv_heads * head_dim`.
//!
//! `paged_attention` splits work into tasks of (sequence, query head, chunk of query rows).
//! Each task walks the sequence's cache blocks once, scoring a whole block of keys for all its
//! query rows before one online-softmax rescale per block, so K/V rows are reused across the
//! chunk and no full score row is ever materialized. A query row's result depends only on its
//! own query, its position and the cached K/V: chunking, batching and thread count never change
//! its floating-point operation order.

use crate::pool::{SharedMut, ThreadPool};
use crate::simd::{BlockView, OnlineSoftmax, VectorOps};
use crate::KernelError;

/// Query rows handled by one attention task.
const QUERY_CHUNK: usize = 16;

/// Shapes shared by every sequence of an attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`; query head `h` uses kv head
    /// `h / (num_heads / num_kv_heads)`).
    pub num_kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Score scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// One sequence of a flattened attention batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionSeq {
    /// First row of this sequence in `q` / `out`.
    pub query_start: usize,
    /// Query rows of this sequence in this step.
    pub query_len: usize,
    /// Tokens in the cache for this sequence, including this step's tokens.
    pub context_len: usize,
    /// Offset of this sequence's block table inside `block_tables`.
    pub block_table_start: usize,
    /// Entries of this sequence's block table.
    pub num_blocks: usize,
}

/// Slot value that marks a padding token whose K/V is not stored.
pub const PADDING_SLOT: u32 = u32::MAX;

/// Copies each token's K and V rows (`[n_tokens][kv_dim]`) into the cache at its slot.
/// Tokens whose slot is [`PADDING_SLOT`] are skipped.
pub fn write_kv(
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    kv_dim: usize,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) -> Result<(), KernelError> {
    let n_tokens = slot_mapping.len();
    for (what, buffer) in [("write_kv k", k), ("write_kv v", v)] {
        if buffer.len() != n_tokens * kv_dim {
            return Err(KernelError::LengthMismatch {
                what,
                expected: n_tokens * kv_dim,
                actual: buffer.len(),
            });
        }
    }
    if k_cache.len() != v_cache.len() {
        return Err(KernelError::LengthMismatch {
            what: "write_kv v_cache",
            expected: k_cache.len(),
            actual: v_cache.len(),
        });
    }
    if kv_dim == 0 {
        return Ok(());
    }
    let n_slots = k_cache.len() / kv_dim;
    for (token, &slot) in slot_mapping.iter().enumerate() {
        if slot == PADDING_SLOT {
            continue;
        }
        let slot = slot as usize;
        if slot >= n_slots {
            return Err(KernelError::IndexOutOfRange {
                what: "kv cache slot",
                index: slot,
                len: n_slots,
            });
        }
        let source = token * kv_dim..(token + 1) * kv_dim;
        let target = slot * kv_dim..(slot + 1) * kv_dim;
        k_cache[target.clone()].copy_from_slice(&k[source.clone()]);
        v_cache[target].copy_from_slice(&v[source]);
    }
    Ok(())
}

/// Validates a batch against the buffers; returns the number of cache blocks.
fn validate(
    p: &AttentionParams,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out_len: usize,
) -> Result<(), KernelError> {
    if p.num_heads == 0 || p.num_kv_heads == 0 || p.head_dim == 0 || p.block_size == 0 {
        return Err(KernelError::InvalidShape(
            "attention dimensions must be non-zero",
        ));
    }
    if p.num_heads % p.num_kv_heads != 0 {
        return Err(KernelError::InvalidShape(
            "num_heads must be a multiple of num_kv_heads",
        ));
    }
    let q_dim = p.num_heads * p.head_dim;
    if q.len() % q_dim != 0 {
        return Err(KernelError::InvalidShape(
            "q is not a whole number of token rows",
        ));
    }
    if out_len != q.len() {
        return Err(KernelError::LengthMismatch {
            what: "attention output",
            expected: q.len(),
            actual: out_len,
        });
    }
    let block_elems = p.block_size * p.num_kv_heads * p.head_dim;
    if k_cache.len() != v_cache.len() || k_cache.len() % block_elems != 0 {
        return Err(KernelError::InvalidShape(
            "k/v caches must be equal whole numbers of blocks",
        ));
    }
    let cache_blocks = k_cache.len() / block_elems;
    let n_rows = q.len() / q_dim;
    // Each output row must belong to at most one sequence: tasks of different sequences write
    // their rows concurrently.
    let mut row_ranges: Vec<(usize, usize)> = seqs
        .iter()
        .filter(|seq| seq.query_len > 0)
        .map(|seq| {
            (
                seq.query_start,
                seq.query_start.saturating_add(seq.query_len),
            )
        })
        .collect();
    row_ranges.sort_unstable();
    if row_ranges.windows(2).any(|pair| pair[0].1 > pair[1].0) {
        return Err(KernelError::InvalidShape("sequences share query rows"));
    }
    for seq in seqs {
        let rows_end = seq.query_start.saturating_add(seq.query_len);
        if rows_end > n_rows {
            return Err(KernelError::IndexOutOfRange {
                what: "sequence query rows end",
                index: rows_end,
                len: n_rows,
            });
        }
        if seq.query_len > seq.context_len {
            return Err(KernelError::InvalidShape("query_len exceeds context_len"));
        }
        if seq.num_blocks.saturating_mul(p.block_size) < seq.context_len {
            return Err(KernelError::InvalidShape(
                "block table too short for context_len",
            ));
        }
        let table_end = seq.block_table_start.saturating_add(seq.num_blocks);
        if table_end > block_tables.len() {
            return Err(KernelError::IndexOutOfRange {
                what: "block table end",
                index: table_end,
                len: block_tables.len(),
            });
        }
        let used_blocks = seq.context_len.div_ceil(p.block_size);
        for &block in &block_tables[seq.block_table_start..seq.block_table_start + used_blocks] {
            if block as usize >= cache_blocks {
                return Err(KernelError::IndexOutOfRange {
                    what: "cache block id",
                    index: block as usize,
                    len: cache_blocks,
                });
            }
        }
    }
    Ok(())
}

/// Causal paged attention: for every sequence, query row `j` (absolute position
/// `context_len - query_len + j`) attends to cache positions `0..=position` of its own blocks.
/// Writes `out[row][head][head_dim]` for every row covered by a sequence.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    pool: &ThreadPool,
    p: &AttentionParams,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    validate(p, q, k_cache, v_cache, seqs, block_tables, out.len())?;
    let mut task_starts = Vec::with_capacity(seqs.len() + 1);
    let mut total = 0usize;
    for seq in seqs {
        task_starts.push(total);
        total += p.num_heads * seq.query_len.div_ceil(QUERY_CHUNK);
    }
    task_starts.push(total);
    let output = SharedMut::new(out);
    pool.parallel_for(total, &|task| {
        let seq_index = task_starts.partition_point(|&start| start <= task) - 1;
        let seq = &seqs[seq_index];
        let local = task - task_starts[seq_index];
        let head = local % p.num_heads;
        let chunk = local / p.num_heads;
        let first = chunk * QUERY_CHUNK;
        let last = (first + QUERY_CHUNK).min(seq.query_len);
        let table = &block_tables[seq.block_table_start..seq.block_table_start + seq.num_blocks];
        attend_chunk(
            p,
            q,
            k_cache,
            v_cache,
            seq,
            table,
            head,
            first..last,
            &output,
        );
    });
    Ok(())
}

/// Online-softmax attention for query rows `rows` (relative to the sequence) of one head.
#[allow(clippy::too_many_arguments)]
fn attend_chunk(
    p: &AttentionParams,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seq: &AttentionSeq,
    table: &[u32],
    head: usize,
    rows: std::ops::Range<usize>,
    output: &SharedMut<f32>,
) {
    let d = p.head_dim;
    let q_dim = p.num_heads * d;
    let kv_dim = p.num_kv_heads * d;
    let kv_head = head / (p.num_heads / p.num_kv_heads);
    let n_rows = rows.len();
    let first_position = seq.context_len - seq.query_len;
    let position_of = |r: usize| first_position + rows.start + r;
    let query_of = |r: usize| {
        let row = seq.query_start + rows.start + r;
        &q[row * q_dim + head * d..row * q_dim + (head + 1) * d]
    };
    let mut accumulators = vec![0.0f32; n_rows * d];
    let mut states = [OnlineSoftmax::EMPTY; QUERY_CHUNK];
    let mut scores = vec![0.0f32; p.block_size];
    let last_position = position_of(n_rows.saturating_sub(1));
    let n_blocks = (last_position + 1).div_ceil(p.block_size);
    let kernels = VectorOps::detect();
    for (block_index, &block_id) in table.iter().take(n_blocks).enumerate() {
        let block_first_position = block_index * p.block_size;
        let block_base = block_id as usize * p.block_size * kv_dim + kv_head * d;
        let block_end = block_base + (p.block_size - 1) * kv_dim + d;
        for r in 0..n_rows {
            let position = position_of(r);
            if position < block_first_position {
                continue;
            }
            let view = BlockView {
                keys: &k_cache[block_base..block_end],
                values: &v_cache[block_base..block_end],
                stride: kv_dim,
                count: (position - block_first_position + 1).min(p.block_size),
            };
            kernels.attend_block(
                query_of(r),
                view,
                p.scale,
                &mut states[r],
                &mut accumulators[r * d..(r + 1) * d],
                &mut scores,
            );
        }
    }
    for (r, j) in rows.enumerate() {
        let row = seq.query_start + j;
        let inverse = 1.0 / states[r].sum;
        // SAFETY: each (row, head) pair belongs to exactly one task, rows of different
        // sequences are disjoint (callers give each row to one sequence), and the range lies
        // inside `out` (validated against q's shape).
        let target = unsafe { output.slice_mut(row * q_dim + head * d, d) };
        for (o, &a) in target.iter_mut().zip(&accumulators[r * d..(r + 1) * d]) {
            *o = a * inverse;
        }
    }
}

/// Naive reference: gathers each query's visible keys, materializes the score row, and applies
/// an f64 softmax. For tests.
pub fn reference_attention(
    p: &AttentionParams,
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    validate(p, q, k_cache, v_cache, seqs, block_tables, out.len())?;
    let d = p.head_dim;
    let q_dim = p.num_heads * d;
    let kv_dim = p.num_kv_heads * d;
    let group = p.num_heads / p.num_kv_heads;
    for seq in seqs {
        let table = &block_tables[seq.block_table_start..seq.block_table_start + seq.num_blocks];
        for j in 0..seq.query_len {
            let row = seq.query_start + j;
            let position = seq.context_len - seq.query_len + j;
            for head in 0..p.num_heads {
                let kv_head = head / group;
                let query = &q[row * q_dim + head * d..row * q_dim + (head + 1) * d];
                let slot =
                    |t: usize| table[t / p.block_size] as usize * p.block_size + t % p.block_size;
                let scores: Vec<f64> = (0..=position)
                    .map(|t| {
                        let base = slot(t) * kv_dim + kv_head * d;
                        let dot: f64 = query
                            .iter()
                            .zip(&k_cache[base..base + d])
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        dot * f64::from(p.scale)
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for c in 0..d {
                    let value: f64 = weights
                        .iter()
                        .enumerate()
                        .map(|(t, w)| w * f64::from(v_cache[slot(t) * kv_dim + kv_head * d + c]))
                        .sum();
                    out[row * q_dim + head * d + c] = (value / total) as f32;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    struct Batch {
        params: AttentionParams,
        q: Vec<f32>,
        k_cache: Vec<f32>,
        v_cache: Vec<f32>,
        seqs: Vec<AttentionSeq>,
        block_tables: Vec<u32>,
    }

    /// Random sequences with shuffled (non-contiguous) block tables; each entry of
    /// `(query_len, context_len)` becomes one sequence.
    fn random_batch(rng: &mut Rng, params: AttentionParams, shapes: &[(usize, usize)]) -> Batch {
        let kv_dim = params.num_kv_heads * params.head_dim;
        let blocks_needed: usize = shapes
            .iter()
            .map(|&(_, context)| context.div_ceil(params.block_size) + 1)
            .sum();
        let num_cache_blocks = blocks_needed + 3;
        let mut free: Vec<u32> = (0..num_cache_blocks as u32).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.below(i + 1));
        }
        let cache_len = num_cache_blocks * params.block_size * kv_dim;
        let k_cache = rng.vec(cache_len, -1.0, 1.0);
        let v_cache = rng.vec(cache_len, -1.0, 1.0);
        let mut seqs = Vec::new();
        let mut block_tables = Vec::new();
        let mut rows = 0;
        for &(query_len, context_len) in shapes {
            // One spare block beyond the context, as a scheduler that pre-allocates would leave.
            let num_blocks = context_len.div_ceil(params.block_size) + 1;
            seqs.push(AttentionSeq {
                query_start: rows,
                query_len,
                context_len,
                block_table_start: block_tables.len(),
                num_blocks,
            });
            for _ in 0..num_blocks {
                block_tables.push(free.pop().unwrap());
            }
            rows += query_len;
        }
        let q = rng.vec(rows * params.num_heads * params.head_dim, -1.0, 1.0);
        Batch {
            params,
            q,
            k_cache,
            v_cache,
            seqs,
            block_tables,
        }
    }

    fn run(pool: &ThreadPool, batch: &Batch) -> Vec<f32> {
        let mut out = vec![f32::NAN; batch.q.len()];
        paged_attention(
            pool,
            &batch.params,
            &batch.q,
            &batch.k_cache,
            &batch.v_cache,
            &batch.seqs,
            &batch.block_tables,
            &mut out,
        )
        .unwrap();
        out
    }

    #[test]
    fn matches_reference_on_mixed_batches() {
        let mut rng = Rng::new(5);
        let pool = ThreadPool::new(2);
        let configs = [(9, 3, 64, 16), (5, 5, 17, 4), (6, 1, 8, 3), (4, 2, 33, 16)];
        for (num_heads, num_kv_heads, head_dim, block_size) in configs {
            let params = AttentionParams {
                num_heads,
                num_kv_heads,
                head_dim,
                block_size,
                scale: 1.0 / (head_dim as f32).sqrt(),
            };
            // Prefill from scratch, decode, a chunked-prefill continuation, a long prefill
            // crossing many blocks, and a decode at a block boundary.
            let shapes = [
                (37, 37),
                (1, 50),
                (20, 45),
                (1, 1),
                (70, 70),
                (1, 2 * block_size),
            ];
            let batch = random_batch(&mut rng, params, &shapes);
            let out = run(&pool, &batch);
            let mut expected = vec![0.0f32; batch.q.len()];
            reference_attention(
                &params,
                &batch.q,
                &batch.k_cache,
                &batch.v_cache,
                &batch.seqs,
                &batch.block_tables,
                &mut expected,
            )
            .unwrap();
            for (i, (a, b)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                    "{params:?} element {i}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn sequence_result_is_independent_of_batch_and_threads() {
        let mut rng = Rng::new(9);
        let params = AttentionParams {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            block_size: 16,
            scale: 0.125,
        };
        let batch = random_batch(&mut rng, params, &[(40, 40), (1, 77), (5, 30)]);
        let together = run(&ThreadPool::new(2), &batch);
        let q_dim = params.num_heads * params.head_dim;
        for (index, seq) in batch.seqs.iter().enumerate() {
            let alone_rows =
                &batch.q[seq.query_start * q_dim..(seq.query_start + seq.query_len) * q_dim];
            let alone = Batch {
                params,
                q: alone_rows.to_vec(),
                k_cache: batch.k_cache.clone(),
                v_cache: batch.v_cache.clone(),
                seqs: vec![AttentionSeq {
                    query_start: 0,
                    ..*seq
                }],
                block_tables: batch.block_tables.clone(),
            };
            for threads in [1, 3] {
                let out = run(&ThreadPool::new(threads), &alone);
                let expected =
                    &together[seq.query_start * q_dim..(seq.query_start + seq.query_len) * q_dim];
                assert!(
                    out.iter()
                        .zip(expected)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "sequence {index} differs alone with {threads} threads"
                );
            }
        }
        // The last decode row of a prefill equals the same row computed as a 1-token step.
        let seq = batch.seqs[0];
        let last_row = seq.query_start + seq.query_len - 1;
        let decode = Batch {
            params,
            q: batch.q[last_row * q_dim..(last_row + 1) * q_dim].to_vec(),
            k_cache: batch.k_cache.clone(),
            v_cache: batch.v_cache.clone(),
            seqs: vec![AttentionSeq {
                query_start: 0,
                query_len: 1,
                ..seq
            }],
            block_tables: batch.block_tables.clone(),
        };
        let out = run(&ThreadPool::new(2), &decode);
        assert_eq!(
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            together[last_row * q_dim..(last_row + 1) * q_dim]
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn write_kv_scatters_by_slot() {
        let kv_dim = 3;
        let k: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let v: Vec<f32> = (0..6).map(|v| -(v as f32)).collect();
        let mut k_cache = vec![0.0f32; 4 * kv_dim];
        let mut v_cache = vec![0.0f32; 4 * kv_dim];
        write_kv(&k, &v, &[3, 1], kv_dim, &mut k_cache, &mut v_cache).unwrap();
        assert_eq!(&k_cache[9..12], &[0.0, 1.0, 2.0]);
        assert_eq!(&k_cache[3..6], &[3.0, 4.0, 5.0]);
        assert_eq!(&v_cache[3..6], &[-3.0, -4.0, -5.0]);
        assert!(write_kv(&k, &v, &[3, 4], kv_dim, &mut k_cache, &mut v_cache).is_err());
        write_kv(
            &k,
            &v,
            &[PADDING_SLOT, 0],
            kv_dim,
            &mut k_cache,
            &mut v_cache,
        )
        .unwrap();
        assert_eq!(&k_cache[0..3], &[3.0, 4.0, 5.0]);
    }

    #[test]
    fn rejects_bad_batches() {
        let params = AttentionParams {
            num_heads: 4,
            num_kv_heads: 3,
            head_dim: 4,
            block_size: 2,
            scale: 1.0,
        };
        let pool = ThreadPool::new(1);
        let q = vec![0.0f32; 16];
        let cache = vec![0.0f32; 2 * 2 * 3 * 4];
        let mut out = vec![0.0f32; 16];
        assert!(paged_attention(&pool, &params, &q, &cache, &cache, &[], &[], &mut out).is_err());
        let params = AttentionParams {
            num_kv_heads: 2,
            ..params
        };
        let cache = vec![0.0f32; 2 * 2 * 2 * 4];
        let seq = AttentionSeq {
            query_start: 0,
            query_len: 1,
            context_len: 5,
            block_table_start: 0,
            num_blocks: 2,
        };
        assert!(paged_attention(
            &pool,
            &params,
            &q,
            &cache,
            &cache,
            &[seq],
            &[0, 1],
            &mut out
        )
        .is_err());
        let seq = AttentionSeq {
            context_len: 3,
            ..seq
        };
        assert!(paged_attention(
            &pool,
            &params,
            &q,
            &cache,
            &cache,
            &[seq],
            &[0, 7],
            &mut out
        )
        .is_err());
        paged_attention(
            &pool,
            &params,
            &q,
            &cache,
            &cache,
            &[seq],
            &[0, 1],
            &mut out,
        )
        .unwrap();
    }
}
