//! AVX2 + FMA dot kernels (Zen 3 and any x86-64-v3 CPU): the f32 row dot and the interleaved
//! Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/IQ4_XS/MXFP4 group kernels.
//!
//! Quantized groups multiply weight bytes against the int8 activations with `maddubs`
//! (u8 × i8 → i16 pairs) and `madd` (→ i32), exact in integers; the per-block scale product is
//! applied with one FMA into an 8-lane f32 accumulator per activation row. Signed weights
//! (Q8_0) use the usual sign transfer: `|w| · (x · sign(w))`.

use std::arch::x86_64::*;

use super::activation::QuantizedRow;
use super::interleaved::{GroupKind, GROUP, NIBBLE_BYTES, TABLE_IQ4_XS, TABLE_MXFP4};
use super::prefetch;
use super::Tile;
use crate::dtype::{bf16_to_f32, f16_to_f32};
use crate::quant::QK;

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn horizontal_sum(v: __m256) -> f32 {
    let low = _mm256_castps256_ps128(v);
    let high = _mm256_extractf128_ps::<1>(v);
    let sum4 = _mm_add_ps(low, high);
    let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
    let sum1 = _mm_add_ss(sum2, _mm_shuffle_ps::<1>(sum2, sum2));
    _mm_cvtss_f32(sum1)
}

/// How a float weight row is stored: [`dot_float`]'s `KIND`.
pub(crate) const F32_WEIGHTS: u8 = 0;
/// f16 bits, widened 8 at a time by F16C (exact, as [`f16_to_f32`]).
pub(crate) const F16_WEIGHTS: u8 = 1;
/// bf16 bits, widened 8 at a time by a 16-bit shift (exact).
pub(crate) const BF16_WEIGHTS: u8 = 2;

/// Weights `c..c + 16` of a `KIND` row as two f32 vectors.
///
/// # Safety
/// AVX2 and F16C; 16 weights from `c` lie inside the row at `w`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load16<const KIND: u8>(w: *const u8, c: usize) -> (__m256, __m256) {
    // SAFETY: the caller's contract: the 16 weights from `c` are inside the row.
    unsafe {
        match KIND {
            F32_WEIGHTS => {
                let p = w.cast::<f32>().add(c);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            }
            F16_WEIGHTS => {
                let p = w.cast::<u16>().add(c).cast::<__m128i>();
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p)),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(1))),
                )
            }
            _ => {
                let p = w.cast::<u16>().add(c).cast::<__m128i>();
                (
                    widen_bf16(_mm_loadu_si128(p)),
                    widen_bf16(_mm_loadu_si128(p.add(1))),
                )
            }
        }
    }
}

/// Weights `c..c + 8` of a `KIND` row as one f32 vector.
///
/// # Safety
/// AVX2 and F16C; 8 weights from `c` lie inside the row at `w`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8<const KIND: u8>(w: *const u8, c: usize) -> __m256 {
    // SAFETY: the caller's contract: the 8 weights from `c` are inside the row.
    unsafe {
        match KIND {
            F32_WEIGHTS => _mm256_loadu_ps(w.cast::<f32>().add(c)),
            F16_WEIGHTS => _mm256_cvtph_ps(_mm_loadu_si128(w.cast::<u16>().add(c).cast())),
            _ => widen_bf16(_mm_loadu_si128(w.cast::<u16>().add(c).cast())),
        }
    }
}

/// Eight bf16 bit patterns as f32 (a bf16 is the top half of an f32).
#[inline]
#[target_feature(enable = "avx2")]
fn widen_bf16(half: __m128i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half)))
}

/// Weight `j` of a `KIND` row, widened exactly.
///
/// # Safety
/// `j` lies inside the row at `w`.
#[inline]
pub(crate) unsafe fn weight_at<const KIND: u8>(w: *const u8, j: usize) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        match KIND {
            F32_WEIGHTS => *w.cast::<f32>().add(j),
            F16_WEIGHTS => f16_to_f32(*w.cast::<u16>().add(j)),
            _ => bf16_to_f32(*w.cast::<u16>().add(j)),
        }
    }
}

