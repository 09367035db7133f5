//! Scalar reference dequantizers and quantizers for GGML block formats.
//!
//! These follow the block layouts of `ggml-common.h` and the arithmetic of GGML's
//! `dequantize_row_*` / `quantize_row_*_ref`, so bytes read from a GGUF file decode to the same
//! f32 values llama.cpp would produce. They are the ground truth the SIMD matmul kernels are
//! tested against.

use crate::dtype::{bf16_to_f32, e8m0_to_f32_half, f16_to_f32, f32_to_f16, DType};
use crate::KernelError;

/// Elements in a `Q*_0` / `Q*_1` block.
pub const QK: usize = 32;
/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;

/// GGML's `kvalues_iq4nl`: the 16 int8 levels an IQ4_NL / IQ4_XS nibble indexes (a format
/// constant, denser near zero where weights cluster).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// GGML's `kvalues_mxfp4`: the 16 int8 levels an MXFP4 nibble indexes, the E2M1 values
/// `±{0, 0.5, 1, 1.5, 2, 3, 4, 6}` doubled (bit 3 is the sign), which is why the E8M0 scale is
/// halved ([`e8m0_to_f32_half`]).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

pub(crate) fn read_f16(bytes: &[u8], offset: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]))
}

/// Decodes `dst.len()` elements of `dtype` from `src`.
///
/// `src` must hold exactly `dtype.row_bytes(dst.len())` bytes.
pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let expected = dtype.row_bytes(dst.len())?;
    if src.len() != expected {
        return Err(KernelError::LengthMismatch {
            what: "quantized source bytes",
            expected,
            actual: src.len(),
        });
    }
    let block_bytes = dtype.block_bytes();
    let block_size = dtype.block_size();
    match dtype {
        DType::F32 => {
            for (value, bytes) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
        }
        DType::F16 => {
            for (value, bytes) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *value = f16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]]));
            }
        }
        DType::BF16 => {
            for (value, bytes) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *value = bf16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]]));
            }
        }
        _ => {
            let decode: fn(&[u8], &mut [f32]) = match dtype {
                DType::Q8_0 => dequantize_block_q8_0,
                DType::Q4_0 => dequantize_block_q4_0,
                DType::Q4_1 => dequantize_block_q4_1,
                DType::Q5_0 => dequantize_block_q5_0,
                DType::Q5_1 => dequantize_block_q5_1,
                DType::IQ4_NL => dequantize_block_iq4_nl,
                DType::IQ4_XS => dequantize_block_iq4_xs,
                DType::Q4_K => dequantize_block_q4_k,
                DType::Q5_K => dequantize_block_q5_k,
                DType::MXFP4 => dequantize_block_mxfp4,
                _ => dequantize_block_q6_k,
            };
            for (block, out) in src
                .chunks_exact(block_bytes)
                .zip(dst.chunks_exact_mut(block_size))
            {
                decode(block, out);
            }
        }
    }
    Ok(())
}

fn dequantize_block_q8_0(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    for (value, &q) in out.iter_mut().zip(&block[2..2 + QK]) {
        *value = f32::from(q as i8) * d;
    }
}

fn dequantize_block_q4_0(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let qs = &block[2..2 + QK / 2];
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = (i32::from(byte & 0x0f) - 8) as f32 * d;
        out[j + QK / 2] = (i32::from(byte >> 4) - 8) as f32 * d;
    }
}

fn dequantize_block_q4_1(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let m = read_f16(block, 2);
    let qs = &block[4..4 + QK / 2];
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = f32::from(byte & 0x0f) * d + m;
        out[j + QK / 2] = f32::from(byte >> 4) * d + m;
    }
}

/// The 5-bit quant of element `j` (0..32) of a Q5_0/Q5_1 block: nibble `j % 16` of `qs` (low
/// nibbles first) with bit `j` of the little-endian `qh` on top.
pub(crate) fn q5_quant(qh: u32, qs: &[u8], j: usize) -> u8 {
    let nibble = if j < QK / 2 {
        qs[j] & 0x0f
    } else {
        qs[j - QK / 2] >> 4
    };
    nibble | ((((qh >> j) & 1) as u8) << 4)
}

fn dequantize_block_q5_0(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let qs = &block[6..6 + QK / 2];
    for (j, value) in out.iter_mut().enumerate() {
        *value = (i32::from(q5_quant(qh, qs, j)) - 16) as f32 * d;
    }
}

fn dequantize_block_q5_1(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let m = read_f16(block, 2);
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let qs = &block[8..8 + QK / 2];
    for (j, value) in out.iter_mut().enumerate() {
        *value = f32::from(q5_quant(qh, qs, j)) * d + m;
    }
}

/// Decodes the 32 nibbles `qs[16]` (low nibbles first) through `table` times `d`.
fn dequantize_table_nibbles(table: &[i8; 16], d: f32, qs: &[u8], out: &mut [f32]) {
    for (j, &byte) in qs.iter().enumerate() {
        out[j] = d * f32::from(table[usize::from(byte & 0x0f)]);
        out[j + QK / 2] = d * f32::from(table[usize::from(byte >> 4)]);
    }
}

