//! Paged KV cache writes and causal paged attention over a flattened batch of sequences.
//!
//! Cache layout per layer (K and V alike): `[num_blocks][block_size][num_kv_heads][head_dim]`
//! elements of the cache's [`KvCacheDType`](crate::KvCacheDType), so a token's K row for all
//! kv heads sits at `slot * kv_dim` with `slot = block_id * block_size + offset_in_block` and
//! `kv_dim = num_kv_heads * head_dim`.
//!
//! An f32 cache is read in place. Any other type is decoded tile by tile (at most [`TILE`]
//! keys of one kv head, K and V) into a per-thread f32 scratch that stays in L1, and the same
//! f32 tile code runs on it. Decoding is exact, so attention over such a cache gives bitwise
//! what it gives over an f32 cache holding the decoded values, and everything said below about
//! batch invariance holds for every cache type.
//!
//! `paged_attention` splits work into tasks of (sequence, kv head, chunk of query rows) that
//! cover all query heads sharing that kv head (or a part of them, when a small decode batch
//! would otherwise leave threads idle). Each task walks the sequence's cache blocks once, in
//! tiles of at most 16 keys at fixed offsets inside each block, and folds each tile into every
//! (row, head) pair of the task (one online-softmax rescale per tile; up to three pairs that see
//! the same keys share each K/V row load) while the tile's K/V rows are hot in L1, so K/V are
//! read once per group and no full score row is ever materialized.
//!
//! A query row's result depends only on its own query, its position and the cached K/V: every
//! (row, head) pair sees the same tiles in the same order with the same per-tile operations, so
//! chunking, batching, grouping and thread count never change its floating-point results.

use std::cell::RefCell;

use crate::kv_dtype::{KvCacheSlice, KvCacheSliceMut, KvCodec, Rows};
use crate::pool::{SharedMut, ThreadPool};
use crate::simd::{KeyTile, OnlineSoftmax, VectorOps, GROUP, TILE};
use crate::KernelError;

/// Most query rows handled by one attention task.
const QUERY_CHUNK: usize = 16;

/// Most (row, head) pairs in one task.
const MAX_PAIRS: usize = 64;

/// f32 accumulators a task keeps on its stack (16 KiB). Tasks are cut to fit it; only a head
/// larger than this (never seen in practice) makes a task use the heap.
const ACC_CAPACITY: usize = 4096;

/// A plan splits head groups until the batch has this many tasks per thread (or every task
/// holds a single head).
const MIN_TASKS_PER_THREAD: usize = 2;

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
    /// `Some(w)`: a query at position `p` attends to keys in `(p - w, p]` only (Mistral's
    /// `sliding_window`, Gemma 3's local layers); `None`: to the whole causal context.
    pub sliding_window: Option<usize>,
}

impl AttentionParams {
    /// The first key position a query at `position` attends to.
    #[inline]
    fn first_visible(&self, position: usize) -> usize {
        match self.sliding_window {
            Some(window) => (position + 1).saturating_sub(window),
            None => 0,
        }
    }
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

/// Stores each token's K and V rows (`[n_tokens][kv_dim]`) into the cache at its slot,
/// converted to the cache's type (round-to-nearest-even, saturating; see [`KvCacheDType`]).
/// Tokens whose slot is [`PADDING_SLOT`] are skipped.
pub fn write_kv(
    k: &[f32],
    v: &[f32],
    slot_mapping: &[u32],
    kv_dim: usize,
    mut k_cache: KvCacheSliceMut<'_>,
    mut v_cache: KvCacheSliceMut<'_>,
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
    if k_cache.dtype() != v_cache.dtype() {
        return Err(KernelError::InvalidShape(
            "k and v caches have different element types",
        ));
    }
    if kv_dim == 0 {
        return Ok(());
    }
    let n_slots = k_cache.len() / kv_dim;
    let codec = KvCodec::detect();
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
        k_cache.encode_at(codec, slot * kv_dim, &k[source.clone()]);
        v_cache.encode_at(codec, slot * kv_dim, &v[source]);
    }
    Ok(())
}

