//! Q4_K / Q5_K / Q6_K weights repacked eight rows at a time for integer GEMM/GEMV.
//!
//! Rows are taken in groups of [`GROUP`] (the last group padded with zero rows); each group
//! holds its 256-element super-blocks in order, one group-block per super-block:
//!
//! ```text
//! Q4_K (1152 B): [8 × f16 d] [8 × f16 dmin] [8 sub × 8 rows: scale & 15 | (min & 15) << 4]
//!                [4 subs × 8 rows: top bit pairs] [4 chunks × 8 steps × (8 rows × 4 packed bytes)]
//! Q5_K (1408 B): as Q4_K, with [8 steps × (8 rows × 4 high-bit bytes)] before the quants
//! Q6_K (1680 B): [8 × f16 d] [16 sub × 8 rows i8 scale]
//!                [2 halves × 3 runs × 8 steps × (8 rows × 4 six-bit bytes)]
//! ```
//!
//! Step `kk` of a 32-byte run holds bytes `4kk..4kk + 4` of each row's run, so one 32-byte
//! load masked or shifted gives elements `4kk..4kk + 4` of one 32-element sub-block of all
//! eight rows, and one `maddubs` against four broadcast activation bytes advances eight output
//! columns (as in `interleaved.rs`). Q4_K/Q5_K chunk `c` holds sub-blocks `2c` (low nibbles)
//! and `2c + 1` (high nibbles), the fifth bit of sub-block `j` is bit `j` of the high-bit
//! bytes. Q6_K stores whole 6-bit quants: byte `l` of half `h`'s run `v` (0..3) holds quant
//! `q` of element `l` of 32-element block `4h + v` in bits 0..6 and bits `2v..2v + 2` of block
//! `4h + 3`'s quant in bits 6..8, so blocks `4h..4h + 3` are one mask each and block `4h + 3`
//! is gathered from the three top bit pairs (GGML's file splits every quant into a nibble and
//! a bit pair instead; the repacking moves bits, never values).
//!
//! Q4_K/Q5_K's 6-bit scales and mins take 12 bytes per row and super-block, as in GGUF, split
//! for SIMD unpacking: the low-nibble bytes hold sub-block `j`'s scale and min low four bits,
//! and top-bit byte `[j % 4][row]` holds the scale's and min's top two bits at bits
//! `4 · (j / 4)..+2` and `4 · (j / 4) + 2..+2`, so one 32-byte load of the top bits serves
//! sub-blocks `0..4` and `4..8` with masks alone (see [`scale_min`]). Every row therefore
//! takes GGUF's bytes per 256 weights: 144 (Q4_K), 176 (Q5_K), 210 (Q6_K).
//!
//! Arithmetic per (weight row, activation row), shared by the scalar and AVX2 kernels so both
//! give bitwise-equal results, with activations quantized per 32 elements (`d_x`, see
//! `activation.rs`): for every 32-element block `b` in order, the exact integer dot `s` of the
//! weight quants with the int8 activations, multiplied by the integer sub-block scale (Q6_K:
//! each 16-element half by its own scale), then `acc = fma(d · d_x[b], scale · s, acc)`. For
//! Q4_K/Q5_K each super-block then subtracts its mins: `m = Σ fma(min_j, d_x · Σq, m)` over its
//! eight blocks, `acc = fma(-dmin, m, acc)`. Every integer sum stays below 2²⁴ in magnitude, so
//! its conversion to f32 is exact.

use super::activation::{QuantizedActivations, QuantizedRow};
use super::grouped::{matmul_grouped, GroupPair, GroupedLayout, PairOut, GROUP};
use super::Isa;
use crate::dtype::DType;
use crate::pool::ThreadPool;
use crate::quant::{dequantize, scale_min_k4, QK, QK_K};
use crate::weight_buf::WeightBuf;
use crate::{f16_to_f32, KernelError};