fn dequantize_iq4_nibbles(d: f32, qs: &[u8], out: &mut [f32]) {
    dequantize_table_nibbles(&KVALUES_IQ4NL, d, qs, out);
}

fn dequantize_block_iq4_nl(block: &[u8], out: &mut [f32]) {
    dequantize_iq4_nibbles(read_f16(block, 0), &block[2..2 + QK / 2], out);
}

fn dequantize_block_mxfp4(block: &[u8], out: &mut [f32]) {
    let d = e8m0_to_f32_half(block[0]);
    dequantize_table_nibbles(&KVALUES_MXFP4, d, &block[1..1 + QK / 2], out);
}

/// The 6-bit scale of sub-block `ib` (0..8) of an IQ4_XS super-block, as GGML stores it:
/// nibble `ib` of `scales_l` (`u32`, little-endian) below bits `2ib..2ib + 2` of `scales_h`.
pub(crate) fn iq4_xs_scale(scales_h: u16, scales_l: u32, ib: usize) -> i32 {
    (((scales_l >> (4 * ib)) & 0x0f) | (((u32::from(scales_h) >> (2 * ib)) & 3) << 4)) as i32
}

fn dequantize_block_iq4_xs(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let scales_h = u16::from_le_bytes([block[2], block[3]]);
    let scales_l = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let qs = &block[8..8 + QK_K / 2];
    for (ib, (y, q)) in out
        .chunks_exact_mut(QK)
        .zip(qs.chunks_exact(QK / 2))
        .enumerate()
    {
        // GGML: `dl = d * (ls - 32)`, exact in f32 (an 11-bit significand times a 6-bit int).
        let dl = d * (iq4_xs_scale(scales_h, scales_l, ib) - 32) as f32;
        dequantize_iq4_nibbles(dl, q, y);
    }
}

/// Unpacks the 6-bit scale and min of sub-block `j` (0..8) from a K-quant `scales[12]`.
///
/// Sub-blocks 0..4 keep their low six bits in bytes 0..4 (scales) and 4..8 (mins); sub-blocks
/// 4..8 split theirs between the nibbles of bytes 8..12 and the top two bits of bytes 0..8.
pub(crate) fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

fn dequantize_block_q4_k(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let dmin = read_f16(block, 2);
    let scales = &block[4..16];
    let qs = &block[16..16 + QK_K / 2];
    for chunk in 0..QK_K / 64 {
        let (scale_lo, min_lo) = scale_min_k4(2 * chunk, scales);
        let (scale_hi, min_hi) = scale_min_k4(2 * chunk + 1, scales);
        let (d_lo, m_lo) = (d * f32::from(scale_lo), dmin * f32::from(min_lo));
        let (d_hi, m_hi) = (d * f32::from(scale_hi), dmin * f32::from(min_hi));
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let y = &mut out[chunk * 64..chunk * 64 + 64];
        for l in 0..32 {
            y[l] = d_lo * f32::from(q[l] & 0x0f) - m_lo;
            y[l + 32] = d_hi * f32::from(q[l] >> 4) - m_hi;
        }
    }
}

fn dequantize_block_q5_k(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let dmin = read_f16(block, 2);
    let scales = &block[4..16];
    let qh = &block[16..48];
    let ql = &block[48..48 + QK_K / 2];
    for chunk in 0..QK_K / 64 {
        let (scale_lo, min_lo) = scale_min_k4(2 * chunk, scales);
        let (scale_hi, min_hi) = scale_min_k4(2 * chunk + 1, scales);
        let (d_lo, m_lo) = (d * f32::from(scale_lo), dmin * f32::from(min_lo));
        let (d_hi, m_hi) = (d * f32::from(scale_hi), dmin * f32::from(min_hi));
        let bit_lo = 1u8 << (2 * chunk);
        let bit_hi = 2u8 << (2 * chunk);
        let q = &ql[chunk * 32..chunk * 32 + 32];
        let y = &mut out[chunk * 64..chunk * 64 + 64];
        for l in 0..32 {
            let high_lo = if qh[l] & bit_lo != 0 { 16 } else { 0 };
            let high_hi = if qh[l] & bit_hi != 0 { 16 } else { 0 };
            y[l] = d_lo * f32::from((q[l] & 0x0f) + high_lo) - m_lo;
            y[l + 32] = d_hi * f32::from((q[l] >> 4) + high_hi) - m_hi;
        }
    }
}

fn dequantize_block_q6_k(block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 208);
    for half in 0..2 {
        let ql = &block[half * 64..half * 64 + 64];
        let qh = &block[128 + half * 32..128 + half * 32 + 32];
        let scales = &block[192 + half * 8..192 + half * 8 + 8];
        let y = &mut out[half * 128..half * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            let scale = |k: usize| d * f32::from(scales[is + k] as i8);
            y[l] = scale(0) * q1 as f32;
            y[l + 32] = scale(2) * q2 as f32;
            y[l + 64] = scale(4) * q3 as f32;
            y[l + 96] = scale(6) * q4 as f32;
        }
    }
}

fn check_quantize_lengths(dtype: DType, src: &[f32], dst: &[u8]) -> Result<(), KernelError> {
    let expected = dtype.row_bytes(src.len())?;
    if dst.len() != expected {
        return Err(KernelError::LengthMismatch {
            what: "quantized destination bytes",
            expected,
            actual: dst.len(),
        });
    }
    Ok(())
}

