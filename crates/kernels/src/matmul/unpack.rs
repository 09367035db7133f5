//! Weight blocks of the eight-row group layouts unpacked for tile-shaped kernels — the AMX
//! tiles (`amx.rs`) and the AVX-512 VNNI row sweeps (`vnni_tiles.rs`) — and the f32 epilogue
//! both apply to a block's exact integer dots.
//!
//! A 16-column tile is two interleaved eight-row groups side by side. Per 32-element block,
//! [`Weights::unpack`] writes the weight levels as int8 in the tile layout `[8 k-quads][16
//! columns][4 bytes]` (the layouts' own steps, two groups side by side, so unpacking is a
//! mask/shift plus the Q4_0/Q5_0/Q6_K offset, the fifth bits, the top bit pairs of Q6_K's
//! fourth block or the IQ4 / MXFP4 table per 64 bytes), and [`Weights::params_into`] the
//! block's column parameters as f32 lanes (MXFP4's E8M0 scales decoded exactly).
//! [`BlockVectors::update`] then folds one activation row's block dots into its accumulator in
//! the scalar twins' order: for every block
//! `acc = fma(d_w · d_x, dot, acc)`, then for Q4_1/Q5_1 `acc = fma(m_w, d_x · Σx, acc)`;
//! K-quants multiply the dot by the sub-block's integer scale first (Q6_K: two dots, one per
//! 16-element half with its own scale) and Q4_K/Q5_K end each super-block with the min term
//! ([`SuperBlockMins`]). Results are therefore bitwise equal to the scalar and AVX2 paths.

use std::arch::x86_64::*;

use super::grouped::{GroupedLayout, GROUP};
use super::interleaved::{GroupKind, Groups, NIBBLE_BYTES};
use super::kquant::{self, KGroups, KKind};
use crate::pool::{SharedMut, ThreadPool};
use crate::quant::{QK, QK_K};

/// Weight rows per B tile: two interleaved groups.
pub(crate) const TILE_COLS: usize = 2 * GROUP;
/// Bytes of one unpacked B tile: 8 k-quads × 16 columns × 4 bytes.
pub(crate) const B_TILE_BYTES: usize = QK * TILE_COLS;

/// Where one [`for_column_tiles`] call writes: [`ColumnTarget::row`]. A plain value rather
/// than a closure, so the tile kernels' write-out inlines (it was a `dyn` call, with a
/// `vzeroupper`, per row and column tile; the gain is within the noise of a prefill).
pub(crate) struct ColumnTarget<'o> {
    output: SharedMut<f32>,
    out_features: usize,
    /// The columns this call owns.
    columns: std::ops::Range<usize>,
    _out: std::marker::PhantomData<&'o mut [f32]>,
}

impl<'o> ColumnTarget<'o> {
    /// The output's row `row` from column `col` on: at most one tile's 16 values, all in this
    /// call's columns. Each `(row, col)` is asked for once.
    #[inline]
    pub(crate) fn row(&mut self, row: usize, col: usize) -> &'o mut [f32] {
        let lanes = TILE_COLS.min(self.out_features - col);
        assert!(
            self.columns.start <= col && col + lanes <= self.columns.end,
            "column tile outside the call's columns"
        );
        // SAFETY: the columns are this call's alone (the ranges `for_column_tiles` hands out
        // are disjoint, checked above), `slice_mut` checks the range against `out`, and `out`
        // outlives `'o`.
        unsafe { self.output.slice_mut(row * self.out_features + col, lanes) }
    }
}

