//! Linear layers: `out[n, out_features] = x[n, in_features] · Wᵀ` for weights in any [`DType`].
//!
//! Weights are repacked once at load ([`QMatrix::from_bytes`]): float types become f32 rows,
//! Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/IQ4_XS/MXFP4 are interleaved eight rows at a time so one integer
//! instruction advances eight output columns (`interleaved.rs`, same bytes per weight as the
//! GGUF file), and so are Q4_K/Q5_K/Q6_K, per 256-element super-block (`kquant.rs`, at most 4
//! bytes per row and super-block more than the file). Both eight-row layouts share one driver
//! (`grouped.rs`). Activations of quantized layers are quantized per 32 elements to int8
//! (symmetric, `d = amax / 127`, round to nearest even) and every block product is an exact
//! integer dot, scaled in f32.
//!
//! Determinism: each output element is produced by one call of a per-(weight row, activation
//! row) routine whose floating-point operation order depends only on `in_features` and the
//! instruction set picked at runtime, never on `n`, on neighbouring rows, or on the thread
//! count. Tiles of several activation rows share weight loads but keep separate accumulators.

mod activation;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod float;
#[cfg(target_arch = "x86_64")]
mod float_avx512;
mod grouped;
mod interleaved;
mod kquant;
#[cfg(target_arch = "x86_64")]
mod kquant_avx2;
#[cfg(target_arch = "x86_64")]
mod prefetch;
mod scalar;
mod segmented;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod unpack;
mod untransposed;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod vnni_kernels;
#[cfg(target_arch = "x86_64")]
mod vnni_tiles;

use crate::cpu::{CpuFeatures, KernelPath};
use crate::dtype::DType;
use crate::pool::ThreadPool;
use crate::quant::dequantize;
use crate::weight_buf::WeightBuf;
use crate::KernelError;

pub use activation::QuantizedActivations;

/// Pieces each thread's share of a matmul runs in (grouped kernels, VNNI row sweeps, AMX
/// tiles, 16-bit and f32 weights; [`crate::ThreadPool::parallel_ranges`]). Each thread owns one
/// contiguous range of output columns and streams its weights front to back (one stream the
/// hardware prefetcher follows, where interleaved smaller tasks made every thread jump; one
/// task per thread measured 5-20 % faster than four interleaved ones on the two-core Xeon,
/// bench/RESULTS.md); a thread done with its share takes pieces from the back of another's,
/// so a late or slowed thread (a busy core on a shared host) holds the matmul up by a piece
/// rather than its whole share: 8- and 16-row model steps ~4 % faster than whole shares in
/// step-by-step alternation (bench/RESULTS.md), one-row steps unchanged. (The mixture-of-experts driver,
/// `segmented.rs`, keeps its own split over experts.)
pub(crate) const PIECES_PER_THREAD: usize = 4;

#[cfg(target_arch = "x86_64")]
pub(crate) use amx::min_rows_summary as amx_min_rows_summary;
#[cfg(target_arch = "x86_64")]
pub(crate) use amx::Amx;
use float::{half_widener, FloatWeights};
pub use segmented::Segments;

/// How a matrix's weights are held in memory after repacking.
#[derive(Debug, Clone)]
pub(crate) enum Storage {
    /// F32 weights, `[out][in]`.
    Float { values: WeightBuf<f32> },
    /// F16 or BF16 weights kept as their 16-bit patterns, `[out][in]`: half the bytes of
    /// widened f32, widened exactly inside the dot kernel, so results equal the f32 path's.
    Half { bits: WeightBuf<u16>, dtype: DType },
    /// Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS / MXFP4: eight rows interleaved per block
    /// (see `interleaved.rs`).
    Interleaved(interleaved::Groups),
    /// Q4_K / Q5_K / Q6_K: eight rows interleaved per super-block (see `kquant.rs`).
    KQuant(kquant::KGroups),
}

/// A linear layer's weight `[out_features, in_features]`, each output row contiguous.
#[derive(Debug, Clone)]
pub struct QMatrix {
    dtype: DType,
    out_features: usize,
    in_features: usize,
    storage: Storage,
}