/// Validates a batch against the buffers; returns the number of cache blocks.
fn validate(
    p: &AttentionParams,
    q: &[f32],
    k_cache: KvCacheSlice<'_>,
    v_cache: KvCacheSlice<'_>,
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out_len: usize,
) -> Result<(), KernelError> {
    if p.num_heads == 0 || p.num_kv_heads == 0 || p.head_dim == 0 || p.block_size == 0 {
        return Err(KernelError::InvalidShape(
            "attention dimensions must be non-zero",
        ));
    }
    if p.sliding_window == Some(0) {
        return Err(KernelError::InvalidShape("sliding window must be non-zero"));
    }
    if !p.num_heads.is_multiple_of(p.num_kv_heads) {
        return Err(KernelError::InvalidShape(
            "num_heads must be a multiple of num_kv_heads",
        ));
    }
    let q_dim = p.num_heads * p.head_dim;
    if !q.len().is_multiple_of(q_dim) {
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
    if k_cache.dtype() != v_cache.dtype() {
        return Err(KernelError::InvalidShape(
            "k and v caches have different element types",
        ));
    }
    let block_elems = p.block_size * p.num_kv_heads * p.head_dim;
    if k_cache.len() != v_cache.len() || !k_cache.len().is_multiple_of(block_elems) {
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
/// `context_len - query_len + j`) attends to cache positions `0..=position` of its own blocks,
/// or to the last `w` of them under a sliding window `w` (blocks wholly before the window are
/// not read).
/// Writes `out[row][head][head_dim]` for every row covered by a sequence. The caches may be
/// of any [`KvCacheDType`](crate::KvCacheDType) (both the same); `&[f32]` converts with
/// `.into()`.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    pool: &ThreadPool,
    p: &AttentionParams,
    q: &[f32],
    k_cache: KvCacheSlice<'_>,
    v_cache: KvCacheSlice<'_>,
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    attention_with(
        VectorOps::detect(),
        pool,
        p,
        q,
        k_cache,
        v_cache,
        seqs,
        block_tables,
        out,
    )
}

/// [`paged_attention`] with the vector primitives chosen by the caller.
#[allow(clippy::too_many_arguments)]
fn attention_with(
    kernels: VectorOps,
    pool: &ThreadPool,
    p: &AttentionParams,
    q: &[f32],
    k_cache: KvCacheSlice<'_>,
    v_cache: KvCacheSlice<'_>,
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    validate(p, q, k_cache, v_cache, seqs, block_tables, out.len())?;
    let plan = Plan::new(p, seqs, pool.num_threads());
    let mut task_starts = Vec::with_capacity(seqs.len() + 1);
    let mut total = 0usize;
    for seq in seqs {
        task_starts.push(total);
        total += plan.tasks_per_seq(seq);
    }
    task_starts.push(total);
    let output = SharedMut::new(out);
    let run_task = |task: usize, source: &mut dyn FnMut(&TaskInputs<'_>)| {
        let seq_index = task_starts.partition_point(|&start| start <= task) - 1;
        let seq = &seqs[seq_index];
        let work = plan.task(seq, task - task_starts[seq_index]);
        let table = &block_tables[seq.block_table_start..seq.block_table_start + seq.num_blocks];
        source(&TaskInputs {
            kernels,
            p,
            q,
            seq,
            table,
            work: &work,
            output: &output,
        });
    };
    match (k_cache, v_cache) {
        (KvCacheSlice::F32(keys), KvCacheSlice::F32(values)) => {
            pool.parallel_for(total, &|task| {
                run_task(task, &mut |job| {
                    attend_task(job, &mut InPlaceTiles { keys, values });
                });
            });
        }
        _ => {
            let codec = KvCodec::detect();
            pool.parallel_for(total, &|task| {
                run_task(task, &mut |job| {
                    TILE_SCRATCH.with(|cell| match cell.try_borrow_mut() {
                        Ok(mut scratch) => attend_task(
                            job,
                            &mut DecodedTiles::new(codec, k_cache, v_cache, &mut scratch),
                        ),
                        // Only a re-entrant call on this thread could hold it: use a scratch
                        // of its own.
                        Err(_) => attend_task(
                            job,
                            &mut DecodedTiles::new(codec, k_cache, v_cache, &mut Vec::new()),
                        ),
                    })
                });
            });
        }
    }
    Ok(())
}

thread_local! {
    /// Decoded K and V rows of one tile (`2 * TILE * head_dim` f32), reused by every task this
    /// thread runs so a reduced-precision cache costs no allocation or zeroing per task.
    static TILE_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where a task's tiles come from: the cache itself (f32) or a decoded copy.
trait TileSource {
    /// The K/V rows of `tile_len` keys whose first row starts at element `base` of the caches
    /// (rows `kv_dim` apart, `d` values each); only the first `visible` of them are read.
    fn tile(
        &mut self,
        base: usize,
        tile_len: usize,
        visible: usize,
        kv_dim: usize,
        d: usize,
    ) -> KeyTile<'_>;
}

/// An f32 cache, read in place: the path every default-configured step takes.
struct InPlaceTiles<'a> {
    keys: &'a [f32],
    values: &'a [f32],
}

impl TileSource for InPlaceTiles<'_> {
    #[inline(always)]
    fn tile(
        &mut self,
        base: usize,
        tile_len: usize,
        _visible: usize,
        kv_dim: usize,
        d: usize,
    ) -> KeyTile<'_> {
        let end = base + (tile_len - 1) * kv_dim + d;
        KeyTile {
            keys: &self.keys[base..end],
            values: &self.values[base..end],
            stride: kv_dim,
            count: tile_len,
        }
    }
}