/// What [`for_column_tiles`] runs per range: `(column tiles, target)`.
pub(crate) type ColumnTileTask<'a, 'o> =
    dyn Fn(std::ops::Range<usize>, ColumnTarget<'o>) + Sync + 'a;

/// Runs `task(col_tiles, target)` over a tile kernel's matmul: the `out_features` columns'
/// 16-column tiles cut into contiguous ranges (a share per thread, run in
/// [`super::PIECES_PER_THREAD`] pieces, `ThreadPool::parallel_ranges`), and `target` the
/// row-major `out`'s columns of those tiles, which only that call writes.
pub(crate) fn for_column_tiles<'o>(
    pool: &ThreadPool,
    out_features: usize,
    out: &'o mut [f32],
    task: &ColumnTileTask<'_, 'o>,
) {
    let n_col_tiles = out_features.div_ceil(TILE_COLS);
    let output = SharedMut::new(out);
    pool.parallel_ranges(n_col_tiles, super::PIECES_PER_THREAD, &|col_tiles| {
        let target = ColumnTarget {
            output,
            out_features,
            columns: col_tiles.start * TILE_COLS..(col_tiles.end * TILE_COLS).min(out_features),
            _out: std::marker::PhantomData,
        };
        task(col_tiles, target);
    });
}

/// How a block's integer dots become f32 (each the scalar twin's order per output element):
/// `acc = fma(d_w · d_x, dot, acc)` per block.
pub(crate) const PLAIN: u8 = 0;
/// Q4_1/Q5_1: then `acc = fma(m_w, d_x · Σx, acc)` per block.
pub(crate) const MIN: u8 = 1;
/// Q4_K/Q5_K: the dot times the sub-block's integer scale; after each super-block's eight
/// blocks `acc = fma(-dmin, Σ_j fma(min_j, d_x · Σx, ·), acc)`.
pub(crate) const K_MIN: u8 = 2;
/// Q6_K: two dots (elements 0..16 and 16..32) times their integer scales, summed.
pub(crate) const Q6: u8 = 3;

/// One 32-element block's column parameters for a 16-column tile.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
pub(crate) struct BlockParams {
    /// `d_w` (IQ4_XS `d · (ls - 32)`; MXFP4 `2^(e - 128)`; K-quants the super-block's `d`).
    scale: [f32; TILE_COLS],
    /// Q4_1/Q5_1 `m`; Q4_K/Q5_K the sub-block's 6-bit min.
    min: [f32; TILE_COLS],
    /// Q4_K/Q5_K the sub-block's 6-bit scale; Q6_K the scales of elements 0..16 and 16..32;
    /// small integers held as f32 (exact).
    int_scale: [[f32; TILE_COLS]; 2],
    /// Q4_K/Q5_K: `-dmin` of the super-block.
    neg_dmin: [f32; TILE_COLS],
}

/// One block's column parameters in registers, loaded once per block and applied to every
/// activation row's dots.
#[derive(Clone, Copy)]
pub(crate) struct BlockVectors {
    w_scale: __m512,
    int_scale0: __m512,
    int_scale1: __m512,
    w_min: __m512,
}

impl BlockVectors {
    /// The vectors epilogue `E` needs from `params` (the others zero).
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn load<const E: u8>(params: &BlockParams) -> BlockVectors {
        let zero = _mm512_setzero_ps();
        // SAFETY: aligned 64-byte arrays of `params`.
        unsafe {
            BlockVectors {
                w_scale: _mm512_load_ps(params.scale.as_ptr()),
                int_scale0: if E == K_MIN || E == Q6 {
                    _mm512_load_ps(params.int_scale[0].as_ptr())
                } else {
                    zero
                },
                int_scale1: if E == Q6 {
                    _mm512_load_ps(params.int_scale[1].as_ptr())
                } else {
                    zero
                },
                w_min: if E == MIN {
                    _mm512_load_ps(params.min.as_ptr())
                } else {
                    zero
                },
            }
        }
    }

