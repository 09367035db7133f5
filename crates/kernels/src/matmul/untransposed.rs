//! `out[i] += x[i] · W` with `W` read as stored (`[out_features][in_features]`, no transpose):
//! one scaled-row add (axpy) per element of `x[i]`, in order. For a LoRA `B` kept
//! `[rank][out]`, a decode row's product is `rank` vector axpys over `out` columns instead of
//! `out` dots of length `rank`, each of which would be mostly reduction overhead.
//!
//! Every output element is `y = fma(x[k], w[k][c], y)` for `k = 0, 1, ...`: the order depends
//! on nothing but `k`, so rows never depend on each other, and the AVX2 path (8 columns per
//! vector, the tail in scalar fused multiply-adds) equals the scalar twin bit for bit.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{FloatWeights, Isa, QMatrix, Storage};
use crate::dtype::{bf16_to_f32, f16_to_f32, DType};
use crate::KernelError;

impl QMatrix {
    /// `out[i][c] += Σ_k x[i][k] · W[k][c]` for `n` rows, `x` `[n][out_features]` and `out`
    /// `[n][in_features]`, on the calling thread (meant for products too small to split).
    /// F32, F16 and BF16 weights.
    pub fn add_untransposed(
        &self,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.add_untransposed_with_isa(Isa::detect(), x, n, out)
    }

    pub(crate) fn add_untransposed_with_isa(
        &self,
        isa: Isa,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        let (k, columns) = (self.out_features, self.in_features);
        if x.len() != n * k {
            return Err(KernelError::LengthMismatch {
                what: "untransposed input",
                expected: n * k,
                actual: x.len(),
            });
        }
        if out.len() != n * columns {
            return Err(KernelError::LengthMismatch {
                what: "untransposed output",
                expected: n * columns,
                actual: out.len(),
            });
        }
        let weights = match &self.storage {
            Storage::Float { values } => FloatWeights::F32(values),
            Storage::Half {
                bits,
                dtype: DType::BF16,
            } => FloatWeights::Bf16(bits),
            Storage::Half { bits, .. } => FloatWeights::F16(bits),
            Storage::Interleaved(_) | Storage::KQuant(_) => {
                return Err(KernelError::UnsupportedDType {
                    dtype: self.dtype,
                    operation: "add_untransposed",
                })
            }
        };
        if columns == 0 {
            return Ok(());
        }
        for (x_row, out_row) in x.chunks_exact(k.max(1)).zip(out.chunks_exact_mut(columns)) {
            axpy_rows(isa, weights, x_row, out_row);
        }
        Ok(())
    }
}

/// `out += Σ_k x[k] · W[k]` for one row; `W` holds `x.len()` rows of `out.len()` weights.
fn axpy_rows(isa: Isa, weights: FloatWeights<'_>, x: &[f32], out: &mut [f32]) {
    match (isa, weights) {
        // SAFETY (the three AVX2 arms): the SIMD `Isa`s are only constructed after detecting
        // (at least) AVX2, FMA and F16C, and `W` holds `x.len()` rows of `out.len()` elements of its type.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2 | Isa::AvxVnni | Isa::Avx512, FloatWeights::F32(w)) => {
            // SAFETY: as above.
            unsafe { avx2_axpy_rows::<{ super::avx2::F32_WEIGHTS }>(w.as_ptr().cast(), x, out) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2 | Isa::AvxVnni | Isa::Avx512, FloatWeights::F16(w)) => {
            // SAFETY: as above.
            unsafe { avx2_axpy_rows::<{ super::avx2::F16_WEIGHTS }>(w.as_ptr().cast(), x, out) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2 | Isa::AvxVnni | Isa::Avx512, FloatWeights::Bf16(w)) => {
            // SAFETY: as above.
            unsafe { avx2_axpy_rows::<{ super::avx2::BF16_WEIGHTS }>(w.as_ptr().cast(), x, out) }
        }
        (Isa::Scalar, FloatWeights::F32(w)) => scalar_axpy_rows(|i| w[i], x, out),
        (Isa::Scalar, FloatWeights::F16(w)) => scalar_axpy_rows(|i| f16_to_f32(w[i]), x, out),
        (Isa::Scalar, FloatWeights::Bf16(w)) => scalar_axpy_rows(|i| bf16_to_f32(w[i]), x, out),
    }
}

/// The twin: element by element, `k` in order, one fused multiply-add each.
fn scalar_axpy_rows(weight: impl Fn(usize) -> f32, x: &[f32], out: &mut [f32]) {
    let columns = out.len();
    for (c, y) in out.iter_mut().enumerate() {
        for (k, &scale) in x.iter().enumerate() {
            *y = scale.mul_add(weight(k * columns + c), *y);
        }
    }
}

/// 8 columns at a time held in a register across all `k`, then the tail columns as the twin.
///
/// # Safety
/// AVX2, FMA and F16C; `w` points at `x.len() * out.len()` weights of `KIND`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_axpy_rows<const KIND: u8>(w: *const u8, x: &[f32], out: &mut [f32]) {
    let columns = out.len();
    let mut c = 0;
    while c + 8 <= columns {
        // SAFETY: columns c..c + 8 lie inside `out` and inside every weight row.
        unsafe {
            let mut y = _mm256_loadu_ps(out.as_ptr().add(c));
            for (k, &scale) in x.iter().enumerate() {
                let weights = super::avx2::load8::<KIND>(w, k * columns + c);
                y = _mm256_fmadd_ps(_mm256_set1_ps(scale), weights, y);
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(c), y);
        }
        c += 8;
    }
    for (c, y) in out.iter_mut().enumerate().skip(c) {
        for (k, &scale) in x.iter().enumerate() {
            // SAFETY: element k * columns + c lies inside the weights.
            let weight = unsafe { super::avx2::weight_at::<KIND>(w, k * columns + c) };
            *y = scale.mul_add(weight, *y);
        }
    }
}