/// Reusable buffers for [`QMatrix::matmul`]; grows to the largest shape seen, then no longer
/// allocates.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    activations: QuantizedActivations,
}

impl MatmulScratch {
    /// An empty scratch.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Which kernel family runs (the crate-internal face of [`KernelPath`]): scalar, AVX2 (with
/// FMA and F16C), AVX-VNNI (AVX2 plus 256-bit `vpdpbusd`) or AVX-512 (F + BW + VNNI, two
/// eight-row groups per 512-bit register). The float kernels of the VNNI paths are AVX2's.
///
/// A SIMD variant is only ever constructed by [`Isa::from`] / [`Isa::for_path`] after the CPU
/// was found to have its features: the kernels' `SAFETY` notes rely on that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The path for this process's [`CpuFeatures`].
    pub(crate) fn detect() -> Isa {
        Isa::from(CpuFeatures::get())
    }

    /// `path` if this process may run it (its features detected and not narrowed away by
    /// `TOKENMILL_KERNELS`), else `None`.
    pub(crate) fn for_path(path: KernelPath) -> Option<Isa> {
        if !path.missing(CpuFeatures::get()).is_empty() {
            return None;
        }
        Some(match path {
            KernelPath::Scalar => Isa::Scalar,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx2 => Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            KernelPath::AvxVnni => Isa::AvxVnni,
            #[cfg(target_arch = "x86_64")]
            KernelPath::Avx512 => Isa::Avx512,
            #[cfg(not(target_arch = "x86_64"))]
            _ => return None,
        })
    }

    /// Eight-row groups one group kernel call computes: two 256-bit halves of a 512-bit
    /// register for AVX-512, else one.
    pub(crate) fn groups_per_call(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 2,
            _ => 1,
        }
    }
}

impl From<&CpuFeatures> for Isa {
    fn from(features: &CpuFeatures) -> Isa {
        Isa::for_path(KernelPath::from(features)).unwrap_or(Isa::Scalar)
    }
}

/// The kernels over unpacked 16-column tiles (`unpack.rs`) that take the group layouts at
/// several rows, each with the token that proves this process may run it; bitwise equal to
/// the group kernels.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileKernel {
    /// AMX int8 tiles (`amx.rs`).
    Amx(amx::Amx),
    /// AVX-512 VNNI row sweeps (`vnni_tiles.rs`).
    Sweeps(vnni_tiles::Vnni512),
}

#[cfg(target_arch = "x86_64")]
impl TileKernel {
    /// The kernel for `n` rows of `dtype` on `isa`: AMX tiles from `amx::min_rows` rows where
    /// the process may use them, else the AVX-512 row sweeps from `vnni_tiles::MIN_ROWS`
    /// rows; `None` (the group kernels) below both.
    fn for_rows(dtype: DType, n: usize, isa: Isa) -> Option<TileKernel> {
        match amx::Amx::detect() {
            Some(amx) if n >= amx::min_rows(dtype) => Some(TileKernel::Amx(amx)),
            _ => vnni_tiles::Vnni512::for_isa(isa)
                .filter(|_| n >= vnni_tiles::MIN_ROWS)
                .map(TileKernel::Sweeps),
        }
    }
}

/// `R` f32 activation rows processed together against each f32 weight row.
pub(crate) type Tile<'a, const R: usize> = [&'a [f32]; R];

impl QMatrix {
    /// Copies GGML-layout bytes (`out_features` rows of `in_features` elements) into an owned,
    /// repacked matrix.
    pub fn from_bytes(
        dtype: DType,
        out_features: usize,
        in_features: usize,
        bytes: &[u8],
    ) -> Result<QMatrix, KernelError> {
        let row_bytes = dtype.row_bytes(in_features)?;
        let expected = row_bytes
            .checked_mul(out_features)
            .ok_or(KernelError::InvalidShape("matrix size overflows usize"))?;
        if bytes.len() != expected {
            return Err(KernelError::LengthMismatch {
                what: "weight bytes",
                expected,
                actual: bytes.len(),
            });
        }
        let storage = match dtype {
            DType::F32 => {
                let mut values = WeightBuf::zeroed(out_features * in_features)?;
                dequantize(dtype, bytes, &mut values)?;
                Storage::Float { values }
            }
            DType::F16 | DType::BF16 => {
                let mut bits = WeightBuf::zeroed(out_features * in_features)?;
                for (value, pair) in bits.iter_mut().zip(bytes.chunks_exact(2)) {
                    *value = u16::from_le_bytes([pair[0], pair[1]]);
                }
                Storage::Half { bits, dtype }
            }
            DType::Q8_0
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::IQ4_NL
            | DType::IQ4_XS
            | DType::MXFP4 => Storage::Interleaved(interleaved::Groups::pack(
                dtype,
                out_features,
                in_features,
                bytes,
            )?),
            DType::Q4_K | DType::Q5_K | DType::Q6_K => Storage::KQuant(kquant::KGroups::pack(
                dtype,
                out_features,
                in_features,
                bytes,
            )?),
        };
        Ok(QMatrix {
            dtype,
            out_features,
            in_features,
            storage,
        })
    }

