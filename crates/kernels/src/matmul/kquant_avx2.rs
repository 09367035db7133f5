//! AVX2 kernels for the interleaved K-quant layout (`kquant.rs`): eight weight rows, one per
//! 32-bit lane, `maddubs` against four broadcast activation bytes, sub-block scales
//! applied exactly by `madd` with the scale in both 16-bit halves of each lane, then the
//! scalar twin's f32 order per lane.

use std::arch::x86_64::*;

use super::activation::QuantizedRow;
use super::grouped::GROUP;
use super::kquant::{
    q6_run, KKind, D, DMIN, K_HIGH, K_LOW, Q5_HIGH, Q6_SCALES, STEP, UNPACKED_MINS, UNPACKED_SCALES,
};
use super::prefetch;
use crate::quant::QK;

/// The 6-bit scales and mins of the Q4_K/Q5_K group-block at `base`, unpacked to bytes
/// (`UNPACKED_SCALES`/`UNPACKED_MINS`, `[sub-block][row]`): what `kquant::scale_min` gives
/// for every sub-block and row, 32 bytes per operation. The top-bit byte of sub-blocks `j`
/// and `j + 4` is shared, so one load of it serves both halves with masks; the 16-bit shifts
/// move only masked bits that stay inside their byte.
///
/// # Safety
/// AVX2 available; `base` a whole Q4_K/Q5_K group-block.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn unpack_scales_mins(base: *const u8) -> [u8; 128] {
    let mut unpacked = [0u8; 128];
    // SAFETY: the low nibbles (64 bytes at K_LOW) and top bits (32 at K_HIGH) lie inside the
    // group-block (caller contract); the stores fill `unpacked`'s four 32-byte quarters.
    unsafe {
        let low0 = _mm256_loadu_si256(base.add(K_LOW) as *const __m256i);
        let low1 = _mm256_loadu_si256(base.add(K_LOW + 32) as *const __m256i);
        let high = _mm256_loadu_si256(base.add(K_HIGH) as *const __m256i);
        let nibble = _mm256_set1_epi8(0x0f);
        let bits = |mask: i8| _mm256_and_si256(high, _mm256_set1_epi8(mask));
        let scales0 = _mm256_or_si256(
            _mm256_and_si256(low0, nibble),
            _mm256_slli_epi16::<4>(bits(0x03)),
        );
        let scales1 = _mm256_or_si256(_mm256_and_si256(low1, nibble), bits(0x30));
        let mins0 = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(low0), nibble),
            _mm256_slli_epi16::<2>(bits(0x0c)),
        );
        let mins1 = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(low1), nibble),
            _mm256_srli_epi16::<2>(bits(-0x40)),
        );
        let out = unpacked.as_mut_ptr();
        _mm256_storeu_si256(out.add(UNPACKED_SCALES) as *mut __m256i, scales0);
        _mm256_storeu_si256(out.add(UNPACKED_SCALES + 32) as *mut __m256i, scales1);
        _mm256_storeu_si256(out.add(UNPACKED_MINS) as *mut __m256i, mins0);
        _mm256_storeu_si256(out.add(UNPACKED_MINS + 32) as *mut __m256i, mins1);
    }
    unpacked
}

/// Eight u8 scales at `at` as i16 pairs `(scale, scale)`, one pair per 32-bit lane.
///
/// # Safety
/// AVX2 available; `at..at + 8` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unsigned_scale_pairs(at: *const u8) -> __m256i {
    // SAFETY: eight readable bytes (caller contract).
    let v = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(at as *const __m128i) });
    _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
}

/// Eight i8 scales at `at` as i16 pairs `(scale, scale)`, one pair per 32-bit lane.
///
/// # Safety
/// AVX2 available; `at..at + 8` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn signed_scale_pairs(at: *const u8) -> __m256i {
    // SAFETY: eight readable bytes (caller contract).
    let v = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(at as *const __m128i) });
    let low = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    _mm256_or_si256(low, _mm256_slli_epi32::<16>(v))
}

/// Four activation bytes at `at`, broadcast to every 32-bit lane.
///
/// # Safety
/// AVX2 available; `at..at + 4` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast4(at: *const i8) -> __m256i {
    // SAFETY: four readable bytes (caller contract).
    _mm256_set1_epi32(unsafe { (at as *const i32).read_unaligned() })
}

