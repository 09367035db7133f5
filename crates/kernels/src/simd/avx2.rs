//! The AVX2 (and, where the caller holds AVX-512 F, 512-bit) bodies of [`super::VectorOps`].

use std::arch::x86_64::*;

#[cfg(test)]
use super::TileWeights;
use super::{scalar_silu_mul, KeyTile, OnlineSoftmax, GROUP, TILE};
use super::{EXP_HIGH, EXP_LN2_HIGH, EXP_LN2_LOW, EXP_LOW, EXP_POLY};

/// AVX2 body of `VectorOps::silu_mul`; the last `len % 8` elements take the scalar path.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let len = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: i + 8 <= len, within both slices.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(silu, u));
        }
        i += 8;
    }
    scalar_silu_mul(&mut gate[i..len], &up[i..len]);
}

/// `e^x` for 8 lanes: Cephes-style range reduction `x = n·ln2 + r` and a degree-6
/// polynomial (relative error ~1e-7); inputs below -87.3 (and -inf) give exactly 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp8(x: __m256) -> __m256 {
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LOW));
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_LOW)),
        _mm256_set1_ps(EXP_HIGH),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HIGH), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LOW), r);
    let mut y = _mm256_set1_ps(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(*c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let y = _mm256_add_ps(_mm256_fmadd_ps(y, r2, r), _mm256_set1_ps(1.0));
    let exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(exponent));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(y, scale))
}

/// [`exp8`] on sixteen lanes: the same operations lane for lane (the rounding, the
/// conversion and the underflow zeroing in their AVX-512 forms), so the same bits.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let underflow = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LOW));
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP_LOW)),
        _mm512_set1_ps(EXP_HIGH),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HIGH), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LOW), r);
    let mut y = _mm512_set1_ps(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(*c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let y = _mm512_add_ps(_mm512_fmadd_ps(y, r2, r), _mm512_set1_ps(1.0));
    let exponent = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(exponent));
    _mm512_maskz_mov_ps(!underflow, _mm512_mul_ps(y, scale))
}

/// `(exp8(a), exp8(b))` as one [`exp16`].
///
/// # Safety
/// The CPU must support AVX-512 F.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn exp8_pair(a: __m256, b: __m256) -> (__m256, __m256) {
    let both = _mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(a)),
        _mm256_castps_pd(b),
    );
    let weights = _mm512_castps_pd(exp16(_mm512_castpd_ps(both)));
    (
        _mm256_castpd_ps(_mm512_castpd512_pd256(weights)),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(weights)),
    )
}

/// A lane mask with the first `n` lanes (`n <= 8`) set.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn first_lanes(n: usize) -> __m256i {
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), iota)
}

/// [`scalar_exp`] of `a` and `b` with the FMA and rounding instructions inline.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scalar_exp_pair(a: f32, b: f32) -> (f32, f32) {
    (super::scalar_exp(a), super::scalar_exp(b))
}

/// Transposing reduction: lane `k` of the result is the sum of accumulator `k`'s lanes,
/// always added as `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce8(a: [__m256; 8]) -> __m256 {
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    // Lanes: keys 0-3 of the low halves, then keys 0-3 of the high halves.
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let low = _mm256_permute2f128_ps::<0x20>(u0, u1);
    let high = _mm256_permute2f128_ps::<0x31>(u0, u1);
    _mm256_add_ps(low, high)
}

/// Horizontal max, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn max_all(m: __m256) -> __m256 {
    let m = _mm256_max_ps(m, _mm256_permute2f128_ps::<1>(m, m));
    let m = _mm256_max_ps(m, _mm256_permute_ps::<0b0100_1110>(m));
    _mm256_max_ps(m, _mm256_permute_ps::<0b1011_0001>(m))
}

/// Horizontal sum in a fixed order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sum_all(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps::<1>(x, x)))
}

