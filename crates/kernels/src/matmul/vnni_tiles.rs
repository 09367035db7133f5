//! AVX-512 VNNI over unpacked 16-column tiles: the eight-row group layouts at verification
//! steps and small batches ([`MIN_ROWS`] rows up to where the AMX tiles take over).
//!
//! The group kernels (`vnni_kernels.rs`) unpack every weight block once per tile of at most
//! four activation rows, so a step of 5-15 rows unpacks each block two to four times, and
//! their unpacking, conversions and per-block epilogue compete with the `vpdpbusd`s for ports
//! 0 and 5. Here a task unpacks each 16-column tile's blocks once, exactly as the AMX path
//! does (`unpack.rs`: int8 levels in the tile layout `[8 k-quads][16 columns][4 bytes]` and
//! the block's column parameters), and then sweeps the activation rows up to eight at a time:
//! per block one 64-byte load per k-quad shared by every row, then eight `vpdpbusd` per row,
//! the weights as the unsigned operand and the row's four activation bytes broadcast as the
//! signed one. Signed levels (Q4_0, Q5_0, Q8_0, IQ4, MXFP4, Q6_K) are read as `w + 128`
//! (`w ^ 0x80`) and each dot starts at `-128 · Σx`; the other kinds' levels are non-negative
//! and go in as they are. So every block dot is the exact integer the scalar twins compute, and
//! the f32 epilogue is the AMX path's ([`unpack::BlockVectors`]): results are bitwise the
//! scalar twins', whatever the rows' grouping.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::activation::{QuantizedActivations, QuantizedRow};
use super::unpack::{
    for_column_tiles, prefetch_share, BlockParams, BlockVectors, ColumnTarget, Weights,
    B_TILE_BYTES, K_MIN, Q6, TILE_COLS,
};
use crate::aligned::AlignedBytes;
use crate::pool::ThreadPool;
use crate::quant::QK;
use crate::simd::first_lanes_mask;

/// Activation rows from which [`super::QMatrix::matmul`] takes this path on AVX-512 VNNI
/// hosts (below it the group kernels, whose per-row weight streaming wins).
pub(crate) const MIN_ROWS: usize = 5;

/// Most activation rows per sweep (Q6_K, with two dots per row: [`MAX_ROWS_Q6`]).
const MAX_ROWS: usize = 8;
const MAX_ROWS_Q6: usize = 4;

/// Per-thread buffers, grown to the largest shape seen and then reused.
#[derive(Default)]
struct Scratch {
    /// Unpacked B tiles of one 16-column tile, [`Weights::tiles_per_block`] per block.
    b_tiles: AlignedBytes,
    /// Column parameters of one 16-column tile per block.
    params: Vec<BlockParams>,
    /// The task's activation rows.
    rows: Vec<RowPtrs>,
    /// Every row's accumulators for the current column tile, carried across block chunks.
    acc: Vec<[f32; TILE_COLS]>,
}

/// Most blocks unpacked at a time ([`Weights::chunk_blocks`]): their tiles and parameters
/// stay in L1 while every row sweeps them.
const CHUNK_BLOCKS: usize = 24;

/// Where one activation row's quantized blocks are (see [`QuantizedRow`]).
#[derive(Clone, Copy)]
struct RowPtrs {
    quants: *const i8,
    scales: *const f32,
    block_sums: *const f32,
    quant_sums: *const i32,
    half_sums: *const i32,
}

