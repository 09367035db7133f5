//! Deterministic random data for tests.

use crate::dtype::{f32_to_f16, DType};
use crate::quant::{
    encode_float_row, quantize_row_q4_0, quantize_row_q4_1, quantize_row_q5_0, quantize_row_q5_1,
    quantize_row_q8_0,
};

/// xorshift64*: tiny, seedable, good enough for test data.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[low, high)`.
    pub(crate) fn uniform(&mut self, low: f32, high: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        low + (high - low) * unit
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub(crate) fn vec(&mut self, n: usize, low: f32, high: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(low, high)).collect()
    }
}

/// Random weight bytes of `dtype` for a `[rows, cols]` matrix. Float and 32-block types are
/// quantized from uniform values; K-quant and IQ4 blocks are random bytes with small random
/// scales; MXFP4 blocks random bytes with E8M0 scales around 2^-4 and, one block in eight,
/// the smallest ones (`e` 0, 1, 2: subnormal and smallest-normal scales).
pub(crate) fn random_weights(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = dtype.row_bytes(cols).expect("cols fit the block size");
    let mut bytes = vec![0u8; rows * row_bytes];
    for row in bytes.chunks_exact_mut(row_bytes) {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => {
                let values = rng.vec(cols, -1.0, 1.0);
                encode_float_row(dtype, &values, row).expect("sizes match");
            }
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
                let values = rng.vec(cols, -1.0, 1.0);
                let quantize = match dtype {
                    DType::Q8_0 => quantize_row_q8_0,
                    DType::Q4_0 => quantize_row_q4_0,
                    DType::Q4_1 => quantize_row_q4_1,
                    DType::Q5_0 => quantize_row_q5_0,
                    _ => quantize_row_q5_1,
                };
                quantize(&values, row).expect("sizes match");
            }
            DType::IQ4_NL | DType::IQ4_XS => {
                for block in row.chunks_exact_mut(dtype.block_bytes()) {
                    for b in block.iter_mut() {
                        *b = rng.next_u64() as u8;
                    }
                    // IQ4_XS multiplies d by up to 32 per sub-block.
                    let d = if dtype == DType::IQ4_XS { 0.0005 } else { 0.01 };
                    let d = f32_to_f16(rng.uniform(d, 2.0 * d)).to_le_bytes();
                    block[0..2].copy_from_slice(&d);
                }
            }
            DType::MXFP4 => {
                for block in row.chunks_exact_mut(dtype.block_bytes()) {
                    for b in block.iter_mut() {
                        *b = rng.next_u64() as u8;
                    }
                    // Levels reach 12: 12 · 2^(e - 128) is 0.2-1.5 for e in 122..=125.
                    block[0] = if rng.below(8) == 0 {
                        rng.below(3) as u8
                    } else {
                        122 + rng.below(4) as u8
                    };
                }
            }
            DType::Q4_K | DType::Q5_K | DType::Q6_K => {
                for block in row.chunks_exact_mut(dtype.block_bytes()) {
                    for b in block.iter_mut() {
                        *b = rng.next_u64() as u8;
                    }
                    let d = f32_to_f16(rng.uniform(0.001, 0.02)).to_le_bytes();
                    if dtype == DType::Q6_K {
                        block[208..210].copy_from_slice(&d);
                    } else {
                        block[0..2].copy_from_slice(&d);
                        let dmin = f32_to_f16(rng.uniform(0.001, 0.02)).to_le_bytes();
                        block[2..4].copy_from_slice(&dmin);
                    }
                }
            }
        }
    }
    bytes
}