/// Quantizes `src` to Q8_0 blocks as GGML's `quantize_row_q8_0_ref` does: `d = amax / 127`,
/// `q = round(x / d)` (halves away from zero).
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(DType::Q8_0, src, dst)?;
    for (x, block) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(DType::Q8_0.block_bytes()))
    {
        let amax = x.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
        let d = amax / 127.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for (q, &v) in block[2..].iter_mut().zip(x) {
            *q = ((v * inverse).round() as i8) as u8;
        }
    }
    Ok(())
}

/// Quantizes `src` to Q4_0 blocks as GGML's `quantize_row_q4_0_ref` does: the element of
/// largest magnitude maps to -8, `d = max / -8`.
pub fn quantize_row_q4_0(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(DType::Q4_0, src, dst)?;
    for (x, block) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(DType::Q4_0.block_bytes()))
    {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK / 2 {
            let lo = ((x[j] * inverse + 8.5) as i8).min(15) as u8;
            let hi = ((x[j + QK / 2] * inverse + 8.5) as i8).min(15) as u8;
            block[2 + j] = lo | (hi << 4);
        }
    }
    Ok(())
}

/// Quantizes `src` to Q4_1 blocks as GGML's `quantize_row_q4_1_ref` does: `m = min`,
/// `d = (max - min) / 15`.
pub fn quantize_row_q4_1(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(DType::Q4_1, src, dst)?;
    for (x, block) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(DType::Q4_1.block_bytes()))
    {
        let min = x.iter().fold(f32::MAX, |acc, &v| acc.min(v));
        let max = x.iter().fold(f32::MIN, |acc, &v| acc.max(v));
        let d = (max - min) / 15.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        block[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        for j in 0..QK / 2 {
            let lo = (((x[j] - min) * inverse + 0.5) as i8).min(15) as u8;
            let hi = (((x[j + QK / 2] - min) * inverse + 0.5) as i8).min(15) as u8;
            block[4 + j] = lo | (hi << 4);
        }
    }
    Ok(())
}

/// Writes 32 five-bit quants as a Q5 block's `qh` (bit `j` = fifth bit of element `j`) and
/// `qs` (nibbles as Q4_0).
fn pack_q5(quants: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    let mut high = 0u32;
    for (j, &q) in quants.iter().enumerate() {
        high |= u32::from(q >> 4) << j;
    }
    qh.copy_from_slice(&high.to_le_bytes());
    for j in 0..QK / 2 {
        qs[j] = (quants[j] & 0x0f) | ((quants[j + QK / 2] & 0x0f) << 4);
    }
}

/// Quantizes `src` to Q5_0 blocks as GGML's `quantize_row_q5_0_ref` does: the element of
/// largest magnitude maps to 0, `d = max / -16`, `q = min(31, trunc(x / d + 16.5))`.
pub fn quantize_row_q5_0(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(DType::Q5_0, src, dst)?;
    for (x, block) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(DType::Q5_0.block_bytes()))
    {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let quants: [u8; QK] =
            std::array::from_fn(|j| ((x[j] * inverse + 16.5) as i8).min(31) as u8);
        let (qh, qs) = block[2..].split_at_mut(4);
        pack_q5(&quants, qh, qs);
    }
    Ok(())
}

/// Quantizes `src` to Q5_1 blocks as GGML's `quantize_row_q5_1_ref` does: `m = min`,
/// `d = (max - min) / 31`, `q = trunc((x - min) / d + 0.5)`.
pub fn quantize_row_q5_1(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(DType::Q5_1, src, dst)?;
    for (x, block) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(DType::Q5_1.block_bytes()))
    {
        let min = x.iter().fold(f32::MAX, |acc, &v| acc.min(v));
        let max = x.iter().fold(f32::MIN, |acc, &v| acc.max(v));
        let d = (max - min) / 31.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        block[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        let quants: [u8; QK] =
            std::array::from_fn(|j| (((x[j] - min) * inverse + 0.5) as u8).min(31));
        let (qh, qs) = block[4..].split_at_mut(4);
        pack_q5(&quants, qh, qs);
    }
    Ok(())
}

/// The index of the MXFP4 level nearest `x` at scale `d` (GGML's `best_index_mxfp4`: the
/// first of equal errors wins, so `+0` before `-0`).
fn nearest_mxfp4_level(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_error = (f32::from(KVALUES_MXFP4[0]) * d - x).abs();
    for (index, &level) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let error = (f32::from(level) * d - x).abs();
        if error < best_error {
            best = index as u8;
            best_error = error;
        }
    }
    best
}

/// One MXFP4 block's 17 bytes, as GGUF stores it, from its E8M0 scale byte `e` and the 32
/// elements' codes (indices into [`KVALUES_MXFP4`]; only their low four bits are used):
/// element `j`'s code in the low nibble of `qs[j]` for `j < 16`, in the high nibble of
/// `qs[j - 16]` above. For tests and fixtures that write MXFP4 tensors from chosen codes.
pub fn pack_mxfp4_block(e: u8, codes: &[u8; QK]) -> [u8; 17] {
    let mut block = [0u8; 17];
    block[0] = e;
    for j in 0..QK / 2 {
        block[1 + j] = (codes[j] & 0x0f) | ((codes[j + QK / 2] & 0x0f) << 4);
    }
    block
}