impl RowPtrs {
    fn of(row: &QuantizedRow<'_>) -> RowPtrs {
        RowPtrs {
            quants: row.quants.as_ptr(),
            scales: row.scales.as_ptr(),
            block_sums: row.block_sums.as_ptr(),
            quant_sums: row.quant_sums.as_ptr(),
            half_sums: row.half_sums.as_ptr(),
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Proof that this process may run these kernels: AVX-512 F, BW and VNNI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vnni512 {
    _checked: (),
}

impl Vnni512 {
    /// The token where the AVX-512 group kernels run (`Isa::Avx512`: F + BW + VNNI detected
    /// and not narrowed away by `TOKENMILL_KERNELS`).
    pub(crate) fn for_isa(isa: super::Isa) -> Option<Vnni512> {
        (isa == super::Isa::Avx512).then_some(Vnni512 { _checked: () })
    }
}

/// `out[n, out_features] = x · Wᵀ` for activations already quantized into `activations`.
/// Bitwise equal to the grouped kernels on any ISA.
pub(crate) fn matmul(
    token: Vnni512,
    weights: Weights<'_>,
    pool: &ThreadPool,
    activations: &QuantizedActivations,
    n: usize,
    out: &mut [f32],
) {
    for_column_tiles(pool, weights.out_features(), out, &|col_tiles, target| {
        SCRATCH.with_borrow_mut(|scratch| {
            // SAFETY: `token` proves AVX-512 F/BW/VNNI; the activations hold `n` rows of the
            // matrix's input width.
            unsafe { run_task(token, weights, activations, n, col_tiles, scratch, target) };
        });
    });
}

/// One task: column tiles `col_tiles` against all `n` activation rows.
///
/// # Safety
/// `_token` is genuine (AVX-512 F/BW/VNNI), and `activations` holds `n` quantized rows of the
/// weights' input width.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn run_task<'o>(
    _token: Vnni512,
    weights: Weights<'_>,
    activations: &QuantizedActivations,
    n: usize,
    col_tiles: std::ops::Range<usize>,
    scratch: &mut Scratch,
    mut target: ColumnTarget<'o>,
) {
    let blocks = weights.blocks();
    let n_groups = weights.out_features().div_ceil(super::grouped::GROUP);
    let tile_bytes = weights.tiles_per_block() * B_TILE_BYTES;
    let chunk = weights.chunk_blocks(CHUNK_BLOCKS);
    scratch.b_tiles.resize(chunk * tile_bytes);
    scratch.params.resize(chunk, BlockParams::default());
    let epilogue = weights.epilogue();
    let max_rows = if epilogue == Q6 {
        MAX_ROWS_Q6
    } else {
        MAX_ROWS
    };
    // Rows in as few sweeps as the widest allows, as even as possible.
    let sweeps = n.div_ceil(max_rows);
    let per_sweep = n.div_ceil(sweeps);
    scratch.rows.clear();
    scratch
        .rows
        .extend((0..n).map(|i| RowPtrs::of(&activations.row(i))));
    // The first chunk of every column tile starts its accumulators from zero.
    scratch.acc.clear();
    scratch.acc.resize(n, [0.0; TILE_COLS]);
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
            // SAFETY: AVX-512 F/BW (the token); both groups hold `blocks` blocks and the
            // buffers were sized for a chunk above.
            unsafe {
                weights.unpack_tile(
                    data0,
                    data1,
                    range.clone(),
                    scratch.b_tiles.as_mut_ptr(),
                    &mut scratch.params,
                )
            };
            let mut first = 0;
            while first < n {
                let rows = per_sweep.min(n - first);
                let tiles = Tiles {
                    b_tiles: scratch.b_tiles.as_ptr(),
                    params: scratch.params.as_ptr(),
                    blocks: range.clone(),
                    total_blocks: blocks,
                    next: if first == 0 { next } else { std::ptr::null() },
                    next_len,
                };
                // SAFETY: the token's features; `tiles` holds the chunk's unpacked blocks and
                // their parameters; rows first..first + rows exist, as do their accumulators.
                unsafe {
                    dispatch_rows(
                        epilogue,
                        &tiles,
                        &scratch.rows[first..first + rows],
                        &mut scratch.acc[first..first + rows],
                    );
                }
                first += rows;
            }
            start = range.end;
        }
        for (r, values) in scratch.acc.iter().enumerate() {
            let dst = target.row(r, col_tile * TILE_COLS);
            let mask = first_lanes_mask(dst.len().min(TILE_COLS));
            // SAFETY: AVX-512 F; the mask keeps the store inside `dst`.
            unsafe {
                _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, _mm512_loadu_ps(values.as_ptr()))
            };
        }
    }
}

/// One column tile's unpacked blocks.
struct Tiles {
    /// B tiles and parameters of blocks `blocks`, from `blocks.start` on.
    b_tiles: *const u8,
    params: *const BlockParams,
    blocks: std::ops::Range<usize>,
    /// Blocks per row (the prefetch spreads over all of them).
    total_blocks: usize,
    /// The next column tile's weight bytes, prefetched a share per block while the first
    /// sweep runs (null: none).
    next: *const u8,
    next_len: usize,
}

/// Picks the kernel instance for `rows.len()` (1..=8; Q6_K 1..=4) rows.
///
/// # Safety
/// As [`row_dots`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dispatch_rows(
    epilogue: u8,
    tiles: &Tiles,
    rows: &[RowPtrs],
    acc: &mut [[f32; TILE_COLS]],
) {
    debug_assert_eq!(rows.len(), acc.len());
    macro_rules! rows {
        ($e:expr, $($r:literal)*) => {
            match rows.len() {
                // SAFETY: the caller's contract; `rows` and `acc` hold `$r` rows.
                $($r => unsafe { row_dots::<{ $e }, $r>(tiles, rows.as_ptr(), acc.as_mut_ptr()) },)*
                _ => unreachable!("row sweeps hold 1..=8 rows"),
            }
        };
    }
    use super::unpack::{MIN, PLAIN};
    match epilogue {
        PLAIN => rows!(PLAIN, 1 2 3 4 5 6 7 8),
        MIN => rows!(MIN, 1 2 3 4 5 6 7 8),
        K_MIN => rows!(K_MIN, 1 2 3 4 5 6 7 8),
        _ => rows!(Q6, 1 2 3 4),
    }
}

