//! AMX int8 tile kernels for the interleaved 32-element-block layouts (`interleaved.rs`:
//! Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS) at prefill and large batches.
//!
//! One tile multiply (`tdpbssd`) yields the exact integer block dots of 16 activation rows
//! against 16 weight rows for one 32-element block: A is 16 rows × 32 int8 activations, read
//! in place from the quantized activations (row stride `in_features`); B is two eight-row
//! groups of the block's weight levels unpacked to int8 in the tile's four-byte (VNNI) layout,
//! `[8 k-quads][16 columns][4 bytes]` — exactly the interleaved layout's steps, two groups side
//! by side, so unpacking is a mask/shift (plus the Q4_0/Q5_0 offset, Q5's fifth bits or the
//! IQ4 table) per 64 bytes; C is 16 × 16 i32. C is stored and the block's scales applied in
//! AVX-512 floats with one accumulator per (activation row, weight row): for every block in
//! order `acc = fma(d_w · d_x, dot, acc)`, then for Q4_1/Q5_1 `acc = fma(m_w, d_x · Σx, acc)` —
//! the operation order of `group_tile_scalar`, so results are bitwise equal to the scalar and
//! AVX2 paths and a row's result never depends on which tile or batch it lands in.
//!
//! A task owns a range of 16-column tiles; for each it unpacks every block's B tile once into a
//! per-thread buffer and then sweeps all activation rows, 16 at a time (the last tile shorter,
//! with its own tile configuration). Tile state is configured at the start of each task and
//! released at its end. Only runs with an [`Amx`] token, which exists only once the CPU, the OS
//! permission (`crate::cpu::amx_enabled`) and AVX-512 F/BW are all there.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::activation::QuantizedActivations;
use super::grouped::GroupedLayout;
use super::interleaved::{GroupKind, Groups, GROUP, NIBBLE_BYTES};
use crate::cpu::{amx_enabled, CpuFeatures};
use crate::f16_to_f32;
use crate::pool::{SharedMut, ThreadPool};
use crate::quant::{iq4_xs_scale, KVALUES_IQ4NL, QK};

/// Activation rows from which [`super::QMatrix::matmul`] takes the AMX path (measured
/// crossover, see bench/RESULTS.md); fewer rows keep the AVX2 group kernels.
pub(crate) const MIN_ROWS: usize = 16;
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