/// Dot products of `query` with eight key rows, one per lane, each accumulated over
/// 8-wide chunks of `d` in order (a masked last chunk when `d % 8 != 0`) and reduced by
/// [`reduce8`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; `query` and every `rows[k]` must point at `d`
/// readable f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores8(query: *const f32, rows: [*const f32; 8], d: usize) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c + 8 <= d {
        // SAFETY: c + 8 <= d, inside every row (caller contract).
        unsafe {
            let q = _mm256_loadu_ps(query.add(c));
            for (lane, row) in acc.iter_mut().zip(rows) {
                *lane = _mm256_fmadd_ps(q, _mm256_loadu_ps(row.add(c)), *lane);
            }
        }
        c += 8;
    }
    if c < d {
        let mask = first_lanes(d - c);
        // SAFETY: masked loads touch only lanes c..d, inside every row.
        unsafe {
            let q = _mm256_maskload_ps(query.add(c), mask);
            for (lane, row) in acc.iter_mut().zip(rows) {
                *lane = _mm256_fmadd_ps(q, _mm256_maskload_ps(row.add(c), mask), *lane);
            }
        }
    }
    reduce8(acc)
}

/// `acc[0 .. 8R] = acc · factor + Σ_t weights[t] · v_t[0 .. 8R]`, keys in order, with
/// `v_t` at `values + t * stride`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `acc` must be writable and every value row readable
/// for `8 * R` f32.
#[cfg(test)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate<const R: usize>(
    acc: *mut f32,
    values: *const f32,
    stride: usize,
    weights: &[f32],
    factor: __m256,
) {
    let mut lanes = [_mm256_setzero_ps(); R];
    // SAFETY: every access stays within the first 8R values of `acc` and of each row.
    unsafe {
        for (u, lane) in lanes.iter_mut().enumerate() {
            *lane = _mm256_mul_ps(_mm256_loadu_ps(acc.add(8 * u)), factor);
        }
        for (t, weight) in weights.iter().enumerate() {
            let w = _mm256_set1_ps(*weight);
            let row = values.add(t * stride);
            for (u, lane) in lanes.iter_mut().enumerate() {
                *lane = _mm256_fmadd_ps(w, _mm256_loadu_ps(row.add(8 * u)), *lane);
            }
        }
        for (u, lane) in lanes.iter().enumerate() {
            _mm256_storeu_ps(acc.add(8 * u), *lane);
        }
    }
}

