//! AVX2 + FMA dot kernels (Zen 3 and any x86-64-v3 CPU).
//!
//! Quantized rows: weights are unpacked to 32 bytes per block and multiplied against the int8
//! activations with `maddubs` (u8 × i8 → i16 pairs) and `madd` (→ i32), exact in integers; the
//! per-block scale product is applied with one FMA into an 8-lane f32 accumulator per
//! activation row. Signed weights (Q8_0, Q4_0, Q6_K) use the usual sign transfer:
//! `|w| · (x · sign(w))`.

use std::arch::x86_64::*;

use super::activation::QuantizedRow;
use std::ops::Range;

use super::{QMatrix, Tile, WeightRow};
use crate::quant::{scale_min_k4, QK};

/// Computes `out[j - rows.start][r] = W[j] · tile[r]` for the weight rows in `rows`.
///
/// # Safety
/// The CPU must support AVX2 and FMA. `tile` rows must have `matrix.in_features()` elements
/// (quantized for quantized matrices), as `QMatrix::matmul` guarantees.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn kernel_pass<const R: usize>(
    matrix: &QMatrix,
    rows: Range<usize>,
    tile: &Tile<'_, R>,
    out: &mut [[f32; R]],
) {
    let mut rows = rows;
    let mut out = out;
    // Decode (one activation row): two weight rows per pass share the activation loads and
    // give the core two independent accumulator chains. Each pair member follows exactly the
    // operation order of the one-row kernels, so results do not depend on the pairing.
    if let (1, Tile::Quantized(xs)) = (R, tile) {
        let x = &xs[0];
        while rows.len() >= 2 {
            let (j, pair_out) = (rows.start, &mut out[..2]);
            // SAFETY: AVX2/FMA enabled; rows j and j + 1 span `in_features` like `x`.
            let pair = unsafe {
                match (matrix.weight_row(j), matrix.weight_row(j + 1)) {
                    (
                        WeightRow::Q4_1 {
                            scales: s0,
                            mins: m0,
                            quants: q0,
                        },
                        WeightRow::Q4_1 {
                            scales: s1,
                            mins: m1,
                            quants: q1,
                        },
                    ) => dot_q4_1_pair([s0, s1], [m0, m1], [q0, q1], x),
                    (
                        WeightRow::Q8_0 {
                            scales: s0,
                            quants: q0,
                        },
                        WeightRow::Q8_0 {
                            scales: s1,
                            quants: q1,
                        },
                    ) => dot_q8_0_pair([s0, s1], [q0, q1], x),
                    _ => break,
                }
            };
            pair_out[0][0] = pair[0];
            pair_out[1][0] = pair[1];
            rows.start += 2;
            out = &mut out[2..];
        }
    }
    for (j, results) in rows.zip(out.iter_mut()) {
        // SAFETY: (all arms) AVX2/FMA are enabled; every kernel bounds its loads by the row
        // lengths, and weight rows and activation rows both span `in_features` elements.
        unsafe {
            match (matrix.weight_row(j), tile) {
                (WeightRow::Float(w), Tile::Float(xs)) => dot_f32(w, xs, results),
                (WeightRow::Q8_0 { scales, quants }, Tile::Quantized(xs)) => {
                    dot_q8_0(scales, quants, xs, results)
                }
                (WeightRow::Q4_0 { scales, quants }, Tile::Quantized(xs)) => {
                    dot_q4_0(scales, quants, xs, results)
                }
                (
                    WeightRow::Q4_1 {
                        scales,
                        mins,
                        quants,
                    },
                    Tile::Quantized(xs),
                ) => dot_q4_1(scales, mins, quants, xs, results),
                (WeightRow::Q4K { super_scales, raw }, Tile::Quantized(xs)) => {
                    dot_k4_k5::<R, false>(super_scales, raw, xs, results)
                }
                (WeightRow::Q5K { super_scales, raw }, Tile::Quantized(xs)) => {
                    dot_k4_k5::<R, true>(super_scales, raw, xs, results)
                }
                (WeightRow::Q6K { super_scales, raw }, Tile::Quantized(xs)) => {
                    dot_q6_k(super_scales, raw, xs, results)
                }
                // `QMatrix::matmul` pairs float weights with float rows and quantized weights
                // with quantized rows; other pairings cannot be built.
                _ => *results = [f32::NAN; R],
            }
        }
    }
}

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

