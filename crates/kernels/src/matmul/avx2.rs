//! AVX2 + FMA dot kernels (Zen 3 and any x86-64-v3 CPU): the f32 row dot and the interleaved
//! Q4_0/Q4_1/Q8_0 group kernels.
//!
//! Quantized groups multiply weight bytes against the int8 activations with `maddubs`
//! (u8 × i8 → i16 pairs) and `madd` (→ i32), exact in integers; the per-block scale product is
//! applied with one FMA into an 8-lane f32 accumulator per activation row. Signed weights
//! (Q8_0) use the usual sign transfer: `|w| · (x · sign(w))`.

use std::arch::x86_64::*;

use super::activation::QuantizedRow;
use super::interleaved::{GroupKind, GROUP};
use super::Tile;
use crate::quant::QK;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn horizontal_sum(v: __m256) -> f32 {
    let low = _mm256_castps256_ps128(v);
    let high = _mm256_extractf128_ps::<1>(v);
    let sum4 = _mm_add_ps(low, high);
    let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
    let sum1 = _mm_add_ss(sum2, _mm_shuffle_ps::<1>(sum2, sum2));
    _mm_cvtss_f32(sum1)
}

/// `out[r] = w · xs[r]` for f32 rows, two 8-lane accumulators per activation row.
///
/// # Safety
/// The CPU must support AVX2 and FMA; every row of `xs` holds at least `w.len()` values.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32<const R: usize>(w: &[f32], xs: &Tile<'_, R>, out: &mut [f32; R]) {
    let k = w.len();
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    let mut c = 0;
    while c + 16 <= k {
        // SAFETY: c + 16 <= k = len of `w` and of every row.
        unsafe {
            let w0 = _mm256_loadu_ps(w.as_ptr().add(c));
            let w1 = _mm256_loadu_ps(w.as_ptr().add(c + 8));
            for r in 0..R {
                let x0 = _mm256_loadu_ps(xs[r].as_ptr().add(c));
                let x1 = _mm256_loadu_ps(xs[r].as_ptr().add(c + 8));
                acc0[r] = _mm256_fmadd_ps(w0, x0, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(w1, x1, acc1[r]);
            }
        }
        c += 16;
    }
    for r in 0..R {
        let mut tail = 0.0f32;
        for j in c..k {
            tail += w[j] * xs[r][j];
        }
        out[r] = horizontal_sum(_mm256_add_ps(acc0[r], acc1[r])) + tail;
    }
}

/// Eight interleaved Q4_0/Q4_1 weight rows (one group, see `interleaved.rs`) against `R`
/// quantized activation rows: `out[r][lane] = W[lane] · x[r]`.
///
/// Per block, the eight `maddubs` partial sums of a row stay in i16 (each is at most
/// 2 · 15 · 127, eight of them at most 30 480, so nothing saturates), one `madd` widens them to
/// the exact block dot per lane, and the scale products follow the scalar twin's order.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `group` must hold `n_blocks` group-blocks of
/// `kind` and every activation row `n_blocks` quantized blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_group_tile<const R: usize>(
    kind: GroupKind,
    group: &[u8],
    n_blocks: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let stride = kind.block_stride();
    debug_assert!(group.len() >= n_blocks * stride);
    debug_assert!(xs.iter().all(|x| x.quants.len() >= n_blocks * QK));
    let mask = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..n_blocks {
        // SAFETY: block b's `stride` bytes lie inside `group`, and activation block b inside
        // every row (caller contract); all loads are unaligned loads within those ranges.
        unsafe {
            let base = group.as_ptr().add(b * stride);
            let scales = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let quants = base.add(kind.quant_offset());
            let mut sums = [_mm256_setzero_si256(); R];
            for kk in 0..4 {
                let packed = _mm256_loadu_si256(quants.add(kk * 32) as *const __m256i);
                let low = _mm256_and_si256(packed, mask);
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask);
                for r in 0..R {
                    let x = xs[r].quants.as_ptr().add(b * QK);
                    let x_low = _mm256_set1_epi32((x.add(4 * kk) as *const i32).read_unaligned());
                    let x_high =
                        _mm256_set1_epi32((x.add(16 + 4 * kk) as *const i32).read_unaligned());
                    sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(low, x_low));
                    sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(high, x_high));
                }
            }
            let mins = match kind {
                GroupKind::Q4One => {
                    _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i))
                }
                GroupKind::Q4Zero | GroupKind::Q8Zero => _mm256_setzero_ps(),
            };
            for r in 0..R {
                let mut dot = _mm256_madd_epi16(sums[r], ones);
                if kind == GroupKind::Q4Zero {
                    dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(8 * xs[r].quant_sums[b]));
                }
                let d = _mm256_mul_ps(scales, _mm256_set1_ps(xs[r].scales[b]));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc[r]);
                if kind == GroupKind::Q4One {
                    acc[r] = _mm256_fmadd_ps(mins, _mm256_set1_ps(xs[r].block_sums[b]), acc[r]);
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
}

/// Eight interleaved Q8_0 weight rows against `R` quantized activation rows. Signed weights
/// use the sign transfer `|w| · (x · sign(w))`; a pair of such products reaches 2 · 128 · 127,
/// so each step's `maddubs` is widened to i32 right away.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `group` must hold `n_blocks` Q8_0 group-blocks and
/// every activation row `n_blocks` quantized blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_group_tile<const R: usize>(
    group: &[u8],
    n_blocks: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let kind = GroupKind::Q8Zero;
    let stride = kind.block_stride();
    debug_assert!(group.len() >= n_blocks * stride);
    debug_assert!(xs.iter().all(|x| x.quants.len() >= n_blocks * QK));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..n_blocks {
        // SAFETY: block b's `stride` bytes lie inside `group`, and activation block b inside
        // every row (caller contract); all loads are unaligned loads within those ranges.
        unsafe {
            let base = group.as_ptr().add(b * stride);
            let scales = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let quants = base.add(kind.quant_offset());
            let mut sums = [_mm256_setzero_si256(); R];
            for step in 0..8 {
                let w = _mm256_loadu_si256(quants.add(step * 32) as *const __m256i);
                let magnitude = _mm256_sign_epi8(w, w);
                for r in 0..R {
                    let x = xs[r].quants.as_ptr().add(b * QK + 4 * step);
                    let x = _mm256_set1_epi32((x as *const i32).read_unaligned());
                    let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, w));
                    sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs, ones));
                }
            }
            for r in 0..R {
                let d = _mm256_mul_ps(scales, _mm256_set1_ps(xs[r].scales[b]));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums[r]), acc[r]);
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
}