/// Four activation bytes at `at`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn quad(at: *const i8) -> __m512i {
    // SAFETY: the caller's contract: four readable bytes.
    unsafe { _mm512_set1_epi32(at.cast::<i32>().read_unaligned()) }
}

/// Folds blocks `tiles.blocks` of `R` activation rows against the tile's 16 weight columns
/// into the rows' accumulators `io[r]` (from zero when the chunk starts the row), block by
/// block in order, with epilogue `E`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `tiles` holds its blocks' unpacked B tiles and parameters of the kind
/// `E` belongs to; `rows` and `acc` point at `R` rows, each holding those quantized blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn row_dots<const E: u8, const R: usize>(
    tiles: &Tiles,
    rows: *const RowPtrs,
    io: *mut [f32; TILE_COLS],
) {
    use super::unpack::PLAIN;
    // Levels that can be negative go in as `w + 128`.
    let biased = E == PLAIN || E == Q6;
    let tile_bytes = if E == Q6 { 2 } else { 1 } * B_TILE_BYTES;
    let row_bytes = 4 * TILE_COLS;
    // SAFETY: (whole body) the caller's contract: block b's tiles, parameters and activation
    // quants/scales/sums are in bounds for every b of the chunk.
    unsafe {
        let xs: [RowPtrs; R] = std::array::from_fn(|r| *rows.add(r));
        // (A loop, not `array::from_fn`: a generic closure carries no target features, so the
        // intrinsic would not be inlined.)
        let mut acc = [_mm512_setzero_ps(); R];
        if tiles.blocks.start > 0 {
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_loadu_ps((*io.add(r)).as_ptr());
            }
        }
        let bias = _mm512_set1_epi8(i8::MIN);
        for (i, b) in tiles.blocks.clone().enumerate() {
            if !tiles.next.is_null() {
                prefetch_share(tiles.next, tiles.next_len, b, tiles.total_blocks);
            }
            let tile = tiles.b_tiles.add(i * tile_bytes);
            let vectors = BlockVectors::load::<E>(&*tiles.params.add(i));
            let mut dot0 = [_mm512_setzero_si512(); R];
            let mut dot1 = [_mm512_setzero_si512(); R];
            if biased {
                for r in 0..R {
                    if E == Q6 {
                        let sums = xs[r].half_sums.add(2 * b);
                        dot0[r] = _mm512_set1_epi32(-128 * *sums);
                        dot1[r] = _mm512_set1_epi32(-128 * *sums.add(1));
                    } else {
                        dot0[r] = _mm512_set1_epi32(-128 * *xs[r].quant_sums.add(b));
                    }
                }
            }
            for kk in 0..QK / 4 {
                // Q6_K: elements 0..16 (k-quads 0..4) from the first tile, 16..32 from the
                // second (the other halves are zero).
                let from = if E == Q6 && kk >= 4 {
                    tile.add(B_TILE_BYTES)
                } else {
                    tile
                };
                let mut w = _mm512_loadu_si512(from.add(kk * row_bytes).cast());
                if biased {
                    w = _mm512_xor_si512(w, bias);
                }
                for r in 0..R {
                    let x = quad(xs[r].quants.add(b * QK + 4 * kk));
                    if E == Q6 && kk >= 4 {
                        dot1[r] = _mm512_dpbusd_epi32(dot1[r], w, x);
                    } else {
                        dot0[r] = _mm512_dpbusd_epi32(dot0[r], w, x);
                    }
                }
            }
            for r in 0..R {
                let x_scale = *xs[r].scales.add(b);
                let x_sum = *xs[r].block_sums.add(b);
                acc[r] = vectors.update::<E>(x_scale, x_sum, dot0[r], dot1[r], acc[r]);
            }
            if E == K_MIN && b % 8 == 7 {
                let first = b - 7;
                let ends = super::unpack::SuperBlockMins::load(tiles.params.add(i - 7));
                for r in 0..R {
                    let sums = std::slice::from_raw_parts(xs[r].block_sums.add(first), 8);
                    acc[r] = ends.apply(sums, acc[r]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps((*io.add(r)).as_mut_ptr(), *acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuFeatures;
    use crate::matmul::tests::{
        assert_same_bits, assert_tile_rows_batch_invariant, extreme_weights, isa_bits, public_bits,
        tile_bits, QUANTIZED,
    };
    use crate::matmul::{Isa, QMatrix, TileKernel};
    use crate::test_util::{random_weights, Rng};

    fn token_or_skip(test: &str) -> Option<Vnni512> {
        let token = Vnni512::for_isa(Isa::detect());
        if token.is_none() {
            eprintln!(
                "{test}: AVX-512 VNNI row sweeps skipped (this host lacks AVX-512 F/BW/VNNI, or \
                 TOKENMILL_KERNELS excludes them; CPU: {})",
                CpuFeatures::get()
            );
        }
        token
    }

    fn sweep_bits(
        token: Vnni512,
        matrix: &QMatrix,
        x: &[f32],
        n: usize,
        pool: &ThreadPool,
    ) -> Vec<u32> {
        tile_bits(TileKernel::Sweeps(token), matrix, x, n, pool)
    }

    /// The row sweeps equal the scalar twin bit for bit for every group-layout type, at every
    /// sweep width (1-8 rows, Q6_K 1-4) and split (9 = 5 + 4, 17 = 6 + 6 + 5), odd output
    /// widths (a padded last group, a half-empty last column tile) and input widths of one
    /// to three block chunks; the public entry point agrees at the same sizes.
    #[test]
    fn sweeps_equal_scalar_twin_bitwise() {
        let Some(token) = token_or_skip("sweeps_equal_scalar_twin_bitwise") else {
            return;
        };
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(41);
        for dtype in QUANTIZED {
            for &(rows, cols) in &[(37usize, 256usize), (16, 512), (24, 768), (9, 2304)] {
                let bytes = random_weights(&mut rng, dtype, rows, cols);
                let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
                for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 17] {
                    let x = rng.vec(n * cols, -2.0, 2.0);
                    let scalar = isa_bits(Isa::Scalar, &matrix, &x, n, &pool);
                    let context = format!("{dtype} {rows}x{cols} n={n}");
                    let sweeps = sweep_bits(token, &matrix, &x, n, &pool);
                    assert_same_bits(&sweeps, &scalar, &context);
                    let public = public_bits(&matrix, &x, n, &pool);
                    assert_same_bits(&public, &scalar, &format!("{context} matmul"));
                }
            }
        }
    }

    /// The largest integer dots each type can give (levels at their extremes, activations at
    /// -127, including the `w + 128` bias of signed levels) still match the scalar twin.
    #[test]
    fn sweeps_extreme_values_equal_scalar() {
        let Some(token) = token_or_skip("sweeps_extreme_values_equal_scalar") else {
            return;
        };
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(43);
        let (rows, cols) = (24usize, 1024usize);
        for dtype in QUANTIZED {
            let bytes = extreme_weights(&mut rng, dtype, rows, cols);
            let matrix = QMatrix::from_bytes(dtype, rows, cols, &bytes).unwrap();
            for (n, value) in [(7usize, -2.0f32), (11, 2.0)] {
                let x = vec![value; n * cols];
                let scalar = isa_bits(Isa::Scalar, &matrix, &x, n, &pool);
                let sweeps = sweep_bits(token, &matrix, &x, n, &pool);
                assert_same_bits(&sweeps, &scalar, &format!("{dtype} extreme x={value}"));
            }
        }
    }

    /// A row's result does not depend on its batch, on which sweep it lands in or at which
    /// position, or on the thread count; and equals the row computed alone on the group
    /// kernels.
    #[test]
    fn sweep_rows_are_batch_invariant() {
        let Some(token) = token_or_skip("sweep_rows_are_batch_invariant") else {
            return;
        };
        assert_tile_rows_batch_invariant(
            TileKernel::Sweeps(token),
            47,
            (45, 1536, 15),
            &[(1, 5), (3, 9), (6, 8)],
            &[0, 7, 14],
        );
    }

    /// Hosts without AVX-512 VNNI (or with the kernels narrowed below it) get no token and
    /// keep the group kernels.
    #[test]
    fn only_the_avx512_path_has_a_token() {
        assert_eq!(Vnni512::for_isa(Isa::Scalar), None);
        assert_eq!(Vnni512::for_isa(Isa::Avx2), None);
        assert_eq!(Vnni512::for_isa(Isa::AvxVnni), None);
        assert!(Vnni512::for_isa(Isa::Avx512).is_some());
    }
}
