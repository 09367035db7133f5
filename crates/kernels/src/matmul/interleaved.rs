//! Legacy-quant, IQ4 and MXFP4 weights repacked eight rows at a time for integer GEMM/GEMV.
//!
//! Layout: rows are taken in groups of [`GROUP`] (the last group padded with zero rows). For each
//! group and each block `b` (32 elements; a 256-element super-block for IQ4_XS), in order:
//!
//! ```text
//! Q4_0, IQ4_NL: [8 × f16 d]                          [4 × (8 rows × 4 packed bytes)]
//! Q4_1:         [8 × f16 d] [8 × f16 m]              [4 × (8 rows × 4 packed bytes)]
//! Q5_0:         [8 × f16 d]             [8 × u32 qh] [4 × (8 rows × 4 packed bytes)]
//! Q5_1:         [8 × f16 d] [8 × f16 m] [8 × u32 qh] [4 × (8 rows × 4 packed bytes)]
//! Q8_0:         [8 × f16 d]                          [8 × (8 rows × 4 quants)]
//! MXFP4:        [8 × u8 e]                           [4 × (8 rows × 4 packed bytes)]
//! IQ4_XS:       [8 × f16 d] [8 × u16 scales_h] [8 × u32 scales_l]
//!                                       8 sub-blocks × [4 × (8 rows × 4 packed bytes)]
//! ```
//!
//! The 4-bit quant part holds, for `kk` in `0..4`, bytes `4kk..4kk + 4` of each of the 8 rows'
//! GGML nibbles. Masking a 32-byte load with `0x0f` therefore gives elements `4kk..4kk + 4` of all
//! eight rows, and shifting it right by 4 gives elements `16 + 4kk..16 + 4kk + 4`; Q8_0's step
//! `k` holds elements `4k..4k + 4` of all eight rows. One `maddubs` against four broadcast
//! activation bytes thus yields partial dot products for eight weight rows at once, one row per
//! 32-bit lane. Q5's fifth bits are reordered at load so each step finds its bits by one shift:
//! byte `i` of a row's `qh` holds in bit `kk` the fifth bit of element `4kk + i` and in bit
//! `4 + kk` that of element `16 + 4kk + i`. IQ4 and MXFP4 nibbles index GGML's int8 level
//! tables ([`KVALUES_IQ4NL`], [`KVALUES_MXFP4`]; one `pshufb`). Bytes per row and block equal
//! GGUF's (18 for Q4_0/IQ4_NL, 20 for Q4_1, 22 for Q5_0, 24 for Q5_1, 34 for Q8_0, 17 for MXFP4,
//! 136 per 256 for IQ4_XS), so decode streams no more memory than the file holds: MXFP4 keeps
//! its one-byte E8M0 scales, decoded exactly to f32 in the kernels ([`e8m0_to_f32_half`]).
//!
//! Arithmetic per (weight row, activation row), shared by the scalar and AVX2 kernels so both
//! give bitwise-equal results: for every 32-element block in order, the exact integer dot `s` of
//! the weight levels with the int8 activations (Q4_0/Q5_0: unsigned quants minus `8 · Σx` /
//! `16 · Σx`; IQ4, MXFP4: table values), then `acc = fma(d_w · d_x, s, acc)` with `d_w` the
//! block's scale (IQ4_XS: `d · (ls - 32)`, exact in f32; MXFP4: `2^(e - 128)`, exact), then for
//! Q4_1/Q5_1 `acc = fma(m_w, d_x · Σx, acc)`.

use super::activation::{QuantizedActivations, QuantizedRow};
use super::grouped::{matmul_grouped, GroupPair, GroupedLayout, PairOut};
use super::Isa;
use crate::dtype::DType;
use crate::pool::ThreadPool;
use crate::quant::{iq4_xs_scale, KVALUES_IQ4NL, KVALUES_MXFP4, QK, QK_K};
use crate::weight_buf::WeightBuf;
use crate::{e8m0_to_f32_half, f16_to_f32, KernelError};

pub(crate) use super::grouped::GROUP;

/// Bytes of one 32-element block's nibbles for a whole group.
pub(crate) const NIBBLE_BYTES: usize = GROUP * QK / 2;

