//! The float weight path (F32, and F16/BF16 kept 16-bit and widened in registers): weight rows
//! split over the pool, activation rows in tiles of [`ROW_TILE`] with a separate accumulator
//! each, and several weight rows per kernel call.
//!
//! Every output element is one (weight row, activation row) dot in the order of
//! `scalar::dot_tile`, whichever kernel computes it: the AVX2 kernel, its AVX-512 form (one
//! 16-lane register for the AVX2 kernel's two 8-lane accumulators) and the number of weight
//! rows or activation rows a call takes only change how independent dots interleave. So the
//! results depend on nothing but the two rows (not on `n`, the thread count or the host).
//!
//! A decode step (one activation row) streams every weight row once, one row per call: a single
//! sequential stream per thread is what the hardware prefetchers serve best (several rows per
//! call, i.e. several interleaved streams, read DRAM no faster on the Xeon host, measured).
//! Tiles of activation rows (prefill, batches) reuse each weight row from cache and are bound
//! by the FMAs, so there AVX-512 takes two weight rows per call ([`rows_per_call`]).

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::{avx2, float_avx512};
use super::{scalar, Isa, QMatrix, Tile};
use crate::dtype::{bf16_to_f32, f16_to_f32, DType};
use crate::pool::{SharedMut, ThreadPool};

/// Activation rows processed together against each weight row.
const ROW_TILE: usize = 4;
/// Weight rows visited for all activation tiles before moving on, sized to stay in L2.
const WEIGHT_ROWS_PER_PASS: usize = 32;

/// A float matrix's weights as the dot kernels read them.
#[derive(Clone, Copy)]
pub(super) enum FloatWeights<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

/// The exact f32 value of one 16-bit weight of `dtype` (F16 or BF16).
pub(super) fn half_widener(dtype: DType) -> fn(u16) -> f32 {
    match dtype {
        DType::BF16 => bf16_to_f32,
        _ => f16_to_f32,
    }
}

impl QMatrix {
    /// `out[n][out_features] = x[n][in_features] · Wᵀ` for float `weights` (see the module
    /// notes).
    pub(super) fn float_matmul(
        &self,
        isa: Isa,
        pool: &ThreadPool,
        weights: FloatWeights<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        let in_features = self.in_features;
        let tile = |first: usize| -> Tile<'_, ROW_TILE> {
            std::array::from_fn(|r| &x[(first + r) * in_features..(first + r + 1) * in_features])
        };
        let single = |i: usize| -> Tile<'_, 1> { [&x[i * in_features..(i + 1) * in_features]] };
        let out_features = self.out_features;
        let output = SharedMut::new(out);
        // Ranges of whole `ROW_TILE`-row units of weight rows.
        let units = out_features.div_ceil(ROW_TILE);
        pool.parallel_ranges(units, super::PIECES_PER_THREAD, &|range| {
            let first = range.start * ROW_TILE;
            let last = (range.end * ROW_TILE).min(out_features);
            let mut pass_start = first;
            while pass_start < last {
                let pass_end = (pass_start + WEIGHT_ROWS_PER_PASS).min(last);
                let rows = pass_start..pass_end;
                let mut i = 0;
                while i + ROW_TILE <= n {
                    let mut results = [[0.0f32; ROW_TILE]; WEIGHT_ROWS_PER_PASS];
                    let (tile, results) = (&tile(i), &mut results[..rows.len()]);
                    match rows_per_call(isa) {
                        2 => kernel_pass::<2, ROW_TILE>(isa, weights, rows.clone(), tile, results),
                        _ => kernel_pass::<1, ROW_TILE>(isa, weights, rows.clone(), tile, results),
                    }
                    for (j, values) in rows.clone().zip(results.iter()) {
                        for (r, value) in values.iter().enumerate() {
                            // SAFETY: this call alone owns output columns first..last, and
                            // (i + r, j) lies inside `out` (lengths checked by the caller).
                            unsafe { output.write((i + r) * out_features + j, *value) };
                        }
                    }
                    i += ROW_TILE;
                }
                while i < n {
                    let mut results = [[0.0f32; 1]; WEIGHT_ROWS_PER_PASS];
                    let results = &mut results[..rows.len()];
                    kernel_pass::<1, 1>(isa, weights, rows.clone(), &single(i), results);
                    for (j, values) in rows.clone().zip(results.iter()) {
                        // SAFETY: as above.
                        unsafe { output.write(i * out_features + j, values[0]) };
                    }
                    i += 1;
                }
                pass_start = pass_end;
            }
        });
    }
}

