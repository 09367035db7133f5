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
//! cover all query heads sharing that kv head. Each task walks the sequence's cache blocks once,
//! in tiles of at most 16 keys at fixed offsets inside each block, and folds each tile into
//! every (row, head) pair of the task (one online-softmax rescale per tile; up to three pairs
//! that see the same keys share each K/V row load, six with AVX-512) while the tile's K/V rows
//! are hot in L1, so K/V are read once per group and no full score row is ever materialized.
//!
//! Keys are folded in **segments** of [`SEGMENT_KEYS`] positions (whole cache blocks, at fixed
//! positions `0, S, 2S, ...` of every sequence): each pair starts every segment from an empty
//! softmax state and merges the segment's (max, sum, accumulator) into its running result in
//! segment order ([`merge_segment`]). When a small decode batch would leave threads idle, a
//! long sequence's segments are split over several tasks (flash-decoding): each task stores its
//! segments' states, and one pass after the parallel region merges them in the same order. A
//! task therefore never re-reads another task's K/V (as splitting the heads of a group would),
//! and only short contexts fall back to splitting head groups.
//!
//! A query row's result depends only on its own query, its position and the cached K/V: every
//! (row, head) pair sees the same tiles and segments in the same order with the same
//! operations, so chunking, batching, grouping, segment splitting and thread count never
//! change its floating-point results.

use std::cell::RefCell;

use crate::kv_dtype::{KvCacheSlice, KvCacheSliceMut, KvCodec, Rows};
use crate::pool::{SharedMut, ThreadPool};
use crate::simd::{KeyTile, OnlineSoftmax, VectorOps, GROUP, TILE};
use crate::KernelError;

/// Most query rows handled by one attention task.
const QUERY_CHUNK: usize = 16;

/// Most (row, head) pairs in one task.
const MAX_PAIRS: usize = 64;

/// f32 accumulators a task keeps in its thread's scratch (16 KiB, so they stay in L1 beside a
/// tile). Tasks are cut to fit it; only a head larger than this (never seen in practice) makes
/// a task's scratch larger.
const ACC_CAPACITY: usize = 4096;

/// A plan splits verification rows, long contexts into segment ranges, then head groups, until
/// the batch has this many tasks per thread (or nothing is left to split).
const MIN_TASKS_PER_THREAD: usize = 2;

/// Fewest query rows of a sequence a row split leaves in one task: below this the tasks'
/// extra passes over the context (each decodes every tile again) cost more than the
/// segment split's merge.
const MIN_SPLIT_ROWS: usize = 4;

/// Keys per attention segment (rounded to whole cache blocks): the unit a long context's keys
/// are split into across threads, and the points where every pair merges its running softmax.
const SEGMENT_KEYS: usize = 128;

/// Cache blocks whose K/V rows a task prefetches ahead of the block it folds in.
const PREFETCH_BLOCKS: usize = 2;

/// Floats stored per (pair, segment) state of a split sequence: max, sum, then the accumulator.
const STATE_HEADER: usize = 2;

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

    /// Keys per segment: [`SEGMENT_KEYS`] rounded down to whole blocks (one block at least).
    #[inline]
    fn segment_keys(&self) -> usize {
        (SEGMENT_KEYS / self.block_size).max(1) * self.block_size
    }

    /// The segments holding keys some query row of `seq` sees.
    fn segments(&self, seq: &AttentionSeq) -> std::ops::Range<usize> {
        let keys = self.segment_keys();
        let first_position = seq.context_len - seq.query_len;
        self.first_visible(first_position) / keys..seq.context_len.div_ceil(keys)
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
/// converted to the cache's type (round-to-nearest-even, saturating; see [`KvCacheDType`](crate::KvCacheDType)).
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
    paged_attention_with_sinks(pool, p, None, q, k_cache, v_cache, seqs, block_tables, out)
}