/// A 64-byte tile configuration (palette 1): tmm0 = A (`rows` × 32 bytes), tmm1 = B
/// (8 × 64 bytes), tmm2 = C (`rows` × 16 i32).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(rows: usize) -> TileConfig {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        let mut set = |tile: usize, rows: usize, row_bytes: u16| {
            bytes[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&row_bytes.to_le_bytes());
            bytes[48 + tile] = rows as u8;
        };
        set(0, rows, QK as u16);
        set(1, QK / 4, (4 * TILE_COLS) as u16);
        set(2, rows, (4 * TILE_COLS) as u16);
        TileConfig(bytes)
    }

    /// Loads this configuration into the calling thread's tile registers.
    ///
    /// # Safety
    /// The CPU has AMX and the process holds the tile-data permission (an [`Amx`] token).
    #[inline]
    unsafe fn load(&self) {
        // SAFETY: the caller's contract; `ldtilecfg` reads the 64 bytes of `self`.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Returns the thread's tile registers to their initial state.
///
/// # Safety
/// As [`TileConfig::load`].
#[inline]
unsafe fn release_tiles() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Per-thread buffers, grown to the largest shape seen and then reused.
#[derive(Default)]
struct Scratch {
    /// Unpacked B tiles of one 16-column tile, one per 32-element block.
    b_tiles: Vec<u8>,
    /// Weight scales (`d`, IQ4_XS `d · (ls - 32)`) per block, 16 columns each.
    w_scales: Vec<f32>,
    /// Weight mins (Q4_1/Q5_1) per block, 16 columns each.
    w_mins: Vec<f32>,
    /// Activation scales `d_x` per (activation tile, block), 16 rows each (zero past `n`).
    x_scales: Vec<f32>,
    /// Activation block sums `d_x · Σq` per (activation tile, block), 16 rows each.
    x_sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `out[n, out_features] = x · Wᵀ` for an interleaved matrix and activations already quantized
/// into `activations`, on AMX tiles. Bitwise equal to `Groups::matmul` on any ISA.
pub(crate) fn matmul_interleaved(
    amx: Amx,
    groups: &Groups,
    pool: &ThreadPool,
    activations: &QuantizedActivations,
    n: usize,
    out: &mut [f32],
) {
    let out_features = groups.out_features();
    let n_col_tiles = out_features.div_ceil(TILE_COLS);
    let target_tasks = pool.num_threads() * 4;
    let tiles_per_task = n_col_tiles.div_ceil(target_tasks).max(1);
    let n_tasks = n_col_tiles.div_ceil(tiles_per_task);
    let output = SharedMut::new(out);
    pool.parallel_for(n_tasks, &|task| {
        let first = task * tiles_per_task;
        let col_tiles = first..(first + tiles_per_task).min(n_col_tiles);
        SCRATCH.with_borrow_mut(|scratch| {
            let write = |row: usize, col: usize, values: &[f32; TILE_COLS]| {
                let lanes = TILE_COLS.min(out_features - col);
                // SAFETY: this task alone owns output columns of its column tiles, and
                // row < n, so the range lies inside `out` (length checked by the caller).
                let target = unsafe { output.slice_mut(row * out_features + col, lanes) };
                target.copy_from_slice(&values[..lanes]);
            };
            // SAFETY: `amx` proves AMX, its permission and AVX-512 F/BW; the activations hold
            // `n` rows of the matrix's `in_features`.
            unsafe { run_task(amx, groups, activations, n, col_tiles, scratch, write) };
        });
    });
}

/// One task: column tiles `col_tiles` against all `n` activation rows.
///
/// # Safety
/// `_amx` is a genuine token (AMX usable in this process, AVX-512 F/BW present), and
/// `activations` holds `n` quantized rows of `groups`' input width.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn run_task(
    _amx: Amx,
    groups: &Groups,
    activations: &QuantizedActivations,
    n: usize,
    col_tiles: std::ops::Range<usize>,
    scratch: &mut Scratch,
    mut write: impl FnMut(usize, usize, &[f32; TILE_COLS]),
) {
    let kind = groups.kind();
    let blocks = groups.n_blocks() * kind.block_elems() / QK;
    let in_features = blocks * QK;
    let n_groups = groups.out_features().div_ceil(GROUP);
    let row_tiles = n.div_ceil(TILE_ROWS);
    let quants = activations.quants();
    assert!(
        quants.len() >= n * in_features,
        "activations shorter than n rows"
    );

    // Activation scales and sums, transposed to [row tile][block][16 rows], zero past n.
    let tiled = row_tiles * blocks * TILE_ROWS;
    scratch.x_scales.clear();
    scratch.x_scales.resize(tiled, 0.0);
    scratch.x_sums.clear();
    scratch.x_sums.resize(tiled, 0.0);
    for i in 0..n {
        let row = activations.row(i);
        let (t, r) = (i / TILE_ROWS, i % TILE_ROWS);
        for b in 0..blocks {
            let at = (t * blocks + b) * TILE_ROWS + r;
            scratch.x_scales[at] = row.scales[b];
            scratch.x_sums[at] = row.block_sums[b];
        }
    }
    scratch.b_tiles.resize(blocks * B_TILE_BYTES, 0);
    scratch.w_scales.resize(blocks * TILE_COLS, 0.0);
    scratch.w_mins.resize(blocks * TILE_COLS, 0.0);

    let full = TileConfig::new(TILE_ROWS);
    let last_rows = n - (row_tiles - 1) * TILE_ROWS;
    let partial = TileConfig::new(last_rows);
    // SAFETY: `_amx` (the caller's contract).
    unsafe { full.load() };
    let mut configured_full = true;
    for col_tile in col_tiles {
        let g0 = 2 * col_tile;
        // A missing second group (odd group count) repeats the first; its columns are never
        // written out.
        let g1 = if g0 + 1 < n_groups { g0 + 1 } else { g0 };
        let (data0, data1) = (groups.group(g0), groups.group(g1));
        for b in 0..blocks {
            // SAFETY: AVX-512 F/BW (caller); block b lies in both groups and its B tile in
            // `b_tiles` (resized above).
            unsafe {
                unpack_block(
                    kind,
                    data0,
                    data1,
                    b,
                    scratch.b_tiles.as_mut_ptr().add(b * B_TILE_BYTES),
                );
            }
            for (lane, (scale, min)) in scratch.w_scales[b * TILE_COLS..(b + 1) * TILE_COLS]
                .iter_mut()
                .zip(&mut scratch.w_mins[b * TILE_COLS..(b + 1) * TILE_COLS])
                .enumerate()
            {
                let data = if lane < GROUP { data0 } else { data1 };
                (*scale, *min) = lane_scale_min(kind, data, lane % GROUP, b);
            }
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
                a: quants[t * TILE_ROWS * in_features..].as_ptr(),
                a_stride: in_features,
                blocks,
                b_tiles: scratch.b_tiles.as_ptr(),
                w_scales: scratch.w_scales.as_ptr(),
                w_mins: scratch.w_mins.as_ptr(),
                x_scales: scratch.x_scales[x_at..].as_ptr(),
                x_sums: scratch.x_sums[x_at..].as_ptr(),
            };
            // SAFETY: the tiles are configured for `rows` rows; A's `rows` rows of
            // `in_features` bytes start inside `quants` (rows < n); the scratch buffers hold
            // `blocks` entries from the given offsets.
            unsafe {
                if kind.has_min() {
                    tile_dots::<true>(&args, &mut results);
                } else {
                    tile_dots::<false>(&args, &mut results);
                }
            }
            for (r, values) in results.iter().enumerate().take(rows) {
                write(t * TILE_ROWS + r, col_tile * TILE_COLS, values);
            }
        }
    }
    // SAFETY: `_amx`.
    unsafe { release_tiles() };
}

