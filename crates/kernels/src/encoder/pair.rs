//! The encoder's int8-pair GEMM: f32 linear layers computed on AMX int8 tiles at about 15-bit
//! precision, with exact integer sums.
//!
//! Every weight row (output column) and every activation row is scaled to 15-bit fixed point,
//! `q = round(v · FIXED_MAX / max|row|)` with `|q| ≤ FIXED_MAX = 127 · 128`, and `q` is split
//! into two int8 halves, `q = 128 · hi + lo` (`hi` in -127..=127, `lo` in -64..=63). A dot
//! product of two such rows is then
//!
//! `Σ qx · qw = 16384 · Σ hx · hw + 128 · (Σ hx · lw + Σ lx · hw) + Σ lx · lw`,
//!
//! and the first three sums are three tile multiplies (`tdpbssd`, 16 rows × 16 columns × 64
//! inputs each) into two int32 accumulators; the last, at most `64 · 64` per input against
//! terms up to `16256²`, is left out. The integer sums are exact whatever order the tiles take,
//! so the scalar twin (plain integer loops) is bitwise equal to the AMX kernel, and a row's
//! result never depends on the rows batched with it. The epilogue is one fixed float sequence
//! per output, the same in both: `t = fma(hh, 16384, mid · 128)`, `y = fma(t, s_x · s_w, bias)`
//! (`hh`, `mid` the int32 sums converted to f32, `s_x = max|x| / FIXED_MAX` and
//! `s_w = max|w| / FIXED_MAX` the row scales).
//!
//! Precision: each input and weight is off by at most half a unit of its row's 15-bit scale
//! (3e-5 of the row's largest magnitude), against bf16's 2^-9 of each value and Q8_0's 2^-8 of
//! each 32-block's largest: all-MiniLM-L6-v2's worst cosine with sentence-transformers' f32
//! vectors is 0.999997 (bf16: 0.999963; tests/bert_parity.rs). Speed: three int8 tile multiplies do 3 × 16384 multiply-adds in
//! about 48 cycles where AVX-512 F does 32 f32 multiply-adds a cycle (bench/RESULTS.md).
//!
//! A row with a NaN or an infinity yields NaN outputs (its scale is NaN and its integers zero);
//! an all-zero row yields the bias. Weights must be finite.

use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::gemm::check_lengths;
use crate::aligned::AlignedBytes;
#[cfg(target_arch = "x86_64")]
use crate::cpu::tiles::{release_tiles, TileConfig};
#[cfg(target_arch = "x86_64")]
use crate::matmul::Amx;
use crate::pool::{SharedMut, ThreadPool};
#[cfg(target_arch = "x86_64")]
use crate::simd::first_lanes_mask;
use crate::KernelError;

/// Largest fixed-point magnitude: `127 · 128`, so the high half of any value fits an i8.
const FIXED_MAX: f32 = 16256.0;
/// Rows of an A tile, columns of a B or C tile.
const TILE: usize = 16;
/// Inputs per tile multiply (64 int8 per A row).
const STEP: usize = 64;
/// Bytes of one B tile: 16 input quads × 16 columns × 4 bytes.
const B_TILE_BYTES: usize = STEP * TILE;
/// Row tiles per pool task.
const ROW_TILES_PER_TASK: usize = 4;
/// Column tiles per pool task.
const COL_TILES_PER_TASK: usize = 8;
/// Activation rows quantized per pool task.
const QUANTIZE_ROWS: usize = 64;

/// Which kernel multiplies the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PairKernel {
    /// Integer loops: the twin the tile kernel is tested against.
    Scalar,
    /// AMX int8 tiles, AVX-512 quantization and epilogue.
    #[cfg(target_arch = "x86_64")]
    Amx(Amx),
}

impl PairKernel {
    /// The AMX kernel where this process may run it, else the scalar twin.
    pub(crate) fn detect() -> PairKernel {
        #[cfg(target_arch = "x86_64")]
        if let Some(amx) = Amx::detect() {
            return PairKernel::Amx(amx);
        }
        PairKernel::Scalar
    }

    /// Every kernel this process may run, the scalar twin first (for tests).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<PairKernel> {
        let mut kernels = vec![PairKernel::Scalar];
        if PairKernel::detect() != PairKernel::Scalar {
            kernels.push(PairKernel::detect());
        }
        kernels
    }
}