/// A reduced-precision cache: each tile's visible rows are decoded (exactly) into a
/// contiguous f32 scratch, K rows first, then V rows.
struct DecodedTiles<'a> {
    codec: KvCodec,
    keys: KvCacheSlice<'a>,
    values: KvCacheSlice<'a>,
    scratch: &'a mut Vec<f32>,
}

impl<'a> DecodedTiles<'a> {
    fn new(
        codec: KvCodec,
        keys: KvCacheSlice<'a>,
        values: KvCacheSlice<'a>,
        scratch: &'a mut Vec<f32>,
    ) -> DecodedTiles<'a> {
        DecodedTiles {
            codec,
            keys,
            values,
            scratch,
        }
    }
}

impl TileSource for DecodedTiles<'_> {
    fn tile(
        &mut self,
        base: usize,
        _tile_len: usize,
        visible: usize,
        kv_dim: usize,
        d: usize,
    ) -> KeyTile<'_> {
        let size = TILE * d;
        if self.scratch.len() < 2 * size {
            self.scratch.resize(2 * size, 0.0);
        }
        let (keys, values) = self.scratch.split_at_mut(size);
        let rows = Rows {
            start: base,
            stride: kv_dim,
            count: visible,
            width: d,
        };
        self.keys.decode_rows(self.codec, rows, keys);
        self.values.decode_rows(self.codec, rows, values);
        KeyTile {
            keys: &keys[..visible * d],
            values: &values[..visible * d],
            stride: d,
            count: visible,
        }
    }
}

/// What one task attends over and where it writes.
struct TaskInputs<'a> {
    kernels: VectorOps,
    p: &'a AttentionParams,
    q: &'a [f32],
    seq: &'a AttentionSeq,
    table: &'a [u32],
    work: &'a TaskWork,
    output: &'a SharedMut<f32>,
}

/// How `paged_attention` cuts a batch into tasks. Any cut gives the same results (each
/// (row, head) pair's operations do not depend on its task), so the plan only balances reuse
/// of each K/V tile across a task's pairs against keeping every thread busy.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Query heads sharing one kv head.
    group: usize,
    /// Each kv head's query heads are split into this many contiguous parts.
    parts: usize,
    /// Query rows per task.
    rows: usize,
    num_kv_heads: usize,
}

/// One task: query rows `rows` (relative to the sequence) of query heads `heads`, all of which
/// read kv head `kv_head`.
struct TaskWork {
    kv_head: usize,
    heads: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
}

impl Plan {
    fn new(p: &AttentionParams, seqs: &[AttentionSeq], threads: usize) -> Plan {
        let group = p.num_heads / p.num_kv_heads;
        let max_heads = (ACC_CAPACITY / p.head_dim).clamp(1, MAX_PAIRS).min(group);
        let plan_with = |parts: usize| {
            let heads = group.div_ceil(parts);
            let rows = (ACC_CAPACITY / (heads * p.head_dim))
                .min(MAX_PAIRS / heads)
                .clamp(1, QUERY_CHUNK);
            Plan {
                group,
                parts,
                rows,
                num_kv_heads: p.num_kv_heads,
            }
        };
        let mut plan = plan_with(group.div_ceil(max_heads));
        // Few tasks (a small decode batch): split head groups until every thread has some.
        while plan.parts < group {
            let tasks: usize = seqs.iter().map(|seq| plan.tasks_per_seq(seq)).sum();
            if tasks >= MIN_TASKS_PER_THREAD * threads {
                break;
            }
            plan = plan_with(plan.parts + 1);
        }
        plan
    }

    fn tasks_per_seq(&self, seq: &AttentionSeq) -> usize {
        self.num_kv_heads * self.parts * seq.query_len.div_ceil(self.rows)
    }

    /// The `local`-th task of `seq`. Tasks come heaviest first (later rows see more keys, and
    /// earlier head parts are at least as large), which helps the pool's dynamic hand-out.
    fn task(&self, seq: &AttentionSeq, local: usize) -> TaskWork {
        let kv_head = local % self.num_kv_heads;
        let part = (local / self.num_kv_heads) % self.parts;
        let chunks = seq.query_len.div_ceil(self.rows);
        let chunk = chunks - 1 - local / (self.num_kv_heads * self.parts);
        let first_head = kv_head * self.group;
        let rows_start = chunk * self.rows;
        TaskWork {
            kv_head,
            heads: first_head + (part * self.group).div_ceil(self.parts)
                ..first_head + ((part + 1) * self.group).div_ceil(self.parts),
            rows: rows_start..(rows_start + self.rows).min(seq.query_len),
        }
    }
}

