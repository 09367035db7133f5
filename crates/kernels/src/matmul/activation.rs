//! Per-32-element int8 quantization of activation rows for the integer dot kernels.

use crate::pool::{SharedMut, ThreadPool};
use crate::quant::QK;
use crate::{f16_to_f32, f32_to_f16, KernelError};

/// Activation rows quantized in blocks of 32: `x ≈ q * d` with `d = amax / 127` (kept rounded
/// to f16, like llama.cpp's Q8_0/Q8_1 blocks).
///
/// `block_sums[b] = d[b] * Σ q` feeds the min/offset terms of Q4_1 and Q4_K/Q5_K.
#[derive(Debug, Default, Clone)]
pub struct QuantizedActivations {
    quants: Vec<i8>,
    scales: Vec<f32>,
    block_sums: Vec<f32>,
    quant_sums: Vec<i32>,
    half_sums: Vec<i32>,
    in_features: usize,
}

/// One quantized activation row.
#[derive(Clone, Copy)]
pub(crate) struct QuantizedRow<'a> {
    pub(crate) quants: &'a [i8],
    pub(crate) scales: &'a [f32],
    pub(crate) block_sums: &'a [f32],
    /// Integer `Σ q` per block (the offset term of Q4_0).
    pub(crate) quant_sums: &'a [i32],
    /// Integer `Σ q` per 16-element half block, two per block (the offset term of Q6_K, whose
    /// scales change every 16 elements).
    pub(crate) half_sums: &'a [i32],
}

impl QuantizedActivations {
    /// Quantizes `n` rows of `in_features` values from `x`, reusing the buffers. Large
    /// batches are split over `pool` by whole blocks; each block's result is the same whoever
    /// computes it.
    pub(crate) fn quantize(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        in_features: usize,
    ) -> Result<(), KernelError> {
        self.resize(n, in_features)?;
        let n_blocks = n * in_features / QK;
        let x = &x[..n * in_features];
        if n_blocks < PARALLEL_MIN_BLOCKS || pool.num_threads() == 1 {
            quantize_blocks(
                x,
                &mut self.quants,
                &mut self.scales,
                &mut self.block_sums,
                &mut self.quant_sums,
                &mut self.half_sums,
            );
            return Ok(());
        }
        let blocks_per_task = n_blocks.div_ceil(pool.num_threads() * 4);
        let n_tasks = n_blocks.div_ceil(blocks_per_task);
        let quants = SharedMut::new(&mut self.quants);
        let scales = SharedMut::new(&mut self.scales);
        let block_sums = SharedMut::new(&mut self.block_sums);
        let quant_sums = SharedMut::new(&mut self.quant_sums);
        let half_sums = SharedMut::new(&mut self.half_sums);
        pool.parallel_for(n_tasks, &|task| {
            let first = task * blocks_per_task;
            let count = blocks_per_task.min(n_blocks - first);
            // SAFETY: task `task` alone owns blocks first..first + count of all the buffers,
            // which were resized to hold n_blocks blocks above and outlive the parallel_for.
            let (quants, scales, block_sums, quant_sums, half_sums) = unsafe {
                (
                    quants.slice_mut(first * QK, count * QK),
                    scales.slice_mut(first, count),
                    block_sums.slice_mut(first, count),
                    quant_sums.slice_mut(first, count),
                    half_sums.slice_mut(2 * first, 2 * count),
                )
            };
            quantize_blocks(
                &x[first * QK..(first + count) * QK],
                quants,
                scales,
                block_sums,
                quant_sums,
                half_sums,
            );
        });
        Ok(())
    }

    /// Sizes the buffers for `n` rows of `in_features` values (their contents are whatever
    /// they held until quantized).
    pub(crate) fn resize(&mut self, n: usize, in_features: usize) -> Result<(), KernelError> {
        if !in_features.is_multiple_of(QK) {
            return Err(KernelError::InvalidShape(
                "quantized matmul needs in_features divisible by 32",
            ));
        }
        let n_blocks = n * in_features / QK;
        self.in_features = in_features;
        self.quants.resize(n * in_features, 0);
        self.scales.resize(n_blocks, 0.0);
        self.block_sums.resize(n_blocks, 0.0);
        self.quant_sums.resize(n_blocks, 0);
        self.half_sums.resize(2 * n_blocks, 0);
        Ok(())
    }