/// 16 where bit `j` of a high-bit byte is set, else 0: Q5_K's fifth bit of sub-block `j`.
#[inline]
#[target_feature(enable = "avx2")]
fn fifth_bit(bits: __m256i, j: usize) -> __m256i {
    let bit = _mm256_set1_epi8((1u8 << j) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// Eight interleaved Q4_K (`FIVE_BITS = false`) or Q5_K rows against `R` activation rows:
/// `out[r][lane] = W[lane] · x[r]`.
///
/// Per step a lane's `maddubs` pair reaches 2 · 15 · 127 (Q4_K) or 2 · 31 · 127 (Q5_K), so
/// eight (Q4_K) or four (Q5_K) steps accumulate in i16 without saturating before `madd`
/// multiplies them by the sub-block scale into i32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `group` must hold `n_super` group-blocks of the
/// kind and every activation row `8 · n_super` quantized blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_tile<const R: usize, const FIVE_BITS: bool>(
    group: &[u8],
    n_super: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let kind = if FIVE_BITS { KKind::Q5 } else { KKind::Q4 };
    let stride = kind.stride();
    debug_assert!(group.len() >= n_super * stride);
    debug_assert!(xs.iter().all(|x| x.quants.len() >= n_super * 8 * QK));
    let mask = _mm256_set1_epi8(0x0f);
    let flush_every = if FIVE_BITS { 4 } else { 8 };
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..n_super {
        // SAFETY: group-block s's `stride` bytes lie inside `group`, and activation blocks
        // 8s..8s + 8 inside every row (caller contract); every load stays in those ranges
        // or in the 128 unpacked bytes.
        unsafe {
            let base = group.as_ptr().add(s * stride);
            prefetch::stream(base, stride, prefetch::AVX2_AHEAD_BYTES);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base.add(D) as *const __m128i));
            let unpacked = unpack_scales_mins(base);
            let scales = unpacked.as_ptr().add(UNPACKED_SCALES);
            for c in 0..4 {
                let scale_low = unsigned_scale_pairs(scales.add(2 * c * GROUP));
                let scale_high = unsigned_scale_pairs(scales.add((2 * c + 1) * GROUP));
                let run = base.add(kind.quants() + c * 8 * STEP);
                let mut dot_low = [_mm256_setzero_si256(); R];
                let mut dot_high = [_mm256_setzero_si256(); R];
                for steps in (0..8).step_by(flush_every) {
                    let mut sums_low = [_mm256_setzero_si256(); R];
                    let mut sums_high = [_mm256_setzero_si256(); R];
                    for kk in steps..steps + flush_every {
                        let packed = _mm256_loadu_si256(run.add(kk * STEP) as *const __m256i);
                        let mut low = _mm256_and_si256(packed, mask);
                        let mut high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask);
                        if FIVE_BITS {
                            let bits =
                                _mm256_loadu_si256(base.add(Q5_HIGH + kk * STEP) as *const __m256i);
                            low = _mm256_or_si256(low, fifth_bit(bits, 2 * c));
                            high = _mm256_or_si256(high, fifth_bit(bits, 2 * c + 1));
                        }
                        for r in 0..R {
                            let x = xs[r].quants.as_ptr().add((8 * s + 2 * c) * QK + 4 * kk);
                            let x_low = broadcast4(x);
                            let x_high = broadcast4(x.add(QK));
                            sums_low[r] =
                                _mm256_add_epi16(sums_low[r], _mm256_maddubs_epi16(low, x_low));
                            sums_high[r] =
                                _mm256_add_epi16(sums_high[r], _mm256_maddubs_epi16(high, x_high));
                        }
                    }
                    for r in 0..R {
                        let low = _mm256_madd_epi16(sums_low[r], scale_low);
                        let high = _mm256_madd_epi16(sums_high[r], scale_high);
                        dot_low[r] = _mm256_add_epi32(dot_low[r], low);
                        dot_high[r] = _mm256_add_epi32(dot_high[r], high);
                    }
                }
                for r in 0..R {
                    let xb = 8 * s + 2 * c;
                    let d_low = _mm256_mul_ps(d, _mm256_set1_ps(*xs[r].scales.get_unchecked(xb)));
                    acc[r] = _mm256_fmadd_ps(d_low, _mm256_cvtepi32_ps(dot_low[r]), acc[r]);
                    let d_high =
                        _mm256_mul_ps(d, _mm256_set1_ps(*xs[r].scales.get_unchecked(xb + 1)));
                    acc[r] = _mm256_fmadd_ps(d_high, _mm256_cvtepi32_ps(dot_high[r]), acc[r]);
                }
            }
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(base.add(DMIN) as *const __m128i));
            let mut m = [_mm256_setzero_ps(); R];
            for j in 0..8 {
                let at = unpacked.as_ptr().add(UNPACKED_MINS + j * GROUP);
                let mins = _mm_loadl_epi64(at as *const __m128i);
                let mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins));
                for r in 0..R {
                    let sum = _mm256_set1_ps(*xs[r].block_sums.get_unchecked(8 * s + j));
                    m[r] = _mm256_fmadd_ps(mins, sum, m[r]);
                }
            }
            for r in 0..R {
                acc[r] = _mm256_fnmadd_ps(dmin, m[r], acc[r]);
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
}