/// Splits a fixed-point value (`|q| ≤ FIXED_MAX`) into `(hi, lo)` with `q = 128 · hi + lo`.
#[inline]
fn split(q: i32) -> (i8, i8) {
    let hi = (q + 64) >> 7;
    (hi as i8, (q - (hi << 7)) as i8)
}

/// `v` in fixed point for a row whose inverse scale is `inverse` (`FIXED_MAX / max|row|`):
/// rounded to nearest even, as `vcvtps2dq` rounds, and clamped.
#[inline]
fn fixed(v: f32, inverse: f32) -> i32 {
    ((v * inverse).round_ties_even() as i32).clamp(-(FIXED_MAX as i32), FIXED_MAX as i32)
}

/// The output of one (row, column): the epilogue both kernels run.
#[inline]
fn finish(hh: i32, mid: i32, scale: f32, bias: f32) -> f32 {
    let t = (hh as f32).mul_add(16384.0, mid as f32 * 128.0);
    t.mul_add(scale, bias)
}

/// An f32 weight `[out_features, in_features]` packed for [`Int8PairMatrix::matmul`].
#[derive(Debug, Clone)]
pub struct Int8PairMatrix {
    out_features: usize,
    in_features: usize,
    /// `in_features` rounded up to [`STEP`].
    padded_inputs: usize,
    /// `[column tile][step][hi, lo][16 quads][16 columns][4]`: B tiles in `tdpbssd`'s layout
    /// (input `4 · quad + i` of column `c` at `quad · 64 + c · 4 + i`), zero past the matrix.
    tiles: AlignedBytes,
    /// `max|w| / FIXED_MAX` per output column, zero past the matrix.
    scales: Vec<f32>,
    kernel: PairKernel,
}

impl Int8PairMatrix {
    /// Whether this process has the tile kernel (the scalar twin would be far slower than the
    /// f32 GEMM).
    pub fn supported() -> bool {
        PairKernel::detect() != PairKernel::Scalar
    }

    /// Packs row-major weights `[out_features][in_features]` (all finite).
    pub fn from_rows(
        out_features: usize,
        in_features: usize,
        values: &[f32],
    ) -> Result<Int8PairMatrix, KernelError> {
        Int8PairMatrix::with_kernel(PairKernel::detect(), out_features, in_features, values)
    }

