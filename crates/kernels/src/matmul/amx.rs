//! AMX int8 tile kernels for the eight-row group layouts — `interleaved.rs` (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, IQ4_NL, IQ4_XS) and `kquant.rs` (Q4_K, Q5_K, Q6_K) — at prefill and batches of
//! [`min_rows`] rows or more.
//!
//! One tile multiply (`tdpbssd`) yields the exact integer block dots of 16 activation rows
//! against 16 weight rows for one 32-element block: A is 16 rows × 32 int8 activations, 512
//! contiguous bytes of a per-call copy of the activations tiled `[row tile][block][16 rows]`
//! (`tile_activations`; read in place, rows `in_features` apart, the A loads cost ~8-15 % more
//! on 8192-wide matrices); B is two eight-row
//! groups of the block's weight levels unpacked to int8 in the tile's four-byte (VNNI) layout,
//! `[8 k-quads][16 columns][4 bytes]` — exactly the layouts' steps, two groups side by side,
//! so unpacking is a mask/shift (plus the Q4_0/Q5_0/Q6_K offset, the fifth bits, the top bit
//! pairs of Q6_K's fourth block or the IQ4 table) per 64 bytes; C is 16 × 16 i32. C is stored and the block's scales
//! applied in AVX-512 floats with one accumulator per (activation row, weight row), in the
//! scalar twins' order: for every block `acc = fma(d_w · d_x, dot, acc)`, then for Q4_1/Q5_1
//! `acc = fma(m_w, d_x · Σx, acc)`; K-quants multiply the dot by the sub-block's integer scale
//! first (Q6_K: two dots, one per 16-element half with its own scale, from two B tiles whose
//! other half is zero) and Q4_K/Q5_K end each super-block with the min term. Results are
//! therefore bitwise equal to the scalar and AVX2 paths, and a row's result never depends on
//! which tile or batch it lands in.
//!
//! A task owns a range of 16-column tiles; for each it unpacks every block's B tile and column
//! parameters once into a per-thread buffer and then sweeps all activation rows, 16 at a time
//! (the last tile shorter, with its own tile configuration). Per activation tile, block
//! `b + 1`'s tile multiply is issued right after block `b`'s C tile is stored, so the tile unit
//! runs while block `b`'s epilogue does (the order of the float operations per output element
//! is unchanged). Tile state is configured at the
//! start of each task and released at its end. Only runs with an [`Amx`] token, which exists
//! only once the CPU, the OS permission (`crate::cpu::amx_enabled`) and AVX-512 F/BW are all
//! there.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::activation::QuantizedActivations;
use super::grouped::GroupedLayout;
use super::interleaved::{GroupKind, Groups, GROUP, NIBBLE_BYTES};
use super::kquant::{self, KGroups, KKind};
use crate::cpu::tiles::{release_tiles, TileConfig};
use crate::cpu::{amx_enabled, CpuFeatures};
use crate::dtype::DType;
use crate::pool::{SharedMut, ThreadPool};
use crate::quant::{KVALUES_IQ4NL, QK, QK_K};
use crate::simd::first_lanes_mask;

/// Activation rows from which [`super::QMatrix::matmul`] takes the AMX path for `dtype`: the
/// crossover measured one thread per kernel on the Xeon (bench/RESULTS.md, 2026-11-26 ninth
/// session): at 8 rows the tiles ran 0.56-0.85x the AVX-512 VNNI group kernels on 2048-wide
/// matrices of every type (each call unpacks its weight blocks into tiles, paid back only over
/// enough rows), about even at 12, and ahead at 16 for every type but Q4_K (0.97-0.98x at 16,
/// 1.1-1.2x at 32). Fewer rows keep the group kernels, whose per-row weight streaming wins for
/// decode and small batches.
pub(crate) fn min_rows(dtype: DType) -> usize {
    match dtype {
        DType::Q4_K => 32,
        _ => 16,
    }
}

/// The smallest [`min_rows`] of any type (for the start-up line).
pub(crate) const MIN_ROWS_ANY: usize = 16;
/// Activation rows per A tile (the most a tile holds).
const TILE_ROWS: usize = 16;
/// Weight rows per B tile: two interleaved groups.
const TILE_COLS: usize = 2 * GROUP;
/// Bytes of one unpacked B tile: 8 k-quads × 16 columns × 4 bytes.
const B_TILE_BYTES: usize = QK * TILE_COLS;

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