/// Offset of the eight f16 super-block scales `d` in every group-block.
pub(crate) const D: usize = 0;
/// Q4_K/Q5_K: offset of the eight f16 `dmin`.
pub(crate) const DMIN: usize = 16;
/// Q4_K/Q5_K: offset of the scales' and mins' low nibbles, `[sub-block][row]`.
pub(crate) const K_LOW: usize = 32;
/// Q4_K/Q5_K: offset of the scales' and mins' top bit pairs, `[sub-block % 4][row]`.
pub(crate) const K_HIGH: usize = 96;
/// Q5_K: offset of the interleaved fifth bits.
pub(crate) const Q5_HIGH: usize = 128;
/// Q4_K/Q5_K scales and mins unpacked to bytes ([`scale_min`], or the AVX2
/// `unpack_scales_mins` for a whole group-block): offset of the scales, `[sub-block][row]`.
pub(crate) const UNPACKED_SCALES: usize = 0;
/// Offset of the mins in unpacked scales and mins, `[sub-block][row]`.
pub(crate) const UNPACKED_MINS: usize = 64;
/// Q6_K: offset of the int8 scales, `[16-element sub-block][row]`.
pub(crate) const Q6_SCALES: usize = 16;
/// Q6_K: offset of the interleaved six-bit runs.
pub(crate) const Q6_QUANTS: usize = 144;
/// Bytes of one step: four bytes of each of the eight rows.
pub(crate) const STEP: usize = 32;

/// The super-block formats this layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KKind {
    /// Q4_K: `w = d · scale · q - dmin · min`, q in 0..16.
    Q4,
    /// Q5_K: as Q4_K with a fifth bit, q in 0..32.
    Q5,
    /// Q6_K: `w = d · scale · (q - 32)`, q in 0..64, signed scales per 16 elements.
    Q6,
}

impl KKind {
    fn of(dtype: DType) -> Option<KKind> {
        match dtype {
            DType::Q4_K => Some(KKind::Q4),
            DType::Q5_K => Some(KKind::Q5),
            DType::Q6_K => Some(KKind::Q6),
            _ => None,
        }
    }

    fn dtype(self) -> DType {
        match self {
            KKind::Q4 => DType::Q4_K,
            KKind::Q5 => DType::Q5_K,
            KKind::Q6 => DType::Q6_K,
        }
    }

    /// Bytes of one group-block (eight rows, one super-block).
    pub(crate) const fn stride(self) -> usize {
        match self {
            KKind::Q4 => 1152,
            KKind::Q5 => 1408,
            KKind::Q6 => 1680,
        }
    }

    /// Offset of the interleaved 4-bit runs (Q6_K: its low four bits).
    pub(crate) const fn quants(self) -> usize {
        match self {
            KKind::Q4 => 128,
            KKind::Q5 => 384,
            KKind::Q6 => Q6_QUANTS,
        }
    }
}

/// Q6_K: offset of run `v` (0..3) of half `h` (0..2) in a group-block: 8 steps of 32 bytes.
pub(crate) const fn q6_run(h: usize, v: usize) -> usize {
    Q6_QUANTS + (3 * h + v) * 8 * STEP
}

/// Q6_K: quant `q` (0..64) of element `l` (0..32) of block `4h + g` of lane `lane` in
/// group-block `block` (the layout's bit map, shared by the scalar twin and the unpacking).
fn q6_quant(block: &[u8], lane: usize, h: usize, g: usize, l: usize) -> u8 {
    let byte = |v: usize| lane_byte(block, q6_run(h, v), lane, l);
    if g < 3 {
        byte(g) & 63
    } else {
        (byte(0) >> 6) | ((byte(1) >> 6) << 2) | ((byte(2) >> 6) << 4)
    }
}

/// Q6_K: stores quant `q` of element `l` of block `4h + g` of lane `lane` (inverse of
/// [`q6_quant`]; the other bits of the bytes it touches are kept).
fn set_q6_quant(block: &mut [u8], lane: usize, h: usize, g: usize, l: usize, q: u8) {
    let at = |v: usize| q6_run(h, v) + (l / 4) * STEP + 4 * lane + l % 4;
    if g < 3 {
        let byte = &mut block[at(g)];
        *byte = (*byte & 0xc0) | (q & 63);
    } else {
        for v in 0..3 {
            let byte = &mut block[at(v)];
            *byte = (*byte & 63) | (((q >> (2 * v)) & 3) << 6);
        }
    }
}

/// GGML Q6_K: byte offsets of element `e` (0..256)'s low nibble (and whether it is the high
/// nibble) and of its two high bits (with their shift) in a 210-byte super-block.
fn ggml_q6_position(e: usize) -> (usize, u32, usize, u32) {
    let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
    let low = n * 64 + (j % 2) * 32 + l;
    let high = 128 + n * 32 + l;
    (low, 4 * (j / 2) as u32, high, 2 * j as u32)
}

