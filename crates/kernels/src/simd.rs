//! f32 vector primitives for attention (dot products, one online-softmax block step), with an
//! AVX2 path and a scalar fallback of the same structure.

/// The vector primitives available on this CPU, detected once per use site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VectorOps {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl VectorOps {
    pub(crate) fn detect() -> VectorOps {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return VectorOps::Avx2;
            }
        }
        VectorOps::Scalar
    }

    /// `Σ a[i] · b[i]` over the common length.
    #[cfg(test)]
    pub(crate) fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and FMA.
            VectorOps::Avx2 => unsafe { avx2::dot(a, b) },
            VectorOps::Scalar => scalar_dot(a, b),
        }
    }
}

/// One cache block's keys and values for one kv head: rows `t < count` start at
/// `t * stride` and hold `head_dim` values.
#[derive(Clone, Copy)]
pub(crate) struct BlockView<'a> {
    pub(crate) keys: &'a [f32],
    pub(crate) values: &'a [f32],
    pub(crate) stride: usize,
    pub(crate) count: usize,
}

/// Running state of one query row's online softmax.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OnlineSoftmax {
    pub(crate) max: f32,
    pub(crate) sum: f32,
}

impl OnlineSoftmax {
    pub(crate) const EMPTY: OnlineSoftmax = OnlineSoftmax {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };
}

impl VectorOps {
    /// Folds one block of keys/values into a query row's online softmax: scores
    /// `q·k * scale`, one rescale of `acc` by `exp(old_max - new_max)`, then
    /// `acc += Σ exp(s - new_max) · v` in key order. `scores` needs `block.count` slots.
    #[inline]
    pub(crate) fn attend_block(
        self,
        query: &[f32],
        block: BlockView<'_>,
        scale: f32,
        state: &mut OnlineSoftmax,
        acc: &mut [f32],
        scores: &mut [f32],
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and FMA.
            VectorOps::Avx2 => unsafe {
                avx2::attend_block(query, block, scale, state, acc, scores)
            },
            VectorOps::Scalar => scalar_attend_block(query, block, scale, state, acc, scores),
        }
    }
}

/// Turns raw scores into block weights and updates the softmax state; returns the factor the
/// accumulator must be rescaled by.
#[inline]
fn softmax_block_weights(scores: &mut [f32], state: &mut OnlineSoftmax) -> f32 {
    let block_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let new_max = state.max.max(block_max);
    let correction = (state.max - new_max).exp();
    let mut block_sum = 0.0f32;
    for score in scores.iter_mut() {
        *score = (*score - new_max).exp();
        block_sum += *score;
    }
    state.sum = state.sum * correction + block_sum;
    state.max = new_max;
    correction
}

fn scalar_attend_block(
    query: &[f32],
    block: BlockView<'_>,
    scale: f32,
    state: &mut OnlineSoftmax,
    acc: &mut [f32],
    scores: &mut [f32],
) {
    let d = query.len();
    let scores = &mut scores[..block.count];
    for (t, score) in scores.iter_mut().enumerate() {
        *score = scalar_dot(query, &block.keys[t * block.stride..t * block.stride + d]) * scale;
    }
    let correction = softmax_block_weights(scores, state);
    for (j, a) in acc.iter_mut().enumerate() {
        let mut value = *a * correction;
        for (t, &weight) in scores.iter().enumerate() {
            value += weight * block.values[t * block.stride + j];
        }
        *a = value;
    }
}