    pub(crate) fn with_kernel(
        kernel: PairKernel,
        out_features: usize,
        in_features: usize,
        values: &[f32],
    ) -> Result<Int8PairMatrix, KernelError> {
        if in_features == 0 {
            return Err(KernelError::InvalidShape("int8-pair matrix with no inputs"));
        }
        if values.len() != out_features * in_features {
            return Err(KernelError::LengthMismatch {
                what: "int8-pair matrix values",
                expected: out_features * in_features,
                actual: values.len(),
            });
        }
        if !values.iter().all(|v| v.is_finite()) {
            return Err(KernelError::InvalidShape(
                "int8-pair matrix weights must be finite",
            ));
        }
        let padded_inputs = in_features.next_multiple_of(STEP);
        let steps = padded_inputs / STEP;
        let column_tiles = out_features.div_ceil(TILE);
        let mut packed = AlignedBytes::zeroed(column_tiles * steps * 2 * B_TILE_BYTES);
        let tiles = packed.as_i8_mut();
        let mut scales = vec![0.0f32; column_tiles * TILE];
        for (column, row) in values.chunks_exact(in_features).enumerate() {
            let max = row.iter().fold(0.0f32, |max, v| max.max(v.abs()));
            if max == 0.0 {
                continue;
            }
            scales[column] = max / FIXED_MAX;
            let inverse = FIXED_MAX / max;
            let (tile, c) = (column / TILE, column % TILE);
            for (k, &v) in row.iter().enumerate() {
                let (hi, lo) = split(fixed(v, inverse));
                let (step, within) = (k / STEP, k % STEP);
                let base = (tile * steps + step) * 2 * B_TILE_BYTES;
                let offset = (within / 4) * 64 + c * 4 + within % 4;
                tiles[base + offset] = hi;
                tiles[base + B_TILE_BYTES + offset] = lo;
            }
        }
        Ok(Int8PairMatrix {
            out_features,
            in_features,
            padded_inputs,
            tiles: packed,
            scales,
            kernel,
        })
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes held (tiles of both halves, padding included, and the column scales).
    pub fn storage_bytes(&self) -> usize {
        self.tiles.len() + self.scales.len() * 4
    }

    /// `out[n][out_features] ≈ x[n][in_features] · Wᵀ + bias` on `pool` (no bias: zero).
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let (k, width) = (self.in_features, self.out_features);
        let names = [
            "int8-pair matmul input",
            "int8-pair matmul output",
            "int8-pair matmul bias",
        ];
        if !check_lengths(names, k, width, x, n, bias, out)? {
            return Ok(());
        }
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let activations = scratch.quantize(self.kernel, pool, x, n, k, self.padded_inputs);
            self.multiply(pool, &activations, n, bias, out);
        });
        Ok(())
    }

    /// The products of the quantized activations with every column, tasks over (row-tile
    /// block, column-tile group).
    fn multiply(
        &self,
        pool: &ThreadPool,
        activations: &Activations<'_>,
        n: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) {
        let row_tiles = n.div_ceil(TILE);
        let column_tiles = self.out_features.div_ceil(TILE);
        let row_blocks = row_tiles.div_ceil(ROW_TILES_PER_TASK);
        let column_groups = column_tiles.div_ceil(COL_TILES_PER_TASK);
        let output = SharedMut::new(out);
        let output = &output;
        pool.parallel_for(row_blocks * column_groups, &|task| {
            let (block, group) = (task / column_groups, task % column_groups);
            let rows =
                block * ROW_TILES_PER_TASK..((block + 1) * ROW_TILES_PER_TASK).min(row_tiles);
            let columns =
                group * COL_TILES_PER_TASK..((group + 1) * COL_TILES_PER_TASK).min(column_tiles);
            let task = Task {
                matrix: self,
                activations,
                n,
                bias,
                output,
            };
            match self.kernel {
                PairKernel::Scalar => task.run_scalar(rows, columns),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: an `Amx` token exists only where AMX int8 tiles, their OS permission
                // and AVX-512 F/BW are all there.
                PairKernel::Amx(_) => unsafe { task.run_amx(rows, columns) },
            }
        });
    }
}

/// A call's activations in fixed point: `[padded rows][padded inputs]` per half, rows past
/// `n` zero, and each row's scale.
struct Activations<'a> {
    hi: &'a [i8],
    lo: &'a [i8],
    scales: &'a [f32],
    padded_inputs: usize,
}

/// Per-thread buffers for the quantized activations, grown to the largest call and reused.
#[derive(Default)]
struct Scratch {
    hi: AlignedBytes,
    lo: AlignedBytes,
    scales: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Scratch {
    /// Quantizes `x` (`n` rows of `k`) row by row on `pool`.
    fn quantize(
        &mut self,
        kernel: PairKernel,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        k: usize,
        padded_inputs: usize,
    ) -> Activations<'_> {
        let padded_rows = n.next_multiple_of(TILE);
        let len = padded_rows * padded_inputs;
        for half in [&mut self.hi, &mut self.lo] {
            if half.len() < len {
                half.resize(len);
            }
        }
        if self.scales.len() < padded_rows {
            self.scales.resize(padded_rows, 0.0);
        }
        let (hi, lo, scales) = (
            &mut self.hi.as_i8_mut()[..len],
            &mut self.lo.as_i8_mut()[..len],
            &mut self.scales[..padded_rows],
        );
        // Rows past `n` are zero in case a larger call left values there.
        hi[n * padded_inputs..].fill(0);
        lo[n * padded_inputs..].fill(0);
        scales[n..].fill(0.0);
        {
            let (hi_out, lo_out, scale_out) = (
                SharedMut::new(&mut hi[..]),
                SharedMut::new(&mut lo[..]),
                SharedMut::new(&mut scales[..]),
            );
            pool.parallel_for(n.div_ceil(QUANTIZE_ROWS), &|task| {
                for row in task * QUANTIZE_ROWS..((task + 1) * QUANTIZE_ROWS).min(n) {
                    // SAFETY: each task owns its rows' slices of the three buffers, which hold
                    // `padded_rows >= n` rows.
                    let (hi, lo, scale) = unsafe {
                        (
                            hi_out.slice_mut(row * padded_inputs, padded_inputs),
                            lo_out.slice_mut(row * padded_inputs, padded_inputs),
                            scale_out.slice_mut(row, 1),
                        )
                    };
                    scale[0] = quantize_row(kernel, &x[row * k..(row + 1) * k], hi, lo);
                }
            });
        }
        Activations {
            hi,
            lo,
            scales,
            padded_inputs,
        }
    }
}