/// Loads 32 bytes from `bytes[offset..offset + 32]`.
///
/// # Safety
/// `offset + 32 <= bytes.len()` (asserted in debug builds); AVX2 available.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load32<T>(bytes: &[T], offset: usize) -> __m256i {
    debug_assert!((offset + 32) * std::mem::size_of::<T>() <= std::mem::size_of_val(bytes));
    // SAFETY: in bounds per the contract; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().add(offset) as *const __m256i) }
}

/// Expands 16 packed bytes into 32 nibbles: low nibbles first, then high nibbles.
///
/// # Safety
/// `offset + 16 <= bytes.len()`; AVX2 available.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_nibbles(bytes: &[u8], offset: usize) -> __m256i {
    debug_assert!(offset + 16 <= bytes.len());
    // SAFETY: in bounds per the contract.
    let packed = unsafe { _mm_loadu_si128(bytes.as_ptr().add(offset) as *const __m128i) };
    let high = _mm_srli_epi16::<4>(packed);
    _mm256_and_si256(_mm256_set_m128i(high, packed), _mm256_set1_epi8(0x0f))
}

/// Exact `Σ u · s` of 32 unsigned (≤ 127·2 safe) by signed bytes, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn dot_u8_i8(unsigned: __m256i, signed: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned, signed), _mm256_set1_epi16(1))
}