/// How a block's integer dots become f32 (each the scalar twin's order per output element):
/// `acc = fma(d_w · d_x, dot, acc)` per block.
const PLAIN: u8 = 0;
/// Q4_1/Q5_1: then `acc = fma(m_w, d_x · Σx, acc)` per block.
const MIN: u8 = 1;
/// Q4_K/Q5_K: the dot times the sub-block's integer scale; after each super-block's eight
/// blocks `acc = fma(-dmin, Σ_j fma(min_j, d_x · Σx, ·), acc)`.
const K_MIN: u8 = 2;
/// Q6_K: two dots (elements 0..16 and 16..32) times their integer scales, summed.
const Q6: u8 = 3;

/// One 32-element block's column parameters for a 16-column tile.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct BlockParams {
    /// `d_w` (IQ4_XS `d · (ls - 32)`; K-quants the super-block's `d`).
    scale: [f32; TILE_COLS],
    /// Q4_1/Q5_1 `m`; Q4_K/Q5_K the sub-block's 6-bit min.
    min: [f32; TILE_COLS],
    /// Q4_K/Q5_K the sub-block's 6-bit scale; Q6_K the scales of elements 0..16 and 16..32;
    /// small integers held as f32 (exact).
    int_scale: [[f32; TILE_COLS]; 2],
    /// Q4_K/Q5_K: `-dmin` of the super-block.
    neg_dmin: [f32; TILE_COLS],
}

/// Per-thread buffers, grown to the largest shape seen and then reused.
#[derive(Default)]
struct Scratch {
    /// Unpacked B tiles of one 16-column tile, [`Weights::tiles_per_block`] per block.
    b_tiles: Vec<u8>,
    /// Column parameters of one 16-column tile per block.
    params: Vec<BlockParams>,
    /// Activation scales `d_x` per (activation tile, block), 16 rows each (zero past `n`).
    x_scales: Vec<f32>,
    /// Activation block sums `d_x · Σq` per (activation tile, block), 16 rows each.
    x_sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The calling thread's [`tile_activations`] buffer, shared read-only with the workers.
    static TILED_A: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
}

/// Bytes of one A tile in the tiled activations: 16 rows of one 32-element block.
const A_TILE_BYTES: usize = TILE_ROWS * QK;

