//! AMX int8 tile kernels for the eight-row group layouts — `interleaved.rs` (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4) and `kquant.rs` (Q4_K, Q5_K, Q6_K) — at prefill and
//! batches of [`min_rows`] rows or more.
//!
//! One tile multiply (`tdpbssd`) yields the exact integer block dots of 16 activation rows
//! against 16 weight rows for one 32-element block: A is 16 rows × 32 int8 activations, 512
//! contiguous bytes of a per-call copy of the activations tiled `[row tile][block][16 rows]`
//! (`tile_activations`; read in place, rows `in_features` apart, the A loads cost ~8-15 % more
//! on 8192-wide matrices); B is two eight-row groups of the block's weight levels unpacked to
//! int8 in the tile's four-byte (VNNI) layout `[8 k-quads][16 columns][4 bytes]` (`unpack.rs`;
//! Q6_K: two B tiles, one per 16-element half, the other half zero); C is 16 × 16 i32. C is
//! stored and folded into one f32 accumulator per (activation row, weight row) by
//! `unpack::BlockVectors`, in the scalar twins' order, so results are bitwise equal to the
//! scalar and AVX2 paths, and a row's result never depends on which tile or batch it lands in.
//!
//! A task owns a range of 16-column tiles; for each it unpacks the blocks' B tiles and column
//! parameters into a per-thread buffer a chunk at a time (`unpack::Weights::chunk_blocks`,
//! at most [`CHUNK_BLOCKS`], so they stay in L1: at 2048-wide rows 16-row calls took 0.63-0.75x
//! the time of unpacking the whole row first) and sweeps all activation rows over each chunk,
//! 16 at a time (the last tile shorter, with its own tile configuration; successive chunks
//! sweep in opposite directions, so the configuration changes once per chunk), carrying the
//! accumulators across chunks. Per activation tile, block `b + 1`'s tile multiply is issued
//! right after block `b`'s C tile is stored, so the tile unit runs while block `b`'s epilogue
//! does (the order of the float operations per output element is unchanged). Tile state is
//! configured at the start of each task and released at its end. Only runs with an [`Amx`]
//! token, which exists only once the CPU, the OS permission (`crate::cpu::amx_enabled`) and
//! AVX-512 F/BW are all there.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::activation::QuantizedActivations;
use super::interleaved::GROUP;
use super::unpack::{
    for_column_tiles, prefetch_share, BlockParams, BlockVectors, ColumnTarget, SuperBlockMins,
    Weights, B_TILE_BYTES, K_MIN, MIN, PLAIN, Q6, TILE_COLS,
};
use crate::aligned::AlignedBytes;
use crate::cpu::tiles::{release_tiles, TileConfig};
use crate::cpu::{amx_enabled, CpuFeatures};
use crate::dtype::DType;
use crate::pool::ThreadPool;
use crate::quant::QK;
use crate::simd::first_lanes_mask;

/// Activation rows from which [`super::QMatrix::matmul`] takes the AMX path for `dtype`.
/// Below it the AVX-512 VNNI row sweeps (`vnni_tiles.rs`, from 5 rows) or the group kernels
/// run: each AMX call unpacks its weight blocks into tiles and folds every block's 16 × 16
/// dots whatever the row count, paid back only over enough rows. The crossovers, measured
/// with both threads of the 2-core Xeon (`examples/matmul_speed 2`, bench/RESULTS.md,
/// 2026-11-28 nineteenth session, against the row sweeps): Q4_0, Q5_0, IQ4_NL and Q8_0 gain
/// from 6-8 rows (the default model's Q8_0 head at 10-14 rows 1151-1415 µs against
/// 2148-2364; 2048-wide Q4_0 at 10 rows 200 against 330), Q4_1 and Q5_1 (one more
/// multiply-add per block for the min) from 9-10 (at 6-8 rows on 576-wide inputs the sweeps
/// win: Q5_1 at 6 rows 39-44 against 55-56 µs); Q5_K and Q6_K about even at 12-14, Q4_K
/// behind up to 24 rows on 8192-wide inputs (1.1-1.2x at 32 in the ninth session). The row
/// sweeps' per-row weight streaming wins for decode and small batches. MXFP4 (unmeasured)
/// takes IQ4_NL's threshold: the same unpacking (a table lookup) and epilogue.
pub(crate) fn min_rows(dtype: DType) -> usize {
    match dtype {
        DType::Q4_K => 32,
        DType::Q5_K | DType::Q6_K => 16,
        DType::Q4_1 | DType::Q5_1 => 10,
        _ => MIN_ROWS_ANY,
    }
}

