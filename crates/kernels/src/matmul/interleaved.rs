//! Q4_0 / Q4_1 / Q8_0 weights repacked eight rows at a time for integer GEMM/GEMV.
//!
//! Layout: rows are taken in groups of [`GROUP`] (the last group padded with zero rows). For each
//! group and each 32-element block `b`, in order:
//!
//! ```text
//! Q4_0/Q4_1: [8 × f16 scale] [8 × f16 min, Q4_1 only] [4 × (8 rows × 4 packed bytes)]
//! Q8_0:      [8 × f16 scale] [8 × (8 rows × 4 quants)]
//! ```
//!
//! The 4-bit quant part holds, for `kk` in `0..4`, bytes `4kk..4kk + 4` of each of the 8 rows'
//! GGML block. Masking a 32-byte load with `0x0f` therefore gives elements `4kk..4kk + 4` of all
//! eight rows, and shifting it right by 4 gives elements `16 + 4kk..16 + 4kk + 4`; Q8_0's step
//! `k` holds elements `4k..4k + 4` of all eight rows. One `maddubs` against four broadcast
//! activation bytes thus yields partial dot products for eight weight rows at once, one row per
//! 32-bit lane. Bytes per row and block equal GGUF's (18 for Q4_0, 20 for Q4_1, 34 for Q8_0), so
//! decode streams no more memory than the file holds.
//!
//! Arithmetic per (weight row, activation row), shared by the scalar and AVX2 kernels so both
//! give bitwise-equal results: for every block in order, the exact integer dot `s` of the
//! weight quants with the int8 activations (unsigned nibbles minus `8 · Σq` for Q4_0), then
//! `acc = fma(d_w · d_x, s, acc)`, then for Q4_1 `acc = fma(m_w, d_x · Σq, acc)`.

use super::activation::{QuantizedActivations, QuantizedRow};
use super::grouped::{matmul_grouped, GroupedLayout};
use super::Isa;
use crate::dtype::DType;
use crate::pool::ThreadPool;
use crate::quant::QK;
use crate::{f16_to_f32, KernelError};

pub(crate) use super::grouped::GROUP;

/// The block formats this layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupKind {
    /// Q4_0: `w = d · (q - 8)`.
    Q4Zero,
    /// Q4_1: `w = d · q + m`.
    Q4One,
    /// Q8_0: `w = d · q`, q signed.
    Q8Zero,
}

impl GroupKind {
    /// Bytes of one group-block: scales, mins (Q4_1) and the quants.
    pub(crate) const fn block_stride(self) -> usize {
        self.quant_offset() + GROUP * self.quant_bytes_per_row()
    }

    /// Offset of the quant bytes inside a group-block.
    pub(crate) const fn quant_offset(self) -> usize {
        match self {
            GroupKind::Q4Zero | GroupKind::Q8Zero => 16,
            GroupKind::Q4One => 32,
        }
    }

    /// Quant bytes of one row in one block.
    const fn quant_bytes_per_row(self) -> usize {
        match self {
            GroupKind::Q4Zero | GroupKind::Q4One => QK / 2,
            GroupKind::Q8Zero => QK,
        }
    }
}

/// A Q4_0/Q4_1 matrix in the interleaved layout.
#[derive(Debug, Clone)]
pub(crate) struct Groups {
    kind: GroupKind,
    out_features: usize,
    n_blocks: usize,
    bytes: Vec<u8>,
}