/// [`accumulate`] for the last `n < 8` columns, with masked loads and stores.
///
/// # Safety
/// As for [`accumulate`], for `n` f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_tail(
    acc: *mut f32,
    values: *const f32,
    stride: usize,
    weights: &[f32],
    factor: __m256,
    n: usize,
) {
    let mask = first_lanes(n);
    // SAFETY: masked accesses touch only the first n values of `acc` and of each row.
    unsafe {
        let mut lane = _mm256_mul_ps(_mm256_maskload_ps(acc, mask), factor);
        for (t, weight) in weights.iter().enumerate() {
            let v = _mm256_maskload_ps(values.add(t * stride), mask);
            lane = _mm256_fmadd_ps(_mm256_set1_ps(*weight), v, lane);
        }
        _mm256_maskstore_ps(acc, mask, lane);
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA; `tile` must be valid for `query.len()`
/// (`KeyTile::is_valid`).
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_weights(
    query: &[f32],
    tile: KeyTile<'_>,
    scale: f32,
    state: &mut OnlineSoftmax,
) -> TileWeights {
    let d = query.len();
    let count = tile.count;
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let scale_v = _mm256_set1_ps(scale);
    let mut scores = [neg_inf; TILE / 8];
    for (group, score) in scores.iter_mut().enumerate() {
        let first = group * 8;
        if first >= count {
            break;
        }
        let n = (count - first).min(8);
        // Lanes past the tile re-read its last key; their scores are masked out below.
        let keys = tile.keys.as_ptr();
        let rows: [*const f32; 8] =
            std::array::from_fn(|k| keys.wrapping_add((first + k.min(n - 1)) * tile.stride));
        // SAFETY: AVX2/FMA enabled here; every row index is below `count`, so each row
        // holds d values (tile validated).
        let raw = unsafe { scores8(query.as_ptr(), rows, d) };
        let scaled = _mm256_mul_ps(raw, scale_v);
        *score = _mm256_blendv_ps(neg_inf, scaled, _mm256_castsi256_ps(first_lanes(n)));
    }
    let old_max = _mm256_set1_ps(state.max);
    let new_max = _mm256_max_ps(max_all(_mm256_max_ps(scores[0], scores[1])), old_max);
    let correction = _mm256_cvtss_f32(exp8(_mm256_sub_ps(old_max, new_max)));
    let weights0 = exp8(_mm256_sub_ps(scores[0], new_max));
    let weights1 = exp8(_mm256_sub_ps(scores[1], new_max));
    state.sum = state.sum * correction + sum_all(_mm256_add_ps(weights0, weights1));
    state.max = _mm256_cvtss_f32(new_max);
    let mut result = TileWeights {
        count,
        correction,
        ..TileWeights::EMPTY
    };
    // SAFETY: `weights` holds TILE = 16 f32.
    unsafe {
        _mm256_storeu_ps(result.weights.as_mut_ptr(), weights0);
        _mm256_storeu_ps(result.weights.as_mut_ptr().add(8), weights1);
    }
    result
}

/// # Safety
/// The CPU must support AVX2 and FMA; `tile` (with `tile.count == weights.count`) must be
/// valid for `acc.len()` (`KeyTile::is_valid`).
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn accumulate_one(tile: KeyTile<'_>, weights: &TileWeights, acc: &mut [f32]) {
    let d = acc.len();
    let w = &weights.weights[..tile.count];
    let factor = _mm256_set1_ps(weights.correction);
    let out = acc.as_mut_ptr();
    let values = tile.values.as_ptr();
    let stride = tile.stride;
    let mut c = 0;
    // Each call below covers columns inside c..d of `acc` and of every value row, which
    // hold d values (tile validated).
    while c + 64 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate::<8>(out.add(c), values.add(c), stride, w, factor) };
        c += 64;
    }
    if c + 32 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate::<4>(out.add(c), values.add(c), stride, w, factor) };
        c += 32;
    }
    if c + 16 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate::<2>(out.add(c), values.add(c), stride, w, factor) };
        c += 16;
    }
    if c + 8 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate::<1>(out.add(c), values.add(c), stride, w, factor) };
        c += 8;
    }
    if c < d {
        // SAFETY: AVX2/FMA enabled; the last d - c columns lie inside d.
        unsafe { accumulate_tail(out.add(c), values.add(c), stride, w, factor, d - c) };
    }
}