/// The smallest [`min_rows`], every type's but the exceptions listed there.
const MIN_ROWS_ANY: usize = 8;

/// [`min_rows`] for the start-up line, read from it: `8+ rows (10+ for Q4_1/Q5_1, ...)`,
/// the exceptions by threshold, each threshold's types in [`DType::ALL`] order.
pub(crate) fn min_rows_summary() -> String {
    let mut exceptions: Vec<(usize, Vec<String>)> = Vec::new();
    for dtype in DType::ALL.into_iter().filter(|dtype| dtype.is_quantized()) {
        let rows = min_rows(dtype);
        if rows == MIN_ROWS_ANY {
            continue;
        }
        let name = dtype.name().to_uppercase();
        match exceptions.iter_mut().find(|(r, _)| *r == rows) {
            Some((_, names)) => names.push(name),
            None => exceptions.push((rows, vec![name])),
        }
    }
    exceptions.sort_by_key(|(rows, _)| *rows);
    let exceptions: Vec<String> = exceptions
        .iter()
        .map(|(rows, names)| format!("{rows}+ for {}", names.join("/")))
        .collect();
    format!("{MIN_ROWS_ANY}+ rows ({})", exceptions.join(", "))
}

/// Activation rows per A tile (the most a tile holds).
const TILE_ROWS: usize = 16;
/// Proof that this process may run the AMX kernels: AMX int8 tiles with the OS permission
/// granted, and AVX-512 F/BW for unpacking and the float epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amx {
    _granted: (),
}

impl Amx {
    /// The token for this process, if AMX is usable (cached).
    pub(crate) fn detect() -> Option<Amx> {
        static AMX: OnceLock<Option<Amx>> = OnceLock::new();
        *AMX.get_or_init(|| Amx::for_features(CpuFeatures::get()))
    }

    /// The token if `features` (limited to what this CPU has) include AMX int8 and AVX-512
    /// F/BW and the permission was granted; `None` otherwise, so a CPU without AMX (or a
    /// refused permission) keeps the AVX2/scalar kernels.
    pub(crate) fn for_features(features: &CpuFeatures) -> Option<Amx> {
        let usable = features.usable();
        let wanted = usable.amx_tile && usable.amx_int8 && usable.avx512f && usable.avx512bw;
        (wanted && amx_enabled()).then_some(Amx { _granted: () })
    }
}

/// The tile configuration for `rows` activation rows: tmm0 = A (`rows` × 32 bytes), tmm1 and
/// tmm4 = B (8 × 64 bytes), tmm2 and tmm3 = C (`rows` × 16 i32).
fn tile_config(rows: usize) -> TileConfig {
    let b = (QK / 4, 4 * TILE_COLS);
    let c = (rows, 4 * TILE_COLS);
    TileConfig::new(&[(rows, QK), b, c, c, b])
}

/// Per-thread buffers, grown to the largest shape seen and then reused.
#[derive(Default)]
struct Scratch {
    /// Unpacked B tiles of one 16-column tile, [`Weights::tiles_per_block`] per block.
    b_tiles: AlignedBytes,
    /// Column parameters of one 16-column tile per block.
    params: Vec<BlockParams>,
    /// Every activation tile's accumulators for the current column tile, carried across
    /// block chunks.
    acc: Vec<[[f32; TILE_COLS]; TILE_ROWS]>,
}

/// Most blocks unpacked at a time ([`Weights::chunk_blocks`]): their B tiles and parameters
/// stay in L1 while every activation tile sweeps them.
const CHUNK_BLOCKS: usize = 24;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The calling thread's [`tile_activations`] buffer, shared read-only with the workers.
    static TILED_A: RefCell<AlignedBytes> = RefCell::new(AlignedBytes::default());
    /// The calling thread's [`ActivationParams`], shared read-only with the workers.
    static X_PARAMS: RefCell<ActivationParams> = RefCell::new(ActivationParams::default());
}

/// Activation scales `d_x` and block sums `d_x · Σq` of one matmul's rows, transposed to
/// `[row tile][block][16 rows]` (zero past `n`): what every column tile's epilogue reads.
#[derive(Default)]
struct ActivationParams {
    scales: Vec<f32>,
    sums: Vec<f32>,
}