/// Pointers for one activation tile against one column tile.
struct TileArgs {
    /// First activation row of the tile (block 0).
    a: *const i8,
    /// Bytes between activation rows (`in_features`).
    a_stride: usize,
    /// 32-element blocks per row.
    blocks: usize,
    /// `blocks` unpacked B tiles.
    b_tiles: *const u8,
    /// `blocks × 16` weight scales.
    w_scales: *const f32,
    /// `blocks × 16` weight mins (read only with `MIN`).
    w_mins: *const f32,
    /// `blocks × 16` activation scales of the tile's rows.
    x_scales: *const f32,
    /// `blocks × 16` activation block sums (read only with `MIN`).
    x_sums: *const f32,
}

/// `out[r][c]` = activation row `r` against weight column `c`, over all blocks in order.
///
/// # Safety
/// AMX usable, tiles configured for the tile's row count, AVX-512 F/BW; `args` valid for
/// `args.blocks` blocks.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tile_dots<const MIN: bool>(args: &TileArgs, out: &mut [[f32; TILE_COLS]; TILE_ROWS]) {
    #[repr(C, align(64))]
    struct CTile([i32; TILE_ROWS * TILE_COLS]);
    let mut c = CTile([0; TILE_ROWS * TILE_COLS]);
    let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
    for b in 0..args.blocks {
        // SAFETY: the caller's contract: A block b of each configured row, B tile b and the
        // 64-byte rows of `c` are in bounds; the tile registers are configured.
        unsafe {
            asm!(
                "tileloadd tmm0, [{a} + {a_stride}*1]",
                "tileloadd tmm1, [{b} + {b_stride}*1]",
                "tilezero tmm2",
                "tdpbssd tmm2, tmm0, tmm1",
                "tilestored [{c} + {b_stride}*1], tmm2",
                a = in(reg) args.a.add(b * QK),
                a_stride = in(reg) args.a_stride,
                b = in(reg) args.b_tiles.add(b * B_TILE_BYTES),
                b_stride = in(reg) 4 * TILE_COLS,
                c = in(reg) c.0.as_mut_ptr(),
                options(nostack),
            );
            let w_scale = _mm512_loadu_ps(args.w_scales.add(b * TILE_COLS));
            let x_scales = args.x_scales.add(b * TILE_ROWS);
            for (r, acc) in acc.iter_mut().enumerate() {
                let d = _mm512_mul_ps(w_scale, _mm512_set1_ps(*x_scales.add(r)));
                let dot =
                    _mm512_cvtepi32_ps(_mm512_load_si512(c.0.as_ptr().add(r * TILE_COLS).cast()));
                *acc = _mm512_fmadd_ps(d, dot, *acc);
            }
            if MIN {
                let w_min = _mm512_loadu_ps(args.w_mins.add(b * TILE_COLS));
                let x_sums = args.x_sums.add(b * TILE_ROWS);
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(w_min, _mm512_set1_ps(*x_sums.add(r)), *acc);
                }
            }
        }
    }
    for (row, acc) in out.iter_mut().zip(&acc) {
        // SAFETY: a row holds 16 f32.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), *acc) };
    }
}