/// Writes `row` in fixed point into `hi` and `lo` (zero past `row.len()`) and returns its
/// scale: NaN (integers zero) if any value is not finite, zero for an all-zero row.
fn quantize_row(kernel: PairKernel, row: &[f32], hi: &mut [i8], lo: &mut [i8]) -> f32 {
    let (max, finite) = match kernel {
        PairKernel::Scalar => row.iter().fold((0.0f32, true), |(max, finite), v| {
            (max.max(v.abs()), finite && v.is_finite())
        }),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the `Amx` token implies AVX-512 F.
        PairKernel::Amx(_) => unsafe { avx512::max_abs(row) },
    };
    if !finite || max == 0.0 {
        hi.fill(0);
        lo.fill(0);
        return if finite { 0.0 } else { f32::NAN };
    }
    let inverse = FIXED_MAX / max;
    match kernel {
        PairKernel::Scalar => {
            for (k, (h, l)) in hi.iter_mut().zip(lo.iter_mut()).enumerate() {
                (*h, *l) = row.get(k).map_or((0, 0), |&v| split(fixed(v, inverse)));
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the `Amx` token implies AVX-512 F/BW; `hi` and `lo` are equally long and
        // at least `row.len()` (a multiple of 16).
        PairKernel::Amx(_) => unsafe { avx512::quantize(row, inverse, hi, lo) },
    }
    max / FIXED_MAX
}

/// One pool task's share: a block of row tiles against a group of column tiles.
struct Task<'a> {
    matrix: &'a Int8PairMatrix,
    activations: &'a Activations<'a>,
    n: usize,
    bias: Option<&'a [f32]>,
    output: &'a SharedMut<f32>,
}

impl Task<'_> {
    fn bias(&self, column: usize) -> f32 {
        self.bias.map_or(0.0, |bias| bias[column])
    }

    /// The scalar twin: per output, the two integer sums over the packed halves, then
    /// [`finish`].
    fn run_scalar(&self, rows: std::ops::Range<usize>, columns: std::ops::Range<usize>) {
        let matrix = self.matrix;
        let padded = self.activations.padded_inputs;
        let steps = padded / STEP;
        let width = matrix.out_features;
        for row in rows.start * TILE..(rows.end * TILE).min(self.n) {
            let xh = &self.activations.hi[row * padded..(row + 1) * padded];
            let xl = &self.activations.lo[row * padded..(row + 1) * padded];
            for column in columns.start * TILE..(columns.end * TILE).min(width) {
                let (tile, c) = (column / TILE, column % TILE);
                let (mut hh, mut mid) = (0i32, 0i32);
                for k in 0..padded {
                    let (step, within) = (k / STEP, k % STEP);
                    let base = (tile * steps + step) * 2 * B_TILE_BYTES;
                    let offset = (within / 4) * 64 + c * 4 + within % 4;
                    let (wh, wl) = (
                        i32::from(matrix.tiles.as_i8()[base + offset]),
                        i32::from(matrix.tiles.as_i8()[base + B_TILE_BYTES + offset]),
                    );
                    let (h, l) = (i32::from(xh[k]), i32::from(xl[k]));
                    hh += h * wh;
                    mid += h * wl + l * wh;
                }
                let scale = self.activations.scales[row] * matrix.scales[column];
                let value = finish(hh, mid, scale, self.bias(column));
                // SAFETY: this task alone owns these rows × columns; the index lies inside
                // `out` (n × width, checked by `matmul`).
                unsafe { self.output.write(row * width + column, value) };
            }
        }
    }

    /// The AMX kernel: row tiles two at a time (one at the end of an odd block), against
    /// each column tile of the group in turn, the three tile multiplies per 64 inputs, then
    /// the AVX-512 epilogue. The two row tiles' activations stay in L1 across the column sweep
    /// while each column tile's weights are read once per pair of row tiles.
    ///
    /// # Safety
    /// AMX int8 with its permission and AVX-512 F/BW (an `Amx` token).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn run_amx(&self, rows: std::ops::Range<usize>, columns: std::ops::Range<usize>) {
        let padded = self.activations.padded_inputs;
        let steps = padded / STEP;
        let config = TileConfig::new(&[(TILE, STEP); 8]);
        // SAFETY: the caller's contract.
        unsafe { config.load() };
        let mut sums = Sums([[[0i32; TILE]; TILE]; 4]);
        let a = |row_tile: usize| {
            let offset = row_tile * TILE * padded;
            // SAFETY: the activation buffers hold whole row tiles of `padded` bytes per row.
            unsafe {
                (
                    self.activations.hi.as_ptr().add(offset),
                    self.activations.lo.as_ptr().add(offset),
                )
            }
        };
        let mut row_tile = rows.start;
        while row_tile < rows.end {
            let pair = row_tile + 1 < rows.end;
            for column_tile in columns.clone() {
                // SAFETY: the packed tiles hold `steps` pairs of B tiles per column tile.
                let b = unsafe {
                    self.matrix
                        .tiles
                        .as_ptr()
                        .cast::<i8>()
                        .add(column_tile * steps * 2 * B_TILE_BYTES)
                };
                // SAFETY: `a` gives 16 rows of `padded` bytes per half (rows are padded to
                // whole tiles), `b` `steps` pairs of B tiles, `sums` four 16 × 16 i32 tiles.
                unsafe {
                    tiles::multiply(
                        a(row_tile),
                        pair.then(|| a(row_tile + 1)),
                        padded,
                        b,
                        steps,
                        &mut sums,
                    )
                };
                for i in 0..1 + usize::from(pair) {
                    // SAFETY: the caller's contract (AVX-512 F).
                    unsafe {
                        self.epilogue(
                            row_tile + i,
                            column_tile,
                            &sums.0[2 * i],
                            &sums.0[2 * i + 1],
                        )
                    };
                }
            }
            row_tile += 1 + usize::from(pair);
        }
        // SAFETY: the caller's contract.
        unsafe { release_tiles() };
    }

    /// Writes one 16 × 16 output tile from its two integer sums with [`finish`]'s arithmetic.
    ///
    /// # Safety
    /// AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn epilogue(
        &self,
        row_tile: usize,
        column_tile: usize,
        hh: &[[i32; TILE]; TILE],
        mid: &[[i32; TILE]; TILE],
    ) {
        let width = self.matrix.out_features;
        let first_column = column_tile * TILE;
        let columns = TILE.min(width - first_column);
        let mask = first_lanes_mask(columns);
        // SAFETY: `scales` holds whole tiles; the bias is read under the column mask.
        let (column_scales, bias) = unsafe {
            (
                _mm512_loadu_ps(self.matrix.scales.as_ptr().add(first_column)),
                match self.bias {
                    Some(bias) => _mm512_maskz_loadu_ps(mask, bias.as_ptr().add(first_column)),
                    None => _mm512_setzero_ps(),
                },
            )
        };
        let first_row = row_tile * TILE;
        for r in 0..TILE.min(self.n - first_row) {
            let row = first_row + r;
            // SAFETY: the sums are 16 i32 per row; the output row `row < n` has `width`
            // values from `row * width`, written under the column mask by this task alone.
            unsafe {
                let hh = _mm512_cvtepi32_ps(_mm512_loadu_si512(hh[r].as_ptr().cast()));
                let mid = _mm512_cvtepi32_ps(_mm512_loadu_si512(mid[r].as_ptr().cast()));
                let t = _mm512_fmadd_ps(
                    hh,
                    _mm512_set1_ps(16384.0),
                    _mm512_mul_ps(mid, _mm512_set1_ps(128.0)),
                );
                let scale =
                    _mm512_mul_ps(_mm512_set1_ps(self.activations.scales[row]), column_scales);
                let value = _mm512_fmadd_ps(t, scale, bias);
                let out = self.output.slice_mut(row * width + first_column, columns);
                _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, value);
            }
        }
    }
}