impl ActivationParams {
    fn fill(&mut self, activations: &QuantizedActivations, n: usize, blocks: usize) {
        let len = n.div_ceil(TILE_ROWS) * blocks * TILE_ROWS;
        self.scales.clear();
        self.scales.resize(len, 0.0);
        self.sums.clear();
        self.sums.resize(len, 0.0);
        for i in 0..n {
            let row = activations.row(i);
            let (t, r) = (i / TILE_ROWS, i % TILE_ROWS);
            for b in 0..blocks {
                let at = (t * blocks + b) * TILE_ROWS + r;
                self.scales[at] = row.scales[b];
                self.sums[at] = row.block_sums[b];
            }
        }
    }
}

/// Bytes of one A tile in the tiled activations: 16 rows of one 32-element block.
const A_TILE_BYTES: usize = TILE_ROWS * QK;

/// Copies `n` rows of int8 activations (`in_features` each, row-major) into `dst` as
/// `[row tile][block][16 rows][32 bytes]`, so every A tile is 512 contiguous bytes (rows
/// `in_features` apart alias a few cache sets and each A load would touch 16 half-used lines).
/// The last tile's rows past `n` keep whatever `dst` held: no output is read from them.
fn tile_activations(quants: &[i8], n: usize, in_features: usize, dst: &mut AlignedBytes) {
    let blocks = in_features / QK;
    dst.resize(n.div_ceil(TILE_ROWS) * blocks * A_TILE_BYTES);
    let dst = dst.as_i8_mut();
    for (i, row) in quants[..n * in_features]
        .chunks_exact(in_features)
        .enumerate()
    {
        let (t, r) = (i / TILE_ROWS, i % TILE_ROWS);
        for (b, block) in row.chunks_exact(QK).enumerate() {
            let at = (t * blocks + b) * A_TILE_BYTES + r * QK;
            dst[at..at + QK].copy_from_slice(block);
        }
    }
}

/// `out[n, out_features] = x · Wᵀ` for activations already quantized into `activations`, on
/// AMX tiles. Bitwise equal to the grouped kernels (`grouped.rs`) on any ISA.
pub(crate) fn matmul(
    amx: Amx,
    weights: Weights<'_>,
    pool: &ThreadPool,
    activations: &QuantizedActivations,
    n: usize,
    out: &mut [f32],
) {
    let in_features = weights.blocks() * QK;
    let quants = activations.quants();
    assert!(
        quants.len() >= n * in_features,
        "activations shorter than n rows"
    );
    TILED_A.with_borrow_mut(|tiled| {
        X_PARAMS.with_borrow_mut(|x_params| {
            tile_activations(quants, n, in_features, tiled);
            x_params.fill(activations, n, weights.blocks());
            let rows = Rows {
                tiled: tiled.as_i8(),
                params: x_params,
                n,
            };
            for_column_tiles(pool, weights.out_features(), out, &|col_tiles, target| {
                SCRATCH.with_borrow_mut(|scratch| {
                    // SAFETY: `amx` proves AMX, its permission and AVX-512 F/BW; `tiled` and
                    // `x_params` hold `n` rows of the matrix's `in_features`.
                    unsafe { run_task(amx, weights, rows, col_tiles, scratch, target) };
                });
            });
        });
    });
}

/// The activation rows of one matmul: their int8 quants tiled for A loads, and their scales
/// and sums tiled for the epilogue.
#[derive(Clone, Copy)]
struct Rows<'a> {
    /// [`tile_activations`] of the quantized rows.
    tiled: &'a [i8],
    /// [`ActivationParams::fill`] of the same rows.
    params: &'a ActivationParams,
    /// Rows.
    n: usize,
}