/// Eight interleaved Q6_K rows against `R` activation rows. The weights `q - 32` are signed,
/// so the products use the sign transfer `|w| · (x · sign(w))`: a pair reaches 2 · 32 · 127,
/// and the four steps of one 16-element sub-block accumulate in i16 (at most 32 512) before
/// `madd` applies that sub-block's scale.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `group` must hold `n_super` Q6_K group-blocks and
/// every activation row `8 · n_super` quantized blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_tile<const R: usize>(
    group: &[u8],
    n_super: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let stride = KKind::Q6.stride();
    debug_assert!(group.len() >= n_super * stride);
    debug_assert!(xs.iter().all(|x| x.quants.len() >= n_super * 8 * QK));
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..n_super {
        // SAFETY: group-block s's `stride` bytes lie inside `group`, and activation blocks
        // 8s..8s + 8 inside every row (caller contract).
        unsafe {
            let base = group.as_ptr().add(s * stride);
            prefetch::stream(base, stride, prefetch::AVX2_AHEAD_BYTES);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(base.add(D) as *const __m128i));
            for h in 0..2 {
                // One call per block with its index constant, so each unpacks without
                // branches in the step loop.
                let first = 8 * s + 4 * h;
                q6_k_block::<R, 0>(base, h, first, d, xs, &mut acc);
                q6_k_block::<R, 1>(base, h, first + 1, d, xs, &mut acc);
                q6_k_block::<R, 2>(base, h, first + 2, d, xs, &mut acc);
                q6_k_block::<R, 3>(base, h, first + 3, d, xs, &mut acc);
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
}

/// Block `4h + G` of the Q6_K group-block at `base` against activation block `xb`, added to
/// `acc` (inlined into [`q6_k_tile`], whose target features its intrinsics then run under).
///
/// # Safety
/// AVX2, FMA and F16C available; `base` a whole group-block, `xb` inside every row.
#[inline(always)]
unsafe fn q6_k_block<const R: usize, const G: usize>(
    base: *const u8,
    h: usize,
    xb: usize,
    d: __m256,
    xs: &[QuantizedRow<'_>; R],
    acc: &mut [__m256; R],
) {
    // SAFETY: (whole body) the caller's contract; every load lies in the group-block or in
    // activation block xb.
    unsafe {
        let runs = [
            base.add(q6_run(h, 0)),
            base.add(q6_run(h, 1)),
            base.add(q6_run(h, 2)),
        ];
        let mut dot = [_mm256_setzero_si256(); R];
        for half in 0..2 {
            let mut sums = [_mm256_setzero_si256(); R];
            for kk in 4 * half..4 * half + 4 {
                let load = |v: usize| runs[v].add(kk * STEP) as *const __m256i;
                let q = if G < 3 {
                    _mm256_and_si256(_mm256_loadu_si256(load(G)), _mm256_set1_epi8(0x3f))
                } else {
                    // The three runs' top bit pairs, low to high (16-bit shifts of masked
                    // bytes: nothing crosses into the neighbour byte).
                    let top_bits = _mm256_set1_epi8(-0x40);
                    let p0 = _mm256_and_si256(_mm256_loadu_si256(load(0)), top_bits);
                    let p1 = _mm256_and_si256(_mm256_loadu_si256(load(1)), top_bits);
                    let p2 = _mm256_and_si256(_mm256_loadu_si256(load(2)), top_bits);
                    _mm256_or_si256(
                        _mm256_or_si256(_mm256_srli_epi16::<6>(p0), _mm256_srli_epi16::<4>(p1)),
                        _mm256_srli_epi16::<2>(p2),
                    )
                };
                let w = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
                let magnitude = _mm256_sign_epi8(w, w);
                for (x, sum) in xs.iter().zip(sums.iter_mut()) {
                    let x = broadcast4(x.quants.as_ptr().add(xb * QK + 4 * kk));
                    let products = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, w));
                    *sum = _mm256_add_epi16(*sum, products);
                }
            }
            let sub = 8 * h + 2 * G + half;
            let scales = signed_scale_pairs(base.add(Q6_SCALES + sub * GROUP));
            for r in 0..R {
                dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(sums[r], scales));
            }
        }
        for r in 0..R {
            let dx = _mm256_mul_ps(d, _mm256_set1_ps(xs[r].scales[xb]));
            acc[r] = _mm256_fmadd_ps(dx, _mm256_cvtepi32_ps(dot[r]), acc[r]);
        }
    }
}