/// Calls `span(ggml_offset, group_offset, len)` for every byte range that lane `lane`'s
/// GGML super-block and its group-block share verbatim: the one map both packing and
/// unpacking follow. The Q4_K/Q5_K scales and mins and the Q6_K quants, which change form,
/// are not spans.
fn copied_spans(kind: KKind, lane: usize, mut span: impl FnMut(usize, usize, usize)) {
    match kind {
        KKind::Q4 | KKind::Q5 => {
            span(0, D + 2 * lane, 2);
            span(2, DMIN + 2 * lane, 2);
            let source = if kind == KKind::Q4 { 16 } else { 48 };
            for c in 0..4 {
                for kk in 0..8 {
                    let at = kind.quants() + (c * 8 + kk) * STEP + 4 * lane;
                    span(source + c * 32 + 4 * kk, at, 4);
                }
            }
            if kind == KKind::Q5 {
                for kk in 0..8 {
                    span(16 + 4 * kk, Q5_HIGH + kk * STEP + 4 * lane, 4);
                }
            }
        }
        KKind::Q6 => {
            // The quants change form (see `set_q6_quant`).
            span(208, D + 2 * lane, 2);
            for sub in 0..16 {
                span(192 + sub, Q6_SCALES + sub * GROUP + lane, 1);
            }
        }
    }
}

/// Q4_K/Q5_K: the 6-bit scale and min of sub-block `j` (0..8) of lane `lane` in group-block
/// `block` (the layout's bit map, shared by the scalar twin and the unpacking).
pub(crate) fn scale_min(block: &[u8], j: usize, lane: usize) -> (u8, u8) {
    let low = block[K_LOW + j * GROUP + lane];
    let high = block[K_HIGH + (j % 4) * GROUP + lane] >> (4 * (j / 4));
    (
        (low & 0x0f) | ((high & 3) << 4),
        (low >> 4) | (((high >> 2) & 3) << 4),
    )
}

/// Stores the 6-bit `scale` and `min` of sub-block `j` of lane `lane` (inverse of
/// [`scale_min`]; the other bits of the top-bit byte are kept).
fn set_scale_min(block: &mut [u8], j: usize, lane: usize, scale: u8, min: u8) {
    block[K_LOW + j * GROUP + lane] = (scale & 0x0f) | ((min & 0x0f) << 4);
    let shift = 4 * (j / 4);
    let high = &mut block[K_HIGH + (j % 4) * GROUP + lane];
    *high = (*high & !(0x0f << shift)) | ((((scale >> 4) & 3) | (((min >> 4) & 3) << 2)) << shift);
}

/// Packs eight 6-bit scales and mins back into GGML's 12 bytes (inverse of [`scale_min_k4`]).
fn pack_scale_min_k4(scales: [u8; 8], mins: [u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = (scales[j] & 63) | ((scales[j + 4] >> 4) << 6);
        packed[j + 4] = (mins[j] & 63) | ((mins[j + 4] >> 4) << 6);
        packed[j + 8] = (scales[j + 4] & 0x0f) | ((mins[j + 4] & 0x0f) << 4);
    }
    packed
}

/// A Q4_K/Q5_K/Q6_K matrix in the interleaved layout.
#[derive(Debug, Clone)]
pub(crate) struct KGroups {
    kind: KKind,
    out_features: usize,
    n_super: usize,
    bytes: WeightBuf<u8>,
}