/// One task: column tiles `col_tiles` against all `rows.n` activation rows.
///
/// # Safety
/// `_amx` is a genuine token (AMX usable in this process, AVX-512 F/BW present), and
/// `rows.activations` holds `rows.n` quantized rows of the weights' input width.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn run_task<'o>(
    _amx: Amx,
    weights: Weights<'_>,
    rows: Rows<'_>,
    col_tiles: std::ops::Range<usize>,
    scratch: &mut Scratch,
    mut target: ColumnTarget<'o>,
) {
    let Rows {
        tiled,
        params: x,
        n,
    } = rows;
    let blocks = weights.blocks();
    let n_groups = weights.out_features().div_ceil(GROUP);
    let row_tiles = n.div_ceil(TILE_ROWS);
    assert!(
        tiled.len() >= row_tiles * blocks * A_TILE_BYTES,
        "tiled activations shorter than n rows"
    );
    let params_len = row_tiles * blocks * TILE_ROWS;
    assert!(
        x.scales.len() >= params_len && x.sums.len() >= params_len,
        "activation parameters shorter than n rows"
    );
    let tile_bytes = weights.tiles_per_block() * B_TILE_BYTES;
    let chunk = weights.chunk_blocks(CHUNK_BLOCKS);
    scratch.b_tiles.resize(chunk * tile_bytes);
    scratch.params.resize(chunk, BlockParams::default());

    let full = tile_config(TILE_ROWS);
    let last_rows = n - (row_tiles - 1) * TILE_ROWS;
    let partial = tile_config(last_rows);
    // SAFETY: `_amx` (the caller's contract).
    unsafe { full.load() };
    let mut configured_full = true;
    // Initialized once per task: a partial row tile stores fewer rows than the epilogue
    // reads, and those rows' results are never written out.
    let mut c_tiles = CTiles([[0; TILE_ROWS * TILE_COLS]; 2]);
    // Chunks sweep the row tiles forwards and backwards in turn, so the shorter last tile
    // (with its own configuration) ends one chunk and starts the next: one configuration
    // load per chunk instead of two (each `ldtilecfg` costs hundreds of cycles).
    let mut backwards = false;
    // The first chunk of every column tile starts its accumulators from zero.
    scratch.acc.clear();
    scratch.acc.resize(row_tiles, [[0.0; TILE_COLS]; TILE_ROWS]);
    for col_tile in col_tiles {
        let g0 = 2 * col_tile;
        // A missing second group (odd group count) repeats the first; its columns are never
        // written out.
        let g1 = if g0 + 1 < n_groups { g0 + 1 } else { g0 };
        let (data0, data1) = (weights.group(g0), weights.group(g1));
        // The next column tile's two groups follow this tile's in memory.
        let next = data0.as_ptr().wrapping_add(2 * data0.len());
        let next_len = 2 * data0.len();
        let mut start = 0;
        while start < blocks {
            let range = start..(start + chunk).min(blocks);
            // SAFETY: AVX-512 F/BW (caller); both groups hold `blocks` blocks and the buffers
            // were sized for a chunk above.
            unsafe {
                weights.unpack_tile(
                    data0,
                    data1,
                    range.clone(),
                    scratch.b_tiles.as_mut_ptr(),
                    &mut scratch.params,
                )
            };
            for i in 0..row_tiles {
                let t = if backwards { row_tiles - 1 - i } else { i };
                let rows = if t + 1 == row_tiles {
                    last_rows
                } else {
                    TILE_ROWS
                };
                if (rows == TILE_ROWS) != configured_full {
                    configured_full = rows == TILE_ROWS;
                    let config = if configured_full { &full } else { &partial };
                    // SAFETY: `_amx`.
                    unsafe { config.load() };
                }
                let x_at = t * blocks * TILE_ROWS;
                let args = TileArgs {
                    a: tiled[t * blocks * A_TILE_BYTES..].as_ptr(),
                    blocks: range.clone(),
                    total_blocks: blocks,
                    b_tiles: scratch.b_tiles.as_ptr(),
                    next: if i == 0 { next } else { std::ptr::null() },
                    next_len,
                    params: scratch.params.as_ptr(),
                    x_scales: x.scales[x_at..].as_ptr(),
                    x_sums: x.sums[x_at..].as_ptr(),
                };
                let acc = &mut scratch.acc[t];
                // SAFETY: the tiles are configured for `rows` rows; A's `rows` rows of
                // `in_features` bytes start inside `quants` (rows < n); the scratch buffers
                // hold the chunk's blocks and the activations' `blocks` entries from the
                // given offsets.
                unsafe {
                    match weights.epilogue() {
                        PLAIN => tile_dots::<PLAIN>(&args, &mut c_tiles, acc),
                        MIN => tile_dots::<MIN>(&args, &mut c_tiles, acc),
                        K_MIN => tile_dots::<K_MIN>(&args, &mut c_tiles, acc),
                        _ => tile_dots::<Q6>(&args, &mut c_tiles, acc),
                    }
                }
            }
            backwards = !backwards;
            start = range.end;
        }
        for (t, results) in scratch.acc.iter().enumerate() {
            let rows = if t + 1 == row_tiles {
                last_rows
            } else {
                TILE_ROWS
            };
            for (r, values) in results.iter().enumerate().take(rows) {
                let dst = target.row(t * TILE_ROWS + r, col_tile * TILE_COLS);
                let lanes = dst.len().min(TILE_COLS);
                let mask = first_lanes_mask(lanes);
                // SAFETY: AVX-512 F (caller); the mask keeps the store inside `dst`.
                unsafe {
                    _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, _mm512_loadu_ps(values.as_ptr()))
                };
            }
        }
    }
    // SAFETY: `_amx`.
    unsafe { release_tiles() };
}