/// Weight rows per kernel call for a tile of [`ROW_TILE`] activation rows on `isa`: two on
/// AVX-512 (its 32 registers hold 2 × 4 accumulators: eight independent FMA chains), else one
/// (the tile's own four rows are the independent chains).
fn rows_per_call(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => 2,
        _ => 1,
    }
}

/// Computes `out[j - rows.start][r] = W[j] · tile[r]` for the weight rows in `rows`
/// (`out.len() == rows.len()`), `ROWS` rows per kernel call and the rest one by one.
fn kernel_pass<const ROWS: usize, const R: usize>(
    isa: Isa,
    weights: FloatWeights<'_>,
    rows: Range<usize>,
    tile: &Tile<'_, R>,
    out: &mut [[f32; R]],
) {
    debug_assert_eq!(out.len(), rows.len());
    let (chunks, rest) = out.as_chunks_mut::<ROWS>();
    let mut j = rows.start;
    for chunk in chunks {
        dot_rows::<ROWS, R>(isa, weights, j, tile, chunk);
        j += ROWS;
    }
    for result in rest {
        dot_rows::<1, R>(isa, weights, j, tile, std::array::from_mut(result));
        j += 1;
    }
}

/// `out[i][r] = W[first + i] · tile[r]` for `ROWS` consecutive weight rows.
fn dot_rows<const ROWS: usize, const R: usize>(
    isa: Isa,
    weights: FloatWeights<'_>,
    first: usize,
    tile: &Tile<'_, R>,
    out: &mut [[f32; R]; ROWS],
) {
    let k = tile[0].len();
    // SAFETY (the two SIMD arms): the SIMD `Isa`s are only constructed after detecting (at
    // least) AVX2, FMA and F16C, `Isa::Avx512` after AVX-512 F as well; `row_starts` checked
    // that each of the rows holds `k` weights, and every activation row holds `k` values (the
    // tile is cut at `in_features`).
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 => unsafe {
            match weights {
                FloatWeights::F32(w) => float_avx512::dot_float::<ROWS, R, { avx2::F32_WEIGHTS }>(
                    k,
                    row_starts(w, first, k),
                    tile,
                    out,
                ),
                FloatWeights::F16(w) => float_avx512::dot_float::<ROWS, R, { avx2::F16_WEIGHTS }>(
                    k,
                    row_starts(w, first, k),
                    tile,
                    out,
                ),
                FloatWeights::Bf16(w) => {
                    float_avx512::dot_float::<ROWS, R, { avx2::BF16_WEIGHTS }>(
                        k,
                        row_starts(w, first, k),
                        tile,
                        out,
                    )
                }
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 | Isa::AvxVnni => unsafe {
            match weights {
                FloatWeights::F32(w) => avx2::dot_float::<ROWS, R, { avx2::F32_WEIGHTS }>(
                    k,
                    row_starts(w, first, k),
                    tile,
                    out,
                ),
                FloatWeights::F16(w) => avx2::dot_float::<ROWS, R, { avx2::F16_WEIGHTS }>(
                    k,
                    row_starts(w, first, k),
                    tile,
                    out,
                ),
                FloatWeights::Bf16(w) => avx2::dot_float::<ROWS, R, { avx2::BF16_WEIGHTS }>(
                    k,
                    row_starts(w, first, k),
                    tile,
                    out,
                ),
            }
        },
        Isa::Scalar => {
            for (i, results) in out.iter_mut().enumerate() {
                let j = first + i;
                match weights {
                    FloatWeights::F32(w) => {
                        let w = &w[j * k..(j + 1) * k];
                        scalar::dot_tile::<R>(k, |c| w[c], tile, results);
                    }
                    FloatWeights::F16(w) => {
                        let w = &w[j * k..(j + 1) * k];
                        scalar::dot_tile::<R>(k, |c| f16_to_f32(w[c]), tile, results);
                    }
                    FloatWeights::Bf16(w) => {
                        let w = &w[j * k..(j + 1) * k];
                        scalar::dot_tile::<R>(k, |c| bf16_to_f32(w[c]), tile, results);
                    }
                }
            }
        }
    }
}

/// Byte pointers to weight rows `first..first + ROWS` of `k` elements each (bounds-checked:
/// panics, as slicing would, if a row is not wholly inside `weights`).
#[cfg(target_arch = "x86_64")]
fn row_starts<T, const ROWS: usize>(weights: &[T], first: usize, k: usize) -> [*const u8; ROWS] {
    std::array::from_fn(|i| {
        weights[(first + i) * k..(first + i + 1) * k]
            .as_ptr()
            .cast()
    })
}