impl KGroups {
    /// Repacks GGML K-quant rows (`out_features` rows of `in_features / 256` super-blocks).
    pub(crate) fn pack(
        dtype: DType,
        out_features: usize,
        in_features: usize,
        ggml: &[u8],
    ) -> Result<KGroups, KernelError> {
        let kind = KKind::of(dtype).ok_or(KernelError::InvalidShape(
            "K-quant layout is Q4_K/Q5_K/Q6_K",
        ))?;
        let n_super = in_features / QK_K;
        let src_block = dtype.block_bytes();
        let stride = kind.stride();
        let mut bytes = WeightBuf::zeroed(out_features.div_ceil(GROUP) * n_super * stride)?;
        for row in 0..out_features {
            let (group, lane) = (row / GROUP, row % GROUP);
            for s in 0..n_super {
                let src = &ggml[(row * n_super + s) * src_block..][..src_block];
                let dst = &mut bytes[(group * n_super + s) * stride..][..stride];
                copied_spans(kind, lane, |from, to, len| {
                    dst[to..to + len].copy_from_slice(&src[from..from + len]);
                });
                if kind == KKind::Q6 {
                    for e in 0..QK_K {
                        let (low, low_shift, high, high_shift) = ggml_q6_position(e);
                        let q = ((src[low] >> low_shift) & 0x0f)
                            | (((src[high] >> high_shift) & 3) << 4);
                        set_q6_quant(dst, lane, e / 128, (e % 128) / 32, e % 32, q);
                    }
                } else {
                    for j in 0..8 {
                        let (scale, min) = scale_min_k4(j, &src[4..16]);
                        set_scale_min(dst, j, lane, scale, min);
                    }
                }
            }
        }
        Ok(KGroups {
            kind,
            out_features,
            n_super,
            bytes,
        })
    }

    pub(crate) fn storage_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn kind(&self) -> KKind {
        self.kind
    }

    /// 256-element super-blocks per row.
    pub(crate) fn n_super(&self) -> usize {
        self.n_super
    }

    /// The bytes of group `group` (eight weight rows, all super-blocks).
    pub(crate) fn group(&self, group: usize) -> &[u8] {
        let len = self.n_super * self.kind.stride();
        &self.bytes[group * len..(group + 1) * len]
    }