    /// Quantizes rows `rows` of `x` (`[n][in_features]`, the buffers sized by
    /// [`QuantizedActivations::resize`]) on the calling thread: each row exactly as
    /// [`QuantizedActivations::quantize`] makes it.
    pub(crate) fn quantize_rows(&mut self, x: &[f32], rows: std::ops::Range<usize>) {
        let k = self.in_features;
        let nb = k / QK;
        let (values, blocks) = (rows.start * k..rows.end * k, rows.start * nb..rows.end * nb);
        quantize_blocks(
            &x[values.clone()],
            &mut self.quants[values],
            &mut self.scales[blocks.clone()],
            &mut self.block_sums[blocks.clone()],
            &mut self.quant_sums[blocks.clone()],
            &mut self.half_sums[2 * blocks.start..2 * blocks.end],
        );
    }

    /// All rows' int8 quants, row-major (`in_features` per row).
    pub(crate) fn quants(&self) -> &[i8] {
        &self.quants
    }

    pub(crate) fn row(&self, i: usize) -> QuantizedRow<'_> {
        let k = self.in_features;
        let nb = k / QK;
        QuantizedRow {
            quants: &self.quants[i * k..(i + 1) * k],
            scales: &self.scales[i * nb..(i + 1) * nb],
            block_sums: &self.block_sums[i * nb..(i + 1) * nb],
            quant_sums: &self.quant_sums[i * nb..(i + 1) * nb],
            half_sums: &self.half_sums[2 * i * nb..2 * (i + 1) * nb],
        }
    }
}

/// Blocks below which quantizing on the calling thread beats waking the pool.
const PARALLEL_MIN_BLOCKS: usize = 2048;

fn quantize_blocks(
    x: &[f32],
    quants: &mut [i8],
    scales: &mut [f32],
    block_sums: &mut [f32],
    quant_sums: &mut [i32],
    half_sums: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::get().avx2 && crate::cpu::CpuFeatures::get().f16c {
        // SAFETY: AVX2 and F16C were detected.
        unsafe { avx2::quantize_blocks(x, quants, scales, block_sums, quant_sums, half_sums) };
        return;
    }
    quantize_blocks_scalar(x, quants, scales, block_sums, quant_sums, half_sums);
}

fn quantize_blocks_scalar(
    x: &[f32],
    quants: &mut [i8],
    scales: &mut [f32],
    block_sums: &mut [f32],
    quant_sums: &mut [i32],
    half_sums: &mut [i32],
) {
    for (((((values, quants), scale), block_sum), quant_sum), halves) in x
        .chunks_exact(QK)
        .zip(quants.chunks_exact_mut(QK))
        .zip(scales.iter_mut())
        .zip(block_sums.iter_mut())
        .zip(quant_sums.iter_mut())
        .zip(half_sums.chunks_exact_mut(2))
    {
        let (block_scale, sum) = quantize_block(values, quants);
        let first: i32 = quants[..QK / 2].iter().map(|&q| i32::from(q)).sum();
        halves.copy_from_slice(&[first, sum - first]);
        // Stored rounded to f16, as llama.cpp's Q8_0/Q8_1 activation blocks are: the same
        // rounding keeps our greedy tokens on llama.cpp's path when logits nearly tie.
        *scale = round_to_f16(block_scale);
        *block_sum = round_to_f16(block_scale * sum as f32);
        *quant_sum = sum;
    }
}

fn round_to_f16(value: f32) -> f32 {
    f16_to_f32(f32_to_f16(value))
}