    /// One activation row's accumulator after this block: `dot0` (Q6_K: elements 0..16, and
    /// `dot1` 16..32) are the exact integer dots of the row's block against the 16 columns,
    /// `x_scale` its `d_x` and `x_sum` its `d_x · Σx`.
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn update<const E: u8>(
        &self,
        x_scale: f32,
        x_sum: f32,
        dot0: __m512i,
        dot1: __m512i,
        acc: __m512,
    ) -> __m512 {
        let d = _mm512_mul_ps(self.w_scale, _mm512_set1_ps(x_scale));
        // The scaled dots are integers below 2^24 (K-quants: |dot| ≤ 32 · 31 · 127 times a
        // scale ≤ 63; Q6_K: two halves, each ≤ 16 · 32 · 127 times |s| ≤ 128), so these float
        // products and the sum are exact: the value of the scalar twin's integer
        // `(scale · dot) as f32`.
        let dot0 = _mm512_cvtepi32_ps(dot0);
        let dot = match E {
            K_MIN => _mm512_mul_ps(dot0, self.int_scale0),
            Q6 => _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(dot1),
                self.int_scale1,
                _mm512_mul_ps(dot0, self.int_scale0),
            ),
            _ => dot0,
        };
        let acc = _mm512_fmadd_ps(d, dot, acc);
        if E == MIN {
            _mm512_fmadd_ps(self.w_min, _mm512_set1_ps(x_sum), acc)
        } else {
            acc
        }
    }
}

/// A Q4_K/Q5_K super-block's min term: the eight sub-blocks' 6-bit mins and `-dmin`.
pub(crate) struct SuperBlockMins {
    mins: [__m512; 8],
    neg_dmin: __m512,
}

impl SuperBlockMins {
    /// The mins of the eight blocks whose parameters start at `first`.
    ///
    /// # Safety
    /// AVX-512 F; eight parameters readable from `first`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn load(first: *const BlockParams) -> SuperBlockMins {
        // SAFETY: the caller's contract.
        unsafe {
            // (A loop, not `array::from_fn`: a generic closure carries no target features, so
            // the intrinsic would not be inlined.)
            let mut mins = [_mm512_setzero_ps(); 8];
            for (j, min) in mins.iter_mut().enumerate() {
                *min = _mm512_load_ps((*first.add(j)).min.as_ptr());
            }
            SuperBlockMins {
                mins,
                neg_dmin: _mm512_load_ps((*first.add(7)).neg_dmin.as_ptr()),
            }
        }
    }

    /// `acc = fma(-dmin, m, acc)` with `m = Σ_j fma(min_j, d_x · Σx_j, m)` from 0, the
    /// scalar twin's order; `sums` are the row's eight block sums `d_x · Σx`.
    ///
    /// # Safety
    /// AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn apply(&self, sums: &[f32], acc: __m512) -> __m512 {
        let mut m = _mm512_setzero_ps();
        for (min, &sum) in self.mins.iter().zip(sums) {
            m = _mm512_fmadd_ps(*min, _mm512_set1_ps(sum), m);
        }
        _mm512_fmadd_ps(self.neg_dmin, m, acc)
    }
}

/// A matrix the AMX kernels read: eight-row groups of a 32-element-block type or a K-quant.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    Legacy(&'a Groups),
    KQuant(&'a KGroups),
}

