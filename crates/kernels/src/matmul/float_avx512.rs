//! AVX-512 float dot kernels (f32, f16 and bf16 weight rows): `avx2::dot_float`'s arithmetic
//! in 512-bit registers.
//!
//! The AVX2 kernel keeps two 8-lane accumulators per (weight row, activation row), one for
//! elements `16s..16s + 8` and one for `16s + 8..16s + 16` of every 16-element step, adds them
//! lane-wise at the end and reduces the eight lanes pairwise. Here one 16-lane accumulator holds
//! both (lanes 0..8 the first, 8..16 the second), so every step is one widening (`vcvtph2ps
//! zmm`: 16 f16 at once) and one FMA instead of two of each, and the final `low + high` is the
//! AVX2 kernel's `acc0 + acc1`: every output is bitwise the AVX2 (and scalar) result.
//!
//! The gain over AVX2 is the halved conversion and FMA count per weight (fewer cycles per
//! streamed byte in a decode step, twice the FMA throughput per tile in prefill) and, with two
//! weight rows per call for a tile, more independent FMA chains.

use std::arch::x86_64::*;

use super::avx2::{dot_tail, horizontal_sum, F16_WEIGHTS, F32_WEIGHTS};
use super::Tile;

/// Weights `c..c + 16` of a `KIND` row as one 16-lane f32 vector.
///
/// # Safety
/// AVX-512 F; the 16 weights from `c` lie inside the row at `w`.
#[inline(always)]
unsafe fn load16<const KIND: u8>(w: *const u8, c: usize) -> __m512 {
    // SAFETY: the caller's contract: the 16 weights from `c` are inside the row.
    unsafe {
        match KIND {
            F32_WEIGHTS => _mm512_loadu_ps(w.cast::<f32>().add(c)),
            F16_WEIGHTS => _mm512_cvtph_ps(_mm256_loadu_si256(w.cast::<u16>().add(c).cast())),
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_loadu_si256(w.cast::<u16>().add(c).cast()),
            ))),
        }
    }
}

/// `out[i][r] = W_i · xs[r]` for `ROWS` float weight rows of `k` elements stored as `KIND`
/// (`ws[i]` points at row `i`), bitwise equal to `avx2::dot_float` on each (row, activation
/// row) pair: one 16-lane FMA accumulator per pair over 16-element steps, reduced as the AVX2
/// kernel's two, then the tail in order.
///
/// # Safety
/// The CPU must support AVX-512 F, AVX2, FMA and F16C; each `ws[i]` points at `k` weights of
/// `KIND`; every row of `xs` holds at least `k` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) unsafe fn dot_float<const ROWS: usize, const R: usize, const KIND: u8>(
    k: usize,
    ws: [*const u8; ROWS],
    xs: &Tile<'_, R>,
    out: &mut [[f32; R]; ROWS],
) {
    debug_assert!(xs.iter().all(|x| x.len() >= k));
    let mut acc = [[_mm512_setzero_ps(); R]; ROWS];
    let mut c = 0;
    while c + 16 <= k {
        // SAFETY: c + 16 <= k: inside every weight row and every activation row.
        unsafe {
            let x: [__m512; R] = std::array::from_fn(|r| _mm512_loadu_ps(xs[r].as_ptr().add(c)));
            for i in 0..ROWS {
                let w = load16::<KIND>(ws[i], c);
                for r in 0..R {
                    acc[i][r] = _mm512_fmadd_ps(w, x[r], acc[i][r]);
                }
            }
        }
        c += 16;
    }
    for i in 0..ROWS {
        for r in 0..R {
            // SAFETY: each weight row holds k weights (the caller's contract).
            let tail = unsafe { dot_tail::<KIND>(ws[i], xs[r], c, k) };
            let halves = _mm256_add_ps(
                _mm512_castps512_ps256(acc[i][r]),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[i][r]))),
            );
            out[i][r] = horizontal_sum(halves) + tail;
        }
    }
}