/// `Σ w[j] · x[j]` for `j` in `from..k`, in order, unfused: the float dot kernels' tail
/// (AVX2 and AVX-512 alike, so their results stay bitwise equal).
///
/// # Safety
/// `w` points at a row of at least `k` weights of `KIND`.
#[inline]
pub(crate) unsafe fn dot_tail<const KIND: u8>(
    w: *const u8,
    x: &[f32],
    from: usize,
    k: usize,
) -> f32 {
    let mut tail = 0.0f32;
    for (j, &x) in x.iter().enumerate().take(k).skip(from) {
        // SAFETY: j < k, inside the weight row (the caller's contract).
        tail += unsafe { weight_at::<KIND>(w, j) } * x;
    }
    tail
}

/// `out[i][r] = W_i · xs[r]` for `ROWS` float weight rows of `k` elements stored as `KIND`
/// (`ws[i]` points at row `i`): two 8-lane FMA accumulators per (weight row, activation row)
/// over 16-element steps, then the tail in order; `scalar::dot_tile` is the twin of each pair.
/// Several weight rows per call only interleave independent FMA chains (and share the
/// activation loads): each output's operations are those of a one-row call.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; each `ws[i]` points at `k` weights of `KIND`;
/// every row of `xs` holds at least `k` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_float<const ROWS: usize, const R: usize, const KIND: u8>(
    k: usize,
    ws: [*const u8; ROWS],
    xs: &Tile<'_, R>,
    out: &mut [[f32; R]; ROWS],
) {
    debug_assert!(xs.iter().all(|x| x.len() >= k));
    let mut acc0 = [[_mm256_setzero_ps(); R]; ROWS];
    let mut acc1 = [[_mm256_setzero_ps(); R]; ROWS];
    let mut c = 0;
    while c + 16 <= k {
        // SAFETY: c + 16 <= k: inside every weight row and every activation row.
        unsafe {
            for i in 0..ROWS {
                let (w0, w1) = load16::<KIND>(ws[i], c);
                for r in 0..R {
                    let x0 = _mm256_loadu_ps(xs[r].as_ptr().add(c));
                    let x1 = _mm256_loadu_ps(xs[r].as_ptr().add(c + 8));
                    acc0[i][r] = _mm256_fmadd_ps(w0, x0, acc0[i][r]);
                    acc1[i][r] = _mm256_fmadd_ps(w1, x1, acc1[i][r]);
                }
            }
        }
        c += 16;
    }
    for i in 0..ROWS {
        for r in 0..R {
            // SAFETY: each weight row holds k weights (the caller's contract).
            let tail = unsafe { dot_tail::<KIND>(ws[i], xs[r], c, k) };
            out[i][r] = horizontal_sum(_mm256_add_ps(acc0[i][r], acc1[i][r])) + tail;
        }
    }
}