/// Adding and subtracting 1.5 · 2²³ rounds an f32 of magnitude below 2²² to the nearest
/// integer, ties to even (the default FP rounding mode), with plain vectorizable arithmetic.
const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// Quantizes 32 values; returns the scale and the integer sum of the quants.
fn quantize_block(values: &[f32], quants: &mut [i8]) -> (f32, i32) {
    let amax = values.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
    let scale = amax / 127.0;
    let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in quants.iter_mut().zip(values) {
        let rounded = ((v * inverse + ROUNDING_MAGIC) - ROUNDING_MAGIC) as i32;
        *q = rounded.clamp(-127, 127) as i8;
        sum += i32::from(*q);
    }
    (scale, sum)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::QK;

    /// `(round_to_f16(a), round_to_f16(b))` with one F16C round trip (round to nearest even,
    /// as `dtype::f32_to_f16`).
    ///
    /// # Safety
    /// The CPU must support F16C.
    #[inline]
    #[target_feature(enable = "f16c")]
    pub(super) unsafe fn round_pair_to_f16(a: f32, b: f32) -> (f32, f32) {
        let pair = _mm_setr_ps(a, b, 0.0, 0.0);
        let pair = _mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(pair));
        (_mm_cvtss_f32(pair), _mm_cvtss_f32(_mm_movehdup_ps(pair)))
    }

    /// AVX2 twin of `quantize_blocks_scalar` with bitwise-equal results: the block maximum is
    /// order-independent, `cvtps_epi32` rounds to nearest even like the scalar magic-number
    /// rounding, the scale arithmetic is the same scalar code, and F16C's round-to-nearest-even
    /// conversion rounds the scale and block sum to f16 exactly as `dtype::f32_to_f16` does.
    /// (Plain loops, not `array::from_fn`, around the intrinsics: a generic closure carries no
    /// target features, so they would not be inlined.)
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C. Slices must hold matching whole blocks (as the
    /// scalar version's zips assume): `x` and `quants` 32 values per block, the others one.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn quantize_blocks(
        x: &[f32],
        quants: &mut [i8],
        scales: &mut [f32],
        block_sums: &mut [f32],
        quant_sums: &mut [i32],
        half_sums: &mut [i32],
    ) {
        let n_blocks = (x.len() / QK)
            .min(quants.len() / QK)
            .min(scales.len())
            .min(block_sums.len())
            .min(quant_sums.len())
            .min(half_sums.len() / 2);
        let sign = _mm256_set1_ps(-0.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let limit = _mm256_set1_epi32(127);
        for b in 0..n_blocks {
            // SAFETY: block b spans x[32b..32b + 32] and quants[32b..32b + 32] (n_blocks is
            // bounded by both lengths above).
            unsafe {
                let src = x.as_ptr().add(b * QK);
                let mut v = [_mm256_setzero_ps(); 4];
                let mut a = [_mm256_setzero_ps(); 4];
                for i in 0..4 {
                    v[i] = _mm256_loadu_ps(src.add(8 * i));
                    a[i] = _mm256_andnot_ps(sign, v[i]);
                }
                let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
                let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
                let amax = _mm_cvtss_f32(m1);
                let scale = amax / 127.0;
                let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                let factor = _mm256_set1_ps(inverse);
                let mut q = [_mm256_setzero_si256(); 4];
                for i in 0..4 {
                    let rounded = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], factor));
                    q[i] = _mm256_max_epi32(
                        _mm256_min_epi32(rounded, limit),
                        _mm256_sub_epi32(_mm256_setzero_si256(), limit),
                    );
                }
                let sum_of = |total: __m256i| {
                    let t4 = _mm_add_epi32(
                        _mm256_castsi256_si128(total),
                        _mm256_extracti128_si256::<1>(total),
                    );
                    let t2 = _mm_add_epi32(t4, _mm_shuffle_epi32::<0b01_00_11_10>(t4));
                    let t1 = _mm_add_epi32(t2, _mm_shuffle_epi32::<0b10_11_00_01>(t2));
                    _mm_cvtsi128_si32(t1)
                };
                let first = sum_of(_mm256_add_epi32(q[0], q[1]));
                let sum = first + sum_of(_mm256_add_epi32(q[2], q[3]));
                let words = _mm256_packs_epi16(
                    _mm256_packs_epi32(q[0], q[1]),
                    _mm256_packs_epi32(q[2], q[3]),
                );
                let bytes = _mm256_permutevar8x32_epi32(words, order);
                _mm256_storeu_si256(quants.as_mut_ptr().add(b * QK) as *mut __m256i, bytes);
                (scales[b], block_sums[b]) = round_pair_to_f16(scale, scale * sum as f32);
                quant_sums[b] = sum;
                half_sums[2 * b] = first;
                half_sums[2 * b + 1] = sum - first;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F16C's rounding of the scale and block sum equals the software conversion for every
    /// exponent (f16 normals, subnormals, underflow to zero and overflow to infinity), with
    /// random mantissas and the exact halfway cases.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16c_rounding_equals_software() {
        if !crate::cpu::CpuFeatures::get().f16c {
            eprintln!("f16c_rounding_equals_software: skipped, this host lacks F16C");
            return;
        }
        let mut rng = crate::test_util::Rng::new(5);
        let mut values = Vec::new();
        for exponent in 0u32..255 {
            for &low in &[0u32, 0x1000, 0x3000, 0x0fff, 0x1001, 0x7f_ffff] {
                for sign in [0u32, 1 << 31] {
                    values.push(f32::from_bits(sign | exponent << 23 | low));
                }
            }
            for _ in 0..16 {
                let mantissa = (rng.vec(1, 0.0, 8_388_607.0)[0] as u32) & 0x7f_ffff;
                values.push(f32::from_bits(exponent << 23 | mantissa));
            }
        }
        for pair in values.chunks_exact(2) {
            // SAFETY: F16C was detected above.
            let (a, b) = unsafe { avx2::round_pair_to_f16(pair[0], pair[1]) };
            assert_eq!(
                a.to_bits(),
                round_to_f16(pair[0]).to_bits(),
                "{:e}",
                pair[0]
            );
            assert_eq!(
                b.to_bits(),
                round_to_f16(pair[1]).to_bits(),
                "{:e}",
                pair[1]
            );
        }
    }

    #[test]
    fn quantizes_known_block() {
        // amax = 127 makes the inverse scale exactly 1, so the rounding is visible.
        let mut values = vec![0.0f32; 32];
        values[0] = -127.0;
        values[1] = 63.5;
        values[2] = 62.5;
        values[3] = -0.5;
        values[4] = 3.2;
        let mut acts = QuantizedActivations::default();
        acts.quantize(&ThreadPool::new(1), &values, 1, 32).unwrap();
        let row = acts.row(0);
        assert_eq!(&row.quants[..5], &[-127, 64, 62, 0, 3]);
        assert_eq!(row.scales[0], 1.0);
        assert_eq!(row.block_sums[0], 2.0);
    }

    #[test]
    fn magic_rounding_matches_round_ties_even() {
        for i in -300_000..300_000 {
            let v = i as f32 / 1000.0 * 0.5;
            let magic = (v + ROUNDING_MAGIC) - ROUNDING_MAGIC;
            assert_eq!(magic, v.round_ties_even(), "{v}");
        }
    }

    #[test]
    fn parallel_quantization_equals_serial() {
        let mut rng = crate::test_util::Rng::new(1);
        let n = 70;
        let x = rng.vec(n * 1024, -3.0, 3.0);
        let mut serial = QuantizedActivations::default();
        serial.quantize(&ThreadPool::new(1), &x, n, 1024).unwrap();
        let mut parallel = QuantizedActivations::default();
        parallel.quantize(&ThreadPool::new(3), &x, n, 1024).unwrap();
        assert_eq!(serial.quants, parallel.quants);
        assert_eq!(serial.scales, parallel.scales);
        assert_eq!(serial.block_sums, parallel.block_sums);
        assert_eq!(serial.quant_sums, parallel.quant_sums);
        assert_eq!(serial.half_sums, parallel.half_sums);
    }

    #[test]
    fn simd_quantization_equals_scalar() {
        let mut rng = crate::test_util::Rng::new(3);
        let n_blocks = 300;
        let mut x = rng.vec(n_blocks * QK, -4.0, 4.0);
        // Exact ties at the rounding boundary, zeros, and a lone extreme value.
        x[0..32]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32 - 15.5);
        x[32..64].fill(0.0);
        x[64] = 1e30;
        let run = |simd: bool| {
            let mut quants = vec![0i8; n_blocks * QK];
            let (mut scales, mut sums, mut qsums, mut halves) = (
                vec![0.0; n_blocks],
                vec![0.0; n_blocks],
                vec![0; n_blocks],
                vec![0; 2 * n_blocks],
            );
            let buffers = (&mut quants, &mut scales, &mut sums, &mut qsums, &mut halves);
            if simd {
                quantize_blocks(&x, buffers.0, buffers.1, buffers.2, buffers.3, buffers.4);
            } else {
                quantize_blocks_scalar(&x, buffers.0, buffers.1, buffers.2, buffers.3, buffers.4);
            }
            // The half sums are those of the quants, and add up to the block sums.
            for (b, q) in quants.chunks_exact(QK).enumerate() {
                let first: i32 = q[..QK / 2].iter().map(|&v| i32::from(v)).sum();
                let second: i32 = q[QK / 2..].iter().map(|&v| i32::from(v)).sum();
                assert_eq!([halves[2 * b], halves[2 * b + 1]], [first, second]);
                assert_eq!(first + second, qsums[b]);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            (quants, bits(&scales), bits(&sums), qsums, halves)
        };
        assert_eq!(run(true), run(false));
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let mut acts = QuantizedActivations::default();
        acts.quantize(&ThreadPool::new(1), &[0.0; 64], 1, 64)
            .unwrap();
        assert!(acts.row(0).quants.iter().all(|&q| q == 0));
        assert_eq!(acts.row(0).scales, &[0.0, 0.0]);
    }
}