/// The scale (IQ4_XS: `d · (ls - 32)`, exact) and min of `lane` in 32-element block `b`,
/// the values `group_tile_scalar` uses.
fn lane_scale_min(kind: GroupKind, group: &[u8], lane: usize, b: usize) -> (f32, f32) {
    let subs = kind.block_elems() / QK;
    let block = &group[(b / subs) * kind.block_stride()..][..kind.block_stride()];
    let f16 = |at: usize| f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
    let d = f16(2 * lane);
    let scale = if kind == GroupKind::Iq4Xs {
        let scales_h = u16::from_le_bytes([block[16 + 2 * lane], block[17 + 2 * lane]]);
        let at = kind.high_bits_offset() + 4 * lane;
        let scales_l = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        d * (iq4_xs_scale(scales_h, scales_l, b % subs) - 32) as f32
    } else {
        d
    };
    let min = if kind.has_min() {
        f16(16 + 2 * lane)
    } else {
        0.0
    };
    (scale, min)
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

/// Writes block `b`'s int8 weight levels of groups `first` (columns 0..8) and `second`
/// (columns 8..16) as one B tile at `dst`: row `kk` holds elements `4kk..4kk + 4` of every
/// column.
///
/// # Safety
/// AVX-512 F/BW; block `b` lies inside both groups and `dst` has room for 512 bytes.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_block(kind: GroupKind, first: &[u8], second: &[u8], b: usize, dst: *mut u8) {
    let subs = kind.block_elems() / QK;
    let base = (b / subs) * kind.block_stride();
    let quants = base + kind.quant_offset() + (b % subs) * NIBBLE_BYTES;
    let row = |kk: usize| -> *mut __m512i {
        // SAFETY: kk < 8, inside the 512-byte tile.
        unsafe { dst.add(kk * 4 * TILE_COLS).cast() }
    };
    // SAFETY: every load is 32 bytes inside block b of a group (the caller's contract; the
    // layout's offsets), every store one 64-byte row of the tile.
    unsafe {
        if kind == GroupKind::Q8Zero {
            for step in 0..QK / 4 {
                _mm512_storeu_si512(row(step), pair(first, second, quants + 32 * step));
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
            _mm512_storeu_si512(row(kk), low);
            _mm512_storeu_si512(row(4 + kk), high);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::matmul::{Isa, MatmulScratch, QMatrix, Storage};
    use crate::test_util::{random_weights, Rng};

    /// Every type the AMX path covers (all of the interleaved layout's).
    const COVERED: [DType; 7] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

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
        let Storage::Interleaved(groups) = &matrix.storage else {
            panic!("{} is not interleaved", matrix.dtype());
        };
        let mut out = vec![f32::NAN; n * matrix.out_features()];
        let mut scratch = MatmulScratch::new();
        matrix
            .matmul_amx(amx, groups, pool, x, n, &mut out, &mut scratch)
            .unwrap();
        out.iter().map(|v| v.to_bits()).collect()
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
    /// column tile) and several input widths; the public entry point (which picks AMX from
    /// 16 rows) agrees too.
    #[test]
    fn amx_equals_scalar_twin_bitwise() {
        let Some(amx) = amx_or_skip("amx_equals_scalar_twin_bitwise") else {
            return;
        };
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(19);
        for dtype in COVERED {
            for &(rows, cols) in &[(37usize, 256usize), (16, 512), (24, 768), (9, 1536)] {
                let bytes = random_weights(&mut rng, dtype, rows, cols);
                let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
                for n in [16usize, 17, 31, 32, 33, 64, 100] {
                    let x = rng.vec(n * cols, -2.0, 2.0);
                    let scalar = run_isa(Isa::Scalar, &matrix, &x, n, &pool);
                    let tiles = run_amx(amx, &matrix, &x, n, &pool);
                    assert_eq!(tiles, scalar, "{dtype} {rows}x{cols} n={n}");
                    let mut public = vec![f32::NAN; n * rows];
                    matrix
                        .matmul(&pool, &x, n, &mut public, &mut MatmulScratch::new())
                        .unwrap();
                    let public: Vec<u32> = public.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(public, scalar, "{dtype} {rows}x{cols} n={n} (matmul)");
                }
            }
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
        for dtype in [DType::Q4_1, DType::Q8_0, DType::Q5_0] {
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            let x = rng.vec(n * cols, -2.0, 2.0);
            let full = run_amx(amx, &matrix, &x, n, &pools[0]);
            assert_eq!(
                run_amx(amx, &matrix, &x, n, &pools[1]),
                full,
                "{dtype} threads"
            );
            for (start, len) in [(3usize, 16usize), (5, 21), (40, 30)] {
                let part = run_amx(
                    amx,
                    &matrix,
                    &x[start * cols..(start + len) * cols],
                    len,
                    &pools[1],
                );
                assert_eq!(
                    part,
                    full[start * rows..(start + len) * rows],
                    "{dtype} rows {start}+{len}"
                );
            }
            for i in [0usize, 17, 69] {
                let single = run_isa(
                    Isa::detect(),
                    &matrix,
                    &x[i * cols..(i + 1) * cols],
                    1,
                    &pools[0],
                );
                assert_eq!(
                    single,
                    full[i * rows..(i + 1) * rows],
                    "{dtype} row {i} alone"
                );
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