/// Eight interleaved Q4_0/Q4_1 (`FIVE = false`) or Q5_0/Q5_1 (`FIVE = true`) weight rows
/// (one group, see `interleaved.rs`) against `R` quantized activation rows:
/// `out[r][lane] = W[lane] · x[r]`.
///
/// Per block, the `maddubs` partial sums of a row stay in i16 while they cannot saturate (a
/// pair is at most 2 · 15 · 127 for four bits, eight of them 30 480; 2 · 31 · 127 for five
/// bits, four of them 31 496, so Q5 widens every two steps), `madd` widens them to the exact
/// block dot per lane, and the scale products follow the scalar twin's order. Q5's fifth bits
/// (reordered at load) come down one shift per step into bit 4 of each byte.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `group` must hold `n_blocks` group-blocks of
/// `kind` and every activation row `n_blocks` quantized blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_group_tile<const R: usize, const FIVE: bool, const MIN: bool>(
    group: &[u8],
    n_blocks: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    // The kind from the type parameters, so its offset, layout and min term are constants.
    let kind = match (FIVE, MIN) {
        (false, false) => GroupKind::Q4Zero,
        (false, true) => GroupKind::Q4One,
        (true, false) => GroupKind::Q5Zero,
        (true, true) => GroupKind::Q5One,
    };
    let stride = kind.block_stride();
    debug_assert!(group.len() >= n_blocks * stride);
    debug_assert!(xs.iter().all(|x| x.quants.len() >= n_blocks * QK));
    let mask = _mm256_set1_epi8(0x0f);
    let fifth = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let offset = kind.offset();
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..n_blocks {
        // SAFETY: block b's `stride` bytes lie inside `group`, and activation block b inside
        // every row (caller contract); all loads are unaligned loads within those ranges.
        unsafe {
            let base = group.as_ptr().add(b * stride);
            prefetch::stream(base, stride, prefetch::AVX2_AHEAD_BYTES);
            let scales = _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i));
            let quants = base.add(kind.quant_offset());
            // Bit kk (low halves, moved up to bits 4..8) and bit 4 + kk (high halves) of each
            // byte hold step kk's fifth bits; each step shifts both down by one.
            let (mut high_of_low, mut high_of_high) = if FIVE {
                let qh = _mm256_loadu_si256(base.add(kind.high_bits_offset()) as *const __m256i);
                (_mm256_slli_epi16::<4>(qh), qh)
            } else {
                (_mm256_setzero_si256(), _mm256_setzero_si256())
            };
            let mut sums = [_mm256_setzero_si256(); R];
            let mut dots = [_mm256_setzero_si256(); R];
            for kk in 0..4 {
                let packed = _mm256_loadu_si256(quants.add(kk * 32) as *const __m256i);
                let mut low = _mm256_and_si256(packed, mask);
                let mut high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask);
                if FIVE {
                    low = _mm256_or_si256(low, _mm256_and_si256(high_of_low, fifth));
                    high = _mm256_or_si256(high, _mm256_and_si256(high_of_high, fifth));
                    high_of_low = _mm256_srli_epi16::<1>(high_of_low);
                    high_of_high = _mm256_srli_epi16::<1>(high_of_high);
                }
                for r in 0..R {
                    let x = xs[r].quants.as_ptr().add(b * QK);
                    let x_low = _mm256_set1_epi32((x.add(4 * kk) as *const i32).read_unaligned());
                    let x_high =
                        _mm256_set1_epi32((x.add(16 + 4 * kk) as *const i32).read_unaligned());
                    sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(low, x_low));
                    sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(high, x_high));
                    if kk == 3 || (FIVE && kk == 1) {
                        dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(sums[r], ones));
                        sums[r] = _mm256_setzero_si256();
                    }
                }
            }
            let mins = if MIN {
                _mm256_cvtph_ps(_mm_loadu_si128(base.add(16) as *const __m128i))
            } else {
                _mm256_setzero_ps()
            };
            for r in 0..R {
                let mut dot = dots[r];
                if offset != 0 {
                    dot = _mm256_sub_epi32(
                        dot,
                        _mm256_set1_epi32(offset * *xs[r].quant_sums.get_unchecked(b)),
                    );
                }
                let d = _mm256_mul_ps(scales, _mm256_set1_ps(*xs[r].scales.get_unchecked(b)));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc[r]);
                if MIN {
                    acc[r] = _mm256_fmadd_ps(
                        mins,
                        _mm256_set1_ps(*xs[r].block_sums.get_unchecked(b)),
                        acc[r],
                    );
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
}

/// Eight E8M0 scale bytes, zero-extended to i32 lanes, as f32 `2^(e - 128)`, bit for bit
/// [`crate::e8m0_to_f32_half`]: the normal `(e - 1) << 23` for `e >= 2`, else the subnormal
/// `0x0020_0000 << e`.
///
/// # Safety
/// AVX2: carries no `target_feature` of its own and is inlined into callers that enable it
/// (the AVX2 kernels, and `vnni::Ymm`).
#[inline(always)]
pub(crate) unsafe fn e8m0_half_x8(e: __m256i) -> __m256 {
    // SAFETY: AVX2 integer operations on registers only (the caller's features).
    unsafe {
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        // Shift counts above 31 give 0; those lanes take `normal`.
        let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
    }
}