/// `accumulate::<R>` for two accumulators over the same value rows: per column, each runs
/// the same operations as alone, but every value load feeds both.
///
/// # Safety
/// As for [`accumulate`], for both accumulators.
#[cfg(test)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_pair<const R: usize>(
    acc: [*mut f32; 2],
    values: *const f32,
    stride: usize,
    weights: [&[f32]; 2],
    factor: [__m256; 2],
) {
    let mut lanes = [[_mm256_setzero_ps(); R]; 2];
    // SAFETY: every access stays within the first 8R values of each accumulator and row.
    unsafe {
        for ((pair, target), factor) in lanes.iter_mut().zip(acc).zip(factor) {
            for (u, lane) in pair.iter_mut().enumerate() {
                *lane = _mm256_mul_ps(_mm256_loadu_ps(target.add(8 * u)), factor);
            }
        }
        let [lanes_a, lanes_b] = &mut lanes;
        for (t, (wa, wb)) in weights[0].iter().zip(weights[1]).enumerate() {
            let (wa, wb) = (_mm256_set1_ps(*wa), _mm256_set1_ps(*wb));
            let row = values.add(t * stride);
            for (u, (a, b)) in lanes_a.iter_mut().zip(lanes_b.iter_mut()).enumerate() {
                let v = _mm256_loadu_ps(row.add(8 * u));
                *a = _mm256_fmadd_ps(wa, v, *a);
                *b = _mm256_fmadd_ps(wb, v, *b);
            }
        }
        for (pair, target) in lanes.iter().zip(acc) {
            for (u, lane) in pair.iter().enumerate() {
                _mm256_storeu_ps(target.add(8 * u), *lane);
            }
        }
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA; both weights have `tile.count` keys, both
/// accumulators the same length, and `tile` is valid for it (`KeyTile::is_valid`).
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn accumulate_two(
    tile: KeyTile<'_>,
    weights: [&TileWeights; 2],
    acc: [&mut [f32]; 2],
) {
    let d = acc[0].len();
    let w = [
        &weights[0].weights[..tile.count],
        &weights[1].weights[..tile.count],
    ];
    let factor = [
        _mm256_set1_ps(weights[0].correction),
        _mm256_set1_ps(weights[1].correction),
    ];
    let [acc_a, acc_b] = acc;
    let out = [acc_a.as_mut_ptr(), acc_b.as_mut_ptr()];
    // Offsets below stay inside both accumulators: every caller passes c < d.
    let at = |c: usize| [out[0].wrapping_add(c), out[1].wrapping_add(c)];
    let values = tile.values.as_ptr();
    let stride = tile.stride;
    let mut c = 0;
    // Each call below covers columns inside c..d of both accumulators and of every value
    // row, which hold d values (tile validated).
    while c + 32 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate_pair::<4>(at(c), values.add(c), stride, w, factor) };
        c += 32;
    }
    if c + 16 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate_pair::<2>(at(c), values.add(c), stride, w, factor) };
        c += 16;
    }
    if c + 8 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe { accumulate_pair::<1>(at(c), values.add(c), stride, w, factor) };
        c += 8;
    }
    if c < d {
        for ((target, w), factor) in at(c).into_iter().zip(w).zip(factor) {
            // SAFETY: AVX2/FMA enabled; the last d - c columns lie inside d.
            unsafe { accumulate_tail(target, values.add(c), stride, w, factor, d - c) };
        }
    }
}
/// Scores of `P` queries against the four key rows `rows`: lane `k` of the low half of
/// result `p` is the first half of [`reduce8`]'s tree (`((l0+l1)+(l2+l3))`-style sums of
/// the per-lane accumulators), so two quads combine into exactly what [`scores8`] gives.
///
/// # Safety
/// The CPU must support AVX2 and FMA; every query and row must point at `d` readable f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn score_quads<const P: usize>(
    queries: [*const f32; P],
    rows: [*const f32; 4],
    d: usize,
) -> [__m256; P] {
    let mut acc = [[_mm256_setzero_ps(); 4]; P];
    let mut c = 0;
    while c + 8 <= d {
        // SAFETY: c + 8 <= d, inside every query and row (caller contract).
        unsafe {
            let q: [__m256; P] = std::array::from_fn(|p| _mm256_loadu_ps(queries[p].add(c)));
            for (j, row) in rows.iter().enumerate() {
                let k = _mm256_loadu_ps(row.add(c));
                for (lanes, q) in acc.iter_mut().zip(&q) {
                    lanes[j] = _mm256_fmadd_ps(*q, k, lanes[j]);
                }
            }
        }
        c += 8;
    }
    if c < d {
        let mask = first_lanes(d - c);
        // SAFETY: masked loads touch only lanes c..d, inside every query and row.
        unsafe {
            let q: [__m256; P] =
                std::array::from_fn(|p| _mm256_maskload_ps(queries[p].add(c), mask));
            for (j, row) in rows.iter().enumerate() {
                let k = _mm256_maskload_ps(row.add(c), mask);
                for (lanes, q) in acc.iter_mut().zip(&q) {
                    lanes[j] = _mm256_fmadd_ps(*q, k, lanes[j]);
                }
            }
        }
    }
    std::array::from_fn(|p| {
        let a = &acc[p];
        _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]))
    })
}