/// Quantizes `src` to MXFP4 blocks as GGML's `quantize_row_mxfp4_ref` does: the scale byte
/// `e = floor(log2(amax)) - 2 + 127` (0 for an all-zero block), which puts `amax` in
/// `[8d, 16d)` for the scale `d = 2^(e - 128)` (up to `log2`'s rounding; the top level is 12,
/// so the largest elements may clip), then each element the nearest level `table[q] · d`. `log2` is the platform's `log2f`, as in
/// GGML. Blocks with `amax < 2^-125`, where GGML's float-to-byte conversion leaves the byte
/// range, get `e = 0`.
pub fn quantize_row_mxfp4(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(DType::MXFP4, src, dst)?;
    for (x, block) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(DType::MXFP4.block_bytes()))
    {
        let amax = x.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
        let e = if amax > 0.0 {
            // Saturating: an infinite amax gives the largest scale.
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let codes: [u8; QK] = std::array::from_fn(|j| nearest_mxfp4_level(x[j], d));
        block.copy_from_slice(&pack_mxfp4_block(e, &codes));
    }
    Ok(())
}

/// Encodes `src` as little-endian f16 or bf16 or f32 bytes (`dtype` must be a float type).
pub fn encode_float_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_quantize_lengths(dtype, src, dst)?;
    match dtype {
        DType::F32 => {
            for (v, bytes) in src.iter().zip(dst.chunks_exact_mut(4)) {
                bytes.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, bytes) in src.iter().zip(dst.chunks_exact_mut(2)) {
                bytes.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        DType::BF16 => {
            for (v, bytes) in src.iter().zip(dst.chunks_exact_mut(2)) {
                bytes.copy_from_slice(&crate::dtype::f32_to_bf16(*v).to_le_bytes());
            }
        }
        other => {
            return Err(KernelError::UnsupportedDType {
                dtype: other,
                operation: "encode_float_row",
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f32_to_f16(v).to_le_bytes()
    }

    #[test]
    fn q8_0_known_values() {
        let mut block = vec![0u8; 34];
        block[0..2].copy_from_slice(&f16_bytes(0.5));
        for j in 0..32 {
            block[2 + j] = ((j as i8) - 16) as u8;
        }
        let mut out = vec![0.0; 32];
        dequantize(DType::Q8_0, &block, &mut out).unwrap();
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, (j as f32 - 16.0) * 0.5);
        }
    }

    #[test]
    fn q8_0_quantize_known_values() {
        let x: Vec<f32> = (0..32).map(|j| j as f32 - 15.0).collect();
        let mut block = vec![0u8; 34];
        quantize_row_q8_0(&x, &mut block).unwrap();
        // amax = 16 -> d = 16/127; x = 1 -> 127/16 = 7.9375 -> 8.
        assert_eq!(block[0..2], f16_bytes(16.0 / 127.0));
        assert_eq!(block[2 + 16] as i8, 8);
        assert_eq!(block[2 + 31] as i8, 127);
        assert_eq!(block[2] as i8, -119);
    }

    #[test]
    fn q4_0_known_values() {
        // d = 2: nibble 0 -> -16, nibble 15 -> 14.
        let mut block = vec![0u8; 18];
        block[0..2].copy_from_slice(&f16_bytes(2.0));
        block[2] = 0xf0; // element 0 has q=0, element 16 has q=15
        block[3] = 0x19; // element 1 has q=9, element 17 has q=1
        for b in &mut block[4..] {
            *b = 0x88;
        }
        let mut out = vec![0.0; 32];
        dequantize(DType::Q4_0, &block, &mut out).unwrap();
        assert_eq!(out[0], -16.0);
        assert_eq!(out[16], 14.0);
        assert_eq!(out[1], 2.0);
        assert_eq!(out[17], -14.0);
        assert!(out[2..16].iter().chain(&out[18..]).all(|&v| v == 0.0));
    }

    #[test]
    fn q4_0_quantize_known_values() {
        let mut x = vec![0.0f32; 32];
        x[3] = -4.0; // largest magnitude: d = -4 / -8 = 0.5, and -4 maps to q = 0
        x[20] = 1.0; // 1 / 0.5 + 8.5 = 10.5 -> q = 10
        let mut block = vec![0u8; 18];
        quantize_row_q4_0(&x, &mut block).unwrap();
        assert_eq!(block[0..2], f16_bytes(0.5));
        assert_eq!(block[2 + 3] & 0x0f, 0);
        assert_eq!(block[2 + 4] >> 4, 10);
        let mut out = vec![0.0; 32];
        dequantize(DType::Q4_0, &block, &mut out).unwrap();
        assert_eq!(out[3], -4.0);
        assert_eq!(out[20], 1.0);
        assert_eq!(out[0], 0.0);
    }

    #[test]
    fn q4_1_known_values() {
        let mut block = vec![0u8; 20];
        block[0..2].copy_from_slice(&f16_bytes(0.25));
        block[2..4].copy_from_slice(&f16_bytes(-1.0));
        block[4] = 0x4f; // element 0: q=15 -> 2.75, element 16: q=4 -> 0.0
        let mut out = vec![0.0; 32];
        dequantize(DType::Q4_1, &block, &mut out).unwrap();
        assert_eq!(out[0], 2.75);
        assert_eq!(out[16], 0.0);
        assert_eq!(out[1], -1.0);
    }

    #[test]
    fn q4_1_quantize_round_trip_exact_grid() {
        // Values on the grid min + k*d with d = 0.5 survive quantization exactly.
        let x: Vec<f32> = (0..32).map(|j| -3.0 + 0.5 * (j % 16) as f32).collect();
        let mut block = vec![0u8; 20];
        quantize_row_q4_1(&x, &mut block).unwrap();
        let mut out = vec![0.0; 32];
        dequantize(DType::Q4_1, &block, &mut out).unwrap();
        assert_eq!(out, x);
    }

    #[test]
    fn round_trip_error_is_within_half_step() {
        let mut state = 0x1234_5678u32;
        let x: Vec<f32> = (0..96)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32) * 4.0 - 2.0
            })
            .collect();
        type Quantizer = fn(&[f32], &mut [u8]) -> Result<(), KernelError>;
        let cases: [(DType, Quantizer, f32); 5] = [
            (DType::Q8_0, quantize_row_q8_0, 2.0 / 127.0),
            (DType::Q4_0, quantize_row_q4_0, 2.0 / 8.0),
            (DType::Q4_1, quantize_row_q4_1, 4.0 / 15.0),
            (DType::Q5_0, quantize_row_q5_0, 2.0 / 16.0),
            (DType::Q5_1, quantize_row_q5_1, 4.0 / 31.0),
        ];
        for (dtype, quantize, step) in cases {
            let mut bytes = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
            quantize(&x, &mut bytes).unwrap();
            let mut out = vec![0.0; x.len()];
            dequantize(dtype, &bytes, &mut out).unwrap();
            for (a, b) in x.iter().zip(&out) {
                assert!((a - b).abs() <= step * 0.51 + 1e-3, "{dtype}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn q5_0_known_values() {
        // d = 0.5; element 0: nibble 3, qh bit 0 set -> 19 - 16 = 3 -> 1.5; element 17:
        // nibble 15, qh bit 17 clear -> 15 - 16 = -1 -> -0.5; element 31: nibble 0 with qh bit
        // 31 -> 0; element 20: nibble 0 and no fifth bit -> -16 -> -8.
        let mut block = vec![0u8; 22];
        block[0..2].copy_from_slice(&f16_bytes(0.5));
        let qh: u32 = 1 | (1 << 31);
        block[2..6].copy_from_slice(&qh.to_le_bytes());
        block[6] = 0x03;
        block[7] = 0xf0;
        block[6 + 15] = 0x00;
        let mut out = vec![0.0; 32];
        dequantize(DType::Q5_0, &block, &mut out).unwrap();
        assert_eq!(out[0], 1.5);
        assert_eq!(out[17], -0.5);
        assert_eq!(out[31], 0.0);
        assert_eq!(out[20], -8.0);
        assert_eq!(out[1], -8.0);
    }

    #[test]
    fn q5_1_known_values() {
        let mut block = vec![0u8; 24];
        block[0..2].copy_from_slice(&f16_bytes(0.25));
        block[2..4].copy_from_slice(&f16_bytes(-1.0));
        let qh: u32 = 1 << 16;
        block[4..8].copy_from_slice(&qh.to_le_bytes());
        block[8] = 0x2f; // element 0: q = 15 -> 2.75; element 16: 2 | 16 = 18 -> 3.5
        let mut out = vec![0.0; 32];
        dequantize(DType::Q5_1, &block, &mut out).unwrap();
        assert_eq!(out[0], 2.75);
        assert_eq!(out[16], 3.5);
        assert_eq!(out[1], -1.0);
    }

    #[test]
    fn q5_quantize_round_trip_exact_grid() {
        // Q5_1: values min + k * d with d = 0.25 and k = 0..31 survive exactly.
        let x: Vec<f32> = (0..32)
            .map(|j| -4.0 + 0.25 * ((j * 7) % 32) as f32)
            .collect();
        let mut block = vec![0u8; 24];
        quantize_row_q5_1(&x, &mut block).unwrap();
        let mut out = vec![0.0; 32];
        dequantize(DType::Q5_1, &block, &mut out).unwrap();
        assert_eq!(out, x);
        // Q5_0: largest magnitude -4 gives d = 0.25, so (k - 16) / 4 for k = 0..31 is exact.
        let x: Vec<f32> = (0..32)
            .map(|j| ((j * 5) % 32) as f32 * 0.25 - 4.0)
            .collect();
        let mut block = vec![0u8; 22];
        quantize_row_q5_0(&x, &mut block).unwrap();
        let mut out = vec![0.0; 32];
        dequantize(DType::Q5_0, &block, &mut out).unwrap();
        assert_eq!(out, x);
    }

    #[test]
    fn iq4_nl_known_values() {
        let mut block = vec![0u8; 18];
        block[0..2].copy_from_slice(&f16_bytes(0.5));
        for (j, b) in block[2..].iter_mut().enumerate() {
            *b = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = vec![0.0; 32];
        dequantize(DType::IQ4_NL, &block, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * f32::from(KVALUES_IQ4NL[j]));
            assert_eq!(out[j + 16], 0.5 * f32::from(KVALUES_IQ4NL[15 - j]));
        }
    }

    /// An MXFP4 block with scale byte `e` whose element `j` (and `j + 16`) is nibble `j % 16`
    /// (`15 - j % 16`): every level of the table, in both halves.
    fn mxfp4_block(e: u8) -> Vec<u8> {
        let mut block = vec![e];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        block
    }

    #[test]
    fn mxfp4_blocks_pack_from_codes() {
        let codes: [u8; 32] = std::array::from_fn(|j| (j % 16) as u8);
        let block = pack_mxfp4_block(129, &codes);
        assert_eq!(block[0], 129);
        assert_eq!(block[1], 0x00);
        assert_eq!(block[16], 0xff);
        let mut out = vec![0.0; 32];
        dequantize(DType::MXFP4, &block, &mut out).unwrap();
        for (j, &value) in out.iter().enumerate() {
            assert_eq!(value, 2.0 * f32::from(KVALUES_MXFP4[j % 16]), "element {j}");
        }
        // Codes keep their low four bits only.
        assert_eq!(
            pack_mxfp4_block(0, &[0x1f; 32]),
            pack_mxfp4_block(0, &[0x0f; 32])
        );
    }

    #[test]
    fn mxfp4_known_values() {
        // Levels 0, 1, 2, 3, 4, 6, 8, 12 and their negatives (nibbles 8..16) times 2^(e - 128).
        let levels = [0.0f32, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0];
        let mut out = vec![0.0; 32];
        dequantize(DType::MXFP4, &mxfp4_block(128), &mut out).unwrap();
        for j in 0..8 {
            assert_eq!(out[j], levels[j]);
            assert_eq!(out[8 + j], -levels[j]);
            assert_eq!(out[16 + j], -levels[7 - j]);
            assert_eq!(out[24 + j], levels[7 - j]);
        }
        assert_eq!(
            out[8].to_bits(),
            0,
            "nibble 8 (E2M1's -0) is +0, as in GGML's int8 table"
        );
        // The scale bytes at the ends of the range: subnormal scales (0, 1), the smallest
        // normal (2), 1/2 (127) and the largest two (254, 255), where 12 · 2^127 overflows as
        // GGML's `x0 * d` does.
        for (e, scale) in [
            (0u8, f32::from_bits(0x0020_0000)),
            (1, f32::from_bits(0x0040_0000)),
            (2, f32::MIN_POSITIVE),
            (127, 0.5),
            (254, 2f32.powi(126)),
            (255, 2f32.powi(127)),
        ] {
            assert_eq!(f64::from(scale), 2f64.powi(i32::from(e) - 128), "e = {e}");
            dequantize(DType::MXFP4, &mxfp4_block(e), &mut out).unwrap();
            for (j, &got) in out.iter().enumerate() {
                let nibble = if j < 16 { j } else { 15 - (j - 16) };
                let want = f32::from(KVALUES_MXFP4[nibble]) * scale;
                assert_eq!(got.to_bits(), want.to_bits(), "e = {e} element {j}");
            }
            assert_eq!(out[1], scale, "e = {e}: level 1 is the scale itself");
            assert_eq!(out[9], -scale, "e = {e}: level -1");
        }
        dequantize(DType::MXFP4, &mxfp4_block(0), &mut out).unwrap();
        assert_eq!(
            f64::from(out[7]),
            12.0 * 2f64.powi(-128),
            "subnormal products are exact"
        );
        dequantize(DType::MXFP4, &mxfp4_block(255), &mut out).unwrap();
        assert_eq!(out[2], f32::INFINITY, "2 · 2^127 overflows");
        assert_eq!(out[10], f32::NEG_INFINITY);
    }

    #[test]
    fn mxfp4_random_blocks_match_a_straightforward_decoder() {
        // Every scale byte at least once among 300 random blocks, decoded in f64 from the
        // format's definition (E2M1 value · 2^(e - 127)) and rounded once to f32; E2M1's -0
        // (nibble 8) is GGML's +0.
        let mut state = 0x9e37_79b9u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let n_blocks = 300;
        let mut bytes = vec![0u8; n_blocks * 17];
        for (b, block) in bytes.chunks_exact_mut(17).enumerate() {
            for byte in block.iter_mut() {
                *byte = next() as u8;
            }
            if b < 256 {
                block[0] = b as u8;
            }
        }
        let mut out = vec![0.0f32; n_blocks * 32];
        dequantize(DType::MXFP4, &bytes, &mut out).unwrap();
        let e2m1 = |nibble: u8| {
            let magnitude = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][usize::from(nibble & 7)];
            if nibble & 8 != 0 {
                -magnitude
            } else {
                magnitude
            }
        };
        for (b, block) in bytes.chunks_exact(17).enumerate() {
            let scale = 2f64.powi(i32::from(block[0]) - 127);
            for j in 0..32 {
                let byte = block[1 + j % 16];
                let nibble = if j < 16 { byte & 0x0f } else { byte >> 4 };
                let want = (e2m1(nibble) * scale) as f32 + 0.0;
                let got = out[b * 32 + j];
                assert!(
                    got.to_bits() == want.to_bits(),
                    "block {b} (e = {}) element {j}: {got} vs {want}",
                    block[0]
                );
            }
        }
    }

    #[test]
    fn mxfp4_quantize_known_values() {
        // amax = 6: e = floor(log2 6) - 2 + 127 = 127, d = 1/2; levels are 0, ±0.5, ..., ±6.
        let mut x = vec![0.0f32; 32];
        x[0] = 6.0;
        x[1] = -0.5;
        x[2] = 1.2; // nearest 1.0 (nibble 2)
        x[3] = 1.3; // nearest 1.5 (nibble 3)
        x[16] = -5.1; // nearest -6 (nibble 15): |-6 + 5.1| = 0.9 < |-4 + 5.1| = 1.1
        x[17] = 2.5; // halfway between 2 and 3: the first, 2 (nibble 4)
        x[18] = -0.0; // +0 (nibble 0) wins ties
        let mut block = vec![0u8; 17];
        quantize_row_mxfp4(&x, &mut block).unwrap();
        assert_eq!(block[0], 127);
        assert_eq!(block[1], 7 | (15 << 4));
        assert_eq!(block[2], 9 | (4 << 4));
        assert_eq!(block[3], 2);
        assert_eq!(block[4], 3);
        let mut out = vec![0.0; 32];
        dequantize(DType::MXFP4, &block, &mut out).unwrap();
        assert_eq!(out[..4], [6.0, -0.5, 1.0, 1.5]);
        assert_eq!(out[16..18], [-6.0, 2.0]);
        // An all-zero block gets e = 0 and all-zero nibbles.
        quantize_row_mxfp4(&[0.0; 32], &mut block).unwrap();
        assert!(block.iter().all(|&b| b == 0));
        // Values on the grid of their block's scale survive exactly.
        let levels: Vec<f32> = (0..64)
            .map(|i| f32::from(KVALUES_MXFP4[i % 16]) * 2f32.powi(-(i as i32 / 32) * 3 - 4))
            .collect();
        let mut bytes = vec![0u8; 34];
        quantize_row_mxfp4(&levels, &mut bytes).unwrap();
        let mut out = vec![0.0; 64];
        dequantize(DType::MXFP4, &bytes, &mut out).unwrap();
        assert_eq!(out, levels);
    }

    #[test]
    fn mxfp4_round_trip_error_is_within_half_the_block_max() {
        // amax lies in [8d, 16d) for d = 2^(e - 128); the levels' widest gap (8d to 12d) and
        // the clip above 12d are both under 4d, so an element is off by at most 4d <= amax / 2.
        let mut state = 0x0246_8aceu32;
        let x: Vec<f32> = (0..320)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let magnitude = 2f32.powi(i / 32 - 5);
                (state as f32 / u32::MAX as f32 * 2.0 - 1.0) * magnitude
            })
            .collect();
        let mut bytes = vec![0u8; 10 * 17];
        quantize_row_mxfp4(&x, &mut bytes).unwrap();
        let mut out = vec![0.0; x.len()];
        dequantize(DType::MXFP4, &bytes, &mut out).unwrap();
        for (xb, ob) in x.chunks(32).zip(out.chunks(32)) {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (a, b) in xb.iter().zip(ob) {
                assert!((a - b).abs() <= amax / 2.0, "{a} vs {b} (amax {amax})");
            }
        }
    }

    #[test]
    fn iq4_xs_known_values() {
        let mut block = vec![0u8; 136];
        block[0..2].copy_from_slice(&f16_bytes(0.5));
        // Sub-block 0: ls = 0x5 | (2 << 4) = 37 -> dl = 0.5 * 5; sub-block 3: ls = 0xa | (0 << 4)
        // = 10 -> dl = 0.5 * -22; sub-block 7: ls = 0xf | (3 << 4) = 63 -> dl = 0.5 * 31.
        let scales_h: u16 = 2 | (3 << 14);
        block[2..4].copy_from_slice(&scales_h.to_le_bytes());
        block[4] = 0x05;
        block[5] = 0xa0;
        block[7] = 0xf0;
        block[8] = 0x0f; // element 0: table[15] = 113, element 16: table[0] = -127
        block[8 + 3 * 16 + 1] = 0x80; // sub-block 3, element 17: table[8] = 1
        block[8 + 7 * 16 + 15] = 0x07; // sub-block 7, element 15: table[7] = -10
        let mut out = vec![0.0; 256];
        dequantize(DType::IQ4_XS, &block, &mut out).unwrap();
        assert_eq!(out[0], 2.5 * 113.0);
        assert_eq!(out[16], 2.5 * -127.0);
        assert_eq!(out[3 * 32 + 17], -11.0);
        assert_eq!(out[7 * 32 + 15], 15.5 * -10.0);
        assert_eq!(out[7 * 32 + 16], 15.5 * -127.0);
    }

    #[test]
    fn q4_k_known_values() {
        let mut block = vec![0u8; 144];
        block[0..2].copy_from_slice(&f16_bytes(0.5));
        block[2..4].copy_from_slice(&f16_bytes(0.25));
        let scales = &mut block[4..16];
        scales[0] = 3; // sub-block 0 scale 3
        scales[4] = 8; // sub-block 0 min 8
        scales[1] = 2; // sub-block 1 scale 2
        scales[5] = 1; // sub-block 1 min 1
                       // Sub-block 4: scale 0b01_0101 = 21 = low nibble 5 of byte 8 | top bits (1) of byte 0.
        scales[8] = 0x35; // scale low nibble 5, min low nibble 3
        scales[0] |= 1 << 6; // scale high bits = 1 -> 5 | 16 = 21
        scales[4] |= 2 << 6; // min high bits = 2 -> 3 | 32 = 35
        block[16] = 0x72; // element 0 q=2, element 32 q=7
        block[16 + 64] = 0x0a; // element 128 (sub-block 4) q=10
        let mut out = vec![0.0; 256];
        dequantize(DType::Q4_K, &block, &mut out).unwrap();
        assert_eq!(out[0], 0.5 * 3.0 * 2.0 - 0.25 * 8.0);
        assert_eq!(out[1], -0.25 * 8.0);
        assert_eq!(out[32], 0.5 * 2.0 * 7.0 - 0.25 * 1.0);
        assert_eq!(out[128], 0.5 * 21.0 * 10.0 - 0.25 * 35.0);
        assert_eq!(scale_min_k4(4, &block[4..16]), (21, 35));
    }

    #[test]
    fn q5_k_known_values() {
        let mut block = vec![0u8; 176];
        block[0..2].copy_from_slice(&f16_bytes(1.0));
        block[2..4].copy_from_slice(&f16_bytes(0.5));
        let scales = &mut block[4..16];
        scales[2] = 4; // sub-block 2 scale 4
        scales[6] = 6; // sub-block 2 min 6
        scales[3] = 1; // sub-block 3 scale 1
                       // qh bit 2 -> sub-block 2 high bit, bit 3 -> sub-block 3.
        block[16 + 5] = 0b0000_0100;
        block[16 + 6] = 0b0000_1000;
        // ql chunk 1 (elements 64..128): byte 48 + 32 + l.
        block[48 + 32 + 5] = 0x03; // element 64+5 q = 3 + 16 = 19
        block[48 + 32 + 6] = 0x20; // element 64+6 q = 0; element 96+6 q = 2 + 16 = 18
        let mut out = vec![0.0; 256];
        dequantize(DType::Q5_K, &block, &mut out).unwrap();
        assert_eq!(out[69], 4.0 * 19.0 - 0.5 * 6.0);
        assert_eq!(out[70], -0.5 * 6.0);
        assert_eq!(out[102], 18.0);
        assert_eq!(out[101], 0.0);
    }

    #[test]
    fn q6_k_known_values() {
        let mut block = vec![0u8; 210];
        block[208..210].copy_from_slice(&f16_bytes(0.5));
        for (j, s) in block[192..208].iter_mut().enumerate() {
            *s = (j as i8 - 4) as u8;
        }
        // Element 0: ql[0] low = 1, qh[0] bits 0..2 = 2 -> q = 1 | 32 = 33 -> 1; scale[0] = -4.
        block[0] = 0x01;
        block[128] = 0x02;
        // Element 64+17 (second 16 of q3 group): ql[17] high nibble 0xf, qh[17] bits 4..6 = 3
        // -> q = 15 | 48 = 63 -> 31; scale index 1 + 4 = 5 -> 1.
        block[17] = 0xf0;
        block[128 + 17] = 0x30;
        // Element 128 + 32 + 0 (second half, q2): ql[64 + 32] low = 0, qh[128+32] bits 2..4 = 0
        // -> q = -32; scale index 8 + 2 = 10 -> 6.
        let mut out = vec![0.0; 256];
        dequantize(DType::Q6_K, &block, &mut out).unwrap();
        assert_eq!(out[0], 0.5 * -4.0 * 1.0);
        assert_eq!(out[81], 0.5 * 1.0 * 31.0);
        assert_eq!(out[160], 0.5 * 6.0 * -32.0);
        assert_eq!(
            out[17],
            0.5 * -3.0 * -32.0,
            "ql low nibble 0 with qh bits 0"
        );
    }

    #[test]
    fn float_types_decode() {
        let values = [1.5f32, -2.0, 0.0, 65504.0];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let mut bytes = vec![0u8; dtype.row_bytes(values.len()).unwrap()];
            encode_float_row(dtype, &values, &mut bytes).unwrap();
            let mut out = vec![0.0; values.len()];
            dequantize(dtype, &bytes, &mut out).unwrap();
            assert_eq!(out[..3], values[..3], "{dtype}");
        }
    }

    #[test]
    fn rejects_wrong_lengths() {
        let mut out = vec![0.0; 32];
        assert!(matches!(
            dequantize(DType::Q4_1, &[0u8; 19], &mut out),
            Err(KernelError::LengthMismatch { .. })
        ));
        let mut out = vec![0.0; 33];
        assert!(matches!(
            dequantize(DType::Q4_1, &[0u8; 20], &mut out),
            Err(KernelError::NotBlockAligned { .. })
        ));
    }
}