    /// An F32 matrix from row-major values `[out_features][in_features]`.
    pub fn from_f32(
        out_features: usize,
        in_features: usize,
        values: &[f32],
    ) -> Result<QMatrix, KernelError> {
        if values.len() != out_features * in_features {
            return Err(KernelError::LengthMismatch {
                what: "weight values",
                expected: out_features * in_features,
                actual: values.len(),
            });
        }
        Ok(QMatrix {
            dtype: DType::F32,
            out_features,
            in_features,
            storage: Storage::Float {
                values: WeightBuf::from_slice(values)?,
            },
        })
    }

    /// The element type the weights were loaded from.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Rows of the weight (outputs of the layer).
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Columns of the weight (inputs of the layer).
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Bytes held by the repacked weights.
    pub fn storage_bytes(&self) -> usize {
        match &self.storage {
            Storage::Float { values } => values.len() * 4,
            Storage::Half { bits, .. } => bits.len() * 2,
            Storage::Interleaved(groups) => groups.storage_bytes(),
            Storage::KQuant(groups) => groups.storage_bytes(),
        }
    }

    /// Decodes weight row `row` to f32 (an embedding lookup for a `[vocab, hidden]` table).
    /// Values equal [`dequantize`] of the original bytes exactly.
    pub fn row_to_f32(&self, row: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        if row >= self.out_features {
            return Err(KernelError::IndexOutOfRange {
                what: "weight row",
                index: row,
                len: self.out_features,
            });
        }
        if dst.len() != self.in_features {
            return Err(KernelError::LengthMismatch {
                what: "row destination",
                expected: self.in_features,
                actual: dst.len(),
            });
        }
        let k = self.in_features;
        match &self.storage {
            Storage::Float { values } => dst.copy_from_slice(&values[row * k..(row + 1) * k]),
            Storage::Half { bits, dtype } => {
                let widen = half_widener(*dtype);
                for (value, &b) in dst.iter_mut().zip(&bits[row * k..(row + 1) * k]) {
                    *value = widen(b);
                }
            }
            Storage::Interleaved(groups) => groups.row_to_f32(row, dst),
            Storage::KQuant(groups) => groups.row_to_f32(row, dst)?,
        }
        Ok(())
    }

    /// [`QMatrix::matmul`] on a given kernel path (for benchmarks and comparisons; results
    /// are bitwise those of every other path). Refused with
    /// [`KernelError::UnsupportedKernelPath`] where this process may not run `path` (the CPU
    /// lacks it or `TOKENMILL_KERNELS` narrowed it away).
    pub fn matmul_on(
        &self,
        path: KernelPath,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), KernelError> {
        let isa = Isa::for_path(path).ok_or(KernelError::UnsupportedKernelPath(path))?;
        self.matmul_with_isa(isa, pool, x, n, out, scratch)
    }

    /// Computes `out[n, out_features] = x[n, in_features] · Wᵀ` on `pool`.
    pub fn matmul(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), KernelError> {
        // The group layouts take a kernel over unpacked tiles from several rows (AMX tiles
        // where the process may use them, else AVX-512 VNNI row sweeps; bitwise equal to the
        // other paths).
        let isa = Isa::detect();
        #[cfg(target_arch = "x86_64")]
        if let (Some(kernel), Some(weights)) =
            (TileKernel::for_rows(self.dtype, n, isa), self.amx_weights())
        {
            return self.matmul_tiles(kernel, weights, pool, x, n, out, scratch);
        }
        self.matmul_with_isa(isa, pool, x, n, out, scratch)
    }