/// Raw scores of `P` queries against tile keys `first .. first + n` (`1 <= n <= 8`), one
/// per lane, bitwise what [`scores8`] gives for each query; lanes `>= n` are unspecified.
/// `W` is the calling step's `WIDE`: one instantiation per caller, so LLVM inlines each
/// into its only caller (shared by both steps, it stayed a call in AVX2's).
///
/// # Safety
/// The CPU must support AVX2 and FMA; every query and every key row `first .. first + n`
/// (at `keys + row * stride`) must point at `d` readable f32.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_group<const P: usize, const W: bool>(
    queries: [*const f32; P],
    keys: *const f32,
    stride: usize,
    first: usize,
    n: usize,
    d: usize,
) -> [__m256; P] {
    // Lanes past the tile re-read its last key.
    let rows: [*const f32; 8] =
        std::array::from_fn(|k| keys.wrapping_add((first + k.min(n - 1)) * stride));
    if P == 1 {
        // One query: eight independent chains keep the FMA units busy.
        // SAFETY: every row index is below first + n (caller contract).
        let scores = unsafe { scores8(queries[0], rows, d) };
        return [scores; P];
    }
    let quad = |half: usize| -> [*const f32; 4] { std::array::from_fn(|j| rows[4 * half + j]) };
    // SAFETY: every row index is below first + n (caller contract).
    let low = unsafe { score_quads::<P>(queries, quad(0), d) };
    // Lanes 4..8 come only from the second quad; they are unused when n <= 4.
    let high = if n > 4 {
        // SAFETY: as above.
        unsafe { score_quads::<P>(queries, quad(1), d) }
    } else {
        [_mm256_setzero_ps(); P]
    };
    std::array::from_fn(|p| {
        let (u0, u1) = (low[p], high[p]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(u0, u1),
            _mm256_permute2f128_ps::<0x31>(u0, u1),
        )
    })
}

/// `acc[p][0 .. 8R] = acc[p] · factor[p] + Σ_t weights[p][t] · v_t[0 .. 8R]` for `P`
/// accumulators, keys in order, every value load feeding all of them; each accumulator
/// sees the same operations for any `P` and `R`. `W`: as in [`scores_group`].
///
/// # Safety
/// The CPU must support AVX2 and FMA; every accumulator must be writable and every value
/// row (at `values + t * stride`) readable for `8 * R` f32; all weights have equal length.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate_group<const P: usize, const R: usize, const W: bool>(
    acc: [*mut f32; P],
    values: *const f32,
    stride: usize,
    weights: &[[f32; TILE]; P],
    count: usize,
    factor: [__m256; P],
) {
    let mut lanes = [[_mm256_setzero_ps(); R]; P];
    // SAFETY: every access stays within the first 8R values of each accumulator and row,
    // and t < count <= TILE.
    unsafe {
        for ((group, target), factor) in lanes.iter_mut().zip(acc).zip(factor) {
            for (u, lane) in group.iter_mut().enumerate() {
                *lane = _mm256_mul_ps(_mm256_loadu_ps(target.add(8 * u)), factor);
            }
        }
        // `t` indexes every pair's weights at once.
        #[allow(clippy::needless_range_loop)]
        for t in 0..count {
            let w: [__m256; P] = std::array::from_fn(|p| _mm256_set1_ps(weights[p][t]));
            let row = values.add(t * stride);
            for u in 0..R {
                let v = _mm256_loadu_ps(row.add(8 * u));
                for (group, w) in lanes.iter_mut().zip(&w) {
                    group[u] = _mm256_fmadd_ps(*w, v, group[u]);
                }
            }
        }
        for (group, target) in lanes.iter().zip(acc) {
            for (u, lane) in group.iter().enumerate() {
                _mm256_storeu_ps(target.add(8 * u), *lane);
            }
        }
    }
}

/// `a + b` per 128-bit block as `_mm256_hadd_ps` adds: `[a0+a1, a2+a3, b0+b1, b2+b3]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn hadd16(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(a, b),
        _mm512_shuffle_ps::<0b11_01_11_01>(a, b),
    )
}