/// Online-softmax attention for every (row, head) pair of one task. Keys are walked in cache
/// blocks, in tiles of at most `TILE` keys at fixed offsets inside each block; each tile is
/// folded into every pair that can see it while its K/V rows are hot in L1.
fn attend_task<S: TileSource>(job: &TaskInputs<'_>, source: &mut S) {
    let TaskInputs {
        kernels,
        p,
        q,
        seq,
        table,
        work,
        output,
    } = *job;
    let d = p.head_dim;
    let q_dim = p.num_heads * d;
    let kv_dim = p.num_kv_heads * d;
    let n_heads = work.heads.len();
    let n_pairs = n_heads * work.rows.len();
    if n_pairs == 0 || n_pairs > MAX_PAIRS {
        return;
    }
    let first_position = seq.context_len - seq.query_len;
    // Pair `i` is row `work.rows.start + i / n_heads`, head `work.heads.start + i % n_heads`.
    let row_of = |pair: usize| seq.query_start + work.rows.start + pair / n_heads;
    let position_of = |pair: usize| first_position + work.rows.start + pair / n_heads;
    let query_of = |pair: usize| {
        let start = row_of(pair) * q_dim + (work.heads.start + pair % n_heads) * d;
        &q[start..start + d]
    };
    let mut stack = [0.0f32; ACC_CAPACITY];
    let mut heap = Vec::new();
    let accumulators = if n_pairs * d <= ACC_CAPACITY {
        &mut stack[..n_pairs * d]
    } else {
        heap.resize(n_pairs * d, 0.0f32);
        &mut heap[..]
    };
    let mut states = [OnlineSoftmax::EMPTY; MAX_PAIRS];
    let last_position = position_of(n_pairs - 1);
    let n_blocks = (last_position + 1).div_ceil(p.block_size);
    // Keys of pair `i` are positions `first_of(i)..=position_of(i)`; both ends grow with `i`.
    let first_of = |pair: usize| p.first_visible(position_of(pair));
    let first_block = first_of(0) / p.block_size;
    for (block_index, &block_id) in table.iter().enumerate().take(n_blocks).skip(first_block) {
        let block_base = block_id as usize * p.block_size * kv_dim + work.kv_head * d;
        for tile_start in (0..p.block_size).step_by(TILE) {
            let tile_first_position = block_index * p.block_size + tile_start;
            if tile_first_position > last_position {
                break;
            }
            let tile_len = TILE.min(p.block_size - tile_start);
            // The keys of the tile pair `i` sees: rows `skip..count` of it.
            let span_of = |pair: usize| {
                let count = (position_of(pair) + 1 - tile_first_position).min(tile_len);
                (first_of(pair).saturating_sub(tile_first_position), count)
            };
            // Pairs come in row order, so the ones that see the tile form a contiguous range:
            // from the first whose position reaches the tile to the last whose window does.
            let mut pair = tile_first_position.saturating_sub(position_of(0)) * n_heads;
            let (skip, count) = span_of(pair);
            if skip >= count {
                // Every pair that reaches this tile has its window past it already.
                continue;
            }
            let base = block_base + tile_start * kv_dim;
            let visible = (last_position + 1 - tile_first_position).min(tile_len);
            let tile = source.tile(base, tile_len, visible, kv_dim, d);
            // Runs of consecutive pairs that see the same keys of the tile go through one
            // grouped step (at most GROUP pairs; a run of four splits 2 + 2), which loads each
            // K/V row once for all of them.
            while pair < n_pairs {
                let span = span_of(pair);
                let (skip, count) = span;
                if skip >= count {
                    break;
                }
                let mut run = 1;
                while pair + run < n_pairs && run < 2 * GROUP && span_of(pair + run) == span {
                    run += 1;
                }
                let take = if run == GROUP + 1 { 2 } else { run.min(GROUP) };
                let queries: [&[f32]; GROUP] =
                    std::array::from_fn(|i| query_of(pair + i.min(take - 1)));
                let offset = skip * tile.stride;
                kernels.attend_group(
                    &queries[..take],
                    KeyTile {
                        keys: &tile.keys[offset..],
                        values: &tile.values[offset..],
                        stride: tile.stride,
                        count: count - skip,
                    },
                    p.scale,
                    &mut states[pair..pair + take],
                    &mut accumulators[pair * d..(pair + take) * d],
                );
                pair += take;
            }
        }
    }
    for (pair, (state, acc)) in states[..n_pairs]
        .iter()
        .zip(accumulators.chunks_exact(d))
        .enumerate()
    {
        let inverse = 1.0 / state.sum;
        let start = row_of(pair) * q_dim + (work.heads.start + pair % n_heads) * d;
        // SAFETY: each (row, head) pair belongs to exactly one task, rows of different
        // sequences are disjoint (validated), and the range lies inside `out` (validated
        // against q's shape).
        let target = unsafe { output.slice_mut(start, d) };
        for (o, &a) in target.iter_mut().zip(acc) {
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
    validate(
        p,
        q,
        k_cache.into(),
        v_cache.into(),
        seqs,
        block_tables,
        out.len(),
    )?;
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
                let first = p.first_visible(position);
                let scores: Vec<f64> = (first..=position)
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
                        .map(|(i, w)| {
                            w * f64::from(v_cache[slot(first + i) * kv_dim + kv_head * d + c])
                        })
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
    use crate::{KvCacheBuffer, KvCacheDType};

    #[derive(Clone)]
    struct Batch {
        params: AttentionParams,
        /// The type the caches are stored in when the batch runs (`k_cache`/`v_cache` are
        /// encoded into it first).
        dtype: KvCacheDType,
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
            dtype: KvCacheDType::F32,
            q,
            k_cache,
            v_cache,
            seqs,
            block_tables,
        }
    }

    fn run(pool: &ThreadPool, batch: &Batch) -> Vec<f32> {
        run_with(VectorOps::detect(), pool, batch)
    }

    fn run_with(kernels: VectorOps, pool: &ThreadPool, batch: &Batch) -> Vec<f32> {
        let mut out = vec![f32::NAN; batch.q.len()];
        let k_cache = KvCacheBuffer::from_f32(batch.dtype, &batch.k_cache);
        let v_cache = KvCacheBuffer::from_f32(batch.dtype, &batch.v_cache);
        attention_with(
            kernels,
            pool,
            &batch.params,
            &batch.q,
            k_cache.as_slice(),
            v_cache.as_slice(),
            &batch.seqs,
            &batch.block_tables,
            &mut out,
        )
        .unwrap();
        out
    }

    /// The naive reference over the values the batch's cache type stores.
    fn reference(batch: &Batch) -> Vec<f32> {
        let mut expected = vec![f32::NAN; batch.q.len()];
        reference_attention(
            &batch.params,
            &batch.q,
            &KvCacheBuffer::from_f32(batch.dtype, &batch.k_cache).to_f32(),
            &KvCacheBuffer::from_f32(batch.dtype, &batch.v_cache).to_f32(),
            &batch.seqs,
            &batch.block_tables,
            &mut expected,
        )
        .unwrap();
        expected
    }

    fn params(
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> AttentionParams {
        AttentionParams {
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: None,
        }
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    fn close(got: &[f32], want: &[f32]) -> bool {
        got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(a, b)| (a - b).abs() <= 1e-5 + 1e-4 * b.abs())
    }

    /// (num_heads, num_kv_heads, head_dim, block_size): GQA ratios 1, 3, 4 and 6, head sizes
    /// with and without 8-lane tails, blocks smaller than, equal to and larger than a tile.
    const CONFIGS: [(usize, usize, usize, usize); 10] = [
        (9, 3, 64, 16),
        (8, 2, 128, 16),
        (4, 4, 48, 16),
        (6, 2, 80, 7),
        (5, 5, 17, 4),
        (6, 1, 8, 3),
        (4, 2, 33, 16),
        (8, 2, 64, 40),
        (3, 1, 256, 32),
        (2, 2, 5, 1),
    ];

    #[test]
    fn matches_reference_on_mixed_batches() {
        let mut rng = Rng::new(5);
        let pool = ThreadPool::new(2);
        for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
            let params = params(num_heads, num_kv_heads, head_dim, block_size);
            // Prefill from scratch, decode, a chunked-prefill continuation, a long prefill
            // crossing many blocks, and decodes just before, at and after a block boundary.
            let shapes = [
                (37, 37),
                (1, 50),
                (20, 45),
                (1, 1),
                (70, 70),
                (1, 2 * block_size - 1),
                (1, 2 * block_size),
                (1, 2 * block_size + 1),
            ];
            let batch = random_batch(&mut rng, params, &shapes);
            let expected = reference(&batch);
            for kernels in [VectorOps::detect(), VectorOps::Scalar] {
                let out = run_with(kernels, &pool, &batch);
                for (i, (a, b)) in out.iter().zip(&expected).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                        "{params:?} {kernels:?} element {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn leaves_padding_rows_untouched() {
        let mut rng = Rng::new(6);
        let params = params(9, 3, 64, 16);
        let mut batch = random_batch(&mut rng, params, &[(3, 20), (1, 33)]);
        let q_dim = params.num_heads * params.head_dim;
        // Two padding rows between the sequences and one after them.
        let mut q = batch.q[..3 * q_dim].to_vec();
        q.extend(rng.vec(2 * q_dim, -1.0, 1.0));
        q.extend_from_slice(&batch.q[3 * q_dim..]);
        q.extend(rng.vec(q_dim, -1.0, 1.0));
        batch.q = q;
        batch.seqs[1].query_start = 5;
        let out = run(&ThreadPool::new(2), &batch);
        let expected = reference(&batch);
        for (row, (got, want)) in out.chunks(q_dim).zip(expected.chunks(q_dim)).enumerate() {
            if [3, 4, 6].contains(&row) {
                assert!(got.iter().all(|v| v.is_nan()), "padding row {row} written");
            } else {
                assert!(close(got, want), "row {row}");
            }
        }
    }

    /// Rows `rows` of one sequence of `batch` as a batch of their own (the context ending at
    /// the last of them), as a decode step or a prefill chunk would present them.
    fn rows_alone(batch: &Batch, seq: &AttentionSeq, rows: std::ops::Range<usize>) -> Batch {
        let q_dim = batch.params.num_heads * batch.params.head_dim;
        let first = seq.query_start + rows.start;
        Batch {
            params: batch.params,
            dtype: batch.dtype,
            q: batch.q[first * q_dim..(seq.query_start + rows.end) * q_dim].to_vec(),
            k_cache: batch.k_cache.clone(),
            v_cache: batch.v_cache.clone(),
            seqs: vec![AttentionSeq {
                query_start: 0,
                query_len: rows.len(),
                context_len: seq.context_len - seq.query_len + rows.end,
                ..*seq
            }],
            block_tables: batch.block_tables.clone(),
        }
    }

    #[test]
    fn rows_are_bitwise_independent_of_batch_chunking_and_threads() {
        check_batch_invariance(KvCacheDType::F32, None);
    }

    #[test]
    fn sliding_window_rows_are_bitwise_independent_of_batching() {
        for window in [1, 5, 16, 23] {
            check_batch_invariance(KvCacheDType::F32, Some(window));
        }
        check_batch_invariance(KvCacheDType::F16, Some(9));
    }

    /// Windows of one key, inside one tile, across tiles and blocks, and longer than every
    /// context: each query sees keys `(p - w, p]` on both vector paths; a window longer than
    /// the context changes nothing, bit for bit.
    #[test]
    fn sliding_window_matches_reference_and_scalar_twin() {
        let mut rng = Rng::new(21);
        let pool = ThreadPool::new(2);
        for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
            let full = params(num_heads, num_kv_heads, head_dim, block_size);
            let shapes = [
                (37, 37),
                (1, 50),
                (20, 45),
                (1, 1),
                (70, 70),
                (3, 2 * block_size + 1),
            ];
            let mut batch = random_batch(&mut rng, full, &shapes);
            let unwindowed = run(&pool, &batch);
            for window in [1, 2, 7, 16, 17, 33, 70, 1000] {
                batch.params.sliding_window = Some(window);
                let expected = reference(&batch);
                // The tile kernels' vector twins agree with the scalar ones to rounding (the
                // vector exp differs in the last bits), so both are held to the reference.
                for kernels in [VectorOps::detect(), VectorOps::Scalar] {
                    let got = run_with(kernels, &pool, &batch);
                    assert!(
                        close(&got, &expected),
                        "{full:?} {kernels:?} window {window}"
                    );
                }
                let detected = run(&pool, &batch);
                if window == 1000 {
                    assert_eq!(
                        bits(&detected),
                        bits(&unwindowed),
                        "{full:?} window {window}"
                    );
                }
            }
            if block_size > 1 {
                // A window really narrows what a late query sees.
                batch.params.sliding_window = Some(2);
                assert!(!close(&run(&pool, &batch), &unwindowed), "{full:?}");
            }
        }
        let zero = AttentionParams {
            sliding_window: Some(0),
            ..params(2, 2, 4, 4)
        };
        let batch = random_batch(&mut rng, zero, &[(1, 1)]);
        let mut out = vec![0.0; batch.q.len()];
        assert!(paged_attention(
            &pool,
            &zero,
            &batch.q,
            (&batch.k_cache).into(),
            (&batch.v_cache).into(),
            &batch.seqs,
            &batch.block_tables,
            &mut out
        )
        .is_err());
    }

    #[test]
    fn rows_are_bitwise_independent_of_batching_for_every_cache_type() {
        for dtype in [
            KvCacheDType::F16,
            KvCacheDType::BF16,
            KvCacheDType::Fp8E4m3,
            KvCacheDType::Fp8E5m2,
        ] {
            check_batch_invariance(dtype, None);
        }
    }

    /// Each sequence alone (any thread count), each row as a decode step, and uneven prefill
    /// chunks give bitwise what the whole mixed batch gives, over a `dtype` cache.
    fn check_batch_invariance(dtype: KvCacheDType, sliding_window: Option<usize>) {
        let mut rng = Rng::new(9);
        let pools: Vec<ThreadPool> = [1, 2, 3, 8].into_iter().map(ThreadPool::new).collect();
        for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
            let params = AttentionParams {
                sliding_window,
                ..params(num_heads, num_kv_heads, head_dim, block_size)
            };
            let q_dim = num_heads * head_dim;
            let shapes = [(40, 40), (1, 77), (5, 30), (19, 50)];
            let mut batch = random_batch(&mut rng, params, &shapes);
            batch.dtype = dtype;
            let together = run(&pools[1], &batch);
            assert!(close(&together, &reference(&batch)), "{params:?} {dtype}");
            for (index, seq) in batch.seqs.iter().enumerate() {
                let expected = &together[seq.query_start * q_dim..][..seq.query_len * q_dim];
                // The whole sequence alone, with any thread count.
                let alone = rows_alone(&batch, seq, 0..seq.query_len);
                for pool in &pools {
                    assert_eq!(
                        bits(&run(pool, &alone)),
                        bits(expected),
                        "{params:?} {dtype} sequence {index} alone, {} threads",
                        pool.num_threads()
                    );
                }
                // Every row as a one-token decode step.
                for row in 0..seq.query_len {
                    let decode = rows_alone(&batch, seq, row..row + 1);
                    let pool = &pools[row % pools.len()];
                    assert_eq!(
                        bits(&run(pool, &decode)),
                        bits(&expected[row * q_dim..(row + 1) * q_dim]),
                        "{params:?} {dtype} sequence {index} row {row} as a decode step"
                    );
                }
                // The rows prefilled in uneven chunks, as chunked prefill would.
                let mut chunked = Vec::new();
                let mut start = 0;
                for size in [3, 13, 1, 17].into_iter().cycle() {
                    if start >= seq.query_len {
                        break;
                    }
                    let end = (start + size).min(seq.query_len);
                    chunked.extend(run(&pools[0], &rows_alone(&batch, seq, start..end)));
                    start = end;
                }
                assert_eq!(
                    bits(&chunked),
                    bits(expected),
                    "{params:?} {dtype} sequence {index} chunked"
                );
            }
        }
    }

    /// Decoding is exact, so attention over a reduced-precision cache is bitwise attention
    /// over an f32 cache holding the decoded values, with either vector path.
    #[test]
    fn reduced_precision_caches_attend_exactly_like_f32_caches_of_their_values() {
        let mut rng = Rng::new(12);
        let pool = ThreadPool::new(2);
        for (num_heads, num_kv_heads, head_dim, block_size) in CONFIGS {
            let params = params(num_heads, num_kv_heads, head_dim, block_size);
            let shapes = [(37, 37), (1, 50), (20, 45), (1, 2 * block_size + 1)];
            let mut batch = random_batch(&mut rng, params, &shapes);
            // Beyond fp8 E4M3's range, so saturation is part of what is compared.
            batch
                .k_cache
                .iter_mut()
                .step_by(97)
                .for_each(|v| *v *= 900.0);
            for dtype in KvCacheDType::ALL {
                let stored = Batch {
                    dtype,
                    ..batch.clone()
                };
                let decoded = Batch {
                    dtype: KvCacheDType::F32,
                    k_cache: KvCacheBuffer::from_f32(dtype, &batch.k_cache).to_f32(),
                    v_cache: KvCacheBuffer::from_f32(dtype, &batch.v_cache).to_f32(),
                    ..batch.clone()
                };
                for kernels in [VectorOps::detect(), VectorOps::Scalar] {
                    let got = run_with(kernels, &pool, &stored);
                    assert!(got.iter().all(|v| v.is_finite()), "{params:?} {dtype}");
                    assert_eq!(
                        bits(&got),
                        bits(&run_with(kernels, &pool, &decoded)),
                        "{params:?} {dtype} {kernels:?}"
                    );
                }
                assert!(
                    close(&run(&pool, &stored), &reference(&stored)),
                    "{params:?} {dtype}"
                );
            }
        }
    }

    #[test]
    fn write_kv_encodes_into_the_cache_type() {
        let kv_dim = 9;
        let mut rng = Rng::new(3);
        let k: Vec<f32> = rng.vec(2 * kv_dim, -600.0, 600.0);
        let v: Vec<f32> = rng.vec(2 * kv_dim, -1.0, 1.0);
        for dtype in KvCacheDType::ALL {
            let mut k_cache = KvCacheBuffer::zeros(dtype, 3 * kv_dim);
            let mut v_cache = KvCacheBuffer::zeros(dtype, 3 * kv_dim);
            write_kv(
                &k,
                &v,
                &[2, PADDING_SLOT],
                kv_dim,
                k_cache.as_slice_mut(),
                v_cache.as_slice_mut(),
            )
            .unwrap();
            let (keys, values) = (k_cache.to_f32(), v_cache.to_f32());
            assert!(keys[..2 * kv_dim].iter().all(|&x| x == 0.0), "{dtype}");
            for i in 0..kv_dim {
                assert_eq!(keys[2 * kv_dim + i], dtype.round(k[i]), "{dtype}");
                assert_eq!(values[2 * kv_dim + i], dtype.round(v[i]), "{dtype}");
            }
            let mut other = KvCacheBuffer::zeros(KvCacheDType::F32, 3 * kv_dim);
            assert!(
                write_kv(
                    &k,
                    &v,
                    &[0, 1],
                    kv_dim,
                    k_cache.as_slice_mut(),
                    other.as_slice_mut()
                )
                .is_err()
                    == (dtype != KvCacheDType::F32)
            );
        }
    }

    #[test]
    fn plans_cover_every_pair_once() {
        for (num_heads, num_kv_heads, head_dim) in [
            (9, 3, 64),
            (8, 2, 128),
            (32, 1, 256),
            (4, 4, 48),
            (2, 1, 8192),
        ] {
            let p = params(num_heads, num_kv_heads, head_dim, 16);
            let group = num_heads / num_kv_heads;
            for lens in [&[1usize][..], &[1, 1, 1, 1], &[70, 1, 5], &[512]] {
                let seqs: Vec<AttentionSeq> = lens
                    .iter()
                    .map(|&query_len| AttentionSeq {
                        query_start: 0,
                        query_len,
                        context_len: query_len,
                        block_table_start: 0,
                        num_blocks: 0,
                    })
                    .collect();
                for threads in [1, 2, 16] {
                    let plan = Plan::new(&p, &seqs, threads);
                    for seq in &seqs {
                        let mut seen = vec![0u32; seq.query_len * num_heads];
                        for local in 0..plan.tasks_per_seq(seq) {
                            let work = plan.task(seq, local);
                            assert!(work.heads.len() * work.rows.len() <= MAX_PAIRS);
                            assert!(!work.heads.is_empty() && !work.rows.is_empty());
                            for head in work.heads.clone() {
                                assert_eq!(head / group, work.kv_head);
                                for row in work.rows.clone() {
                                    seen[row * num_heads + head] += 1;
                                }
                            }
                        }
                        assert!(seen.iter().all(|&n| n == 1), "{p:?} {lens:?} {threads}");
                    }
                }
            }
        }
    }

    #[test]
    fn write_kv_scatters_by_slot() {
        let kv_dim = 3;
        let k: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let v: Vec<f32> = (0..6).map(|v| -(v as f32)).collect();
        let mut k_cache = vec![0.0f32; 4 * kv_dim];
        let mut v_cache = vec![0.0f32; 4 * kv_dim];
        write_kv(
            &k,
            &v,
            &[3, 1],
            kv_dim,
            (&mut k_cache).into(),
            (&mut v_cache).into(),
        )
        .unwrap();
        assert_eq!(&k_cache[9..12], &[0.0, 1.0, 2.0]);
        assert_eq!(&k_cache[3..6], &[3.0, 4.0, 5.0]);
        assert_eq!(&v_cache[3..6], &[-3.0, -4.0, -5.0]);
        assert!(write_kv(
            &k,
            &v,
            &[3, 4],
            kv_dim,
            (&mut k_cache).into(),
            (&mut v_cache).into()
        )
        .is_err());
        write_kv(
            &k,
            &v,
            &[PADDING_SLOT, 0],
            kv_dim,
            (&mut k_cache).into(),
            (&mut v_cache).into(),
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
            sliding_window: None,
        };
        let pool = ThreadPool::new(1);
        let q = vec![0.0f32; 16];
        let cache = vec![0.0f32; 2 * 2 * 3 * 4];
        let mut out = vec![0.0f32; 16];
        assert!(paged_attention(
            &pool,
            &params,
            &q,
            (&cache).into(),
            (&cache).into(),
            &[],
            &[],
            &mut out
        )
        .is_err());
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
            (&cache).into(),
            (&cache).into(),
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
            (&cache).into(),
            (&cache).into(),
            &[seq],
            &[0, 7],
            &mut out
        )
        .is_err());
        paged_attention(
            &pool,
            &params,
            &q,
            (&cache).into(),
            (&cache).into(),
            &[seq],
            &[0, 1],
            &mut out,
        )
        .unwrap();
    }
}
