//! AVX2/F16C conversions between f32 and the KV cache types, eight (E4M3 decoding: sixteen)
//! elements per step, each bitwise equal to its scalar reference in `mod.rs` (the tails run
//! the reference itself). Decoders walk strided rows (a tile's K or V rows of one kv head) in
//! one call, so per-call set-up and dispatch are paid once per tile.

use std::arch::x86_64::*;

use super::{
    f32_to_bf16_saturating, f32_to_f16_saturating, fp8_e4m3_to_f32, fp8_e5m2_to_f32, Fp8Format,
    Rows, BF16_MAX, F16_MAX,
};
use crate::dtype::{bf16_to_f32, f16_to_f32};

/// `x` limited to `[-limit, limit]` with NaN kept: `min_ps`/`max_ps` return their second
/// operand when either is NaN.
#[inline]
#[target_feature(enable = "avx2")]
fn clamp_keeping_nan(x: __m256, limit: f32) -> __m256 {
    let upper = _mm256_min_ps(_mm256_set1_ps(limit), x);
    _mm256_max_ps(_mm256_set1_ps(-limit), upper)
}

/// Eight non-negative 32-bit lanes below 2^16 to eight u16, in order.
#[inline]
#[target_feature(enable = "avx2")]
fn pack_u16(lanes: __m256i) -> __m128i {
    _mm_packus_epi32(
        _mm256_castsi256_si128(lanes),
        _mm256_extracti128_si256::<1>(lanes),
    )
}

/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn encode_f16(values: &[f32], out: &mut [u16]) {
    let n = values.len().min(out.len());
    let body = n - n % 8;
    for i in (0..body).step_by(8) {
        // SAFETY: `i + 8 <= n`, inside both slices; unaligned loads and stores.
        unsafe {
            let x = clamp_keeping_nan(_mm256_loadu_ps(values.as_ptr().add(i)), F16_MAX);
            let half = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, half);
        }
    }
    for (slot, &value) in out[body..n].iter_mut().zip(&values[body..n]) {
        *slot = f32_to_f16_saturating(value);
    }
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn encode_bf16(values: &[f32], out: &mut [u16]) {
    let n = values.len().min(out.len());
    let body = n - n % 8;
    let round_base = _mm256_set1_epi32(0x7fff);
    let one = _mm256_set1_epi32(1);
    let quiet = _mm256_set1_epi32(0x40);
    for i in (0..body).step_by(8) {
        // SAFETY: `i + 8 <= n`, inside both slices; unaligned loads and stores.
        unsafe {
            let x = clamp_keeping_nan(_mm256_loadu_ps(values.as_ptr().add(i)), BF16_MAX);
            let bits = _mm256_castps_si256(x);
            let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), one);
            let rounded = _mm256_add_epi32(bits, _mm256_add_epi32(round_base, odd));
            let rounded = _mm256_srli_epi32::<16>(rounded);
            let nan = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), quiet);
            let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            let codes = _mm256_blendv_epi8(rounded, nan, is_nan);
            _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, pack_u16(codes));
        }
    }
    for (slot, &value) in out[body..n].iter_mut().zip(&values[body..n]) {
        *slot = f32_to_bf16_saturating(value);
    }
}

/// The same steps as [`Fp8Format::encode`], eight lanes at a time.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn encode_fp8(format: &Fp8Format, values: &[f32], out: &mut [u8]) {
    let n = values.len().min(out.len());
    let body = n - n % 8;
    let shift = _mm_cvtsi32_si128(23 - format.mantissa_bits as i32);
    let round_base = _mm256_set1_epi32((1 << (22 - format.mantissa_bits)) - 1);
    let rebias = _mm256_set1_epi32((127 - format.bias) << format.mantissa_bits);
    let min_normal = _mm256_set1_epi32(format.min_normal_bits() as i32);
    let subnormal_scale = _mm256_set1_ps(format.subnormal_scale());
    let max_code = _mm256_set1_epi32(format.max_code as i32);
    let nan_code = _mm256_set1_epi32(format.nan_code as i32);
    let infinity = _mm256_set1_epi32(0x7f80_0000);
    let abs_mask = _mm256_set1_epi32(0x7fff_ffff);
    let one = _mm256_set1_epi32(1);
    for i in (0..body).step_by(8) {
        // SAFETY: `i + 8 <= n`: the load reads eight f32 of `values`.
        let bits = _mm256_castps_si256(unsafe { _mm256_loadu_ps(values.as_ptr().add(i)) });
        let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
        let magnitude = _mm256_and_si256(bits, abs_mask);
        let odd = _mm256_and_si256(_mm256_srl_epi32(magnitude, shift), one);
        let rounded = _mm256_add_epi32(magnitude, _mm256_add_epi32(round_base, odd));
        let normal = _mm256_sub_epi32(_mm256_srl_epi32(rounded, shift), rebias);
        let scaled = _mm256_mul_ps(_mm256_castsi256_ps(magnitude), subnormal_scale);
        let subnormal = _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(scaled));
        let is_subnormal = _mm256_cmpgt_epi32(min_normal, magnitude);
        let code = _mm256_blendv_epi8(normal, subnormal, is_subnormal);
        let code = _mm256_min_epi32(code, max_code);
        let is_nan = _mm256_cmpgt_epi32(magnitude, infinity);
        let code = _mm256_or_si256(_mm256_blendv_epi8(code, nan_code, is_nan), sign);
        let words = pack_u16(code);
        let bytes = _mm_packus_epi16(words, words);
        // SAFETY: `i + 8 <= n`: the store writes eight bytes of `out`.
        unsafe { _mm_storel_epi64(out.as_mut_ptr().add(i) as *mut __m128i, bytes) };
    }
    for (slot, &value) in out[body..n].iter_mut().zip(&values[body..n]) {
        *slot = format.encode(value);
    }
}

