//! Portable f32 dot kernel: the fallback when AVX2 is missing and the shape of the SIMD code.

use super::Tile;

pub(crate) fn dot_tile<const R: usize>(w: &[f32], xs: &Tile<'_, R>, out: &mut [f32; R]) {
    for (x, result) in xs.iter().zip(out.iter_mut()) {
        *result = w.iter().zip(x.iter()).map(|(a, b)| a * b).sum();
    }
}