/// Exact `Σ a · b` of 32 signed bytes (`a` never -128 after unpacking, or at most one side).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn dot_i8_i8(a: __m256i, b: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32<const R: usize>(w: &[f32], xs: &[&[f32]; R], out: &mut [f32; R]) {
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

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_0<const R: usize>(
    scales: &[f32],
    quants: &[u8],
    xs: &[QuantizedRow<'_>; R],
    out: &mut [f32; R],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    let n_blocks = scales.len();
    let mut b = 0;
    while b + 8 <= n_blocks {
        // SAFETY: b + 8 <= n_blocks.
        let products = unsafe { scale_products(scales, xs, b) };
        for k in 0..8 {
            // SAFETY: block b + k spans quants[32(b+k)..] and x.quants[32(b+k)..].
            unsafe { q8_0_block(&products, k, quants, b + k, xs, &mut acc) };
        }
        b += 8;
    }
    while b < n_blocks {
        let products: [[f32; 8]; R] = std::array::from_fn(|r| [scales[b] * xs[r].scales[b]; 8]);
        // SAFETY: b < n_blocks.
        unsafe { q8_0_block(&products, 0, quants, b, xs, &mut acc) };
        b += 1;
    }
    for r in 0..R {
        out[r] = horizontal_sum(acc[r]);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_0_block<const R: usize>(
    products: &[[f32; 8]; R],
    k: usize,
    quants: &[u8],
    block: usize,
    xs: &[QuantizedRow<'_>; R],
    acc: &mut [__m256; R],
) {
    // SAFETY: callers pass a block inside the rows.
    let w = unsafe { load32(quants, block * QK) };
    for r in 0..R {
        // SAFETY: as above.
        let x = unsafe { load32(xs[r].quants, block * QK) };
        let sum = _mm256_cvtepi32_ps(dot_i8_i8(w, x));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(products[r][k]), sum, acc[r]);
    }
}

/// Two Q8_0 weight rows against one activation row; per row the same operations, in the same
/// order, as `dot_q8_0::<1>`.
// Index loops mirror the one-row kernels' operation order, which the pairing must keep.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q8_0_pair(scales: [&[f32]; 2], quants: [&[u8]; 2], x: &QuantizedRow<'_>) -> [f32; 2] {
    let mut acc = [_mm256_setzero_ps(); 2];
    let n_blocks = scales[0].len();
    let mut b = 0;
    while b + 8 <= n_blocks {
        // SAFETY: b + 8 <= n_blocks for both weight rows and the activation row.
        let products: [[[f32; 8]; 1]; 2] = unsafe {
            [
                scale_products(scales[0], &[*x], b),
                scale_products(scales[1], &[*x], b),
            ]
        };
        for k in 0..8 {
            let block = b + k;
            // SAFETY: block < n_blocks; rows hold 32 quants per block.
            unsafe {
                let xv = load32(x.quants, block * QK);
                for w in 0..2 {
                    let wv = load32(quants[w], block * QK);
                    let sum = _mm256_cvtepi32_ps(dot_i8_i8(wv, xv));
                    acc[w] = _mm256_fmadd_ps(_mm256_set1_ps(products[w][0][k]), sum, acc[w]);
                }
            }
        }
        b += 8;
    }
    while b < n_blocks {
        // SAFETY: b < n_blocks.
        unsafe {
            let xv = load32(x.quants, b * QK);
            for w in 0..2 {
                let wv = load32(quants[w], b * QK);
                let sum = _mm256_cvtepi32_ps(dot_i8_i8(wv, xv));
                let product = scales[w][b] * x.scales[b];
                acc[w] = _mm256_fmadd_ps(_mm256_set1_ps(product), sum, acc[w]);
            }
        }
        b += 1;
    }
    [horizontal_sum(acc[0]), horizontal_sum(acc[1])]
}

/// Two Q4_1 weight rows against one activation row; per row the same operations, in the same
/// order, as `dot_q4_1::<1>`.
// Index loops mirror the one-row kernels' operation order, which the pairing must keep.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q4_1_pair(
    scales: [&[f32]; 2],
    mins: [&[f32]; 2],
    quants: [&[u8]; 2],
    x: &QuantizedRow<'_>,
) -> [f32; 2] {
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut acc_min = [_mm256_setzero_ps(); 2];
    let n_blocks = scales[0].len();
    let mut b = 0;
    while b + 8 <= n_blocks {
        // SAFETY: b + 8 <= n_blocks for both weight rows and the activation row.
        let products: [[[f32; 8]; 1]; 2] = unsafe {
            [
                scale_products(scales[0], &[*x], b),
                scale_products(scales[1], &[*x], b),
            ]
        };
        // SAFETY: as above.
        unsafe {
            let sums = _mm256_loadu_ps(x.block_sums.as_ptr().add(b));
            for w in 0..2 {
                let m = _mm256_loadu_ps(mins[w].as_ptr().add(b));
                acc_min[w] = _mm256_fmadd_ps(m, sums, acc_min[w]);
            }
        }
        for k in 0..8 {
            let block = b + k;
            // SAFETY: block < n_blocks; weight rows hold 16 bytes and `x` 32 quants per block.
            unsafe {
                let xv = load32(x.quants, block * QK);
                for w in 0..2 {
                    let wv = load_nibbles(quants[w], block * 16);
                    let sum = _mm256_cvtepi32_ps(dot_u8_i8(wv, xv));
                    acc[w] = _mm256_fmadd_ps(_mm256_set1_ps(products[w][0][k]), sum, acc[w]);
                }
            }
        }
        b += 8;
    }
    let mut tail_min = [0.0f32; 2];
    while b < n_blocks {
        for w in 0..2 {
            tail_min[w] += mins[w][b] * x.block_sums[b];
        }
        // SAFETY: b < n_blocks.
        unsafe {
            let xv = load32(x.quants, b * QK);
            for w in 0..2 {
                let wv = load_nibbles(quants[w], b * 16);
                let sum = _mm256_cvtepi32_ps(dot_u8_i8(wv, xv));
                let product = scales[w][b] * x.scales[b];
                acc[w] = _mm256_fmadd_ps(_mm256_set1_ps(product), sum, acc[w]);
            }
        }
        b += 1;
    }
    [
        horizontal_sum(acc[0]) + (horizontal_sum(acc_min[0]) + tail_min[0]),
        horizontal_sum(acc[1]) + (horizontal_sum(acc_min[1]) + tail_min[1]),
    ]
}

/// `w_scale[b + k] · x_scale[b + k]` for 8 blocks of every row, one vector multiply per row
/// (bitwise the same as the scalar product).
///
/// # Safety
/// `b + 8` must not exceed the block count of `scales` and of every row.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_products<const R: usize>(
    scales: &[f32],
    xs: &[QuantizedRow<'_>; R],
    b: usize,
) -> [[f32; 8]; R] {
    debug_assert!(b + 8 <= scales.len());
    let mut products = [[0.0f32; 8]; R];
    // SAFETY: b + 8 is within `scales` and every row's scales (caller contract).
    unsafe {
        let w = _mm256_loadu_ps(scales.as_ptr().add(b));
        for r in 0..R {
            let x = _mm256_loadu_ps(xs[r].scales.as_ptr().add(b));
            _mm256_storeu_ps(products[r].as_mut_ptr(), _mm256_mul_ps(w, x));
        }
    }
    products
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q4_0<const R: usize>(
    scales: &[f32],
    quants: &[u8],
    xs: &[QuantizedRow<'_>; R],
    out: &mut [f32; R],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    let eight = _mm256_set1_epi8(8);
    for (b, &scale) in scales.iter().enumerate() {
        // SAFETY: block b spans quants[16b..16b+16].
        let w = _mm256_sub_epi8(unsafe { load_nibbles(quants, b * 16) }, eight);
        for r in 0..R {
            // SAFETY: block b spans x.quants[32b..32b+32].
            let x = unsafe { load32(xs[r].quants, b * QK) };
            let sum = _mm256_cvtepi32_ps(dot_i8_i8(w, x));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(scale * xs[r].scales[b]), sum, acc[r]);
        }
    }
    for r in 0..R {
        out[r] = horizontal_sum(acc[r]);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q4_1<const R: usize>(
    scales: &[f32],
    mins: &[f32],
    quants: &[u8],
    xs: &[QuantizedRow<'_>; R],
    out: &mut [f32; R],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_min = [_mm256_setzero_ps(); R];
    let n_blocks = scales.len();
    let mut b = 0;
    // Min terms Σ m_w[b] · (d_x Σq)[b] are a plain f32 dot over blocks, done 8 blocks at once.
    while b + 8 <= n_blocks {
        // SAFETY: b + 8 <= n_blocks = len of `mins` and of every `block_sums`.
        let m = unsafe { _mm256_loadu_ps(mins.as_ptr().add(b)) };
        for r in 0..R {
            // SAFETY: as above.
            let s = unsafe { _mm256_loadu_ps(xs[r].block_sums.as_ptr().add(b)) };
            acc_min[r] = _mm256_fmadd_ps(m, s, acc_min[r]);
        }
        // SAFETY: b + 8 <= n_blocks.
        let products = unsafe { scale_products(scales, xs, b) };
        for k in 0..8 {
            // SAFETY: blocks lie inside the rows (b + k < n_blocks).
            unsafe { q4_1_block(&products, k, quants, b + k, xs, &mut acc) };
        }
        b += 8;
    }
    let mut tail_min = [0.0f32; R];
    while b < n_blocks {
        for r in 0..R {
            tail_min[r] += mins[b] * xs[r].block_sums[b];
        }
        let products: [[f32; 8]; R] = std::array::from_fn(|r| [scales[b] * xs[r].scales[b]; 8]);
        // SAFETY: b < n_blocks.
        unsafe { q4_1_block(&products, 0, quants, b, xs, &mut acc) };
        b += 1;
    }
    for r in 0..R {
        out[r] = horizontal_sum(acc[r]) + (horizontal_sum(acc_min[r]) + tail_min[r]);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_1_block<const R: usize>(
    products: &[[f32; 8]; R],
    k: usize,
    quants: &[u8],
    block: usize,
    xs: &[QuantizedRow<'_>; R],
    acc: &mut [__m256; R],
) {
    // SAFETY: callers run with AVX2/FMA enabled and `block` inside the row.
    unsafe {
        let w = load_nibbles(quants, block * 16);
        for r in 0..R {
            let x = load32(xs[r].quants, block * QK);
            let sum = _mm256_cvtepi32_ps(dot_u8_i8(w, x));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(products[r][k]), sum, acc[r]);
        }
    }
}

/// Q4_K and Q5_K share everything but the fifth bit.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_k4_k5<const R: usize, const FIVE_BITS: bool>(
    super_scales: &[f32],
    raw: &[u8],
    xs: &[QuantizedRow<'_>; R],
    out: &mut [f32; R],
) {
    let block_bytes = if FIVE_BITS { 176 } else { 144 };
    let quant_offset = if FIVE_BITS { 48 } else { 16 };
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_min = [0.0f32; R];
    // SAFETY: callers run with AVX2/FMA enabled; all loads stay inside one super-block of `raw`
    // and the matching 256 activations.
    unsafe {
        let low_mask = _mm256_set1_epi8(0x0f);
        for (s, block) in raw.chunks_exact(block_bytes).enumerate() {
            let (d, dmin) = (super_scales[2 * s], super_scales[2 * s + 1]);
            let scales = &block[4..16];
            let qh = if FIVE_BITS {
                load32(block, 16)
            } else {
                _mm256_setzero_si256()
            };
            for pair in 0..4 {
                let packed = load32(block, quant_offset + pair * 32);
                for half in 0..2 {
                    let sub = 2 * pair + half;
                    let mut w = if half == 0 {
                        _mm256_and_si256(packed, low_mask)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low_mask)
                    };
                    if FIVE_BITS {
                        let bit = _mm256_set1_epi8((1u8 << sub) as i8);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                        w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
                    }
                    let (scale, min) = scale_min_k4(sub, scales);
                    let d_scale = d * f32::from(scale);
                    let d_min = dmin * f32::from(min);
                    let xb = s * 8 + sub;
                    for r in 0..R {
                        let x = load32(xs[r].quants, xb * QK);
                        let sum = _mm256_cvtepi32_ps(dot_u8_i8(w, x));
                        acc[r] = _mm256_fmadd_ps(
                            _mm256_set1_ps(d_scale * xs[r].scales[xb]),
                            sum,
                            acc[r],
                        );
                        acc_min[r] += d_min * xs[r].block_sums[xb];
                    }
                }
            }
        }
    }
    for r in 0..R {
        out[r] = horizontal_sum(acc[r]) - acc_min[r];
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_q6_k<const R: usize>(
    super_scales: &[f32],
    raw: &[u8],
    xs: &[QuantizedRow<'_>; R],
    out: &mut [f32; R],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    let low_mask = _mm256_set1_epi8(0x0f);
    let two_bits = _mm256_set1_epi8(3);
    let offset = _mm256_set1_epi8(32);
    for (s, block) in raw.chunks_exact(210).enumerate() {
        let d = super_scales[2 * s];
        for half in 0..2 {
            // SAFETY: ql spans block[64h..64h+64], qh block[128+32h..+32]; all in 210 bytes.
            let (ql0, ql1, qh) = unsafe {
                (
                    load32(block, half * 64),
                    load32(block, half * 64 + 32),
                    load32(block, 128 + half * 32),
                )
            };
            for group in 0..4 {
                let low_source = if group % 2 == 0 { ql0 } else { ql1 };
                let low = if group < 2 {
                    _mm256_and_si256(low_source, low_mask)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(low_source), low_mask)
                };
                let high_bits = match group {
                    0 => qh,
                    1 => _mm256_srli_epi16::<2>(qh),
                    2 => _mm256_srli_epi16::<4>(qh),
                    _ => _mm256_srli_epi16::<6>(qh),
                };
                let high = _mm256_slli_epi16::<4>(_mm256_and_si256(high_bits, two_bits));
                let w = _mm256_sub_epi8(_mm256_or_si256(low, high), offset);
                let sc0 = i16::from(block[192 + half * 8 + 2 * group] as i8);
                let sc1 = i16::from(block[192 + half * 8 + 2 * group + 1] as i8);
                let scale_pairs = _mm256_set_m128i(_mm_set1_epi16(sc1), _mm_set1_epi16(sc0));
                let abs_w = _mm256_sign_epi8(w, w);
                let xb = s * 8 + half * 4 + group;
                for r in 0..R {
                    // SAFETY: activation block xb lies inside the row.
                    let x = unsafe { load32(xs[r].quants, xb * QK) };
                    let products = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w));
                    let sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(products, scale_pairs));
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xs[r].scales[xb]), sum, acc[r]);
                }
            }
        }
    }
    for r in 0..R {
        out[r] = horizontal_sum(acc[r]);
    }
}