/// Copies `n` rows of int8 activations (`in_features` each, row-major) into `dst` as
/// `[row tile][block][16 rows][32 bytes]`, so every A tile is 512 contiguous bytes (rows
/// `in_features` apart alias a few cache sets and each A load would touch 16 half-used lines).
/// The last tile's rows past `n` keep whatever `dst` held: no output is read from them.
fn tile_activations(quants: &[i8], n: usize, in_features: usize, dst: &mut Vec<i8>) {
    let blocks = in_features / QK;
    dst.resize(n.div_ceil(TILE_ROWS) * blocks * A_TILE_BYTES, 0);
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

/// A matrix the AMX kernels read: eight-row groups of a 32-element-block type or a K-quant.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    Legacy(&'a Groups),
    KQuant(&'a KGroups),
}

impl Weights<'_> {
    fn out_features(self) -> usize {
        match self {
            Weights::Legacy(groups) => groups.out_features(),
            Weights::KQuant(groups) => groups.out_features(),
        }
    }

    /// 32-element blocks per row.
    fn blocks(self) -> usize {
        match self {
            Weights::Legacy(groups) => groups.n_blocks() * groups.kind().block_elems() / QK,
            Weights::KQuant(groups) => groups.n_super() * QK_K / QK,
        }
    }

    fn group(&self, group: usize) -> &[u8] {
        match *self {
            Weights::Legacy(groups) => groups.group(group),
            Weights::KQuant(groups) => groups.group(group),
        }
    }

    fn epilogue(self) -> u8 {
        match self {
            Weights::Legacy(groups) if groups.kind().has_min() => MIN,
            Weights::Legacy(_) => PLAIN,
            Weights::KQuant(groups) if groups.kind() == KKind::Q6 => Q6,
            Weights::KQuant(_) => K_MIN,
        }
    }

    /// B tiles per block: Q6_K's two 16-element halves get one each (the other half zero).
    fn tiles_per_block(self) -> usize {
        if self.epilogue() == Q6 {
            2
        } else {
            1
        }
    }

    /// Block `b`'s column parameters for groups `first` (columns 0..8) and `second` (8..16),
    /// the values the scalar twins use (f16 widening and the small integer products are
    /// exact, so vector and scalar decoding agree bit for bit).
    ///
    /// # Safety
    /// AVX-512 F/BW; block `b` lies inside both groups.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn params(self, first: &[u8], second: &[u8], b: usize) -> BlockParams {
        let mut params = BlockParams::default();
        // SAFETY: every load lies inside block (or super-block) b of a group, at the layout's
        // offsets (the caller's contract); stores go to `params`' 64-byte arrays.
        unsafe {
            match self {
                Weights::Legacy(groups) => {
                    let kind = groups.kind();
                    let subs = kind.block_elems() / QK;
                    let base = (b / subs) * kind.block_stride();
                    let d = _mm512_cvtph_ps(pair16(first, second, base));
                    let scale = if kind == GroupKind::Iq4Xs {
                        let sub = (b % subs) as i32;
                        let high = _mm512_cvtepu16_epi32(pair16(first, second, base + 16));
                        let low = pair(first, second, base + kind.high_bits_offset());
                        let low = _mm512_srl_epi32(low, _mm_cvtsi32_si128(4 * sub));
                        let high = _mm512_srl_epi32(high, _mm_cvtsi32_si128(2 * sub));
                        let ls = _mm512_or_si512(
                            _mm512_and_si512(low, _mm512_set1_epi32(0x0f)),
                            _mm512_slli_epi32::<4>(_mm512_and_si512(high, _mm512_set1_epi32(3))),
                        );
                        let ls = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
                        _mm512_mul_ps(d, _mm512_cvtepi32_ps(ls))
                    } else {
                        d
                    };
                    _mm512_store_ps(params.scale.as_mut_ptr(), scale);
                    if kind.has_min() {
                        let min = _mm512_cvtph_ps(pair16(first, second, base + 16));
                        _mm512_store_ps(params.min.as_mut_ptr(), min);
                    }
                }
                Weights::KQuant(groups) => {
                    let kind = groups.kind();
                    let base = (b / 8) * kind.stride();
                    let j = b % 8;
                    let d = _mm512_cvtph_ps(pair16(first, second, base + kquant::D));
                    _mm512_store_ps(params.scale.as_mut_ptr(), d);
                    if kind == KKind::Q6 {
                        let sub = 8 * (j / 4) + 2 * (j % 4);
                        for half in 0..2 {
                            let at = base + kquant::Q6_SCALES + (sub + half) * GROUP;
                            let scales = _mm512_cvtepi8_epi32(pair8(first, second, at));
                            _mm512_store_ps(
                                params.int_scale[half].as_mut_ptr(),
                                _mm512_cvtepi32_ps(scales),
                            );
                        }
                    } else {
                        // `kquant::scale_min`'s bit map, sixteen rows at once.
                        let at = base + kquant::K_LOW + j * GROUP;
                        let low = _mm512_cvtepu8_epi32(pair8(first, second, at));
                        let at = base + kquant::K_HIGH + (j % 4) * GROUP;
                        let high = _mm512_cvtepu8_epi32(pair8(first, second, at));
                        let high = _mm512_srl_epi32(high, _mm_cvtsi32_si128(4 * (j / 4) as i32));
                        let three = _mm512_set1_epi32(3);
                        let min = _mm512_or_si512(
                            _mm512_srli_epi32::<4>(low),
                            _mm512_slli_epi32::<4>(_mm512_and_si512(
                                _mm512_srli_epi32::<2>(high),
                                three,
                            )),
                        );
                        _mm512_store_ps(params.min.as_mut_ptr(), _mm512_cvtepi32_ps(min));
                        let scales = _mm512_or_si512(
                            _mm512_and_si512(low, _mm512_set1_epi32(0x0f)),
                            _mm512_slli_epi32::<4>(_mm512_and_si512(high, three)),
                        );
                        _mm512_store_ps(
                            params.int_scale[0].as_mut_ptr(),
                            _mm512_cvtepi32_ps(scales),
                        );
                        // -dmin: a sign flip, as the scalar twin's negation.
                        let dmin = _mm512_cvtph_ps(pair16(first, second, base + kquant::DMIN));
                        let neg_dmin = _mm512_castsi512_ps(_mm512_xor_si512(
                            _mm512_castps_si512(dmin),
                            _mm512_set1_epi32(i32::MIN),
                        ));
                        _mm512_store_ps(params.neg_dmin.as_mut_ptr(), neg_dmin);
                    }
                }
            }
        }
        params
    }

    /// Writes block `b`'s B tile(s) for groups `first` and `second` at `tiles`.
    ///
    /// # Safety
    /// AVX-512 F/BW; block `b` lies inside both groups; `tiles` has room for
    /// `tiles_per_block()` tiles.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn unpack(self, first: &[u8], second: &[u8], b: usize, tiles: *mut u8) {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Weights::Legacy(groups) => unpack_legacy(groups.kind(), first, second, b, tiles),
                Weights::KQuant(groups) => unpack_kquant(groups.kind(), first, second, b, tiles),
            }
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
    let out_features = weights.out_features();
    let n_col_tiles = out_features.div_ceil(TILE_COLS);
    let target_tasks = pool.num_threads() * 4;
    let tiles_per_task = n_col_tiles.div_ceil(target_tasks).max(1);
    let n_tasks = n_col_tiles.div_ceil(tiles_per_task);
    let output = SharedMut::new(out);
    let in_features = weights.blocks() * QK;
    let quants = activations.quants();
    assert!(
        quants.len() >= n * in_features,
        "activations shorter than n rows"
    );
    TILED_A.with_borrow_mut(|tiled| {
        tile_activations(quants, n, in_features, tiled);
        let tiled: &[i8] = tiled;
        pool.parallel_for(n_tasks, &|task| {
            let first = task * tiles_per_task;
            let col_tiles = first..(first + tiles_per_task).min(n_col_tiles);
            SCRATCH.with_borrow_mut(|scratch| {
                let target = |row: usize, col: usize| {
                    let lanes = TILE_COLS.min(out_features - col);
                    // SAFETY: this task alone owns output columns of its column tiles, and
                    // row < n, so the range lies inside `out` (length checked by the caller).
                    unsafe { output.slice_mut(row * out_features + col, lanes) }
                };
                let rows = Rows {
                    activations,
                    tiled,
                    n,
                };
                // SAFETY: `amx` proves AMX, its permission and AVX-512 F/BW; the activations hold
                // `n` rows of the matrix's `in_features`, tiled in `tiled`.
                unsafe { run_task(amx, weights, rows, col_tiles, scratch, target) };
            });
        });
    });
}

