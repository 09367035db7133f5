//! Portable float dot kernel: the fallback when AVX2 is missing, and the AVX2 kernels' scalar
//! twin (same lanes, same fused multiply-adds, same reduction order, so bitwise equal).

use super::Tile;

/// Lanes of one AVX2 accumulator.
const LANES: usize = 8;

/// `out[r] = w · xs[r]` over `k` weights read through `weight(c)` (f32 weights, or f16/bf16
/// bits widened exactly), in `avx2::dot_f32`'s order: two 8-lane FMA accumulators over
/// 16-element steps, lanes added pairwise (`acc0 + acc1`, then halves, then pairs), then the
/// tail summed in order and added last.
pub(crate) fn dot_tile<const R: usize>(
    k: usize,
    weight: impl Fn(usize) -> f32,
    xs: &Tile<'_, R>,
    out: &mut [f32; R],
) {
    for (x, result) in xs.iter().zip(out.iter_mut()) {
        let mut acc0 = [0.0f32; LANES];
        let mut acc1 = [0.0f32; LANES];
        let mut c = 0;
        while c + 2 * LANES <= k {
            for lane in 0..LANES {
                acc0[lane] = weight(c + lane).mul_add(x[c + lane], acc0[lane]);
                acc1[lane] = weight(c + LANES + lane).mul_add(x[c + LANES + lane], acc1[lane]);
            }
            c += 2 * LANES;
        }
        let mut tail = 0.0f32;
        for j in c..k {
            tail += weight(j) * x[j];
        }
        let v: [f32; LANES] = std::array::from_fn(|lane| acc0[lane] + acc1[lane]);
        let sum4: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
        *result = ((sum4[0] + sum4[2]) + (sum4[1] + sum4[3])) + tail;
    }
}