/// Pointers for one activation tile against one column tile.
struct TileArgs {
    /// The tile's first A tile (block 0) in the tiled activations ([`tile_activations`]).
    a: *const i8,
    /// The blocks of this call (a chunk of the row).
    blocks: std::ops::Range<usize>,
    /// 32-element blocks per row (the prefetch spreads over all of them).
    total_blocks: usize,
    /// The chunk's unpacked B tiles, one (Q6_K: two) per block, from `blocks.start` on.
    b_tiles: *const u8,
    /// The next column tile's weight bytes, prefetched a share per block while this tile's
    /// multiplies run (null: none).
    next: *const u8,
    next_len: usize,
    /// The chunk's column parameters, from `blocks.start` on.
    params: *const BlockParams,
    /// `blocks × 16` activation scales of the tile's rows.
    x_scales: *const f32,
    /// `blocks × 16` activation block sums.
    x_sums: *const f32,
}

/// The stored C tiles of one block: one (Q6_K: two, one per 16-element half).
#[repr(C, align(64))]
struct CTiles([[i32; TILE_ROWS * TILE_COLS]; 2]);

/// Starts block `b`'s tile multiply (Q6_K: two): A into tmm0, B into tmm1 (Q6_K: and tmm4),
/// the dots into tmm2 (and tmm3). Not stored yet (see [`store_block`]), so the tile unit
/// works while the epilogue of the block before runs.
///
/// # Safety
/// As [`tile_dots`]; the previous block's C tiles are stored.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn multiply_block<const E: u8>(args: &TileArgs, b: usize) {
    let tile_bytes = if E == Q6 { 2 } else { 1 } * B_TILE_BYTES;
    let row_bytes = 4 * TILE_COLS;
    // SAFETY: the caller's contract: A block b of each configured row and B tile(s) b are in
    // bounds; the tiles are configured.
    unsafe {
        let b_tile = args.b_tiles.add((b - args.blocks.start) * tile_bytes);
        asm!(
            "tileloadd tmm0, [{a} + {a_stride}*1]",
            "tileloadd tmm1, [{b} + {row_bytes}*1]",
            "tilezero tmm2",
            "tdpbssd tmm2, tmm0, tmm1",
            a = in(reg) args.a.add(b * A_TILE_BYTES),
            a_stride = in(reg) QK,
            b = in(reg) b_tile,
            row_bytes = in(reg) row_bytes,
            options(nostack),
        );
        if E == Q6 {
            asm!(
                "tileloadd tmm4, [{b} + {row_bytes}*1]",
                "tilezero tmm3",
                "tdpbssd tmm3, tmm0, tmm4",
                b = in(reg) b_tile.add(B_TILE_BYTES),
                row_bytes = in(reg) row_bytes,
                options(nostack),
            );
        }
    }
}

/// Stores the C tile(s) [`multiply_block`] left in tmm2 (and tmm3) into `c`.
///
/// # Safety
/// As [`tile_dots`], after a [`multiply_block`] with the same `E`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store_block<const E: u8>(c: &mut CTiles) {
    let row_bytes = 4 * TILE_COLS;
    // SAFETY: the caller's contract; each C buffer holds 16 rows of 64 bytes.
    unsafe {
        asm!(
            "tilestored [{c} + {row_bytes}*1], tmm2",
            row_bytes = in(reg) row_bytes,
            c = in(reg) c.0[0].as_mut_ptr(),
            options(nostack),
        );
        if E == Q6 {
            asm!(
                "tilestored [{c} + {row_bytes}*1], tmm3",
                row_bytes = in(reg) row_bytes,
                c = in(reg) c.0[1].as_mut_ptr(),
                options(nostack),
            );
        }
    }
}