/// Four 16 × 16 int32 tiles: `hh` and `mid` of the first row tile, then of the second.
#[repr(C, align(64))]
struct Sums([[[i32; TILE]; TILE]; 4]);

#[cfg(target_arch = "x86_64")]
mod tiles {
    use super::*;

    /// The integer sums of one or two A row tiles against one column tile over `steps` × 64
    /// inputs: tmm0/tmm1 = the first row tile's hi/lo (16 rows of 64 bytes, `a_stride`
    /// apart), tmm2/tmm3 = B hi/lo, tmm4/tmm5 = the first row tile's `hh`/`mid`, tmm6/tmm7
    /// the second's (whose hi/lo reuse tmm0/tmm1 once the first's products are issued).
    ///
    /// # Safety
    /// Tiles configured as 8 × (16 rows, 64 bytes); each `(hi, lo)` of `a0` (and `a1`)
    /// points at 16 rows of `steps · 64` bytes, `a_stride` apart; `b` at `steps` pairs of B
    /// tiles.
    pub(super) unsafe fn multiply(
        a0: (*const i8, *const i8),
        a1: Option<(*const i8, *const i8)>,
        a_stride: usize,
        b: *const i8,
        steps: usize,
        sums: &mut Sums,
    ) {
        let b_stride = 4 * TILE;
        // SAFETY: the caller's contract covers every asm block below: each address read is in
        // the buffers it names, and `sums` holds the four stored tiles.
        unsafe {
            asm!(
                "tilezero tmm4",
                "tilezero tmm5",
                "tilezero tmm6",
                "tilezero tmm7",
                options(nostack, nomem)
            );
            for step in 0..steps {
                let k = step * STEP;
                let b = b.add(step * 2 * B_TILE_BYTES);
                asm!(
                    "tileloadd tmm2, [{b_hi} + {b_stride}*1]",
                    "tileloadd tmm0, [{a_hi} + {a_stride}*1]",
                    "tdpbssd tmm4, tmm0, tmm2",
                    "tileloadd tmm3, [{b_lo} + {b_stride}*1]",
                    "tdpbssd tmm5, tmm0, tmm3",
                    "tileloadd tmm1, [{a_lo} + {a_stride}*1]",
                    "tdpbssd tmm5, tmm1, tmm2",
                    a_hi = in(reg) a0.0.add(k),
                    a_lo = in(reg) a0.1.add(k),
                    a_stride = in(reg) a_stride,
                    b_hi = in(reg) b,
                    b_lo = in(reg) b.add(B_TILE_BYTES),
                    b_stride = in(reg) b_stride,
                    options(nostack, readonly)
                );
                if let Some(a1) = a1 {
                    asm!(
                        "tileloadd tmm0, [{a_hi} + {a_stride}*1]",
                        "tdpbssd tmm6, tmm0, tmm2",
                        "tdpbssd tmm7, tmm0, tmm3",
                        "tileloadd tmm1, [{a_lo} + {a_stride}*1]",
                        "tdpbssd tmm7, tmm1, tmm2",
                        a_hi = in(reg) a1.0.add(k),
                        a_lo = in(reg) a1.1.add(k),
                        a_stride = in(reg) a_stride,
                        options(nostack, readonly)
                    );
                }
            }
            let row_bytes = 4 * TILE;
            asm!(
                "tilestored [{c0} + {row_bytes}*1], tmm4",
                "tilestored [{c1} + {row_bytes}*1], tmm5",
                c0 = in(reg) sums.0[0].as_mut_ptr(),
                c1 = in(reg) sums.0[1].as_mut_ptr(),
                row_bytes = in(reg) row_bytes,
                options(nostack)
            );
            if a1.is_some() {
                asm!(
                    "tilestored [{c2} + {row_bytes}*1], tmm6",
                    "tilestored [{c3} + {row_bytes}*1], tmm7",
                    c2 = in(reg) sums.0[2].as_mut_ptr(),
                    c3 = in(reg) sums.0[3].as_mut_ptr(),
                    row_bytes = in(reg) row_bytes,
                    options(nostack)
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;

    /// The largest magnitude of `row` and whether every value is finite, from the largest
    /// magnitude's bit pattern: for non-negative floats the integer order is the float order,
    /// and an infinity or a NaN has bits at or above the infinity's, so one unsigned max per
    /// sixteen values finds both (the scalar twin's fold gives the same answer: max over
    /// magnitudes is exact in any order).
    ///
    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn max_abs(row: &[f32]) -> (f32, bool) {
        let magnitude = _mm512_set1_epi32(0x7fff_ffff);
        let (mut max0, mut max1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        let mut pairs = row.chunks_exact(32);
        for pair in &mut pairs {
            // SAFETY: `pair` holds 32 values.
            unsafe {
                let a = _mm512_loadu_si512(pair.as_ptr().cast());
                let b = _mm512_loadu_si512(pair.as_ptr().add(16).cast());
                max0 = _mm512_max_epu32(max0, _mm512_and_si512(a, magnitude));
                max1 = _mm512_max_epu32(max1, _mm512_and_si512(b, magnitude));
            }
        }
        for chunk in pairs.remainder().chunks(16) {
            let mask = first_lanes_mask(chunk.len());
            // SAFETY: the load is masked to the chunk's values.
            let v = unsafe { _mm512_maskz_loadu_epi32(mask, chunk.as_ptr().cast()) };
            max0 = _mm512_max_epu32(max0, _mm512_and_si512(v, magnitude));
        }
        let bits = _mm512_reduce_max_epu32(_mm512_max_epu32(max0, max1));
        (f32::from_bits(bits), bits < f32::INFINITY.to_bits())
    }

    /// [`super::fixed`] and [`super::split`] 16 values at a time; `hi`/`lo` past `row.len()`
    /// are written zero.
    ///
    /// # Safety
    /// AVX-512 F/BW; `hi.len() == lo.len()`, a multiple of 16, at least `row.len()`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize(row: &[f32], inverse: f32, hi: &mut [i8], lo: &mut [i8]) {
        let inverse = _mm512_set1_ps(inverse);
        let (low, high) = (
            _mm512_set1_epi32(-(FIXED_MAX as i32)),
            _mm512_set1_epi32(FIXED_MAX as i32),
        );
        let half = _mm512_set1_epi32(64);
        for start in (0..hi.len()).step_by(16) {
            let mask = first_lanes_mask(row.len().saturating_sub(start));
            // SAFETY: the load is masked to `row`'s values; the stores write 16 bytes at
            // `start`, inside `hi` and `lo` (multiples of 16 long).
            unsafe {
                let v = _mm512_maskz_loadu_ps(mask, row.as_ptr().add(start.min(row.len())));
                let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_mul_ps(v, inverse),
                );
                let q = _mm512_min_epi32(_mm512_max_epi32(q, low), high);
                let h = _mm512_srai_epi32::<7>(_mm512_add_epi32(q, half));
                let l = _mm512_sub_epi32(q, _mm512_slli_epi32::<7>(h));
                _mm_storeu_si128(hi.as_mut_ptr().add(start).cast(), _mm512_cvtepi32_epi8(h));
                _mm_storeu_si128(lo.as_mut_ptr().add(start).cast(), _mm512_cvtepi32_epi8(l));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn split_covers_the_fixed_range() {
        for q in -(FIXED_MAX as i32)..=FIXED_MAX as i32 {
            let (hi, lo) = split(q);
            assert_eq!(128 * i32::from(hi) + i32::from(lo), q);
            assert!(
                (-127..=127).contains(&hi) && (-64..=63).contains(&lo),
                "{q}"
            );
        }
    }

    #[test]
    fn matches_f64_reference_and_every_kernel_equals_the_scalar_twin_bitwise() {
        let available = PairKernel::available();
        eprintln!("int8-pair matmul kernels tested against the scalar twin: {available:?}");
        if available.len() == 1 {
            eprintln!(
                "skipped: AMX int8-pair matmul (host, its permission or TOKENMILL_AMX lacks it)"
            );
        }
        let mut rng = Rng::new(29);
        let pool = ThreadPool::new(3);
        // Widths off the tile size and odd tile counts, inputs off the 64-wide step, rows
        // around the tile height (16) and the task's row block (64).
        for (width, k, n) in [
            (37, 19, 1),
            (16, 64, 16),
            (40, 130, 53),
            (384, 384, 101),
            (48, 1536, 17),
            (33, 41, 65),
            (272, 8, 600),
        ] {
            let w = rng.vec(width * k, -1.0, 1.0);
            let mut x = rng.vec(n * k, -2.0, 2.0);
            // One row with an outlier 300x its neighbours, one all zero.
            x[..k].iter_mut().for_each(|v| *v *= 0.01);
            x[0] = 3.0;
            if n > 2 {
                x[2 * k..3 * k].fill(0.0);
            }
            let bias = rng.vec(width, -0.5, 0.5);
            for bias in [None, Some(bias.as_slice())] {
                let expected = super::super::gemm::tests::reference(&w, &x, n, k, bias);
                let twin = Int8PairMatrix::with_kernel(PairKernel::Scalar, width, k, &w).unwrap();
                let mut scalar = vec![0.0; n * width];
                twin.matmul(&pool, &x, n, bias, &mut scalar).unwrap();
                // Each product is off by at most ~7.7e-5 of max|x_row| · max|w_col|.
                for i in 0..n {
                    let max_x = x[i * k..(i + 1) * k]
                        .iter()
                        .fold(0.0f32, |m, v| m.max(v.abs()));
                    for j in 0..width {
                        let max_w = w[j * k..(j + 1) * k]
                            .iter()
                            .fold(0.0f32, |m, v| m.max(v.abs()));
                        let bound = 1e-4 * k as f64 * f64::from(max_x * max_w) + 1e-6;
                        let (got, want) = (scalar[i * width + j], expected[i * width + j]);
                        assert!((f64::from(got) - want).abs() <= bound, "{got} vs {want}");
                    }
                }
                let error: f64 = scalar
                    .iter()
                    .zip(&expected)
                    .map(|(&g, w)| (f64::from(g) - w).powi(2))
                    .sum();
                let norm: f64 = expected.iter().map(|w| w * w).sum();
                assert!(error.sqrt() <= 1e-4 * norm.sqrt(), "{width}x{k} n={n}");
                if n > 2 && bias.is_none() {
                    assert!(scalar[2 * width..3 * width].iter().all(|&v| v == 0.0));
                }
                for &kernel in &available[1..] {
                    let matrix = Int8PairMatrix::with_kernel(kernel, width, k, &w).unwrap();
                    let mut out = vec![0.0; n * width];
                    matrix.matmul(&pool, &x, n, bias, &mut out).unwrap();
                    assert_eq!(bits(&out), bits(&scalar), "{kernel:?} {width}x{k} n={n}");
                }
            }
        }
    }

    #[test]
    fn a_row_with_a_nan_or_an_infinity_gives_nan_and_leaves_the_others() {
        let mut rng = Rng::new(31);
        let (width, k, n) = (20, 70, 4);
        let w = rng.vec(width * k, -1.0, 1.0);
        let pool = ThreadPool::new(2);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = rng.vec(n * k, -1.0, 1.0);
            x[k + 5] = bad;
            for kernel in PairKernel::available() {
                let matrix = Int8PairMatrix::with_kernel(kernel, width, k, &w).unwrap();
                let mut out = vec![0.0; n * width];
                matrix.matmul(&pool, &x, n, None, &mut out).unwrap();
                assert!(
                    out[width..2 * width].iter().all(|v| v.is_nan()),
                    "{kernel:?}"
                );
                let finite = [&out[..width], &out[2 * width..]].concat();
                assert!(finite.iter().all(|v| v.is_finite()), "{kernel:?}");
            }
        }
        assert!(Int8PairMatrix::from_rows(1, 2, &[1.0, f32::NAN]).is_err());
    }

    #[test]
    fn a_row_is_the_same_alone_and_in_a_batch() {
        for kernel in PairKernel::available() {
            super::super::gemm::tests::check_rows_alone_equal_batched(|width, k, w| {
                let matrix = Int8PairMatrix::with_kernel(kernel, width, k, w).unwrap();
                Box::new(move |pool, x, n, out| matrix.matmul(pool, x, n, None, out).unwrap())
            });
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        super::super::gemm::tests::check_bad_lengths_rejected(
            Int8PairMatrix::from_rows,
            Int8PairMatrix::matmul,
        );
    }
}