fn scalar_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let n = a.len().min(b.len());
    let mut chunks_a = a[..n].chunks_exact(8);
    let mut chunks_b = b[..n].chunks_exact(8);
    for (ca, cb) in (&mut chunks_a).zip(&mut chunks_b) {
        for l in 0..8 {
            lanes[l] += ca[l] * cb[l];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in chunks_a.remainder().iter().zip(chunks_b.remainder()) {
        tail += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
        + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BlockView, OnlineSoftmax};

    /// `e^x` for 8 lanes: Cephes-style range reduction `x = n·ln2 + r` and a degree-6
    /// polynomial (relative error ~1e-7); inputs below -87.3 give exactly 0.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_55));
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.336_55)),
            _mm256_set1_ps(88.376_26),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, r2, r), _mm256_set1_ps(1.0));
        let exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(exponent));
        _mm256_andnot_ps(underflow, _mm256_mul_ps(y, scale))
    }

    /// AVX2 twin of `softmax_block_weights`, with the block's exponentials vectorized.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax_block_weights_avx2(scores: &mut [f32], state: &mut OnlineSoftmax) -> f32 {
        let block_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let new_max = state.max.max(block_max);
        let correction = (state.max - new_max).exp();
        let shift = _mm256_set1_ps(new_max);
        let mut chunks = scores.chunks_exact_mut(8);
        for chunk in &mut chunks {
            // SAFETY: the chunk holds exactly 8 f32.
            unsafe {
                let v = _mm256_loadu_ps(chunk.as_ptr());
                _mm256_storeu_ps(chunk.as_mut_ptr(), exp8(_mm256_sub_ps(v, shift)));
            }
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut padded = [f32::NEG_INFINITY; 8];
            padded[..tail.len()].copy_from_slice(tail);
            let mut result = [0.0f32; 8];
            // SAFETY: both arrays hold exactly 8 f32.
            unsafe {
                let v = _mm256_loadu_ps(padded.as_ptr());
                _mm256_storeu_ps(result.as_mut_ptr(), exp8(_mm256_sub_ps(v, shift)));
            }
            tail.copy_from_slice(&result[..tail.len()]);
        }
        let block_sum = scores.iter().fold(0.0f32, |acc, &w| acc + w);
        state.sum = state.sum * correction + block_sum;
        state.max = new_max;
        correction
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `block` rows `t < count` hold `query.len()` values
    /// at `t * stride` in both `keys` and `values`; `acc.len() == query.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn attend_block(
        query: &[f32],
        block: BlockView<'_>,
        scale: f32,
        state: &mut OnlineSoftmax,
        acc: &mut [f32],
        scores: &mut [f32],
    ) {
        let d = query.len();
        let rows_fit = |buffer: &[f32]| {
            block.count == 0 || (block.count - 1) * block.stride + d <= buffer.len()
        };
        if acc.len() != d || !rows_fit(block.keys) || !rows_fit(block.values) {
            return;
        }
        let scores = &mut scores[..block.count];
        for (t, score) in scores.iter_mut().enumerate() {
            let key = &block.keys[t * block.stride..t * block.stride + d];
            // SAFETY: AVX2/FMA enabled here.
            *score = unsafe { dot(query, key) } * scale;
        }
        let correction = softmax_block_weights_avx2(scores, state);
        let factor = _mm256_set1_ps(correction);
        let values = block.values;
        let mut c = 0;
        // Eight registers of accumulator (64 values) stay resident across the block's keys.
        while c + 64 <= d {
            // SAFETY: c + 64 <= d; value rows hold d values at t * stride (caller contract).
            unsafe {
                let base = acc.as_mut_ptr().add(c);
                let mut lanes: [__m256; 8] = std::array::from_fn(|u| {
                    _mm256_mul_ps(_mm256_loadu_ps(base.add(8 * u)), factor)
                });
                for (t, &weight) in scores.iter().enumerate() {
                    let w = _mm256_set1_ps(weight);
                    let row = values.as_ptr().add(t * block.stride + c);
                    for (u, lane) in lanes.iter_mut().enumerate() {
                        *lane = _mm256_fmadd_ps(w, _mm256_loadu_ps(row.add(8 * u)), *lane);
                    }
                }
                for (u, lane) in lanes.iter().enumerate() {
                    _mm256_storeu_ps(base.add(8 * u), *lane);
                }
            }
            c += 64;
        }
        while c + 8 <= d {
            // SAFETY: c + 8 <= d, as above.
            unsafe {
                let base = acc.as_mut_ptr().add(c);
                let mut lane = _mm256_mul_ps(_mm256_loadu_ps(base), factor);
                for (t, &weight) in scores.iter().enumerate() {
                    let row = values.as_ptr().add(t * block.stride + c);
                    lane = _mm256_fmadd_ps(_mm256_set1_ps(weight), _mm256_loadu_ps(row), lane);
                }
                _mm256_storeu_ps(base, lane);
            }
            c += 8;
        }
        for j in c..d {
            let mut value = acc[j] * correction;
            for (t, &weight) in scores.iter().enumerate() {
                value = weight.mul_add(values[t * block.stride + j], value);
            }
            acc[j] = value;
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n, within both slices.
            unsafe {
                acc0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    acc1,
                );
            }
            i += 16;
        }
        if i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe {
                acc0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
            }
            i += 8;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let low = _mm256_castps256_ps128(acc);
        let high = _mm256_extractf128_ps::<1>(acc);
        let sum4 = _mm_add_ps(low, high);
        let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
        let sum1 = _mm_add_ss(sum2, _mm_shuffle_ps::<1>(sum2, sum2));
        let mut total = _mm_cvtss_f32(sum1);
        while i < n {
            total += a[i] * b[i];
            i += 1;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_matches_scalar_on_odd_lengths() {
        let ops = VectorOps::detect();
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 33, 64, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            assert!((f64::from(ops.dot(&a, &b)) - exact).abs() < 1e-4);
            assert!((f64::from(scalar_dot(&a, &b)) - exact).abs() < 1e-4);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp_matches_libm() {
        if VectorOps::detect() == VectorOps::Scalar {
            return;
        }
        let mut scores: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
        scores.extend([f32::NEG_INFINITY, -87.0, -88.0, -200.0, 0.0]);
        let expected: Vec<f32> = scores.iter().map(|s| s.exp()).collect();
        let mut state = OnlineSoftmax { max: 0.0, sum: 0.0 };
        // SAFETY: AVX2 and FMA were detected above.
        let correction = unsafe { avx2::softmax_block_weights_avx2(&mut scores, &mut state) };
        assert_eq!(correction, 1.0);
        for (got, want) in scores.iter().zip(&expected) {
            assert!((got - want).abs() <= 2e-7 * want + 1e-37, "{got} vs {want}");
        }
    }

    #[test]
    fn attend_block_simd_matches_scalar() {
        let ops = VectorOps::detect();
        let mut rng = crate::test_util::Rng::new(17);
        for d in [1usize, 7, 8, 17, 64, 72, 130] {
            for count in [1usize, 3, 16] {
                let stride = d + 5;
                let keys = rng.vec((count - 1) * stride + d, -1.0, 1.0);
                let values = rng.vec((count - 1) * stride + d, -1.0, 1.0);
                let query = rng.vec(d, -1.0, 1.0);
                let block = BlockView {
                    keys: &keys,
                    values: &values,
                    stride,
                    count,
                };
                let start = rng.vec(d, -1.0, 1.0);
                let (mut acc_a, mut acc_b) = (start.clone(), start);
                let mut state_a = OnlineSoftmax { max: 0.3, sum: 1.5 };
                let mut state_b = state_a;
                let mut scores = vec![0.0f32; 16];
                // Two blocks in a row exercise the rescale of an existing accumulator.
                for _ in 0..2 {
                    ops.attend_block(&query, block, 0.7, &mut state_a, &mut acc_a, &mut scores);
                    scalar_attend_block(&query, block, 0.7, &mut state_b, &mut acc_b, &mut scores);
                }
                assert!((state_a.max - state_b.max).abs() < 1e-5);
                assert!((state_a.sum - state_b.sum).abs() < 1e-4 * state_b.sum);
                for (x, y) in acc_a.iter().zip(&acc_b) {
                    assert!(
                        (x - y).abs() < 1e-4 * (1.0 + y.abs()),
                        "d={d} count={count}"
                    );
                }
            }
        }
    }
}