    /// Decodes weight row `row` to f32 by rebuilding each GGML super-block and running the
    /// reference dequantizer on it, so values equal GGML's exactly.
    pub(crate) fn row_to_f32(&self, row: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        let (group, lane) = (row / GROUP, row % GROUP);
        let stride = self.kind.stride();
        let dtype = self.kind.dtype();
        let data = self.group(group);
        let mut ggml = [0u8; 210];
        let ggml = &mut ggml[..dtype.block_bytes()];
        for (s, out) in dst.chunks_exact_mut(QK_K).enumerate() {
            let block = &data[s * stride..(s + 1) * stride];
            copied_spans(self.kind, lane, |from, to, len| {
                ggml[from..from + len].copy_from_slice(&block[to..to + len]);
            });
            if self.kind == KKind::Q6 {
                ggml[..192].fill(0);
                for e in 0..QK_K {
                    let q = q6_quant(block, lane, e / 128, (e % 128) / 32, e % 32);
                    let (low, low_shift, high, high_shift) = ggml_q6_position(e);
                    ggml[low] |= (q & 0x0f) << low_shift;
                    ggml[high] |= (q >> 4) << high_shift;
                }
            } else {
                let pairs: [(u8, u8); 8] = std::array::from_fn(|j| scale_min(block, j, lane));
                ggml[4..16]
                    .copy_from_slice(&pack_scale_min_k4(pairs.map(|p| p.0), pairs.map(|p| p.1)));
            }
            dequantize(dtype, ggml, out)?;
        }
        Ok(())
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

impl GroupedLayout for KGroups {
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
        let (kind, n_super) = (self.kind, self.n_super);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only constructed after detecting AVX2, FMA and F16C;
            // the group holds `n_super` group-blocks of its kind and every activation row
            // `8 · n_super` quantized blocks.
            Isa::Avx2 => unsafe {
                use super::kquant_avx2;
                let out = &mut out[0];
                match kind {
                    KKind::Q4 => kquant_avx2::q4_k_tile::<R, false>(data, n_super, xs, out),
                    KKind::Q5 => kquant_avx2::q4_k_tile::<R, true>(data, n_super, xs, out),
                    KKind::Q6 => kquant_avx2::q6_k_tile::<R>(data, n_super, xs, out),
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::AvxVnni` is only constructed after detecting AVX2, FMA, F16C and
            // AVX-VNNI; the group and activation rows hold what `Isa::Avx2`'s do.
            Isa::AvxVnni => unsafe {
                let pair = GroupPair {
                    first: data,
                    second: data,
                    blocks: n_super,
                };
                super::vnni_kernels::k_avxvnni::<R>(kind, pair, xs, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` is only constructed after detecting AVX2, FMA, F16C and
            // AVX-512 F/BW/VNNI; both groups (`groups[1]` < the group count, as the driver
            // passes) hold what `Isa::Avx2`'s does.
            Isa::Avx512 => unsafe {
                let pair = GroupPair {
                    first: data,
                    second: self.group(groups[1]),
                    blocks: n_super,
                };
                super::vnni_kernels::k_avx512::<R>(kind, pair, xs, out)
            },
            Isa::Scalar => tile_scalar(kind, data, n_super, xs, &mut out[0]),
        }
    }
}

/// Portable twin of the AVX2 kernels, operation for operation.
fn tile_scalar<const R: usize>(
    kind: KKind,
    group: &[u8],
    n_super: usize,
    xs: &[QuantizedRow<'_>; R],
    out: &mut [[f32; GROUP]; R],
) {
    let stride = kind.stride();
    for (x, out) in xs.iter().zip(out.iter_mut()) {
        for (lane, result) in out.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for s in 0..n_super {
                let block = &group[s * stride..(s + 1) * stride];
                acc = match kind {
                    KKind::Q4 | KKind::Q5 => super_block_k4_k5(kind, block, lane, x, s, acc),
                    KKind::Q6 => super_block_q6_k(block, lane, x, s, acc),
                };
            }
            *result = acc;
        }
    }
}

fn lane_f16(block: &[u8], at: usize, lane: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([
        block[at + 2 * lane],
        block[at + 2 * lane + 1],
    ]))
}

/// Byte `l` (0..32) of lane `lane`'s 32-byte run starting at step-major offset `run`.
fn lane_byte(block: &[u8], run: usize, lane: usize, l: usize) -> u8 {
    block[run + (l / 4) * STEP + 4 * lane + l % 4]
}

/// One Q4_K/Q5_K super-block `s` of one lane against activation row `x`, added to `acc`.
fn super_block_k4_k5(
    kind: KKind,
    block: &[u8],
    lane: usize,
    x: &QuantizedRow<'_>,
    s: usize,
    mut acc: f32,
) -> f32 {
    let d = lane_f16(block, D, lane);
    for j in 0..8 {
        let run = kind.quants() + (j / 2) * 8 * STEP;
        let xb = 8 * s + j;
        let q = &x.quants[xb * QK..(xb + 1) * QK];
        let mut dot = 0i32;
        for (l, &xq) in q.iter().enumerate() {
            let mut w = (lane_byte(block, run, lane, l) >> (4 * (j % 2))) & 0x0f;
            if kind == KKind::Q5 {
                w |= ((lane_byte(block, Q5_HIGH, lane, l) >> j) & 1) << 4;
            }
            dot += i32::from(w) * i32::from(xq);
        }
        let scale = i32::from(scale_min(block, j, lane).0);
        acc = (d * x.scales[xb]).mul_add((scale * dot) as f32, acc);
    }
    let mut m = 0.0f32;
    for j in 0..8 {
        let min = f32::from(scale_min(block, j, lane).1);
        m = min.mul_add(x.block_sums[8 * s + j], m);
    }
    (-lane_f16(block, DMIN, lane)).mul_add(m, acc)
}

/// One Q6_K super-block `s` of one lane against activation row `x`, added to `acc`.
fn super_block_q6_k(
    block: &[u8],
    lane: usize,
    x: &QuantizedRow<'_>,
    s: usize,
    mut acc: f32,
) -> f32 {
    let d = lane_f16(block, D, lane);
    for h in 0..2 {
        for g in 0..4 {
            let xb = 8 * s + 4 * h + g;
            let q = &x.quants[xb * QK..(xb + 1) * QK];
            let mut dot = 0i32;
            for (l, &xq) in q.iter().enumerate() {
                let w = i32::from(q6_quant(block, lane, h, g, l)) - 32;
                let scale = block[Q6_SCALES + (8 * h + 2 * g + l / 16) * GROUP + lane] as i8;
                dot += i32::from(scale) * w * i32::from(xq);
            }
            acc = (d * x.scales[xb]).mul_add(dot as f32, acc);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    #[test]
    fn scale_min_packing_round_trips() {
        let mut rng = Rng::new(5);
        for _ in 0..1000 {
            let packed: [u8; 12] = std::array::from_fn(|_| rng.next_u64() as u8);
            let unpacked: [(u8, u8); 8] = std::array::from_fn(|j| scale_min_k4(j, &packed));
            let again = pack_scale_min_k4(unpacked.map(|p| p.0), unpacked.map(|p| p.1));
            assert_eq!(again, packed);
        }
    }

    #[test]
    fn spans_cover_each_group_block_once() {
        for kind in [KKind::Q4, KKind::Q5, KKind::Q6] {
            let mut group_hits = vec![0u32; kind.stride()];
            for lane in 0..GROUP {
                let mut ggml_hits = vec![0u32; kind.dtype().block_bytes()];
                copied_spans(kind, lane, |from, to, len| {
                    ggml_hits[from..from + len].iter_mut().for_each(|h| *h += 1);
                    group_hits[to..to + len].iter_mut().for_each(|h| *h += 1);
                });
                if kind == KKind::Q6 {
                    // The quants: every GGML quant byte, and this lane's four bytes of each
                    // step of the six runs.
                    ggml_hits[..192].iter_mut().for_each(|h| *h += 1);
                    for kk in 0..16 * 3 {
                        let at = Q6_QUANTS + kk * STEP + 4 * lane;
                        group_hits[at..at + 4].iter_mut().for_each(|h| *h += 1);
                    }
                } else {
                    // The scales and mins: eight low-nibble bytes, four top-bit bytes.
                    ggml_hits[4..16].iter_mut().for_each(|h| *h += 1);
                    for j in 0..8 {
                        group_hits[K_LOW + j * GROUP + lane] += 1;
                    }
                    for j in 0..4 {
                        group_hits[K_HIGH + j * GROUP + lane] += 1;
                    }
                }
                assert!(ggml_hits.iter().all(|&h| h == 1), "{kind:?} lane {lane}");
            }
            assert!(group_hits.iter().all(|&h| h == 1), "{kind:?}");
        }
    }

    #[test]
    fn k4_scales_and_mins_round_trip_through_the_layout() {
        // Random 6-bit scales and mins of all eight lanes, stored in any order, read back
        // exactly; the unpacked form (scalar, and AVX2 where the host has it) agrees.
        let mut rng = Rng::new(13);
        for _ in 0..200 {
            let values: [[(u8, u8); 8]; GROUP] = std::array::from_fn(|_| {
                std::array::from_fn(|_| (rng.next_u64() as u8 & 63, rng.next_u64() as u8 & 63))
            });
            let mut block = vec![0u8; KKind::Q5.stride()];
            for j in [3, 7, 0, 4, 1, 5, 2, 6] {
                for (lane, lane_values) in values.iter().enumerate() {
                    let (scale, min) = lane_values[j];
                    set_scale_min(&mut block, j, lane, scale, min);
                }
            }
            let mut unpacked = [0u8; 128];
            for (lane, lane_values) in values.iter().enumerate() {
                for (j, &pair) in lane_values.iter().enumerate() {
                    assert_eq!(scale_min(&block, j, lane), pair, "lane {lane} sub {j}");
                    unpacked[UNPACKED_SCALES + j * GROUP + lane] = pair.0;
                    unpacked[UNPACKED_MINS + j * GROUP + lane] = pair.1;
                }
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 detected; `block` is a whole Q5_K group-block.
                let simd = unsafe { super::super::kquant_avx2::unpack_scales_mins(block.as_ptr()) };
                assert_eq!(simd, unpacked);
            }
        }
    }

    #[test]
    fn q6_k_quants_round_trip_through_the_layout() {
        // Every quant of random GGML super-blocks is read back from the layout, and the
        // rebuilt GGML bytes are the original ones.
        let mut rng = Rng::new(11);
        for lane in 0..GROUP {
            let src: Vec<u8> = (0..210).map(|_| rng.next_u64() as u8).collect();
            let mut block = vec![0u8; KKind::Q6.stride()];
            for e in 0..QK_K {
                let (low, low_shift, high, high_shift) = ggml_q6_position(e);
                let q = ((src[low] >> low_shift) & 0x0f) | (((src[high] >> high_shift) & 3) << 4);
                set_q6_quant(&mut block, lane, e / 128, (e % 128) / 32, e % 32, q);
            }
            let mut rebuilt = vec![0u8; 192];
            for e in 0..QK_K {
                let q = q6_quant(&block, lane, e / 128, (e % 128) / 32, e % 32);
                let (low, low_shift, high, high_shift) = ggml_q6_position(e);
                rebuilt[low] |= (q & 0x0f) << low_shift;
                rebuilt[high] |= (q >> 4) << high_shift;
            }
            assert_eq!(rebuilt, src[..192], "lane {lane}");
        }
    }
}