/// The block formats this layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupKind {
    /// Q4_0: `w = d · (q - 8)`.
    Q4Zero,
    /// Q4_1: `w = d · q + m`.
    Q4One,
    /// Q5_0: `w = d · (q - 16)`, q five bits.
    Q5Zero,
    /// Q5_1: `w = d · q + m`, q five bits.
    Q5One,
    /// Q8_0: `w = d · q`, q signed.
    Q8Zero,
    /// IQ4_NL: `w = d · table[q]`.
    Iq4Nl,
    /// IQ4_XS: `w = d · (ls - 32) · table[q]`, a 6-bit `ls` per 32 of a 256-element block.
    Iq4Xs,
    /// MXFP4: `w = 2^(e - 128) · table[q]`, a one-byte E8M0 `e` per block.
    Mxfp4,
}

/// The nibble-table kinds as the SIMD kernels' const parameter (`TABLE`), so each kind's
/// scale decoding and table are constants there ([`GroupKind::of_table`] maps back).
pub(crate) const TABLE_IQ4_NL: u8 = 0;
/// See [`TABLE_IQ4_NL`].
pub(crate) const TABLE_IQ4_XS: u8 = 1;
/// See [`TABLE_IQ4_NL`].
pub(crate) const TABLE_MXFP4: u8 = 2;

impl GroupKind {
    fn of(dtype: DType) -> Option<GroupKind> {
        Some(match dtype {
            DType::Q4_0 => GroupKind::Q4Zero,
            DType::Q4_1 => GroupKind::Q4One,
            DType::Q5_0 => GroupKind::Q5Zero,
            DType::Q5_1 => GroupKind::Q5One,
            DType::Q8_0 => GroupKind::Q8Zero,
            DType::IQ4_NL => GroupKind::Iq4Nl,
            DType::IQ4_XS => GroupKind::Iq4Xs,
            DType::MXFP4 => GroupKind::Mxfp4,
            _ => return None,
        })
    }

    /// The kind a `TABLE_*` constant names.
    pub(crate) const fn of_table(table: u8) -> GroupKind {
        match table {
            TABLE_IQ4_NL => GroupKind::Iq4Nl,
            TABLE_IQ4_XS => GroupKind::Iq4Xs,
            _ => GroupKind::Mxfp4,
        }
    }

    /// The 16 int8 levels the nibbles of a table kind (IQ4_NL, IQ4_XS, MXFP4) index.
    pub(crate) const fn levels(self) -> &'static [i8; 16] {
        match self {
            GroupKind::Mxfp4 => &KVALUES_MXFP4,
            _ => &KVALUES_IQ4NL,
        }
    }

    /// Bytes of one row's block scale at the start of a group-block: 1 for MXFP4's E8M0
    /// byte, 2 for the others' f16 `d`.
    pub(crate) const fn scale_bytes(self) -> usize {
        match self {
            GroupKind::Mxfp4 => 1,
            _ => 2,
        }
    }

    /// Elements per stored block: 32, or 256 for IQ4_XS's super-blocks.
    pub(crate) const fn block_elems(self) -> usize {
        match self {
            GroupKind::Iq4Xs => QK_K,
            _ => QK,
        }
    }

    /// Bytes of one group-block: header (scales, mins, fifth bits) and the quants.
    pub(crate) const fn block_stride(self) -> usize {
        self.quant_offset() + GROUP * self.quant_bytes_per_row()
    }

    /// Offset of the quant bytes inside a group-block.
    pub(crate) const fn quant_offset(self) -> usize {
        match self {
            GroupKind::Mxfp4 => 8,
            GroupKind::Q4Zero | GroupKind::Q8Zero | GroupKind::Iq4Nl => 16,
            GroupKind::Q4One => 32,
            GroupKind::Q5Zero => 48,
            GroupKind::Q5One | GroupKind::Iq4Xs => 64,
        }
    }

    /// Offset of the eight rows' `u32` fifth bits (Q5) or IQ4_XS's `scales_l`. (Mins and
    /// IQ4_XS's `u16 scales_h` sit at 16, right after the eight scales.)
    pub(crate) const fn high_bits_offset(self) -> usize {
        match self {
            GroupKind::Q5One | GroupKind::Iq4Xs => 32,
            _ => 16,
        }
    }

    /// Quant bytes of one row in one block.
    const fn quant_bytes_per_row(self) -> usize {
        match self {
            GroupKind::Q8Zero => QK,
            GroupKind::Iq4Xs => QK_K / 2,
            _ => QK / 2,
        }
    }

    /// Whether blocks carry a per-row min (`w = d · q + m`).
    pub(crate) const fn has_min(self) -> bool {
        matches!(self, GroupKind::Q4One | GroupKind::Q5One)
    }

    /// What the unsigned quants are offset by (`w = d · (q - offset)`).
    pub(crate) const fn offset(self) -> i32 {
        match self {
            GroupKind::Q4Zero => 8,
            GroupKind::Q5Zero => 16,
            _ => 0,
        }
    }

    /// Where a GGML block of this kind keeps `(min or scales_h, qh or scales_l, quants)`.
    const fn source_offsets(self) -> (usize, usize, usize) {
        match self {
            GroupKind::Q4Zero | GroupKind::Q8Zero | GroupKind::Iq4Nl => (0, 0, 2),
            GroupKind::Mxfp4 => (0, 0, 1),
            GroupKind::Q4One => (2, 0, 4),
            GroupKind::Q5Zero => (0, 2, 6),
            GroupKind::Q5One => (2, 4, 8),
            GroupKind::Iq4Xs => (2, 4, 8),
        }
    }
}