/// [`scores_group`] for `d % 8 == 0`, two keys per 512-bit accumulator (key `2j` in the
/// low half, `2j + 1` in the high), so each multiply-add serves two keys; [`hadd16`]
/// replays [`reduce8`]'s tree on both halves at once, so every score has its bits.
///
/// # Safety
/// As [`scores_group`], with AVX-512 F and `d % 8 == 0`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn scores_group16<const P: usize>(
    queries: [*const f32; P],
    keys: *const f32,
    stride: usize,
    first: usize,
    n: usize,
    d: usize,
) -> [__m256; P] {
    // Lanes past the tile re-read its last key.
    let rows: [*const f32; 8] =
        std::array::from_fn(|k| keys.wrapping_add((first + k.min(n - 1)) * stride));
    let mut acc = [[_mm512_setzero_ps(); 4]; P];
    let mut c = 0;
    // SAFETY: c + 8 <= d inside every query and row (caller contract, d % 8 == 0).
    #[allow(clippy::needless_range_loop)]
    unsafe {
        while c < d {
            let mut q = [_mm512_setzero_ps(); P];
            for p in 0..P {
                // (The f64x4 forms are AVX-512 F; the f32x8 ones need DQ.)
                let chunk = _mm256_castps_pd(_mm256_loadu_ps(queries[p].add(c)));
                q[p] = _mm512_castpd_ps(_mm512_broadcast_f64x4(chunk));
            }
            for j in 0..4 {
                let low =
                    _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(rows[2 * j].add(c))));
                let high = _mm256_castps_pd(_mm256_loadu_ps(rows[2 * j + 1].add(c)));
                let k = _mm512_castpd_ps(_mm512_insertf64x4::<1>(low, high));
                for p in 0..P {
                    acc[p][j] = _mm512_fmadd_ps(q[p], k, acc[p][j]);
                }
            }
            c += 8;
        }
    }
    let mut out = [_mm256_setzero_ps(); P];
    for (out, a) in out.iter_mut().zip(&acc) {
        // Blocks: low sums of keys 0, 2, 4, 6; their high sums; the same for 1, 3, 5, 7.
        let u = hadd16(hadd16(a[0], a[1]), hadd16(a[2], a[3]));
        let even = _mm_add_ps(
            _mm512_extractf32x4_ps::<0>(u),
            _mm512_extractf32x4_ps::<1>(u),
        );
        let odd = _mm_add_ps(
            _mm512_extractf32x4_ps::<2>(u),
            _mm512_extractf32x4_ps::<3>(u),
        );
        *out = _mm256_set_m128(_mm_unpackhi_ps(even, odd), _mm_unpacklo_ps(even, odd));
    }
    out
}

/// `acc[p][0 .. 16R] = acc[p] · factor[p] + Σ_t weights[p][t] · v_t[0 .. 16R]`: what
/// [`accumulate_group`] does, sixteen lanes per operation (each lane sees the same
/// multiply and the same fused multiply-adds in the same key order).
///
/// # Safety
/// The CPU must support AVX-512 F; every accumulator must be writable and every value
/// row (at `values + t * stride`) readable for `16 * R` f32; `t < count <= TILE`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_group16<const P: usize, const R: usize>(
    acc: [*mut f32; P],
    values: *const f32,
    stride: usize,
    weights: &[[f32; TILE]; P],
    count: usize,
    corrections: &[f32; 8],
) {
    let mut lanes = [[_mm512_setzero_ps(); R]; P];
    // Index loops over the constant bounds: fully unrolled, the accumulators stay in
    // registers (iterator chains here left them on the stack).
    // SAFETY: every access stays within the first 16R values of each accumulator and row,
    // and t < count <= TILE.
    #[allow(clippy::needless_range_loop)]
    unsafe {
        for p in 0..P {
            let factor = _mm512_set1_ps(corrections[p]);
            for u in 0..R {
                lanes[p][u] = _mm512_mul_ps(_mm512_loadu_ps(acc[p].add(16 * u)), factor);
            }
        }
        for t in 0..count {
            let row = values.add(t * stride);
            let mut w = [_mm512_setzero_ps(); P];
            for p in 0..P {
                w[p] = _mm512_set1_ps(weights[p][t]);
            }
            for u in 0..R {
                let v = _mm512_loadu_ps(row.add(16 * u));
                for p in 0..P {
                    lanes[p][u] = _mm512_fmadd_ps(w[p], v, lanes[p][u]);
                }
            }
        }
        for p in 0..P {
            for u in 0..R {
                _mm512_storeu_ps(acc[p].add(16 * u), lanes[p][u]);
            }
        }
    }
}