/// Folds blocks `args.blocks` of the tile's activation rows against its 16 weight columns
/// into `io[r][c]` (row `r`, column `c`; from zero when the chunk starts the row), block by
/// block in order, with epilogue `E` ([`PLAIN`], [`MIN`], [`K_MIN`], [`Q6`]).
///
/// # Safety
/// AMX usable, tiles configured for the tile's row count, AVX-512 F/BW; `args` valid for its
/// blocks; a chunk starts at a multiple of eight blocks.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tile_dots<const E: u8>(
    args: &TileArgs,
    c: &mut CTiles,
    io: &mut [[f32; TILE_COLS]; TILE_ROWS],
) {
    // (Loops, not `array::from_fn`, around intrinsics: a generic closure carries no target
    // features, so the intrinsic would not be inlined.)
    let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
    let blocks = args.blocks.clone();
    if blocks.start > 0 {
        for (acc, row) in acc.iter_mut().zip(io.iter()) {
            // SAFETY: a row holds 16 f32.
            *acc = unsafe { _mm512_loadu_ps(row.as_ptr()) };
        }
    }
    if !blocks.is_empty() {
        // SAFETY: the caller's contract.
        unsafe { multiply_block::<E>(args, blocks.start) };
    }
    for b in blocks.clone() {
        if !args.next.is_null() {
            prefetch_share(args.next, args.next_len, b, args.total_blocks);
        }
        // Block b's dots to memory, then block b + 1's multiply (running in the tile unit
        // while block b's dots are scaled below).
        // SAFETY: the caller's contract; block b was multiplied last.
        unsafe { store_block::<E>(c) };
        if b + 1 < blocks.end {
            // SAFETY: as above, block b + 1 is in the chunk.
            unsafe { multiply_block::<E>(args, b + 1) };
        }
        // SAFETY: the caller's contract: the parameters and activation scales of block b are
        // in bounds; `c` holds block b's stored dots.
        unsafe {
            let vectors = BlockVectors::load::<E>(&*args.params.add(b - blocks.start));
            let x_scales = args.x_scales.add(b * TILE_ROWS);
            let x_sums = args.x_sums.add(b * TILE_ROWS);
            for (r, acc) in acc.iter_mut().enumerate() {
                let dot0 = _mm512_load_si512(c.0[0].as_ptr().add(r * TILE_COLS).cast());
                let dot1 = if E == Q6 {
                    _mm512_load_si512(c.0[1].as_ptr().add(r * TILE_COLS).cast())
                } else {
                    _mm512_setzero_si512()
                };
                *acc = vectors.update::<E>(*x_scales.add(r), *x_sums.add(r), dot0, dot1, *acc);
            }
            if E == K_MIN && b % 8 == 7 {
                let first = b - 7;
                let mins = SuperBlockMins::load(args.params.add(first - blocks.start));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let sums: [f32; 8] =
                        std::array::from_fn(|j| *args.x_sums.add((first + j) * TILE_ROWS + r));
                    *acc = mins.apply(&sums, *acc);
                }
            }
        }
    }
    for (row, acc) in io.iter_mut().zip(&acc) {
        // SAFETY: a row holds 16 f32.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), *acc) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::tests::{
        assert_same_bits as assert_same, assert_tile_rows_batch_invariant, extreme_weights,
        isa_bits as run_isa, public_bits, tile_bits,
    };
    use crate::matmul::{Isa, QMatrix, TileKernel};
    use crate::test_util::{random_weights, Rng};

    // Every type the AMX path covers: all ten quantized types (both group layouts).
    use crate::matmul::tests::QUANTIZED as COVERED;

    fn amx_or_skip(test: &str) -> Option<Amx> {
        let amx = Amx::detect();
        if amx.is_none() {
            eprintln!(
                "{test}: AMX path skipped (AMX int8 or AVX-512 F/BW unavailable, permission \
                 refused, or {}=0; CPU: {})",
                crate::cpu::AMX_ENV,
                CpuFeatures::get()
            );
        }
        amx
    }

    fn run_amx(amx: Amx, matrix: &QMatrix, x: &[f32], n: usize, pool: &ThreadPool) -> Vec<u32> {
        tile_bits(TileKernel::Amx(amx), matrix, x, n, pool)
    }

    /// AMX results equal the scalar twin's bit for bit, for every covered type, batch sizes
    /// around the 16-row tile, odd output widths (a padded last group and a half-empty last
    /// column tile) and several input widths; the public entry point (AMX from `min_rows`
    /// rows, the grouped kernels below) agrees too.
    #[test]
    fn amx_equals_scalar_twin_bitwise() {
        let Some(amx) = amx_or_skip("amx_equals_scalar_twin_bitwise") else {
            return;
        };
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(19);
        for dtype in COVERED {
            // Odd widths: a padded last group and a half-empty last column tile.
            for &(rows, cols) in &[(37usize, 256usize), (16, 512), (24, 768), (9, 1536)] {
                let bytes = random_weights(&mut rng, dtype, rows, cols);
                let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
                for n in [1usize, 8, 16, 17, 31, 32, 33, 64, 100] {
                    let x = rng.vec(n * cols, -2.0, 2.0);
                    let scalar = run_isa(Isa::Scalar, &matrix, &x, n, &pool);
                    let tiles = run_amx(amx, &matrix, &x, n, &pool);
                    assert_same(&tiles, &scalar, &format!("{dtype} {rows}x{cols} n={n}"));
                    let public = public_bits(&matrix, &x, n, &pool);
                    assert_same(
                        &public,
                        &scalar,
                        &format!("{dtype} {rows}x{cols} n={n} matmul"),
                    );
                }
            }
        }
    }

    /// The largest integer dots each type can produce (every level at its extreme, every
    /// activation at -127, K-quant scales at their maximum) still match the scalar twin: no
    /// tile sum or scaled dot loses a bit.
    #[test]
    fn amx_extreme_values_equal_scalar() {
        let Some(amx) = amx_or_skip("amx_extreme_values_equal_scalar") else {
            return;
        };
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(29);
        let (rows, cols, n) = (24usize, 512usize, 19usize);
        for dtype in COVERED {
            let bytes = extreme_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            let x = vec![-2.0f32; n * cols];
            let scalar = run_isa(Isa::Scalar, &matrix, &x, n, &pool);
            let tiles = run_amx(amx, &matrix, &x, n, &pool);
            assert_same(&tiles, &scalar, &format!("{dtype} extreme"));
        }
    }

    /// A row's result does not depend on the batch it is in, on its position inside a tile,
    /// or on the thread count: sub-batches starting at odd offsets (so rows land in other
    /// tiles and tile positions) and single rows on the non-AMX path give the same bits.
    #[test]
    fn amx_rows_are_batch_invariant() {
        let Some(amx) = amx_or_skip("amx_rows_are_batch_invariant") else {
            return;
        };
        assert_tile_rows_batch_invariant(
            TileKernel::Amx(amx),
            23,
            (45, 512, 70),
            &[(3, 16), (5, 21), (40, 30)],
            &[0, 17, 69],
        );
    }

    /// The start-up line's thresholds come from `min_rows` itself (the literal it printed
    /// before it was derived).
    #[test]
    fn min_rows_summary_lists_the_exceptions() {
        assert_eq!(
            min_rows_summary(),
            "8+ rows (10+ for Q4_1/Q5_1, 16+ for Q5_K/Q6_K, 32+ for Q4_K)"
        );
    }

    /// Without AMX int8 (or without AVX-512 F/BW next to it) there is no token, so matmul keeps
    /// the AVX2/scalar kernels; with every feature the token exists exactly when this process
    /// has AMX with the permission.
    #[test]
    fn hosts_without_amx_fall_back() {
        assert_eq!(Amx::for_features(&CpuFeatures::NONE), None);
        let cpu = *CpuFeatures::get();
        let no_amx = CpuFeatures {
            amx_int8: false,
            amx_tile: false,
            ..cpu
        };
        assert_eq!(Amx::for_features(&no_amx), None);
        let no_avx512 = CpuFeatures {
            avx512bw: false,
            ..cpu
        };
        assert_eq!(Amx::for_features(&no_avx512), None);
        let expected = cpu.amx_int8
            && cpu.amx_tile
            && cpu.avx512f
            && cpu.avx512bw
            && crate::cpu::amx_enabled();
        assert_eq!(Amx::detect().is_some(), expected);
        if !expected {
            eprintln!("hosts_without_amx_fall_back: this process runs without AMX ({cpu})");
        }
    }
}
