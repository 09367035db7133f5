//! Vector primitives of the encoder: `exp`, exact GELU and the two halves of attention
//! (scores against transposed keys, the probability-weighted sum of values), each with an
//! AVX2 path and a scalar twin that is bitwise equal to it.
//!
//! Equality holds by construction: both paths run the same IEEE operations in the same
//! order per element (plain `+ - * /`, fused multiply-add as `f32::mul_add` / `vfmadd`,
//! round-to-nearest-even, exponent bits built as integers), and no value is ever reduced
//! across SIMD lanes. `exp` and `erfc` are this module's own approximations, not the C
//! library's, so the scalar twin can follow them step for step.

use super::super::simd::VectorOps;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two (Cody–Waite): `n · LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor coefficients 1/k! for k = 7..=2 (|r| ≤ ln2/2: truncation error ≤ 5e-9 relative).
const EXP_POLY: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];
/// Inputs are clamped here so `2^n` stays a normal number (and NaN becomes the lower bound).
const EXP_LOW: f32 = -87.0;
const EXP_HIGH: f32 = 88.0;

/// `erfc(z) = t · exp(-z² + P(t))`, `t = 1 / (1 + z/2)`: `P`'s coefficients (ascending) are
/// a least-squares fit over `z ∈ [0, 9]` made for this file (relative error of `erfc` below
/// 5e-6 there, absolute below 3e-7).
const ERFC_POLY: [f32; 10] = [
    -1.265_415_1,
    0.997_978_3,
    0.392_154_96,
    0.008_687_085,
    0.076_345_52,
    -0.219_760_45,
    -0.529_553_3,
    1.032_77,
    -0.628_631_7,
    0.135_424_72,
];
/// Past this `erfc(z)` is below 1e-36: GELU of `x < -9√2` is -0 to f32 precision.
const ERFC_Z_MAX: f32 = 9.0;

/// `exp(x)`, within 2 ulp for `x ∈ [-87, 88]`; clamped outside.
pub(crate) fn exp_scalar(x: f32) -> f32 {
    // `if x > lo { x } else { lo }` is `vmaxps(x, lo)` exactly, NaN included.
    let x = if x > EXP_LOW { x } else { EXP_LOW };
    let x = if x < EXP_HIGH { x } else { EXP_HIGH };
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `gelu(x) = x/2 · (1 + erf(x/√2))`, computed as `x/2 · (2 - erfc(z))` for `x ≥ 0` and
/// `x/2 · erfc(z)` below, `z = |x|/√2`: the negative side keeps its relative accuracy.
pub(crate) fn gelu_scalar(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let z = if z < ERFC_Z_MAX { z } else { ERFC_Z_MAX };
    let t = 1.0 / 0.5f32.mul_add(z, 1.0);
    let mut p = ERFC_POLY[9];
    for &c in ERFC_POLY[..9].iter().rev() {
        p = p.mul_add(t, c);
    }
    let erfc = t * exp_scalar((-z).mul_add(z, p));
    let phi2 = if x >= 0.0 { 2.0 - erfc } else { erfc };
    (0.5 * x) * phi2
}

/// Whether this process may run the AVX-512 F element-wise kernels (the `KernelPath` the
/// matmul kernels take, so `TOKENMILL_KERNELS` narrows it too).
pub(crate) fn avx512_usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::{CpuFeatures, KernelPath};
        KernelPath::from(CpuFeatures::get()) == KernelPath::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// GELU in place: sixteen lanes at a time where AVX-512 is usable, then eight with AVX2, then
/// the scalar twin (the same operations per value in all three, so the split changes nothing).
pub(crate) fn gelu(ops: VectorOps, x: &mut [f32]) {
    gelu_with(ops, avx512_usable(), x);
}

/// [`gelu`] with the AVX-512 path chosen by the caller (`wide` needs AVX2 `ops` and AVX-512 F).
pub(crate) fn gelu_with(ops: VectorOps, wide: bool, x: &mut [f32]) {
    let done = match ops {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `VectorOps::Avx2` and `Avx512` are only built after detecting AVX2 and FMA;
        // `wide` only where AVX-512 F is usable too.
        VectorOps::Avx2 | VectorOps::Avx512 => unsafe {
            let wide_done = if wide { avx512::gelu(x) } else { 0 };
            wide_done + avx2::gelu(&mut x[wide_done..])
        },
        VectorOps::Scalar => 0,
    };
    x[done..].iter_mut().for_each(|v| *v = gelu_scalar(*v));
}

/// `x[j] = exp(x[j] - shift)` in place.
pub(crate) fn exp_shifted(ops: VectorOps, x: &mut [f32], shift: f32) {
    let done = match ops {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `gelu`.
        VectorOps::Avx2 | VectorOps::Avx512 => unsafe { avx2::exp_shifted(x, shift) },
        VectorOps::Scalar => 0,
    };
    x[done..]
        .iter_mut()
        .for_each(|v| *v = exp_scalar(*v - shift));
}

/// `scores[j] = Σ_d q[d] · keys_t[d * stride + j]` for `j < scores.len()`, one fused chain per
/// key over `d` in order. `keys_t` holds the keys transposed (`[head_dim][stride]`).
pub(crate) fn key_scores(
    ops: VectorOps,
    q: &[f32],
    keys_t: &[f32],
    stride: usize,
    scores: &mut [f32],
) {
    debug_assert!(scores.len() <= stride && keys_t.len() >= q.len() * stride);
    let done = match ops {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `gelu`; `keys_t` holds `q.len()` rows of `stride >= scores.len()`.
        VectorOps::Avx2 | VectorOps::Avx512 => unsafe {
            avx2::key_scores(q, keys_t, stride, scores)
        },
        VectorOps::Scalar => 0,
    };
    for (j, score) in scores.iter_mut().enumerate().skip(done) {
        let mut acc = 0.0f32;
        for (d, &qd) in q.iter().enumerate() {
            acc = qd.mul_add(keys_t[d * stride + j], acc);
        }
        *score = acc;
    }
}

/// `dst[d] = Σ_j p[j] · values[j * stride + d]`, one fused chain per `d` over `j` in order.
pub(crate) fn weighted_values(
    ops: VectorOps,
    p: &[f32],
    values: &[f32],
    stride: usize,
    dst: &mut [f32],
) {
    debug_assert!(p.is_empty() || values.len() >= (p.len() - 1) * stride + dst.len());
    let done = match ops {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `gelu`; row `j < p.len()` of `values` holds `dst.len()` values.
        VectorOps::Avx2 | VectorOps::Avx512 => unsafe {
            avx2::weighted_values(p, values, stride, dst)
        },
        VectorOps::Scalar => 0,
    };
    for (d, out) in dst.iter_mut().enumerate().skip(done) {
        let mut acc = 0.0f32;
        for (j, &pj) in p.iter().enumerate() {
            acc = pj.mul_add(values[j * stride + d], acc);
        }
        *out = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{ERFC_POLY, ERFC_Z_MAX, EXP_HIGH, EXP_LOW, EXP_POLY, LN2_HI, LN2_LO, LOG2E};

    /// Sixteen lanes of [`super::exp_scalar`] (the AVX2 `exp8`'s operations).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LOW));
        let x = _mm512_min_ps(x, _mm512_set1_ps(EXP_HIGH));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let one = _mm512_set1_ps(1.0);
        p = _mm512_fmadd_ps(p, r, one);
        p = _mm512_fmadd_ps(p, r, one);
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        _mm512_mul_ps(p, _mm512_castsi512_ps(bits))
    }

    /// Sixteen lanes of [`super::gelu_scalar`] (the AVX2 `gelu8`'s operations).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn gelu16(x: __m512) -> __m512 {
        let z = _mm512_mul_ps(
            _mm512_abs_ps(x),
            _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
        );
        let z = _mm512_min_ps(z, _mm512_set1_ps(ERFC_Z_MAX));
        let one = _mm512_set1_ps(1.0);
        let t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.5), z, one));
        let mut p = _mm512_set1_ps(ERFC_POLY[9]);
        for &c in ERFC_POLY[..9].iter().rev() {
            p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c));
        }
        let erfc = _mm512_mul_ps(t, exp16(_mm512_fnmadd_ps(z, z, p)));
        let positive = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_setzero_ps());
        let phi2 = _mm512_mask_blend_ps(positive, erfc, _mm512_sub_ps(_mm512_set1_ps(2.0), erfc));
        _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5), x), phi2)
    }

    /// GELU over whole groups of sixteen; returns how many values it did.
    ///
    /// # Safety
    /// AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gelu(x: &mut [f32]) -> usize {
        let whole = x.len() / 16 * 16;
        for chunk in x.chunks_exact_mut(16) {
            // SAFETY: `chunk` holds sixteen values.
            unsafe {
                let v = _mm512_loadu_ps(chunk.as_ptr());
                _mm512_storeu_ps(chunk.as_mut_ptr(), gelu16(v));
            }
        }
        whole
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{ERFC_POLY, ERFC_Z_MAX, EXP_HIGH, EXP_LOW, EXP_POLY, LN2_HI, LN2_LO, LOG2E};

    /// Eight lanes of [`super::exp_scalar`].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LOW));
        let x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HIGH));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let one = _mm256_set1_ps(1.0);
        p = _mm256_fmadd_ps(p, r, one);
        p = _mm256_fmadd_ps(p, r, one);
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
    }

    /// Eight lanes of [`super::gelu_scalar`].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn gelu8(x: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let z = _mm256_mul_ps(
            _mm256_andnot_ps(sign, x),
            _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
        );
        let z = _mm256_min_ps(z, _mm256_set1_ps(ERFC_Z_MAX));
        let one = _mm256_set1_ps(1.0);
        let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.5), z, one));
        let mut p = _mm256_set1_ps(ERFC_POLY[9]);
        for &c in ERFC_POLY[..9].iter().rev() {
            p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
        }
        let erfc = _mm256_mul_ps(t, exp8(_mm256_fnmadd_ps(z, z, p)));
        let positive = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_setzero_ps());
        let phi2 = _mm256_blendv_ps(erfc, _mm256_sub_ps(_mm256_set1_ps(2.0), erfc), positive);
        _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5), x), phi2)
    }

    /// GELU over whole groups of eight; returns how many values it did.
    ///
    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gelu(x: &mut [f32]) -> usize {
        let whole = x.len() / 8 * 8;
        for chunk in x.chunks_exact_mut(8) {
            // SAFETY: `chunk` holds eight values.
            unsafe {
                let v = _mm256_loadu_ps(chunk.as_ptr());
                _mm256_storeu_ps(chunk.as_mut_ptr(), gelu8(v));
            }
        }
        whole
    }

    /// `exp(x - shift)` over whole groups of eight; returns how many values it did.
    ///
    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted(x: &mut [f32], shift: f32) -> usize {
        let shift = _mm256_set1_ps(shift);
        let whole = x.len() / 8 * 8;
        for chunk in x.chunks_exact_mut(8) {
            // SAFETY: `chunk` holds eight values.
            unsafe {
                let v = _mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), shift);
                _mm256_storeu_ps(chunk.as_mut_ptr(), exp8(v));
            }
        }
        whole
    }

    /// Scores of whole groups of eight keys, four groups at a time while they last (four
    /// independent chains hide the FMA latency); returns how many keys it did.
    ///
    /// # Safety
    /// AVX2 and FMA; `keys_t` holds `q.len()` rows of `stride >= scores.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn key_scores(
        q: &[f32],
        keys_t: &[f32],
        stride: usize,
        scores: &mut [f32],
    ) -> usize {
        let whole = scores.len() / 8 * 8;
        let kp = keys_t.as_ptr();
        let sp = scores.as_mut_ptr();
        let mut j = 0;
        // SAFETY: (both loops) row `d < q.len()` of `keys_t` has `stride >= whole` values,
        // so lanes `j..j + 8 * G` (all below `whole`) are inside it and inside `scores`.
        unsafe {
            while j + 32 <= whole {
                let mut acc = [_mm256_setzero_ps(); 4];
                for (d, &qd) in q.iter().enumerate() {
                    let qv = _mm256_set1_ps(qd);
                    let row = kp.add(d * stride + j);
                    for (g, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(row.add(8 * g)), *a);
                    }
                }
                for (g, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(sp.add(j + 8 * g), *a);
                }
                j += 32;
            }
            while j < whole {
                let mut acc = _mm256_setzero_ps();
                for (d, &qd) in q.iter().enumerate() {
                    let row = kp.add(d * stride + j);
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(qd), _mm256_loadu_ps(row), acc);
                }
                _mm256_storeu_ps(sp.add(j), acc);
                j += 8;
            }
        }
        whole
    }

    /// The weighted sum over whole groups of eight output columns, at most four groups
    /// (32 columns) per pass; returns how many columns it did.
    ///
    /// # Safety
    /// AVX2 and FMA; row `j < p.len()` of `values` (at `j * stride`) holds `dst.len()` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_values(
        p: &[f32],
        values: &[f32],
        stride: usize,
        dst: &mut [f32],
    ) -> usize {
        let whole = dst.len() / 8 * 8;
        let vp = values.as_ptr();
        let mut d = 0;
        while d < whole {
            let groups = ((whole - d) / 8).min(4);
            let mut acc = [_mm256_setzero_ps(); 4];
            // SAFETY: columns `d..d + 8 * groups <= dst.len()` of each row are in `values`
            // (the caller's contract) and in `dst`.
            unsafe {
                for (j, &pj) in p.iter().enumerate() {
                    let pv = _mm256_set1_ps(pj);
                    let row = vp.add(j * stride + d);
                    for (g, a) in acc.iter_mut().enumerate().take(groups) {
                        *a = _mm256_fmadd_ps(pv, _mm256_loadu_ps(row.add(8 * g)), *a);
                    }
                }
                for (g, a) in acc.iter().enumerate().take(groups) {
                    _mm256_storeu_ps(dst.as_mut_ptr().add(d + 8 * g), *a);
                }
            }
            d += 8 * groups;
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// The AVX2 path when the host has it (the caller then compares it with the scalar twin).
    fn simd() -> Option<VectorOps> {
        let ops = VectorOps::detect();
        if ops == VectorOps::Scalar {
            eprintln!("skipped: AVX2 encoder vector ops (host lacks AVX2/FMA)");
            return None;
        }
        Some(ops)
    }

    #[test]
    fn exp_is_accurate_and_simd_equals_scalar() {
        let xs: Vec<f32> = (0..20_001)
            .map(|i| -87.0 + i as f32 * 0.0087)
            .chain([f32::NAN, f32::NEG_INFINITY, -100.0, 0.0, -0.0, 1.0])
            .collect();
        for &x in &xs[..20_001] {
            let want = f64::from(x).exp();
            let got = f64::from(exp_scalar(x));
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
        let mut scalar = xs.clone();
        exp_shifted(VectorOps::Scalar, &mut scalar, 0.5);
        if let Some(ops) = simd() {
            let mut vector = xs.clone();
            exp_shifted(ops, &mut vector, 0.5);
            assert_eq!(bits(&vector), bits(&scalar));
        }
    }

    #[test]
    fn gelu_is_accurate_and_simd_equals_scalar() {
        let xs: Vec<f32> = (0..40_001)
            .map(|i| -20.0 + i as f32 * 0.001)
            .chain([
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                -0.0,
                1e-30,
                -1e-30,
            ])
            .collect();
        for &x in &xs[..40_001] {
            let x64 = f64::from(x);
            // Exact GELU in f64 from libm's double erfc; the bounds are erfc's (5e-6
            // relative, 3e-7 absolute, the latter scaled by x/2).
            let want = 0.5 * x64 * libm::erfc(-x64 / std::f64::consts::SQRT_2);
            let got = f64::from(gelu_scalar(x));
            assert!(
                (got - want).abs() <= 5e-6 * want.abs() + 2e-7 * x64.abs() + 1e-30,
                "gelu({x}) = {got}, want {want}"
            );
        }
        let mut scalar = xs.clone();
        gelu(VectorOps::Scalar, &mut scalar);
        assert_eq!(scalar[40_001 + 1], f32::INFINITY);
        if let Some(ops) = simd() {
            let mut vector = xs.clone();
            gelu_with(ops, false, &mut vector);
            assert_eq!(bits(&vector), bits(&scalar));
            if avx512_usable() {
                // Odd offsets so every path (16, 8, scalar) covers some values.
                for start in [0, 3, 9] {
                    let mut wide = xs[start..].to_vec();
                    gelu_with(ops, true, &mut wide);
                    assert_eq!(bits(&wide), bits(&scalar[start..]), "offset {start}");
                }
            } else {
                eprintln!("skipped: AVX-512 GELU (host or TOKENMILL_KERNELS lacks it)");
            }
        }
    }

    #[test]
    fn attention_halves_match_f64_and_simd_equals_scalar() {
        let mut rng = Rng::new(3);
        for (keys, head_dim, stride) in [(45, 32, 48), (8, 12, 8), (3, 5, 3), (70, 64, 72)] {
            let q = rng.vec(head_dim, -1.0, 1.0);
            let keys_t = rng.vec(head_dim * stride, -1.0, 1.0);
            let mut scalar = vec![0.0; keys];
            key_scores(VectorOps::Scalar, &q, &keys_t, stride, &mut scalar);
            for (j, s) in scalar.iter().enumerate() {
                let want: f64 = (0..head_dim)
                    .map(|d| f64::from(q[d]) * f64::from(keys_t[d * stride + j]))
                    .sum();
                assert!((f64::from(*s) - want).abs() < 1e-5);
            }
            let p = rng.vec(keys, 0.0, 1.0);
            let value_stride = head_dim + 7;
            let values = rng.vec(keys * value_stride, -1.0, 1.0);
            let mut summed = vec![0.0; head_dim];
            weighted_values(VectorOps::Scalar, &p, &values, value_stride, &mut summed);
            for (d, s) in summed.iter().enumerate() {
                let want: f64 = (0..keys)
                    .map(|j| f64::from(p[j]) * f64::from(values[j * value_stride + d]))
                    .sum();
                assert!((f64::from(*s) - want).abs() < 1e-4);
            }
            if let Some(ops) = simd() {
                let mut vector = vec![0.0; keys];
                key_scores(ops, &q, &keys_t, stride, &mut vector);
                assert_eq!(bits(&vector), bits(&scalar));
                let mut vector = vec![0.0; head_dim];
                weighted_values(ops, &p, &values, value_stride, &mut vector);
                assert_eq!(bits(&vector), bits(&summed));
            }
        }
    }
}