/// AVX2 body of `VectorOps::attend_group` for `P` pairs (at most three: more spill
/// AVX2's 16 registers).
///
/// # Safety
/// The CPU must support AVX2 and FMA; `1 <= P <= 3`; `states.len() == P`;
/// `accs.len() == P * d` with every query pointing at `d` readable f32; `tile` must be
/// valid for `d` (`KeyTile::is_valid`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend_group<const P: usize>(
    queries: [*const f32; P],
    tile: KeyTile<'_>,
    scale: f32,
    states: &mut [OnlineSoftmax],
    accs: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe { attend_group_with::<P, false>(queries, tile, scale, states, accs) }
}

/// [`attend_group`] compiled with AVX-512 F/VL: the same 256-bit operations with 32
/// registers (up to [`GROUP`] pairs), and the V rows added sixteen lanes at a time
/// ([`accumulate_group16`]), which gives every lane AVX2's bits.
///
/// # Safety
/// As [`attend_group`], with AVX-512 F/VL as well and `1 <= P <= GROUP`.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
pub(super) unsafe fn attend_group_wide<const P: usize>(
    queries: [*const f32; P],
    tile: KeyTile<'_>,
    scale: f32,
    states: &mut [OnlineSoftmax],
    accs: &mut [f32],
) {
    // SAFETY: the caller's contract.
    unsafe { attend_group_with::<P, true>(queries, tile, scale, states, accs) }
}