/// [`paged_attention`] with learned **attention sinks** (gpt-oss): `sinks[h]` is one more
/// logit in query head `h`'s softmax that attends to nothing, so each output is
/// `Σ e^(s_i) v_i / (Σ e^(s_i) + e^(sinks[h]))` (HF's `cat([scores, sinks])` softmax with the
/// sink column dropped). It is folded in as a last segment of one key with weight sum 1 and
/// a zero value, after every real segment, so a row's result still depends only on its own
/// query, position and cached K/V. `None` is plain attention.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_with_sinks(
    pool: &ThreadPool,
    p: &AttentionParams,
    sinks: Option<&[f32]>,
    q: &[f32],
    k_cache: KvCacheSlice<'_>,
    v_cache: KvCacheSlice<'_>,
    seqs: &[AttentionSeq],
    block_tables: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    if let Some(sinks) = sinks {
        if sinks.len() != p.num_heads {
            return Err(KernelError::LengthMismatch {
                what: "attention sinks",
                expected: p.num_heads,
                actual: sinks.len(),
            });
        }
    }
    attention_with(
        VectorOps::detect(),
        pool,
        p,
        sinks,
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
    sinks: Option<&[f32]>,
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
    // Where each split sequence's segment states start in `states` (None: not split).
    let mut state_starts = Vec::with_capacity(seqs.len());
    let state_len = STATE_HEADER + p.head_dim;
    let mut total = 0usize;
    let mut total_states = 0usize;
    for seq in seqs {
        task_starts.push(total);
        total += plan.tasks_per_seq(seq);
        if plan.splits(seq) {
            state_starts.push(Some(total_states));
            total_states += seq.query_len * p.num_heads * p.segments(seq).len() * state_len;
        } else {
            state_starts.push(None);
        }
    }
    task_starts.push(total);
    // Zero is an empty state (sum 0), which merging skips: segments a pair never reaches stay so.
    let mut states = vec![0.0f32; total_states];
    let output = SharedMut::new(out);
    let state_sink = SharedMut::new(&mut states);
    let run_task = |task: usize, source: &mut dyn FnMut(&TaskInputs<'_>)| {
        let seq_index = task_starts.partition_point(|&start| start <= task) - 1;
        let seq = &seqs[seq_index];
        let work = plan.task(seq, task - task_starts[seq_index]);
        let table = &block_tables[seq.block_table_start..seq.block_table_start + seq.num_blocks];
        let sink = match state_starts[seq_index] {
            Some(start) => {
                let segments = p.segments(seq);
                Sink::States {
                    states: &state_sink,
                    start,
                    first_segment: segments.start,
                    n_segments: segments.len(),
                }
            }
            None => Sink::Output(&output),
        };
        source(&TaskInputs {
            kernels,
            p,
            sinks,
            q,
            seq,
            table,
            work: &work,
            sink,
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
    // Split sequences: merge every pair's segment states in segment order.
    if total_states == 0 {
        return Ok(());
    }
    let d = p.head_dim;
    let q_dim = p.num_heads * d;
    let mut running = vec![0.0f32; d];
    for (seq, start) in seqs.iter().zip(&state_starts) {
        let Some(start) = *start else { continue };
        let n_segments = p.segments(seq).len();
        for pair in 0..seq.query_len * p.num_heads {
            let first = start + pair * n_segments * state_len;
            let mut state = OnlineSoftmax::EMPTY;
            for stored in states[first..first + n_segments * state_len].chunks_exact(state_len) {
                let segment = OnlineSoftmax {
                    max: stored[0],
                    sum: stored[1],
                };
                let acc = &stored[STATE_HEADER..];
                merge_segment(kernels, &mut state, &mut running, segment, acc);
            }
            let row = seq.query_start + pair / p.num_heads;
            let head = pair % p.num_heads;
            let at = row * q_dim + head * d;
            // SAFETY: the parallel region has ended; `at..at + d` lies inside `out` (validated
            // against q's shape).
            let target = unsafe { output.slice_mut(at, d) };
            let sink = sinks.map(|sinks| sinks[head]);
            finish_pair(kernels, &mut state, &mut running, sink, target);
        }
    }
    Ok(())
}

/// Folds a segment's softmax state and accumulator into a pair's running ones: the running
/// maximum becomes the larger of the two and each side is rescaled to it. An empty segment
/// (sum 0: no key of it was visible) changes nothing; into an empty running state a segment is
/// copied as it is, so a context of one segment gives exactly its tile-by-tile result.
fn merge_segment(
    kernels: VectorOps,
    running: &mut OnlineSoftmax,
    running_acc: &mut [f32],
    segment: OnlineSoftmax,
    segment_acc: &[f32],
) {
    if segment.sum == 0.0 {
        return;
    }
    if running.sum == 0.0 {
        *running = segment;
        running_acc.copy_from_slice(segment_acc);
        return;
    }
    let max = running.max.max(segment.max);
    // The tile kernels' exponential, so no result depends on the C library's `expf`.
    let (keep, add) = kernels.scalar_exp_pair(running.max - max, segment.max - max);
    running.sum = running.sum * keep + segment.sum * add;
    running.max = max;
    for (r, &s) in running_acc.iter_mut().zip(segment_acc) {
        *r = *r * keep + s * add;
    }
}

/// A pair's attention output from its final state: the accumulator over the softmax sum,
/// after the head's attention sink (if any) is merged in as one more segment of a single key
/// whose value is zero ([`paged_attention_with_sinks`]).
fn finish_pair(
    kernels: VectorOps,
    state: &mut OnlineSoftmax,
    acc: &mut [f32],
    sink: Option<f32>,
    target: &mut [f32],
) {
    if let Some(logit) = sink {
        if state.sum != 0.0 {
            let max = state.max.max(logit);
            let (keep, add) = kernels.scalar_exp_pair(state.max - max, logit - max);
            state.sum = state.sum * keep + add;
            state.max = max;
            for a in acc.iter_mut() {
                *a *= keep;
            }
        }
    }
    let inverse = 1.0 / state.sum;
    for (o, &a) in target.iter_mut().zip(acc.iter()) {
        *o = a * inverse;
    }
}

thread_local! {
    /// A task's f32 accumulators (two per pair: the segment's and the running one), reused by
    /// every task this thread runs.
    static ACC_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

    /// Starts loading the K/V rows of `count` keys from element `base` (rows `kv_dim` apart,
    /// `d` values each) into cache, ahead of their tiles.
    fn prefetch(&self, base: usize, count: usize, kv_dim: usize, d: usize);
}

/// `count` rows of `d` elements from `base`, `kv_dim` apart.
fn key_rows(base: usize, count: usize, kv_dim: usize, d: usize) -> Rows {
    Rows {
        start: base,
        stride: kv_dim,
        count,
        width: d,
    }
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

    fn prefetch(&self, base: usize, count: usize, kv_dim: usize, d: usize) {
        let rows = key_rows(base, count, kv_dim, d);
        KvCacheSlice::F32(self.keys).prefetch_rows(rows);
        KvCacheSlice::F32(self.values).prefetch_rows(rows);
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
        let rows = key_rows(base, visible, kv_dim, d);
        self.keys.decode_rows(self.codec, rows, keys);
        self.values.decode_rows(self.codec, rows, values);
        KeyTile {
            keys: &keys[..visible * d],
            values: &values[..visible * d],
            stride: d,
            count: visible,
        }
    }

    fn prefetch(&self, base: usize, count: usize, kv_dim: usize, d: usize) {
        let rows = key_rows(base, count, kv_dim, d);
        self.keys.prefetch_rows(rows);
        self.values.prefetch_rows(rows);
    }
}

/// Where a task's finished segments go.
#[derive(Clone, Copy)]
enum Sink<'a> {
    /// Merged into the pair's running state in the task; the result written to the output.
    Output(&'a SharedMut<f32>),
    /// Stored as (max, sum, accumulator) states, `n_segments` per pair (pair-major, pairs
    /// row-major over the sequence's rows and heads; the sequence's segments from
    /// `first_segment`) from element `start`, for the merge pass.
    States {
        states: &'a SharedMut<f32>,
        start: usize,
        first_segment: usize,
        n_segments: usize,
    },
}

/// What one task attends over and where it writes.
struct TaskInputs<'a> {
    kernels: VectorOps,
    p: &'a AttentionParams,
    /// Per query head, the attention sink's logit.
    sinks: Option<&'a [f32]>,
    q: &'a [f32],
    seq: &'a AttentionSeq,
    table: &'a [u32],
    work: &'a TaskWork,
    sink: Sink<'a>,
}

/// How `paged_attention` cuts a batch into tasks. Any cut gives the same results (each
/// (row, head) pair's operations do not depend on its task), so the plan only balances reuse
/// of each K/V tile across a task's pairs against keeping every thread busy.
///
/// A sequence with few query rows (a decode or verification step) takes all kv heads whose
/// pairs fit one task (`kv_span_of`): its cache blocks hold every kv head's row of a token
/// side by side, so such a task streams whole blocks front to back instead of picking one
/// kv head's slice out of each token (a strided read the hardware prefetchers follow poorly
/// once the cache no longer fits in L2).
///
/// Too few tasks for the threads: a verification step's rows are split first (while every
/// task keeps at least [`MIN_SPLIT_ROWS`] of them: equal tasks, each over the whole context,
/// with no merge pass), then long contexts into segment ranges (larger ranges first), then kv
/// heads, then head groups.
#[derive(Debug, Clone, Copy)]
struct Plan {
    params: AttentionParams,
    /// Query heads sharing one kv head.
    group: usize,
    /// Each kv head's query heads are split into this many contiguous parts (a task then
    /// covers one kv head).
    parts: usize,
    /// A sequence's query rows (up to one task's worth) are split into this many parts, each
    /// at least [`MIN_SPLIT_ROWS`] rows (1: no split).
    row_parts: usize,
    /// A sequence whose rows fit one task has its segments split into up to this many
    /// contiguous ranges, one task each (1: no split).
    segment_parts: usize,
    /// Most kv heads one task covers.
    max_kv_span: usize,
}

/// One task: query rows `rows` (relative to the sequence) of the query heads `heads` (relative
/// to their group) of every kv head in `kv_heads`, over the keys of `segments`.
#[derive(Debug)]
struct TaskWork {
    kv_heads: std::ops::Range<usize>,
    heads: std::ops::Range<usize>,
    rows: std::ops::Range<usize>,
    segments: std::ops::Range<usize>,
}

impl TaskWork {
    /// The task's query heads (absolute), kv head by kv head.
    #[cfg(test)]
    fn query_heads(&self, group: usize) -> impl Iterator<Item = usize> + '_ {
        self.kv_heads
            .clone()
            .flat_map(move |kv| self.heads.clone().map(move |h| kv * group + h))
    }
}

impl Plan {
    fn new(p: &AttentionParams, seqs: &[AttentionSeq], threads: usize) -> Plan {
        let group = p.num_heads / p.num_kv_heads;
        let max_heads = (ACC_CAPACITY / p.head_dim).clamp(1, MAX_PAIRS).min(group);
        let mut plan = Plan {
            params: *p,
            group,
            parts: group.div_ceil(max_heads),
            row_parts: 1,
            segment_parts: 1,
            max_kv_span: p.num_kv_heads,
        };
        if threads < 2 {
            return plan;
        }
        let target = MIN_TASKS_PER_THREAD * threads;
        let tasks = |plan: &Plan| -> usize { seqs.iter().map(|seq| plan.tasks_per_seq(seq)).sum() };
        // Few tasks (a small batch): split verification rows first (equal tasks that each read
        // the whole context, and nothing to merge) ...
        let most_rows = seqs
            .iter()
            .map(|seq| seq.query_len.min(plan.rows_of(seq)))
            .max()
            .unwrap_or(1);
        while tasks(&plan) < target
            && plan.row_parts < most_rows
            && most_rows.div_ceil(plan.row_parts + 1) >= MIN_SPLIT_ROWS
        {
            plan.row_parts += 1;
        }
        // ... then long contexts into segment ranges (each task still reads its K/V once for
        // the whole head group) ...
        let most_segments = seqs
            .iter()
            .map(|seq| p.segments(seq).len())
            .max()
            .unwrap_or(1);
        while tasks(&plan) < target && plan.segment_parts < most_segments {
            plan.segment_parts += 1;
        }
        // ... then kv heads ...
        while tasks(&plan) < target && plan.max_kv_span > 1 {
            plan.max_kv_span -= 1;
        }
        // ... then head groups, until every thread has some.
        while plan.parts < group && tasks(&plan) < target {
            plan.parts += 1;
            plan.max_kv_span = 1;
        }
        plan
    }

    /// Query rows per task when each task covers `heads` query heads.
    fn rows_for(&self, heads: usize) -> usize {
        (ACC_CAPACITY / (heads * self.params.head_dim))
            .min(MAX_PAIRS / heads)
            .clamp(1, QUERY_CHUNK)
    }

    /// Query heads of one kv head that a task covers (the larger parts).
    fn part_heads(&self) -> usize {
        self.group.div_ceil(self.parts)
    }

    /// Kv heads per task for `seq`: with whole head groups, the most (a divisor of the kv
    /// heads, at most `max_kv_span`) whose pairs for all of `seq`'s rows, up to a chunk, fit
    /// one task; else 1.
    fn kv_span_of(&self, seq: &AttentionSeq) -> usize {
        if self.parts > 1 {
            return 1;
        }
        let rows = seq.query_len.clamp(1, QUERY_CHUNK);
        let kv_heads = self.params.num_kv_heads;
        (1..=self.max_kv_span.min(kv_heads))
            .rev()
            .filter(|span| kv_heads.is_multiple_of(*span))
            .find(|span| {
                let pairs = span * self.group * rows;
                pairs <= MAX_PAIRS && pairs * self.params.head_dim <= ACC_CAPACITY
            })
            .unwrap_or(1)
    }

    /// Query rows per task for `seq`.
    fn rows_of(&self, seq: &AttentionSeq) -> usize {
        let span = self.kv_span_of(seq);
        let rows = self.rows_for(span * self.part_heads());
        if self.row_parts > 1 {
            rows.min(seq.query_len.div_ceil(self.row_parts)).max(1)
        } else {
            rows
        }
    }

    /// Segment ranges `seq` is split into (1: its tasks merge their segments themselves).
    fn segment_parts_of(&self, seq: &AttentionSeq) -> usize {
        if seq.query_len > self.rows_of(seq) {
            return 1;
        }
        self.segment_parts
            .min(self.params.segments(seq).len())
            .max(1)
    }

    /// Whether `seq`'s tasks store segment states for the merge pass.
    fn splits(&self, seq: &AttentionSeq) -> bool {
        self.segment_parts_of(seq) > 1
    }

    fn tasks_per_seq(&self, seq: &AttentionSeq) -> usize {
        self.params.num_kv_heads / self.kv_span_of(seq)
            * self.parts
            * seq.query_len.div_ceil(self.rows_of(seq))
            * self.segment_parts_of(seq)
    }

    /// The `local`-th task of `seq`. Tasks come heaviest first (later rows see more keys, and
    /// earlier head parts and segment ranges are at least as large), which helps the pool's
    /// dynamic hand-out.
    fn task(&self, seq: &AttentionSeq, local: usize) -> TaskWork {
        let span = self.kv_span_of(seq);
        let rows = self.rows_of(seq);
        let kv_tasks = self.params.num_kv_heads / span;
        let first_kv = (local % kv_tasks) * span;
        let part = (local / kv_tasks) % self.parts;
        let split = self.segment_parts_of(seq);
        let range = (local / (kv_tasks * self.parts)) % split;
        let chunks = seq.query_len.div_ceil(rows);
        let chunk = chunks - 1 - local / (kv_tasks * self.parts * split);
        let rows_start = chunk * rows;
        let all = self.params.segments(seq);
        let n = all.len();
        TaskWork {
            kv_heads: first_kv..first_kv + span,
            heads: (part * self.group).div_ceil(self.parts)
                ..((part + 1) * self.group).div_ceil(self.parts),
            rows: rows_start..(rows_start + rows).min(seq.query_len),
            // Range r ends where n - (split - r - 1) * n / split segments remain behind it: the
            // larger ranges come first, as the hand-out wants.
            segments: all.start + n - (split - range) * n / split
                ..all.start + n - (split - range - 1) * n / split,
        }
    }
}

/// Online-softmax attention for every (row, head) pair of one task. Keys are walked in cache
/// blocks, in tiles of at most `TILE` keys at fixed offsets inside each block; within a block,
/// kv head after kv head, each tile is folded into every pair of that kv head that can see it
/// while its K/V rows are hot in L1. Each segment starts from an empty state; a finished
/// segment goes to the task's [`Sink`].
fn attend_task<S: TileSource>(job: &TaskInputs<'_>, source: &mut S) {
    let TaskInputs {
        kernels,
        p,
        sinks,
        q,
        seq,
        table,
        work,
        sink,
    } = *job;
    let d = p.head_dim;
    let q_dim = p.num_heads * d;
    let kv_dim = p.num_kv_heads * d;
    let group = p.num_heads / p.num_kv_heads;
    // Pairs one grouped kernel call takes on this path.
    let per_call = kernels.group();
    let n_heads = work.heads.len();
    let n_rows = work.rows.len();
    // Pairs of one kv head; the task's pairs are kv head-major.
    let per_kv = n_heads * n_rows;
    let n_pairs = per_kv * work.kv_heads.len();
    if n_pairs == 0 || n_pairs > MAX_PAIRS {
        return;
    }
    let first_position = seq.context_len - seq.query_len;
    // Pair `i` is kv head `work.kv_heads.start + i / per_kv`; within it, row
    // `work.rows.start + (i % per_kv) / n_heads` and head `i % n_heads` of the task's part.
    let row_of = |pair: usize| seq.query_start + work.rows.start + (pair % per_kv) / n_heads;
    let head_of = |pair: usize| {
        (work.kv_heads.start + pair / per_kv) * group + work.heads.start + pair % n_heads
    };
    // The tile loop asks for positions and queries pair by pair; worked out once here (the
    // divisions above cost ~10 % of a verification step's attention when done per tile).
    // Positions depend on the row only: the same for pair `i` of every kv head.
    let mut positions = [0usize; MAX_PAIRS];
    for (local, position) in positions[..per_kv].iter_mut().enumerate() {
        *position = first_position + work.rows.start + local / n_heads;
    }
    let mut query_starts = [0usize; MAX_PAIRS];
    for (pair, start) in query_starts[..n_pairs].iter_mut().enumerate() {
        *start = row_of(pair) * q_dim + head_of(pair) * d;
    }
    let position_of = |local: usize| positions[local];
    let query_of = |pair: usize| &q[query_starts[pair]..query_starts[pair] + d];
    // Only the pairs' part is zeroed (clearing a whole `ACC_CAPACITY` buffer per task cost
    // 1-3 % of a decode step's attention). The scratch is taken out for the task and put back
    // at its end (a re-entrant call finds it empty and grows its own).
    let mut buffers = ACC_SCRATCH.with(RefCell::take);
    buffers.clear();
    buffers.resize(2 * n_pairs * d, 0.0f32);
    // The current segment's accumulators, and the running (merged) ones.
    let (accumulators, running_accs) = buffers.split_at_mut(n_pairs * d);
    let mut states = [OnlineSoftmax::EMPTY; MAX_PAIRS];
    let mut running = [OnlineSoftmax::EMPTY; MAX_PAIRS];
    let mut finish_segment =
        |segment: usize, states: &mut [OnlineSoftmax], accumulators: &mut [f32]| {
            for (pair, (state, acc)) in states[..n_pairs]
                .iter_mut()
                .zip(accumulators.chunks_exact_mut(d))
                .enumerate()
            {
                match sink {
                    Sink::Output(_) => merge_segment(
                        kernels,
                        &mut running[pair],
                        &mut running_accs[pair * d..(pair + 1) * d],
                        *state,
                        acc,
                    ),
                    Sink::States {
                        states: stored,
                        start,
                        first_segment,
                        n_segments,
                    } => {
                        let row = row_of(pair) - seq.query_start;
                        let index = (row * p.num_heads + head_of(pair)) * n_segments
                            + (segment - first_segment);
                        let len = STATE_HEADER + d;
                        // SAFETY: each (row, head, segment) state belongs to exactly one task
                        // (pairs are disjoint across tasks of a sequence, segment ranges too),
                        // and the sequence's states lie inside the buffer (sized by the plan).
                        let target = unsafe { stored.slice_mut(start + index * len, len) };
                        target[0] = state.max;
                        target[1] = state.sum;
                        target[STATE_HEADER..].copy_from_slice(acc);
                    }
                }
                *state = OnlineSoftmax::EMPTY;
                acc.fill(0.0);
            }
        };
    let last_position = position_of(per_kv - 1);
    let segment_blocks = p.segment_keys() / p.block_size;
    let n_blocks = (last_position + 1)
        .div_ceil(p.block_size)
        .min(work.segments.end * segment_blocks);
    // Keys of pair `i` are positions `first_of(i)..=position_of(i)`; both ends grow with `i`.
    let first_of = |local: usize| p.first_visible(position_of(local));
    let first_block = (first_of(0) / p.block_size).max(work.segments.start * segment_blocks);
    // The task's kv heads sit side by side in every token's row.
    let kv_offset = work.kv_heads.start * d;
    let kv_width = work.kv_heads.len() * d;
    let mut segment = first_block / segment_blocks;
    for (block_index, &block_id) in table.iter().enumerate().take(n_blocks).skip(first_block) {
        if block_index / segment_blocks != segment {
            finish_segment(segment, &mut states, accumulators);
            segment = block_index / segment_blocks;
        }
        // The next block sits elsewhere in the cache (a block table is no stream the hardware
        // prefetcher can follow): start loading its rows while this block is folded in.
        let ahead = if block_index == first_block {
            block_index + 1..block_index + 1 + PREFETCH_BLOCKS
        } else {
            block_index + PREFETCH_BLOCKS..block_index + PREFETCH_BLOCKS + 1
        };
        for next_index in ahead.take_while(|&next| next < n_blocks) {
            let Some(&next) = table.get(next_index) else {
                break;
            };
            let keys = (last_position + 1 - next_index * p.block_size).min(p.block_size);
            let next_base = next as usize * p.block_size * kv_dim + kv_offset;
            source.prefetch(next_base, keys, kv_dim, kv_width);
        }
        for kv in 0..work.kv_heads.len() {
            let block_base =
                block_id as usize * p.block_size * kv_dim + (work.kv_heads.start + kv) * d;
            let pairs_start = kv * per_kv;
            for tile_start in (0..p.block_size).step_by(TILE) {
                let tile_first_position = block_index * p.block_size + tile_start;
                if tile_first_position > last_position {
                    break;
                }
                let tile_len = TILE.min(p.block_size - tile_start);
                // The keys of the tile local pair `i` sees: rows `skip..count` of it.
                let span_of = |local: usize| {
                    let count = (position_of(local) + 1 - tile_first_position).min(tile_len);
                    (first_of(local).saturating_sub(tile_first_position), count)
                };
                // Pairs come in row order, so the ones that see the tile form a contiguous
                // range: from the first whose position reaches the tile to the last whose
                // window does.
                let mut local = tile_first_position.saturating_sub(position_of(0)) * n_heads;
                let (skip, count) = span_of(local);
                if skip >= count {
                    // Every pair that reaches this tile has its window past it already.
                    continue;
                }
                let base = block_base + tile_start * kv_dim;
                let visible = (last_position + 1 - tile_first_position).min(tile_len);
                let tile = source.tile(base, tile_len, visible, kv_dim, d);
                // Runs of consecutive pairs that see the same keys of the tile go through one
                // grouped step (at most `per_call` pairs; a run of more, but under twice that,
                // splits in halves: four as 2 + 2 on AVX2), which loads each K/V row once for
                // all of them.
                while local < per_kv {
                    let span = span_of(local);
                    let (skip, count) = span;
                    if skip >= count {
                        break;
                    }
                    let longest = (per_kv - local).min(2 * per_call);
                    let run = if p.sliding_window.is_none() && span == (0, tile_len) {
                        // The pair sees the whole tile, so every later one (at a later or the
                        // same position, with no window) does too.
                        longest
                    } else {
                        let mut run = 1;
                        while run < longest && span_of(local + run) == span {
                            run += 1;
                        }
                        run
                    };
                    let take = if run > per_call && run < 2 * per_call {
                        run.div_ceil(2)
                    } else {
                        run.min(per_call)
                    };
                    let pair = pairs_start + local;
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
                    local += take;
                }
            }
        }
    }
    finish_segment(segment, &mut states, accumulators);
    if let Sink::Output(output) = sink {
        for (pair, (state, acc)) in running[..n_pairs]
            .iter_mut()
            .zip(running_accs.chunks_exact_mut(d))
            .enumerate()
        {
            let head = head_of(pair);
            let start = row_of(pair) * q_dim + head * d;
            // SAFETY: each (row, head) pair belongs to exactly one task, rows of different
            // sequences are disjoint (validated), and the range lies inside `out` (validated
            // against q's shape).
            let target = unsafe { output.slice_mut(start, d) };
            finish_pair(kernels, state, acc, sinks.map(|sinks| sinks[head]), target);
        }
    }
    ACC_SCRATCH.with(|cell| cell.replace(buffers));
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
    reference_attention_with_sinks(p, None, q, k_cache, v_cache, seqs, block_tables, out)
}

/// [`reference_attention`] with attention sinks ([`paged_attention_with_sinks`]): the sink's
/// logit joins the f64 score row's softmax and contributes no value.
#[allow(clippy::too_many_arguments)]
pub fn reference_attention_with_sinks(
    p: &AttentionParams,
    sinks: Option<&[f32]>,
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
                let sink = sinks.map(|sinks| f64::from(sinks[head]));
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 =
                    weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
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
mod tests;