/// The activation rows of one matmul: quantized, and their int8 quants tiled for A loads.
#[derive(Clone, Copy)]
struct Rows<'a> {
    activations: &'a QuantizedActivations,
    /// [`tile_activations`] of `activations`.
    tiled: &'a [i8],
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
    mut target: impl FnMut(usize, usize) -> &'o mut [f32],
) {
    let Rows {
        activations,
        tiled,
        n,
    } = rows;
    let blocks = weights.blocks();
    let n_groups = weights.out_features().div_ceil(GROUP);
    let row_tiles = n.div_ceil(TILE_ROWS);
    assert!(
        tiled.len() >= row_tiles * blocks * A_TILE_BYTES,
        "tiled activations shorter than n rows"
    );

    // Activation scales and sums, transposed to [row tile][block][16 rows], zero past n.
    let params_len = row_tiles * blocks * TILE_ROWS;
    scratch.x_scales.clear();
    scratch.x_scales.resize(params_len, 0.0);
    scratch.x_sums.clear();
    scratch.x_sums.resize(params_len, 0.0);
    for i in 0..n {
        let row = activations.row(i);
        let (t, r) = (i / TILE_ROWS, i % TILE_ROWS);
        for b in 0..blocks {
            let at = (t * blocks + b) * TILE_ROWS + r;
            scratch.x_scales[at] = row.scales[b];
            scratch.x_sums[at] = row.block_sums[b];
        }
    }
    let tile_bytes = weights.tiles_per_block() * B_TILE_BYTES;
    scratch.b_tiles.resize(blocks * tile_bytes, 0);
    scratch.params.resize(blocks, BlockParams::default());

    let full = tile_config(TILE_ROWS);
    let last_rows = n - (row_tiles - 1) * TILE_ROWS;
    let partial = tile_config(last_rows);
    // SAFETY: `_amx` (the caller's contract).
    unsafe { full.load() };
    let mut configured_full = true;
    // Initialized once per task: a partial row tile stores fewer rows than the epilogue
    // reads, and those rows' results are never written out.
    let mut c_tiles = CTiles([[0; TILE_ROWS * TILE_COLS]; 2]);
    for col_tile in col_tiles {
        let g0 = 2 * col_tile;
        // A missing second group (odd group count) repeats the first; its columns are never
        // written out.
        let g1 = if g0 + 1 < n_groups { g0 + 1 } else { g0 };
        let (data0, data1) = (weights.group(g0), weights.group(g1));
        // The next column tile's two groups follow this tile's in memory.
        let next = data0.as_ptr().wrapping_add(2 * data0.len());
        let next_len = 2 * data0.len();
        for b in 0..blocks {
            // SAFETY: AVX-512 F/BW (caller); block b lies in both groups and its tiles in
            // `b_tiles` (resized above).
            unsafe {
                weights.unpack(
                    data0,
                    data1,
                    b,
                    scratch.b_tiles.as_mut_ptr().add(b * tile_bytes),
                );
            }
            // SAFETY: as above.
            scratch.params[b] = unsafe { weights.params(data0, data1, b) };
        }
        for t in 0..row_tiles {
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
            let mut results = [[0.0f32; TILE_COLS]; TILE_ROWS];
            let x_at = t * blocks * TILE_ROWS;
            let args = TileArgs {
                a: tiled[t * blocks * A_TILE_BYTES..].as_ptr(),
                blocks,
                b_tiles: scratch.b_tiles.as_ptr(),
                next: if t == 0 { next } else { std::ptr::null() },
                next_len,
                params: scratch.params.as_ptr(),
                x_scales: scratch.x_scales[x_at..].as_ptr(),
                x_sums: scratch.x_sums[x_at..].as_ptr(),
            };
            // SAFETY: the tiles are configured for `rows` rows; A's `rows` rows of
            // `in_features` bytes start inside `quants` (rows < n); the scratch buffers hold
            // `blocks` entries from the given offsets.
            unsafe {
                match weights.epilogue() {
                    PLAIN => tile_dots::<PLAIN>(&args, &mut c_tiles, &mut results),
                    MIN => tile_dots::<MIN>(&args, &mut c_tiles, &mut results),
                    K_MIN => tile_dots::<K_MIN>(&args, &mut c_tiles, &mut results),
                    _ => tile_dots::<Q6>(&args, &mut c_tiles, &mut results),
                }
            }
            for (r, values) in results.iter().enumerate().take(rows) {
                let dst = target(t * TILE_ROWS + r, col_tile * TILE_COLS);
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

/// Asks L2 for share `b` of `blocks` of the `len` bytes at `start` (the next column tile's
/// weights; possibly past the matrix, since prefetching never faults). A hint only: results do
/// not depend on it.
///
/// Unpacking a column tile reads its weights from memory while the tile multiplies and
/// epilogues that follow read none, so without this the weight stream stalls during every
/// sweep. Spread over the first activation tile's blocks, the next tile's bytes arrive while
/// this one computes (one thread per core, 16-row verification steps of the default model:
/// 26.2-26.6 ms -> 24.4-25.7 ms; prefill and 64-row batches unchanged; bench/RESULTS.md).
#[inline(always)]
fn prefetch_share(start: *const u8, len: usize, b: usize, blocks: usize) {
    let first = (b * len / blocks) & !63;
    let end = (b + 1) * len / blocks;
    let mut line = first;
    while line < end {
        // SAFETY: a prefetch never faults, whatever the address (wrapping arithmetic: no
        // pointer past its allocation is formed by `add`).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(line).cast()) };
        line += 64;
    }
}

/// Pointers for one activation tile against one column tile.
struct TileArgs {
    /// The tile's first A tile (block 0) in the tiled activations ([`tile_activations`]).
    a: *const i8,
    /// 32-element blocks per row.
    blocks: usize,
    /// The unpacked B tiles, one (Q6_K: two) per block.
    b_tiles: *const u8,
    /// The next column tile's weight bytes, prefetched a share per block while this tile's
    /// multiplies run (null: none).
    next: *const u8,
    next_len: usize,
    /// `blocks` column parameters.
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
        let b_tile = args.b_tiles.add(b * tile_bytes);
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

/// `out[r][c]` = activation row `r` against weight column `c`, over all blocks in order, with
/// epilogue `E` ([`PLAIN`], [`MIN`], [`K_MIN`], [`Q6`]).
///
/// # Safety
/// AMX usable, tiles configured for the tile's row count, AVX-512 F/BW; `args` valid for
/// `args.blocks` blocks.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tile_dots<const E: u8>(
    args: &TileArgs,
    c: &mut CTiles,
    out: &mut [[f32; TILE_COLS]; TILE_ROWS],
) {
    let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
    if args.blocks > 0 {
        // SAFETY: the caller's contract.
        unsafe { multiply_block::<E>(args, 0) };
    }
    for b in 0..args.blocks {
        if !args.next.is_null() {
            prefetch_share(args.next, args.next_len, b, args.blocks);
        }
        // Block b's dots to memory, then block b + 1's multiply (running in the tile unit
        // while block b's dots are scaled below).
        // SAFETY: the caller's contract; block b was multiplied last.
        unsafe { store_block::<E>(c) };
        if b + 1 < args.blocks {
            // SAFETY: as above, block b + 1 < blocks.
            unsafe { multiply_block::<E>(args, b + 1) };
        }
        // SAFETY: the caller's contract: the parameters and activation scales of block b are
        // in bounds; `c` holds block b's stored dots.
        unsafe {
            let params = &*args.params.add(b);
            let w_scale = _mm512_load_ps(params.scale.as_ptr());
            let x_scales = args.x_scales.add(b * TILE_ROWS);
            let int_scale0 = _mm512_load_ps(params.int_scale[0].as_ptr());
            let int_scale1 = _mm512_load_ps(params.int_scale[1].as_ptr());
            for (r, acc) in acc.iter_mut().enumerate() {
                let d = _mm512_mul_ps(w_scale, _mm512_set1_ps(*x_scales.add(r)));
                let dot0 = _mm512_load_si512(c.0[0].as_ptr().add(r * TILE_COLS).cast());
                // The scaled dots are integers below 2^24 (K-quants: |dot| ≤ 32 · 31 · 127
                // times a scale ≤ 63; Q6_K: two halves, each ≤ 16 · 32 · 127 times |s| ≤ 128),
                // so these float products and the sum are exact: the value of the scalar
                // twin's integer `(scale · dot) as f32`.
                let dot0 = _mm512_cvtepi32_ps(dot0);
                let dot = match E {
                    K_MIN => _mm512_mul_ps(dot0, int_scale0),
                    Q6 => {
                        let dot1 = _mm512_load_si512(c.0[1].as_ptr().add(r * TILE_COLS).cast());
                        _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(dot1),
                            int_scale1,
                            _mm512_mul_ps(dot0, int_scale0),
                        )
                    }
                    _ => dot0,
                };
                *acc = _mm512_fmadd_ps(d, dot, *acc);
            }
            if E == MIN {
                let w_min = _mm512_load_ps(params.min.as_ptr());
                let x_sums = args.x_sums.add(b * TILE_ROWS);
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(w_min, _mm512_set1_ps(*x_sums.add(r)), *acc);
                }
            }
            if E == K_MIN && b % 8 == 7 {
                // The super-block's mins: m = Σ_j fma(min_j, d_x · Σx, m) from 0, then
                // acc = fma(-dmin, m, acc).
                let first = b - 7;
                let neg_dmin = _mm512_load_ps(params.neg_dmin.as_ptr());
                let mins: [__m512; 8] = std::array::from_fn(|j| {
                    _mm512_load_ps((*args.params.add(first + j)).min.as_ptr())
                });
                // The per-row sums first (their own buffer), then one pass over `acc` with
                // constant indices, so the accumulators stay in registers.
                let mut m = [_mm512_setzero_ps(); TILE_ROWS];
                for (r, m) in m.iter_mut().enumerate() {
                    for (j, min) in mins.iter().enumerate() {
                        let sum = *args.x_sums.add((first + j) * TILE_ROWS + r);
                        *m = _mm512_fmadd_ps(*min, _mm512_set1_ps(sum), *m);
                    }
                }
                for (acc, m) in acc.iter_mut().zip(&m) {
                    *acc = _mm512_fmadd_ps(neg_dmin, *m, *acc);
                }
            }
        }
    }
    for (row, acc) in out.iter_mut().zip(&acc) {
        // SAFETY: a row holds 16 f32.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), *acc) };
    }
}

/// 8 bytes at `at` of `first` and of `second` side by side.
///
/// # Safety
/// AVX-512 F; both ranges in bounds.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair8(first: &[u8], second: &[u8], at: usize) -> __m128i {
    debug_assert!(at + 8 <= first.len() && at + 8 <= second.len());
    // SAFETY: the caller's contract.
    unsafe {
        _mm_unpacklo_epi64(
            _mm_loadl_epi64(first.as_ptr().add(at).cast()),
            _mm_loadl_epi64(second.as_ptr().add(at).cast()),
        )
    }
}

/// 16 bytes at `at` of `first` and of `second` side by side (eight f16 or u16 of each).
///
/// # Safety
/// AVX-512 F; both ranges in bounds.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair16(first: &[u8], second: &[u8], at: usize) -> __m256i {
    debug_assert!(at + 16 <= first.len() && at + 16 <= second.len());
    // SAFETY: the caller's contract.
    unsafe {
        let low = _mm_loadu_si128(first.as_ptr().add(at).cast());
        let high = _mm_loadu_si128(second.as_ptr().add(at).cast());
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(low), high)
    }
}