/// The body of [`attend_group`] (`WIDE`: [`attend_group_wide`]'s, whose features it is
/// inlined under).
///
/// # Safety
/// As the entry point that calls it.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_group_with<const P: usize, const WIDE: bool>(
    queries: [*const f32; P],
    tile: KeyTile<'_>,
    scale: f32,
    states: &mut [OnlineSoftmax],
    accs: &mut [f32],
) {
    let d = accs.len() / P;
    let count = tile.count;
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let scale_v = _mm256_set1_ps(scale);
    let mut scores = [[neg_inf; TILE / 8]; P];
    for half in 0..TILE / 8 {
        let first = half * 8;
        if first >= count {
            break;
        }
        let n = (count - first).min(8);
        let keys = tile.keys.as_ptr();
        // SAFETY: AVX2/FMA enabled here; every row index is below `count`, so each
        // row holds d values (tile validated), as does every query.
        let raw = if WIDE && d.is_multiple_of(8) {
            // SAFETY: as above, with AVX-512 F (`attend_group_wide`'s contract).
            unsafe { scores_group16::<P>(queries, keys, tile.stride, first, n, d) }
        } else {
            // SAFETY: as above.
            unsafe { scores_group::<P, WIDE>(queries, keys, tile.stride, first, n, d) }
        };
        let mask = _mm256_castsi256_ps(first_lanes(n));
        for (score, raw) in scores.iter_mut().zip(raw) {
            score[half] = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(raw, scale_v), mask);
        }
    }
    // New maxima per pair; the rescale factors of all pairs share one exp8 (lane p holds
    // pair p's `old_max - new_max`, exactly the value it would use alone).
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut new_max = [_mm256_setzero_ps(); P];
    let mut diffs = _mm256_setzero_ps();
    for (p, ((max, score), state)) in new_max.iter_mut().zip(&scores).zip(&*states).enumerate() {
        let old_max = _mm256_set1_ps(state.max);
        *max = _mm256_max_ps(max_all(_mm256_max_ps(score[0], score[1])), old_max);
        let lane = _mm256_castsi256_ps(_mm256_cmpeq_epi32(iota, _mm256_set1_epi32(p as i32)));
        diffs = _mm256_blendv_ps(diffs, _mm256_sub_ps(old_max, *max), lane);
    }
    let mut corrections = [0.0f32; 8];
    // SAFETY: `corrections` holds 8 f32.
    unsafe { _mm256_storeu_ps(corrections.as_mut_ptr(), exp8(diffs)) };
    let mut weights = [[0.0f32; TILE]; P];
    for p in 0..P {
        let max = new_max[p];
        let (weights0, weights1) = if WIDE && count > 8 {
            let (low, high) = (scores[p][0], scores[p][1]);
            // Both halves in one 16-lane exp.
            // SAFETY: AVX-512 F (`attend_group_wide`'s contract).
            unsafe { exp8_pair(_mm256_sub_ps(low, max), _mm256_sub_ps(high, max)) }
        } else {
            let weights0 = exp8(_mm256_sub_ps(scores[p][0], max));
            // Keys 8.. absent: their weights are exactly 0 (what exp8 gives for -inf).
            let weights1 = if count > 8 {
                exp8(_mm256_sub_ps(scores[p][1], max))
            } else {
                _mm256_setzero_ps()
            };
            (weights0, weights1)
        };
        let state = &mut states[p];
        state.sum = state.sum * corrections[p] + sum_all(_mm256_add_ps(weights0, weights1));
        state.max = _mm256_cvtss_f32(max);
        // SAFETY: `weights[p]` holds TILE = 16 f32.
        unsafe {
            _mm256_storeu_ps(weights[p].as_mut_ptr(), weights0);
            _mm256_storeu_ps(weights[p].as_mut_ptr().add(8), weights1);
        }
    }
    let factor: [__m256; P] = std::array::from_fn(|p| _mm256_set1_ps(corrections[p]));
    let out = accs.as_mut_ptr();
    // Offsets below stay inside every accumulator: callers pass c < d.
    let at = |c: usize| -> [*mut f32; P] { std::array::from_fn(|p| out.wrapping_add(p * d + c)) };
    let values = tile.values.as_ptr();
    let stride = tile.stride;
    let mut c = 0;
    // Each call below covers columns inside c..d of every accumulator and value row, which
    // hold d values (tile validated); the widest step keeps P * R accumulators in registers.
    const { assert!(P >= 1 && P <= GROUP) };
    if WIDE {
        while c + 64 <= d {
            // SAFETY: AVX-512 F (`attend_group_wide`'s contract); the columns lie inside d.
            unsafe {
                accumulate_group16::<P, 4>(
                    at(c),
                    values.add(c),
                    stride,
                    &weights,
                    count,
                    &corrections,
                )
            };
            c += 64;
        }
    }
    let wide = if P == 1 { 64 } else { 32 };
    while c + wide <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe {
            if P == 1 {
                accumulate_group::<P, 8, WIDE>(
                    at(c),
                    values.add(c),
                    stride,
                    &weights,
                    count,
                    factor,
                );
            } else {
                accumulate_group::<P, 4, WIDE>(
                    at(c),
                    values.add(c),
                    stride,
                    &weights,
                    count,
                    factor,
                );
            }
        }
        c += wide;
    }
    if P == 1 && c + 32 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe {
            accumulate_group::<P, 4, WIDE>(at(c), values.add(c), stride, &weights, count, factor)
        };
        c += 32;
    }
    if c + 16 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe {
            accumulate_group::<P, 2, WIDE>(at(c), values.add(c), stride, &weights, count, factor)
        };
        c += 16;
    }
    if c + 8 <= d {
        // SAFETY: AVX2/FMA enabled; the columns lie inside d (see above).
        unsafe {
            accumulate_group::<P, 1, WIDE>(at(c), values.add(c), stride, &weights, count, factor)
        };
        c += 8;
    }
    if c < d {
        for ((target, w), factor) in at(c).into_iter().zip(&weights).zip(factor) {
            // SAFETY: AVX2/FMA enabled; the last d - c columns lie inside d.
            unsafe { accumulate_tail(target, values.add(c), stride, &w[..count], factor, d - c) };
        }
    }
}