/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_f16_rows(codes: &[u16], rows: Rows, out: &mut [f32]) {
    for row in 0..rows.count {
        let Some((codes, out)) = rows.row(codes, &mut *out, row) else {
            continue;
        };
        let n = codes.len().min(out.len());
        let body = n - n % 8;
        for i in (0..body).step_by(8) {
            // SAFETY: `i + 8 <= n`, inside both slices; unaligned loads and stores.
            unsafe {
                let half = _mm_loadu_si128(codes.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(half));
            }
        }
        super::decode_with(&codes[body..n], &mut out[body..n], f16_to_f32);
    }
}

/// bfloat16 is the high half of an f32: widen and shift left 16.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn decode_bf16_rows(codes: &[u16], rows: Rows, out: &mut [f32]) {
    for row in 0..rows.count {
        let Some((codes, out)) = rows.row(codes, &mut *out, row) else {
            continue;
        };
        let n = codes.len().min(out.len());
        let body = n - n % 8;
        for i in (0..body).step_by(8) {
            // SAFETY: `i + 8 <= n`, inside both slices; unaligned loads and stores.
            unsafe {
                let half = _mm_loadu_si128(codes.as_ptr().add(i) as *const __m128i);
                let bits = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_castsi256_ps(bits));
            }
        }
        super::decode_with(&codes[body..n], &mut out[body..n], bf16_to_f32);
    }
}

/// E5M2 is the high byte of an f16: place each byte there and convert.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_fp8_e5m2_rows(codes: &[u8], rows: Rows, out: &mut [f32]) {
    for row in 0..rows.count {
        let Some((codes, out)) = rows.row(codes, &mut *out, row) else {
            continue;
        };
        let n = codes.len().min(out.len());
        let body = n - n % 8;
        for i in (0..body).step_by(8) {
            // SAFETY: `i + 8 <= n`: the load reads eight bytes, the store writes eight f32.
            unsafe {
                let bytes = _mm_loadl_epi64(codes.as_ptr().add(i) as *const __m128i);
                let half = _mm_unpacklo_epi8(_mm_setzero_si128(), bytes);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(half));
            }
        }
        super::decode_with(&codes[body..n], &mut out[body..n], fp8_e5m2_to_f32);
    }
}

/// E4M3's exponent and mantissa shifted left 7 are the exponent and mantissa fields of an f16
/// worth `2^-8` of the value (bias 15 instead of 7; subnormals line up the same way), so a
/// conversion and a multiplication by `2^8` decode it exactly. The sign goes to the f16's sign
/// bit, and the NaN codes (all seven magnitude bits set) get an all-ones f16 exponent. Sixteen
/// codes per step: the bit work runs on sixteen 16-bit lanes, the conversion on two halves.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn decode_fp8_e4m3_rows(codes: &[u8], rows: Rows, out: &mut [f32]) {
    for row in 0..rows.count {
        let Some((codes, out)) = rows.row(codes, &mut *out, row) else {
            continue;
        };
        let n = codes.len().min(out.len());
        let body = n - n % 16;
        let magnitude_mask = _mm256_set1_epi16(0x7f);
        let sign_mask = _mm256_set1_epi16(0x80);
        let nan_exponent = _mm256_set1_epi16(0x7c00);
        let two_to_8 = _mm256_set1_ps(256.0);
        for i in (0..body).step_by(16) {
            // SAFETY: `i + 16 <= n`: the load reads sixteen bytes of `codes`.
            let bytes = unsafe { _mm_loadu_si128(codes.as_ptr().add(i) as *const __m128i) };
            let words = _mm256_cvtepu8_epi16(bytes);
            let magnitude = _mm256_and_si256(words, magnitude_mask);
            let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(words, sign_mask));
            let is_nan = _mm256_cmpeq_epi16(magnitude, magnitude_mask);
            let half = _mm256_or_si256(
                _mm256_or_si256(_mm256_slli_epi16::<7>(magnitude), sign),
                _mm256_and_si256(is_nan, nan_exponent),
            );
            let low = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(half)), two_to_8);
            let high = _mm256_mul_ps(
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(half)),
                two_to_8,
            );
            // SAFETY: `i + 16 <= n`: the stores write sixteen f32 of `out`.
            unsafe {
                _mm256_storeu_ps(out.as_mut_ptr().add(i), low);
                _mm256_storeu_ps(out.as_mut_ptr().add(i + 8), high);
            }
        }
        super::decode_with(&codes[body..n], &mut out[body..n], fp8_e4m3_to_f32);
    }
}