impl Weights<'_> {
    pub(crate) fn out_features(self) -> usize {
        match self {
            Weights::Legacy(groups) => groups.out_features(),
            Weights::KQuant(groups) => groups.out_features(),
        }
    }

    /// 32-element blocks per row.
    pub(crate) fn blocks(self) -> usize {
        match self {
            Weights::Legacy(groups) => groups.n_blocks() * groups.kind().block_elems() / QK,
            Weights::KQuant(groups) => groups.n_super() * QK_K / QK,
        }
    }

    pub(crate) fn group(&self, group: usize) -> &[u8] {
        match *self {
            Weights::Legacy(groups) => groups.group(group),
            Weights::KQuant(groups) => groups.group(group),
        }
    }

    pub(crate) fn epilogue(self) -> u8 {
        match self {
            Weights::Legacy(groups) if groups.kind().has_min() => MIN,
            Weights::Legacy(_) => PLAIN,
            Weights::KQuant(groups) if groups.kind() == KKind::Q6 => Q6,
            Weights::KQuant(_) => K_MIN,
        }
    }

    /// B tiles per block: Q6_K's two 16-element halves get one each (the other half zero).
    pub(crate) fn tiles_per_block(self) -> usize {
        if self.epilogue() == Q6 {
            2
        } else {
            1
        }
    }

    /// Writes block `b`'s column parameters for groups `first` (columns 0..8) and `second`
    /// (8..16) into `params`: the values the scalar twins use (f16 widening, E8M0 decoding and
    /// the small integer products are exact, so vector and scalar decoding agree bit for bit).
    /// Fields this type does not use keep their values.
    ///
    /// # Safety
    /// AVX-512 F/BW; block `b` lies inside both groups.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) unsafe fn params_into(
        self,
        first: &[u8],
        second: &[u8],
        b: usize,
        params: &mut BlockParams,
    ) {
        // SAFETY: every load lies inside block (or super-block) b of a group, at the layout's
        // offsets (the caller's contract); stores go to `params`' 64-byte arrays.
        unsafe {
            match self {
                Weights::Legacy(groups) => {
                    let kind = groups.kind();
                    let subs = kind.block_elems() / QK;
                    let base = (b / subs) * kind.block_stride();
                    let scale = if kind == GroupKind::Mxfp4 {
                        let e = _mm512_cvtepu8_epi32(pair8(first, second, base));
                        super::vnni::e8m0_half_x16(e)
                    } else if kind == GroupKind::Iq4Xs {
                        let d = _mm512_cvtph_ps(pair16(first, second, base));
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
                        _mm512_cvtph_ps(pair16(first, second, base))
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
    }

    /// Blocks per unpacked chunk when at most `max` should be unpacked at a time: the row's
    /// blocks in equal chunks (K-quants: whole super-blocks of eight), so no short last chunk
    /// pays a pipeline start of its own.
    pub(crate) fn chunk_blocks(self, max: usize) -> usize {
        let blocks = self.blocks().max(1);
        let chunk = blocks.div_ceil(blocks.div_ceil(max.max(1)));
        match self {
            Weights::Legacy(_) => chunk,
            Weights::KQuant(_) => chunk.next_multiple_of(8).min(blocks),
        }
    }

    /// Unpacks blocks `blocks` of the 16-column tile of groups `first` and `second`: block
    /// `b`'s B tile(s) at `tiles + (b - blocks.start) · tiles_per_block() · B_TILE_BYTES` and
    /// its column parameters in `params[b - blocks.start]`. One loop per kind, so the kind's
    /// branches leave the loop.
    ///
    /// # Safety
    /// AVX-512 F/BW; both groups hold every block of `blocks`; `tiles` has room for their
    /// tiles and `params` at least `blocks.len()` entries.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) unsafe fn unpack_tile(
        self,
        first: &[u8],
        second: &[u8],
        blocks: std::ops::Range<usize>,
        tiles: *mut u8,
        params: &mut [BlockParams],
    ) {
        let tile_bytes = self.tiles_per_block() * B_TILE_BYTES;
        debug_assert!(params.len() >= blocks.len());
        macro_rules! each {
            ($unpack:ident, $kind:expr) => {
                for (i, b) in blocks.clone().enumerate() {
                    // SAFETY: the caller's contract: block b lies in both groups, its tiles
                    // inside `tiles` and its parameters at `params[i]`.
                    unsafe {
                        $unpack($kind, first, second, b, tiles.add(i * tile_bytes));
                        self.params_into(first, second, b, params.get_unchecked_mut(i));
                    }
                }
            };
        }
        match self {
            Weights::Legacy(groups) => match groups.kind() {
                GroupKind::Q4Zero => each!(unpack_legacy, GroupKind::Q4Zero),
                GroupKind::Q4One => each!(unpack_legacy, GroupKind::Q4One),
                GroupKind::Q5Zero => each!(unpack_legacy, GroupKind::Q5Zero),
                GroupKind::Q5One => each!(unpack_legacy, GroupKind::Q5One),
                GroupKind::Q8Zero => each!(unpack_legacy, GroupKind::Q8Zero),
                GroupKind::Iq4Nl => each!(unpack_legacy, GroupKind::Iq4Nl),
                GroupKind::Iq4Xs => each!(unpack_legacy, GroupKind::Iq4Xs),
                GroupKind::Mxfp4 => each!(unpack_legacy, GroupKind::Mxfp4),
            },
            Weights::KQuant(groups) => match groups.kind() {
                KKind::Q4 => each!(unpack_kquant, KKind::Q4),
                KKind::Q5 => each!(unpack_kquant, KKind::Q5),
                KKind::Q6 => each!(unpack_kquant, KKind::Q6),
            },
        }
    }
}

/// Asks L2 for share `b` of `blocks` of the `len` bytes at `start` (the next column tile's
/// weights; possibly past the matrix, since prefetching never faults). A hint only: results do
/// not depend on it.
///
/// Unpacking a column tile reads its weights from memory while the dots and epilogues that
/// follow (AMX tiles or VNNI row sweeps) read none, so without this the weight stream stalls during every
/// sweep. Spread over the first activation tile's blocks, the next tile's bytes arrive while
/// this one computes (one thread per core, 16-row verification steps of the default model:
/// 26.2-26.6 ms -> 24.4-25.7 ms; prefill and 64-row batches unchanged; bench/RESULTS.md).
#[inline(always)]
pub(crate) fn prefetch_share(start: *const u8, len: usize, b: usize, blocks: usize) {
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
#[inline]
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
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(kind.levels().as_ptr().cast()));
        let tabled = matches!(kind, GroupKind::Iq4Nl | GroupKind::Iq4Xs | GroupKind::Mxfp4);
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
            if tabled {
                low = _mm512_shuffle_epi8(table, low);
                high = _mm512_shuffle_epi8(table, high);
            } else if kind.offset() != 0 {
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
#[inline]
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
    use crate::matmul::{QMatrix, Storage};
    use crate::test_util::{random_weights, Rng};

    fn weights_of(matrix: &QMatrix) -> Weights<'_> {
        match &matrix.storage {
            Storage::Interleaved(groups) => Weights::Legacy(groups),
            Storage::KQuant(groups) => Weights::KQuant(groups),
            _ => unreachable!("a group layout"),
        }
    }

    /// Chunks split a row's blocks evenly within the bound (no short last chunk) and, for
    /// K-quants, only at super-block boundaries.
    #[test]
    fn chunks_are_even_and_keep_super_blocks() {
        let mut rng = Rng::new(3);
        for (dtype, cols, max, want) in [
            (DType::Q4_1, 576usize, 24usize, 18usize),
            (DType::Q4_1, 1536, 24, 24),
            (DType::Q4_1, 2048, 24, 22),
            (DType::Q4_1, 32, 24, 1),
            (DType::Q8_0, 8192, 24, 24),
            (DType::Q4_K, 2048, 24, 24),
            (DType::Q4_K, 1536, 16, 16),
            (DType::Q6_K, 256, 24, 8),
            (DType::Q5_K, 5120, 24, 24),
        ] {
            let bytes = random_weights(&mut rng, dtype, 16, cols);
            let matrix = QMatrix::from_bytes(dtype, 16, cols, &bytes).unwrap();
            let weights = weights_of(&matrix);
            let chunk = weights.chunk_blocks(max);
            assert_eq!(chunk, want, "{dtype} {cols} columns, at most {max}");
            if matches!(dtype, DType::Q4_K | DType::Q5_K | DType::Q6_K) {
                assert_eq!(chunk % 8, 0, "{dtype}: whole super-blocks");
            }
        }
    }
}