/// Reorders a GGML Q5 `qh` (bit `j` = fifth bit of element `j`) into the kernel's order: byte
/// `i`, bit `kk` for element `4kk + i`; bit `4 + kk` for element `16 + 4kk + i`.
fn reorder_q5_high_bits(qh: u32) -> u32 {
    let mut out = 0u32;
    for i in 0..4 {
        for kk in 0..4 {
            let low = (qh >> (4 * kk + i)) & 1;
            let high = (qh >> (16 + 4 * kk + i)) & 1;
            out |= (low << (8 * i + kk)) | (high << (8 * i + 4 + kk));
        }
    }
    out
}

/// The fifth bit of element `j` from a reordered `qh` (inverse of [`reorder_q5_high_bits`]).
fn reordered_high_bit(qh: u32, j: usize) -> u32 {
    let (half, e) = (j / (QK / 2), j % (QK / 2));
    (qh >> (8 * (e % 4) + 4 * half + e / 4)) & 1
}

/// A matrix in the interleaved layout.
#[derive(Debug, Clone)]
pub(crate) struct Groups {
    kind: GroupKind,
    out_features: usize,
    /// Stored blocks per row (of `kind.block_elems()` elements).
    n_blocks: usize,
    bytes: WeightBuf<u8>,
}

impl Groups {
    /// Repacks GGML rows (`out_features` rows of `in_features / block_size` blocks).
    pub(crate) fn pack(
        dtype: DType,
        out_features: usize,
        in_features: usize,
        ggml: &[u8],
    ) -> Result<Groups, KernelError> {
        let kind = GroupKind::of(dtype).ok_or(KernelError::UnsupportedDType {
            dtype,
            operation: "interleaved repacking",
        })?;
        let n_blocks = in_features / kind.block_elems();
        let src_block = dtype.block_bytes();
        let row_quants = kind.quant_bytes_per_row();
        let (second, high_bits, quant_start) = kind.source_offsets();
        let n_groups = out_features.div_ceil(GROUP);
        let stride = kind.block_stride();
        let mut bytes = WeightBuf::zeroed(n_groups * n_blocks * stride)?;
        for row in 0..out_features {
            let (group, lane) = (row / GROUP, row % GROUP);
            for b in 0..n_blocks {
                let src = &ggml[(row * n_blocks + b) * src_block..][..src_block];
                let dst = &mut bytes[(group * n_blocks + b) * stride..][..stride];
                let scale = kind.scale_bytes();
                dst[scale * lane..scale * (lane + 1)].copy_from_slice(&src[0..scale]);
                if kind.has_min() || kind == GroupKind::Iq4Xs {
                    dst[16 + 2 * lane..16 + 2 * lane + 2].copy_from_slice(&src[second..second + 2]);
                }
                let at = kind.high_bits_offset() + 4 * lane;
                match kind {
                    GroupKind::Q5Zero | GroupKind::Q5One => {
                        let qh = u32::from_le_bytes(read4(src, high_bits));
                        dst[at..at + 4].copy_from_slice(&reorder_q5_high_bits(qh).to_le_bytes());
                    }
                    GroupKind::Iq4Xs => {
                        dst[at..at + 4].copy_from_slice(&src[high_bits..high_bits + 4]);
                    }
                    _ => {}
                }
                let quants = &src[quant_start..quant_start + row_quants];
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

    pub(crate) fn kind(&self) -> GroupKind {
        self.kind
    }

    /// Stored blocks per row (of `kind().block_elems()` elements).
    pub(crate) fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// The bytes of group `group` (eight weight rows, all blocks).
    pub(crate) fn group(&self, group: usize) -> &[u8] {
        let len = self.n_blocks * self.kind.block_stride();
        &self.bytes[group * len..(group + 1) * len]
    }

    /// Decodes weight row `row` to f32, equal to GGML's dequantization.
    pub(crate) fn row_to_f32(&self, row: usize, dst: &mut [f32]) {
        let (group, lane) = (row / GROUP, row % GROUP);
        let data = self.group(group);
        for (b, out) in dst.chunks_exact_mut(QK).enumerate() {
            let (levels, scale, min) = lane_block(self.kind, data, lane, b);
            for (value, &level) in out.iter_mut().zip(&levels) {
                // `level * d (+ m)`: GGML's order (IQ4 computes `d * table[q]`, the same
                // product; MXFP4's `x0 * d` is this one).
                *value = if self.kind.has_min() {
                    level as f32 * scale + min
                } else {
                    level as f32 * scale
                };
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
}

impl GroupedLayout for Groups {
    fn out_features(&self) -> usize {
        self.out_features
    }

    fn group_tile<const R: usize>(
        &self,
        isa: Isa,
        groups: [usize; 2],
        xs: &[QuantizedRow<'_>; R],
        out: &mut PairOut<R>,
    ) {
        let data = self.group(groups[0]);
        let (kind, n_blocks) = (self.kind, self.n_blocks);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C;
            // the group holds `n_blocks` group-blocks of `kind` and every activation row
            // `n_blocks * kind.block_elems()` elements.
            Isa::Avx2 => unsafe {
                use super::avx2;
                let out = &mut out[0];
                match kind {
                    GroupKind::Q8Zero => avx2::q8_group_tile::<R>(data, n_blocks, xs, out),
                    GroupKind::Q4Zero => {
                        avx2::q4_group_tile::<R, false, false>(data, n_blocks, xs, out)
                    }
                    GroupKind::Q4One => {
                        avx2::q4_group_tile::<R, false, true>(data, n_blocks, xs, out)
                    }
                    GroupKind::Q5Zero => {
                        avx2::q4_group_tile::<R, true, false>(data, n_blocks, xs, out)
                    }
                    GroupKind::Q5One => {
                        avx2::q4_group_tile::<R, true, true>(data, n_blocks, xs, out)
                    }
                    GroupKind::Iq4Nl => {
                        avx2::table_group_tile::<R, TABLE_IQ4_NL>(data, n_blocks, xs, out)
                    }
                    GroupKind::Iq4Xs => {
                        avx2::table_group_tile::<R, TABLE_IQ4_XS>(data, n_blocks, xs, out)
                    }
                    GroupKind::Mxfp4 => {
                        avx2::table_group_tile::<R, TABLE_MXFP4>(data, n_blocks, xs, out)
                    }
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::AvxVnni` is only constructed after detecting AVX2, FMA, F16C and
            // AVX-VNNI; the group and activation rows hold what `Isa::Avx2`'s do.
            Isa::AvxVnni => unsafe {
                let pair = GroupPair {
                    first: data,
                    second: data,
                    blocks: n_blocks,
                };
                super::vnni_kernels::interleaved_avxvnni::<R>(kind, pair, xs, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only constructed after detecting AVX2, FMA, F16C and
            // AVX-512 F/BW/VNNI; both groups (`groups[1]` < the group count, as the driver
            // passes) hold what `Isa::Avx2`'s does.
            Isa::Avx512 => unsafe {
                let pair = GroupPair {
                    first: data,
                    second: self.group(groups[1]),
                    blocks: n_blocks,
                };
                super::vnni_kernels::interleaved_avx512::<R>(kind, pair, xs, out)
            },
            Isa::Scalar => group_tile_scalar(kind, data, n_blocks, xs, &mut out[0]),
        }
    }
}

fn read4(bytes: &[u8], at: usize) -> [u8; 4] {
    [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
}

/// The integer levels of `lane` in 32-element block `b` of a group (`w = scale · level + min`,
/// min 0 unless Q4_1/Q5_1), with the block's scale and min as the kernels use them.
fn lane_block(kind: GroupKind, group: &[u8], lane: usize, b: usize) -> ([i32; QK], f32, f32) {
    let subs = kind.block_elems() / QK;
    let block = &group[(b / subs) * kind.block_stride()..][..kind.block_stride()];
    let sub = b % subs;
    let f16 = |at: usize| f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
    let min = if kind.has_min() {
        f16(16 + 2 * lane)
    } else {
        0.0
    };
    let high_bits = || u32::from_le_bytes(read4(block, kind.high_bits_offset() + 4 * lane));
    let scale = match kind {
        GroupKind::Iq4Xs => {
            let scales_h = u16::from_le_bytes([block[16 + 2 * lane], block[17 + 2 * lane]]);
            f16(2 * lane) * (iq4_xs_scale(scales_h, high_bits(), sub) - 32) as f32
        }
        GroupKind::Mxfp4 => e8m0_to_f32_half(block[lane]),
        _ => f16(2 * lane),
    };
    let quants = &block[kind.quant_offset() + sub * NIBBLE_BYTES..];
    // Byte `j` of the row's GGML quants for this block (`j < 16`, or `< 32` for Q8_0).
    let byte = |j: usize| quants[(j / 4) * 32 + lane * 4 + j % 4];
    let nibble = |j: usize| {
        if j < QK / 2 {
            byte(j) & 0x0f
        } else {
            byte(j - QK / 2) >> 4
        }
    };
    let levels = match kind {
        GroupKind::Q8Zero => std::array::from_fn(|j| i32::from(byte(j) as i8)),
        GroupKind::Iq4Nl | GroupKind::Iq4Xs | GroupKind::Mxfp4 => {
            let table = kind.levels();
            std::array::from_fn(|j| i32::from(table[usize::from(nibble(j))]))
        }
        GroupKind::Q4Zero | GroupKind::Q4One => {
            std::array::from_fn(|j| i32::from(nibble(j)) - kind.offset())
        }
        GroupKind::Q5Zero | GroupKind::Q5One => {
            let qh = high_bits();
            std::array::from_fn(|j| {
                let fifth = reordered_high_bit(qh, j) << 4;
                (u32::from(nibble(j)) | fifth) as i32 - kind.offset()
            })
        }
    };
    (levels, scale, min)
}

/// Portable twin of the AVX2 group kernels, operation for operation on the floats (the
/// integer dots are exact, so their evaluation order is free).
fn group_tile_scalar<const R: usize>(
    kind: GroupKind,
    group: &[u8],
    n_blocks: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let blocks = n_blocks * kind.block_elems() / QK;
    let mut lanes = [[0.0f32; R]; GROUP];
    for (lane, acc) in lanes.iter_mut().enumerate() {
        for b in 0..blocks {
            let (levels, scale, min) = lane_block(kind, group, lane, b);
            for (x, acc) in xs.iter().zip(acc.iter_mut()) {
                let q = &x.quants[b * QK..(b + 1) * QK];
                let dot: i32 = levels.iter().zip(q).map(|(&w, &a)| w * i32::from(a)).sum();
                *acc = (scale * x.scales[b]).mul_add(dot as f32, *acc);
                if kind.has_min() {
                    *acc = min.mul_add(x.block_sums[b], *acc);
                }
            }
        }
    }
    for (lane, acc) in lanes.iter().enumerate() {
        for (row, &value) in out.iter_mut().zip(acc) {
            row[lane] = value;
        }
    }
}
