//! Portable dot kernels: the fallback when AVX2 is missing and the shape of the SIMD code.

use super::activation::QuantizedRow;
use super::{Tile, WeightRow};
use crate::quant::{scale_min_k4, QK};

pub(crate) fn dot_tile<const R: usize>(
    weights: WeightRow<'_>,
    tile: &Tile<'_, R>,
    out: &mut [f32; R],
) {
    match (weights, tile) {
        (WeightRow::Float(w), Tile::Float(xs)) => {
            for (x, result) in xs.iter().zip(out.iter_mut()) {
                *result = w.iter().zip(x.iter()).map(|(a, b)| a * b).sum();
            }
        }
        (WeightRow::Float(_), Tile::Quantized(_)) => *out = [f32::NAN; R],
        (weights, Tile::Quantized(xs)) => {
            for (x, result) in xs.iter().zip(out.iter_mut()) {
                *result = dot_quantized(weights, x);
            }
        }
        // Quantized weights always come with quantized rows (see `QMatrix::matmul`).
        (_, Tile::Float(_)) => *out = [f32::NAN; R],
    }
}

fn dot_quantized(weights: WeightRow<'_>, x: &QuantizedRow<'_>) -> f32 {
    match weights {
        WeightRow::Float(_) => f32::NAN,
        WeightRow::Q4K { super_scales, raw } => {
            let mut acc = 0.0f32;
            for (s, block) in raw.chunks_exact(144).enumerate() {
                let (d, dmin) = (super_scales[2 * s], super_scales[2 * s + 1]);
                let scales = &block[4..16];
                for sub in 0..8 {
                    let (scale, min) = scale_min_k4(sub, scales);
                    let bytes = &block[16 + (sub / 2) * 32..16 + (sub / 2) * 32 + 32];
                    let xb = s * 8 + sub;
                    let q = &x.quants[xb * QK..(xb + 1) * QK];
                    let shift = if sub % 2 == 0 { 0 } else { 4 };
                    let sum: i32 = bytes
                        .iter()
                        .zip(q)
                        .map(|(&w, &a)| i32::from((w >> shift) & 0x0f) * i32::from(a))
                        .sum();
                    acc += d * f32::from(scale) * x.scales[xb] * sum as f32
                        - dmin * f32::from(min) * x.block_sums[xb];
                }
            }
            acc
        }
        WeightRow::Q5K { super_scales, raw } => {
            let mut acc = 0.0f32;
            for (s, block) in raw.chunks_exact(176).enumerate() {
                let (d, dmin) = (super_scales[2 * s], super_scales[2 * s + 1]);
                let scales = &block[4..16];
                let qh = &block[16..48];
                for sub in 0..8 {
                    let (scale, min) = scale_min_k4(sub, scales);
                    let bytes = &block[48 + (sub / 2) * 32..48 + (sub / 2) * 32 + 32];
                    let xb = s * 8 + sub;
                    let q = &x.quants[xb * QK..(xb + 1) * QK];
                    let shift = if sub % 2 == 0 { 0 } else { 4 };
                    let mut sum = 0i32;
                    for l in 0..QK {
                        let high = ((qh[l] >> sub) & 1) << 4;
                        let w = ((bytes[l] >> shift) & 0x0f) | high;
                        sum += i32::from(w) * i32::from(q[l]);
                    }
                    acc += d * f32::from(scale) * x.scales[xb] * sum as f32
                        - dmin * f32::from(min) * x.block_sums[xb];
                }
            }
            acc
        }
        WeightRow::Q6K { super_scales, raw } => {
            let mut acc = 0.0f32;
            for (s, block) in raw.chunks_exact(210).enumerate() {
                let d = super_scales[2 * s];
                for half in 0..2 {
                    let ql = &block[half * 64..half * 64 + 64];
                    let qh = &block[128 + half * 32..128 + half * 32 + 32];
                    let scales = &block[192 + half * 8..192 + half * 8 + 8];
                    for group in 0..4 {
                        let xb = s * 8 + half * 4 + group;
                        let q = &x.quants[xb * QK..(xb + 1) * QK];
                        let mut sums = [0i32; 2];
                        for l in 0..QK {
                            let low = if group % 2 == 0 { ql[l] } else { ql[l + 32] };
                            let low = if group < 2 { low & 0x0f } else { low >> 4 };
                            let high = (qh[l] >> (2 * group)) & 3;
                            let w = i32::from(low | (high << 4)) - 32;
                            sums[l / 16] += w * i32::from(q[l]);
                        }
                        let sc0 = i32::from(scales[2 * group] as i8);
                        let sc1 = i32::from(scales[2 * group + 1] as i8);
                        let sum = sc0 * sums[0] + sc1 * sums[1];
                        acc += d * x.scales[xb] * sum as f32;
                    }
                }
            }
            acc
        }
    }
}