impl Groups {
    /// Repacks GGML Q4_0/Q4_1 rows (`out_features` rows of `in_features / 32` blocks).
    pub(crate) fn pack(
        dtype: DType,
        out_features: usize,
        in_features: usize,
        ggml: &[u8],
    ) -> Result<Groups, KernelError> {
        let kind = match dtype {
            DType::Q4_0 => GroupKind::Q4Zero,
            DType::Q4_1 => GroupKind::Q4One,
            DType::Q8_0 => GroupKind::Q8Zero,
            _ => {
                return Err(KernelError::InvalidShape(
                    "interleaved layout is Q4_0/Q4_1/Q8_0",
                ))
            }
        };
        let n_blocks = in_features / QK;
        let src_block = dtype.block_bytes();
        let row_quants = kind.quant_bytes_per_row();
        let header = src_block - row_quants;
        let n_groups = out_features.div_ceil(GROUP);
        let stride = kind.block_stride();
        let mut bytes = vec![0u8; n_groups * n_blocks * stride];
        for row in 0..out_features {
            let (group, lane) = (row / GROUP, row % GROUP);
            for b in 0..n_blocks {
                let src = &ggml[(row * n_blocks + b) * src_block..][..src_block];
                let dst = &mut bytes[(group * n_blocks + b) * stride..][..stride];
                dst[2 * lane..2 * lane + 2].copy_from_slice(&src[0..2]);
                if kind == GroupKind::Q4One {
                    dst[16 + 2 * lane..16 + 2 * lane + 2].copy_from_slice(&src[2..4]);
                }
                let quants = &src[header..];
                for step in 0..row_quants / 4 {
                    let at = kind.quant_offset() + step * 32 + lane * 4;
                    dst[at..at + 4].copy_from_slice(&quants[step * 4..step * 4 + 4]);
                }
            }
        }
        Ok(Groups {
            kind,
            out_features,
            n_blocks,
            bytes,
        })
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn group(&self, group: usize) -> &[u8] {
        let len = self.n_blocks * self.kind.block_stride();
        &self.bytes[group * len..(group + 1) * len]
    }

    /// Decodes weight row `row` to f32, equal to GGML's dequantization.
    pub(crate) fn row_to_f32(&self, row: usize, dst: &mut [f32]) {
        let (group, lane) = (row / GROUP, row % GROUP);
        let stride = self.kind.block_stride();
        let data = self.group(group);
        for (b, out) in dst.chunks_exact_mut(QK).enumerate() {
            let block = &data[b * stride..(b + 1) * stride];
            let (scale, min) = lane_scale_min(self.kind, block, lane);
            let quant =
                |j: usize| block[self.kind.quant_offset() + (j / 4) * 32 + lane * 4 + j % 4];
            match self.kind {
                GroupKind::Q8Zero => {
                    for (j, value) in out.iter_mut().enumerate() {
                        *value = f32::from(quant(j) as i8) * scale;
                    }
                }
                GroupKind::Q4Zero | GroupKind::Q4One => {
                    let offset = if self.kind == GroupKind::Q4Zero {
                        -8.0
                    } else {
                        0.0
                    };
                    for j in 0..QK / 2 {
                        let byte = quant(j);
                        let (low, high) = (f32::from(byte & 0x0f), f32::from(byte >> 4));
                        out[j] = (low + offset) * scale + min;
                        out[j + QK / 2] = (high + offset) * scale + min;
                    }
                }
            }
        }
    }

    /// `out[n, out_features] = x · Wᵀ` for activations already quantized into `activations`.
    pub(crate) fn matmul(
        &self,
        isa: Isa,
        pool: &ThreadPool,
        activations: &QuantizedActivations,
        n: usize,
        out: &mut [f32],
    ) {
        matmul_grouped(self, isa, pool, activations, n, out);
    }

    /// Runs activation rows `first_row..first_row + R` against each group in `groups` and
    /// hands every group's results to `write`.
    fn tiles<const R: usize>(
        &self,
        isa: Isa,
        groups: std::ops::Range<usize>,
        activations: &QuantizedActivations,
        first_row: usize,
        write: &mut dyn FnMut(usize, &[[f32; GROUP]]),
    ) {
        let xs: [QuantizedRow<'_>; R] = std::array::from_fn(|r| activations.row(first_row + r));
        for group in groups {
            let data = self.group(group);
            let mut out = [[0.0f32; GROUP]; R];
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C;
                // the group holds `n_blocks` group-blocks and every activation row `n_blocks`
                // blocks.
                Isa::Avx2 => unsafe {
                    match self.kind {
                        GroupKind::Q8Zero => {
                            super::avx2::q8_group_tile::<R>(data, self.n_blocks, &xs, &mut out)
                        }
                        kind => super::avx2::q4_group_tile::<R>(
                            kind,
                            data,
                            self.n_blocks,
                            &xs,
                            &mut out,
                        ),
                    }
                },
                Isa::Scalar => group_tile_scalar(self.kind, data, self.n_blocks, &xs, &mut out),
            }
            write(group, &out);
        }
    }
}

impl GroupedLayout for Groups {
    fn out_features(&self) -> usize {
        self.out_features
    }

    fn run_tiles<const R: usize>(
        &self,
        isa: Isa,
        groups: std::ops::Range<usize>,
        activations: &QuantizedActivations,
        first_row: usize,
        write: &mut dyn FnMut(usize, &[[f32; GROUP]]),
    ) {
        self.tiles::<R>(isa, groups, activations, first_row, write);
    }
}

/// Scale and min (0 unless Q4_1) of `lane` in one group-block.
fn lane_scale_min(kind: GroupKind, block: &[u8], lane: usize) -> (f32, f32) {
    let f16 = |at: usize| f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
    let scale = f16(2 * lane);
    let min = match kind {
        GroupKind::Q4One => f16(16 + 2 * lane),
        GroupKind::Q4Zero | GroupKind::Q8Zero => 0.0,
    };
    (scale, min)
}

/// Portable twin of the AVX2 group kernel, operation for operation.
fn group_tile_scalar<const R: usize>(
    kind: GroupKind,
    group: &[u8],
    n_blocks: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let stride = kind.block_stride();
    for (r, x) in xs.iter().enumerate() {
        for lane in 0..GROUP {
            let mut acc = 0.0f32;
            for b in 0..n_blocks {
                let block = &group[b * stride..(b + 1) * stride];
                let (scale, min) = lane_scale_min(kind, block, lane);
                let q = &x.quants[b * QK..(b + 1) * QK];
                let quant = |j: usize| block[kind.quant_offset() + (j / 4) * 32 + lane * 4 + j % 4];
                let mut dot = 0i32;
                if kind == GroupKind::Q8Zero {
                    for (j, &x) in q.iter().enumerate() {
                        dot += i32::from(quant(j) as i8) * i32::from(x);
                    }
                } else {
                    for j in 0..QK / 2 {
                        dot += i32::from(quant(j) & 0x0f) * i32::from(q[j]);
                        dot += i32::from(quant(j) >> 4) * i32::from(q[j + QK / 2]);
                    }
                }
                if kind == GroupKind::Q4Zero {
                    dot -= 8 * x.quant_sums[b];
                }
                acc = (scale * x.scales[b]).mul_add(dot as f32, acc);
                if kind == GroupKind::Q4One {
                    acc = min.mul_add(x.block_sums[b], acc);
                }
            }
            out[r][lane] = acc;
        }
    }
}