/// 32 bytes at `at` of `first` and of `second` side by side.
///
/// # Safety
/// AVX-512 F; both ranges in bounds.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair(first: &[u8], second: &[u8], at: usize) -> __m512i {
    debug_assert!(at + 32 <= first.len() && at + 32 <= second.len());
    // SAFETY: the caller's contract.
    unsafe {
        let low = _mm256_loadu_si256(first.as_ptr().add(at).cast());
        let high = _mm256_loadu_si256(second.as_ptr().add(at).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
    }
}

/// Row `kk` (0..8) of the B tile at `tile`.
///
/// # Safety
/// `tile` points at a 512-byte tile.
#[inline]
unsafe fn tile_row(tile: *mut u8, kk: usize) -> *mut __m512i {
    // SAFETY: kk < 8, inside the 512-byte tile (caller).
    unsafe { tile.add(kk * 4 * TILE_COLS).cast() }
}

/// Writes block `b`'s int8 weight levels of interleaved groups `first` (columns 0..8) and
/// `second` (8..16) as one B tile at `dst`: row `kk` holds elements `4kk..4kk + 4` of every
/// column.
///
/// # Safety
/// AVX-512 F/BW; block `b` lies inside both groups and `dst` has room for 512 bytes.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_legacy(kind: GroupKind, first: &[u8], second: &[u8], b: usize, dst: *mut u8) {
    let subs = kind.block_elems() / QK;
    let base = (b / subs) * kind.block_stride();
    let quants = base + kind.quant_offset() + (b % subs) * NIBBLE_BYTES;
    // SAFETY: every load is 32 bytes inside block b of a group (the caller's contract; the
    // layout's offsets), every store one 64-byte row of the tile.
    unsafe {
        if kind == GroupKind::Q8Zero {
            for step in 0..QK / 4 {
                _mm512_storeu_si512(tile_row(dst, step), pair(first, second, quants + 32 * step));
            }
            return;
        }
        let mask = _mm512_set1_epi8(0x0f);
        let five = matches!(kind, GroupKind::Q5Zero | GroupKind::Q5One);
        let (mut high_of_low, mut high_of_high) = if five {
            let qh = pair(first, second, base + kind.high_bits_offset());
            (_mm512_slli_epi16::<4>(qh), qh)
        } else {
            (_mm512_setzero_si512(), _mm512_setzero_si512())
        };
        let fifth = _mm512_set1_epi8(0x10);
        let offset = _mm512_set1_epi8(kind.offset() as i8);
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        let iq4 = matches!(kind, GroupKind::Iq4Nl | GroupKind::Iq4Xs);
        for kk in 0..4 {
            let packed = pair(first, second, quants + 32 * kk);
            let mut low = _mm512_and_si512(packed, mask);
            let mut high = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), mask);
            if five {
                low = _mm512_or_si512(low, _mm512_and_si512(high_of_low, fifth));
                high = _mm512_or_si512(high, _mm512_and_si512(high_of_high, fifth));
                high_of_low = _mm512_srli_epi16::<1>(high_of_low);
                high_of_high = _mm512_srli_epi16::<1>(high_of_high);
            }
            if iq4 {
                low = _mm512_shuffle_epi8(table, low);
                high = _mm512_shuffle_epi8(table, high);
            } else {
                low = _mm512_sub_epi8(low, offset);
                high = _mm512_sub_epi8(high, offset);
            }
            _mm512_storeu_si512(tile_row(dst, kk), low);
            _mm512_storeu_si512(tile_row(dst, 4 + kk), high);
        }
    }
}