    /// The weights as the unpacking tile kernels (AMX, the VNNI row sweeps) read them: the
    /// eight-row group layouts.
    #[cfg(target_arch = "x86_64")]
    fn amx_weights(&self) -> Option<unpack::Weights<'_>> {
        match &self.storage {
            Storage::Interleaved(groups) => Some(unpack::Weights::Legacy(groups)),
            Storage::KQuant(groups) => Some(unpack::Weights::KQuant(groups)),
            Storage::Float { .. } | Storage::Half { .. } => None,
        }
    }

    /// [`QMatrix::matmul`] on a kernel over unpacked 16-column tiles.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn matmul_tiles(
        &self,
        kernel: TileKernel,
        weights: unpack::Weights<'_>,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), KernelError> {
        if self.prepare(pool, x, n, out, scratch)? {
            let activations = &scratch.activations;
            match kernel {
                TileKernel::Amx(amx) => amx::matmul(amx, weights, pool, activations, n, out),
                TileKernel::Sweeps(token) => {
                    vnni_tiles::matmul(token, weights, pool, activations, n, out)
                }
            }
        }
        Ok(())
    }

    /// What every path does first: checks the shapes and quantizes the activations of
    /// quantized weights into `scratch`. `false` when there is nothing to compute.
    fn prepare(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &[f32],
        scratch: &mut MatmulScratch,
    ) -> Result<bool, KernelError> {
        self.check_shapes(x, n, out)?;
        if n == 0 || self.out_features == 0 {
            return Ok(false);
        }
        if self.dtype.is_quantized() {
            scratch.activations.quantize(pool, x, n, self.in_features)?;
        }
        Ok(true)
    }

    fn check_shapes(&self, x: &[f32], n: usize, out: &[f32]) -> Result<(), KernelError> {
        if x.len() != n * self.in_features {
            return Err(KernelError::LengthMismatch {
                what: "matmul input",
                expected: n * self.in_features,
                actual: x.len(),
            });
        }
        if out.len() != n * self.out_features {
            return Err(KernelError::LengthMismatch {
                what: "matmul output",
                expected: n * self.out_features,
                actual: out.len(),
            });
        }
        Ok(())
    }

    pub(crate) fn matmul_with_isa(
        &self,
        isa: Isa,
        pool: &ThreadPool,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), KernelError> {
        if !self.prepare(pool, x, n, out, scratch)? {
            return Ok(());
        }
        match &self.storage {
            Storage::Float { values } => {
                self.float_matmul(isa, pool, FloatWeights::F32(values), x, n, out);
            }
            Storage::Half { bits, dtype } => {
                let weights = match dtype {
                    DType::BF16 => FloatWeights::Bf16(bits),
                    _ => FloatWeights::F16(bits),
                };
                self.float_matmul(isa, pool, weights, x, n, out);
            }
            Storage::Interleaved(groups) => {
                groups.matmul(isa, pool, &scratch.activations, n, out);
            }
            Storage::KQuant(groups) => groups.matmul(isa, pool, &scratch.activations, n, out),
        }
        Ok(())
    }
}

/// Plain f32 reference `out = x · Wᵀ` with weights decoded by [`dequantize`]; for tests.
pub fn reference_matmul(
    dtype: DType,
    out_features: usize,
    in_features: usize,
    weight_bytes: &[u8],
    x: &[f32],
    n: usize,
) -> Result<Vec<f32>, KernelError> {
    let mut weights = vec![0.0f32; out_features * in_features];
    dequantize(dtype, weight_bytes, &mut weights)?;
    let mut out = vec![0.0f32; n * out_features];
    for i in 0..n {
        for j in 0..out_features {
            let mut sum = 0.0f64;
            for k in 0..in_features {
                sum += f64::from(x[i * in_features + k]) * f64::from(weights[j * in_features + k]);
            }
            out[i * out_features + j] = sum as f32;
        }
    }
    Ok(out)
}