/// Eight interleaved rows of a nibble-table kind against `R` quantized activation rows:
/// IQ4_NL (`TABLE_IQ4_NL`), IQ4_XS (`TABLE_IQ4_XS`) or MXFP4 (`TABLE_MXFP4`). Nibbles become
/// int8 levels through one `pshufb` of GGML's table; the signed levels use the sign transfer
/// `|w| · (x · sign(w))`. IQ4 pairs reach 2 · 127 · 127, so each `maddubs` is widened to i32
/// right away; MXFP4's levels are at most 12 in magnitude, so a block's eight pair sums stay
/// in i16 (8 · 2 · 12 · 127 = 24 384) and are widened once. IQ4_XS's per-32 scale
/// `d · (ls - 32)` is built in f32 lanes from the 6-bit `ls`, MXFP4's `2^(e - 128)` from the
/// E8M0 bytes ([`e8m0_half_x8`]); both exact, as in the scalar twin.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `group` must hold `n_blocks` group-blocks (IQ4_XS:
/// super-blocks) and every activation row the matching number of quantized blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn table_group_tile<const R: usize, const TABLE: u8>(
    group: &[u8],
    n_blocks: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let kind = GroupKind::of_table(TABLE);
    let (sub_scales, e8m0) = (TABLE == TABLE_IQ4_XS, TABLE == TABLE_MXFP4);
    let stride = kind.block_stride();
    let subs = kind.block_elems() / QK;
    debug_assert!(group.len() >= n_blocks * stride);
    debug_assert!(xs.iter().all(|x| x.quants.len() >= n_blocks * subs * QK));
    let mask = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    // SAFETY: the table is 16 bytes.
    let table = _mm256_broadcastsi128_si256(unsafe {
        _mm_loadu_si128(kind.levels().as_ptr() as *const __m128i)
    });
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..n_blocks {
        // SAFETY: block b's `stride` bytes lie inside `group`, and its activation blocks inside
        // every row (caller contract); all loads are unaligned loads within those ranges.
        unsafe {
            let base = group.as_ptr().add(b * stride);
            prefetch::stream(base, stride, prefetch::AVX2_AHEAD_BYTES);
            let d = if e8m0 {
                e8m0_half_x8(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                    base as *const __m128i,
                )))
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(base as *const __m128i))
            };
            let (scales_h, scales_l) = if sub_scales {
                (
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(base.add(16) as *const __m128i)),
                    _mm256_loadu_si256(base.add(kind.high_bits_offset()) as *const __m256i),
                )
            } else {
                (_mm256_setzero_si256(), _mm256_setzero_si256())
            };
            for sub in 0..subs {
                let scale = if sub_scales {
                    let low = _mm256_srl_epi32(scales_l, _mm_cvtsi32_si128(4 * sub as i32));
                    let high = _mm256_srl_epi32(scales_h, _mm_cvtsi32_si128(2 * sub as i32));
                    let ls = _mm256_or_si256(
                        _mm256_and_si256(low, _mm256_set1_epi32(0x0f)),
                        _mm256_slli_epi32::<4>(_mm256_and_si256(high, _mm256_set1_epi32(3))),
                    );
                    let ls = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(ls))
                } else {
                    d
                };
                let quants = base.add(kind.quant_offset() + sub * NIBBLE_BYTES);
                let xb = b * subs + sub;
                let mut dots = [_mm256_setzero_si256(); R];
                let mut pairs = [_mm256_setzero_si256(); R];
                for kk in 0..4 {
                    let packed = _mm256_loadu_si256(quants.add(kk * 32) as *const __m256i);
                    let low = _mm256_shuffle_epi8(table, _mm256_and_si256(packed, mask));
                    let high = _mm256_shuffle_epi8(
                        table,
                        _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask),
                    );
                    let (abs_low, abs_high) =
                        (_mm256_sign_epi8(low, low), _mm256_sign_epi8(high, high));
                    for r in 0..R {
                        let x = xs[r].quants.as_ptr().add(xb * QK);
                        let x_low =
                            _mm256_set1_epi32((x.add(4 * kk) as *const i32).read_unaligned());
                        let x_high =
                            _mm256_set1_epi32((x.add(16 + 4 * kk) as *const i32).read_unaligned());
                        let p_low = _mm256_maddubs_epi16(abs_low, _mm256_sign_epi8(x_low, low));
                        let p_high = _mm256_maddubs_epi16(abs_high, _mm256_sign_epi8(x_high, high));
                        if e8m0 {
                            pairs[r] = _mm256_add_epi16(pairs[r], _mm256_add_epi16(p_low, p_high));
                        } else {
                            dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(p_low, ones));
                            dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(p_high, ones));
                        }
                    }
                }
                for r in 0..R {
                    if e8m0 {
                        dots[r] = _mm256_madd_epi16(pairs[r], ones);
                    }
                    let d = _mm256_mul_ps(scale, _mm256_set1_ps(*xs[r].scales.get_unchecked(xb)));
                    acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dots[r]), acc[r]);
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
            prefetch::stream(base, stride, prefetch::AVX2_AHEAD_BYTES);
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
                let d = _mm256_mul_ps(scales, _mm256_set1_ps(*xs[r].scales.get_unchecked(b)));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums[r]), acc[r]);
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
}