/// Writes 32-element block `b` (sub-block `b % 8` of super-block `b / 8`) of K-quant groups
/// `first` and `second` as B tile(s) at `dst`: Q4_K/Q5_K one tile of levels 0..32; Q6_K two,
/// the levels `q - 32` of elements 0..16 (rows 0..4, rows 4..8 zero) and of 16..32 (rows
/// 4..8, rows 0..4 zero), which take different scales.
///
/// # Safety
/// AVX-512 F/BW; super-block `b / 8` lies inside both groups and `dst` has room for one tile
/// (Q6_K: two).
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_kquant(kind: KKind, first: &[u8], second: &[u8], b: usize, dst: *mut u8) {
    let base = (b / 8) * kind.stride();
    let j = b % 8;
    let mask = _mm512_set1_epi8(0x0f);
    // SAFETY: every load is 32 bytes inside super-block b / 8 of a group (the caller's
    // contract; the layout's offsets), every store one 64-byte row of a tile.
    unsafe {
        if kind == KKind::Q6 {
            let (h, g) = (j / 4, j % 4);
            let runs = [0, 1, 2].map(|v| base + kquant::q6_run(h, v));
            let thirty_two = _mm512_set1_epi8(32);
            let top_bits = _mm512_set1_epi8(-0x40);
            let zero = _mm512_setzero_si512();
            for kk in 0..8 {
                let q = if g < 3 {
                    let bytes = pair(first, second, runs[g] + kk * kquant::STEP);
                    _mm512_and_si512(bytes, _mm512_set1_epi8(0x3f))
                } else {
                    // The three runs' top bit pairs, low to high (16-bit shifts of masked
                    // bytes: nothing crosses into the neighbour byte).
                    let mut top = [zero; 3];
                    for (v, top) in top.iter_mut().enumerate() {
                        let bytes = pair(first, second, runs[v] + kk * kquant::STEP);
                        *top = _mm512_and_si512(bytes, top_bits);
                    }
                    _mm512_ternarylogic_epi32::<0xFE>(
                        _mm512_srli_epi16::<6>(top[0]),
                        _mm512_srli_epi16::<4>(top[1]),
                        _mm512_srli_epi16::<2>(top[2]),
                    )
                };
                let level = _mm512_sub_epi8(q, thirty_two);
                let (own, other) = if kk < 4 {
                    (dst, dst.add(B_TILE_BYTES))
                } else {
                    (dst.add(B_TILE_BYTES), dst)
                };
                _mm512_storeu_si512(tile_row(own, kk), level);
                _mm512_storeu_si512(tile_row(other, kk), zero);
            }
            return;
        }
        let run = base + kind.quants() + (j / 2) * 8 * kquant::STEP;
        let shift = _mm_cvtsi32_si128(4 * (j % 2) as i32);
        let bit = _mm512_set1_epi8((1u8 << j) as i8);
        let sixteen = _mm512_set1_epi8(16);
        for kk in 0..8 {
            let packed = pair(first, second, run + kk * kquant::STEP);
            let mut level = _mm512_and_si512(_mm512_srl_epi16(packed, shift), mask);
            if kind == KKind::Q5 {
                let high = pair(first, second, base + kquant::Q5_HIGH + kk * kquant::STEP);
                let set = _mm512_test_epi8_mask(high, bit);
                level = _mm512_mask_blend_epi8(set, level, _mm512_or_si512(level, sixteen));
            }
            _mm512_storeu_si512(tile_row(dst, kk), level);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::matmul::{Isa, MatmulScratch, QMatrix};
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
        let weights = matrix.amx_weights().expect("a group layout");
        let mut out = vec![f32::NAN; n * matrix.out_features()];
        let mut scratch = MatmulScratch::new();
        matrix
            .matmul_amx(amx, weights, pool, x, n, &mut out, &mut scratch)
            .unwrap();
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// Asserts bitwise equality, naming the first differing element (not dumping both).
    fn assert_same(got: &[u32], want: &[u32], context: &str) {
        assert_eq!(got.len(), want.len(), "{context}: lengths");
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{context}: element {i} differs: {} vs {}",
                f32::from_bits(got[i]),
                f32::from_bits(want[i])
            );
        }
    }

    fn run_isa(isa: Isa, matrix: &QMatrix, x: &[f32], n: usize, pool: &ThreadPool) -> Vec<u32> {
        let mut out = vec![f32::NAN; n * matrix.out_features()];
        let mut scratch = MatmulScratch::new();
        matrix
            .matmul_with_isa(isa, pool, x, n, &mut out, &mut scratch)
            .unwrap();
        out.iter().map(|v| v.to_bits()).collect()
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
                    let mut public = vec![f32::NAN; n * rows];
                    matrix
                        .matmul(&pool, &x, n, &mut public, &mut MatmulScratch::new())
                        .unwrap();
                    let public: Vec<u32> = public.iter().map(|v| v.to_bits()).collect();
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
            let mut bytes = random_weights(&mut rng, dtype, rows, cols);
            // Keep each block's f16 scale (and min), saturate everything else.
            let (keep, fill) = match dtype {
                DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => (0..4, 0xff),
                DType::Q8_0 => (0..2, 0x80),
                DType::Q6_K => (208..210, 0x00),
                _ => (0..2, 0x00),
            };
            for block in bytes.chunks_exact_mut(dtype.block_bytes()) {
                for (i, byte) in block.iter_mut().enumerate() {
                    if !keep.contains(&i) {
                        *byte = fill;
                    }
                }
                if dtype == DType::Q6_K {
                    block[192..208].fill(0x80);
                }
            }
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
        let pools = [ThreadPool::new(1), ThreadPool::new(3)];
        let mut rng = Rng::new(23);
        let (rows, cols, n) = (45usize, 512usize, 70usize);
        for dtype in [
            DType::Q4_1,
            DType::Q8_0,
            DType::Q5_0,
            DType::Q4_K,
            DType::Q6_K,
        ] {
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            let x = rng.vec(n * cols, -2.0, 2.0);
            let full = run_amx(amx, &matrix, &x, n, &pools[0]);
            let threads = run_amx(amx, &matrix, &x, n, &pools[1]);
            assert_same(&threads, &full, &format!("{dtype} threads"));
            for (start, len) in [(3usize, 16usize), (5, 21), (40, 30)] {
                let part = run_amx(
                    amx,
                    &matrix,
                    &x[start * cols..(start + len) * cols],
                    len,
                    &pools[1],
                );
                let want = &full[start * rows..(start + len) * rows];
                assert_same(&part, want, &format!("{dtype} rows {start}+{len}"));
            }
            for i in [0usize, 17, 69] {
                let single = run_isa(
                    Isa::detect(),
                    &matrix,
                    &x[i * cols..(i + 1) * cols],
                    1,
                    &pools[0],
                );
                let want = &full[i * rows..(i + 1) * rows];
                assert_same(&single, want, &format!("{dtype} row {i} alone"));
            }
        }
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
