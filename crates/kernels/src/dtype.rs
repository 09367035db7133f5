//! Element types of weight tensors and their GGML block geometry.

use crate::KernelError;

/// A tensor element type, numbered and laid out exactly as GGML (`ggml-common.h`) does.
///
/// Quantized types store elements in fixed-size blocks; a row of a tensor is always a whole
/// number of blocks, so [`DType::row_bytes`] rejects lengths that are not a multiple of
/// [`DType::block_size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16 (the top 16 bits of an f32).
    BF16,
    /// Blocks of 32: `{ f16 d; i8 qs[32] }`, value `q * d`.
    Q8_0,
    /// Blocks of 32: `{ f16 d; u8 qs[16] }`, low nibbles are elements 0..16, high nibbles
    /// 16..32, value `(q - 8) * d`.
    Q4_0,
    /// Blocks of 32: `{ f16 d; f16 m; u8 qs[16] }`, nibbles as Q4_0, value `q * d + m`.
    Q4_1,
    /// Blocks of 32: `{ f16 d; u32 qh; u8 qs[16] }`, nibbles as Q4_0 with bit `j` of `qh` as
    /// element `j`'s fifth bit, value `(q - 16) * d`.
    Q5_0,
    /// Blocks of 32: `{ f16 d; f16 m; u32 qh; u8 qs[16] }`, quants as Q5_0, value `q * d + m`.
    Q5_1,
    /// Blocks of 32: `{ f16 d; u8 qs[16] }`, nibbles as Q4_0 indexing GGML's non-linear table
    /// [`crate::quant::KVALUES_IQ4NL`], value `d * table[q]`.
    IQ4_NL,
    /// Super-blocks of 256: `{ f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }`, eight
    /// sub-blocks of 32 with 6-bit scales `ls` (low nibble in `scales_l`, high two bits in
    /// `scales_h`), value `d * (ls - 32) * table[q]`, nibbles per sub-block as IQ4_NL.
    IQ4_XS,
    /// Super-blocks of 256: `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`, eight
    /// sub-blocks of 32 with 6-bit scales and mins.
    Q4_K,
    /// Super-blocks of 256: `{ f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] }`.
    Q5_K,
    /// Super-blocks of 256: `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`.
    Q6_K,
    /// OCP microscaling FP4 (gpt-oss's experts), blocks of 32: `{ u8 e; u8 qs[16] }`, nibbles
    /// as Q4_0 indexing [`crate::quant::KVALUES_MXFP4`] (twice the E2M1 values), value
    /// `table[q] · 2^(e - 128)` ([`e8m0_to_f32_half`]: the E8M0 scale, halved for the doubled
    /// table).
    MXFP4,
}

impl DType {
    /// Every supported type, in GGML id order.
    pub const ALL: [DType; 14] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::BF16,
        DType::MXFP4,
    ];

    /// The `ggml_type` enum value used in GGUF tensor infos.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::IQ4_NL => 20,
            DType::IQ4_XS => 23,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
        }
    }

    /// The type with GGML id `id`, or `None` for types this crate does not support.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|dtype| dtype.ggml_id() == id)
    }

    /// The GGML name (`"q4_1"`, `"f16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ4_XS => "iq4_xs",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::MXFP4 => "mxfp4",
        }
    }

    /// Elements per block: 1 for float types, 32 for `Q*_0`/`Q*_1`/IQ4_NL/MXFP4, 256 for
    /// K-quants and IQ4_XS.
    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::IQ4_NL
            | DType::MXFP4 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 2 + 32,
            DType::Q4_0 => 2 + 16,
            DType::Q4_1 => 2 + 2 + 16,
            DType::Q5_0 => 2 + 4 + 16,
            DType::Q5_1 => 2 + 2 + 4 + 16,
            DType::IQ4_NL => 2 + 16,
            DType::IQ4_XS => 2 + 2 + 4 + 128,
            DType::Q4_K => 2 + 2 + 12 + 128,
            DType::Q5_K => 2 + 2 + 12 + 32 + 128,
            DType::Q6_K => 128 + 64 + 16 + 2,
            DType::MXFP4 => 1 + 16,
        }
    }

    /// Whether values are stored in quantized blocks (as opposed to one float per element).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n_elements` consecutive elements (a row).
    ///
    /// Fails when `n_elements` is not a whole number of blocks.
    pub fn row_bytes(self, n_elements: usize) -> Result<usize, KernelError> {
        let block_size = self.block_size();
        if !n_elements.is_multiple_of(block_size) {
            return Err(KernelError::NotBlockAligned {
                dtype: self,
                n_elements,
                block_size,
            });
        }
        Ok(n_elements / block_size * self.block_bytes())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Converts IEEE half-precision bits to f32 (exact: every f16 is representable).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        (0, _) => {
            // Subnormal: value = mantissa * 2^-24, exactly representable as a normal f32.
            let value = mantissa as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -value } else { value };
        }
        (0x1f, 0) => 0x7f80_0000,
        (0x1f, _) => 0x7fc0_0000 | (mantissa << 13),
        _ => ((exponent + 127 - 15) << 23) | (mantissa << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// Converts f32 to IEEE half-precision bits, rounding to nearest even (as F16C and GGML do).
pub fn f32_to_f16(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        let nan_bit = if mantissa != 0 { 0x200 } else { 0 };
        return sign | 0x7c00 | nan_bit | (mantissa >> 13) as u16;
    }
    let half_exponent = exponent - 127 + 15;
    if half_exponent >= 0x1f {
        return sign | 0x7c00;
    }
    if half_exponent <= 0 {
        if half_exponent < -10 {
            return sign;
        }
        // Subnormal half: shift the full significand into place with round-to-nearest-even.
        let significand = mantissa | 0x80_0000;
        let shift = (14 - half_exponent) as u32;
        let mut half_mantissa = significand >> shift;
        let remainder = significand & ((1 << shift) - 1);
        let halfway = 1 << (shift - 1);
        if remainder > halfway || (remainder == halfway && (half_mantissa & 1) == 1) {
            half_mantissa += 1;
        }
        return sign | half_mantissa as u16;
    }
    let mut half = ((half_exponent as u32) << 10) | (mantissa >> 13);
    let remainder = mantissa & 0x1fff;
    if remainder > 0x1000 || (remainder == 0x1000 && (half & 1) == 1) {
        // A carry into the exponent is correct: it rounds up to the next binade or to inf.
        half += 1;
    }
    sign | half as u16
}

/// Decodes an E8M0 scale byte (a bare biased exponent, MXFP4's block scale) as GGML's
/// `ggml_e8m0_to_fp32_half` does: `2^(e - 128)`, half the scale `2^(e - 127)` because MXFP4's
/// level table holds twice the E2M1 values. Exact: a power of two from `2^-128` to `2^127`,
/// the f32 subnormals `2^-128` and `2^-127` for `e` 0 and 1. (E8M0 reserves 255 for NaN;
/// GGML reads it as `2^127`, and so does this.)
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        // Subnormal: the significand's bit 21 or 22, i.e. 2^(21 + e) · 2^-149.
        0x0020_0000u32 << e
    } else {
        // Normal: biased exponent e - 1, i.e. 2^(e - 1 - 127).
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// Converts bfloat16 bits to f32 (exact).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Converts f32 to bfloat16 bits, rounding to nearest even (NaN stays NaN).
pub fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_ggml_id(dtype.ggml_id()), Some(dtype));
        }
        assert_eq!(DType::from_ggml_id(9), None);
        assert_eq!(DType::Q4_1.ggml_id(), 3);
        assert_eq!(DType::Q6_K.ggml_id(), 14);
    }

    #[test]
    fn block_geometry_matches_ggml() {
        assert_eq!(DType::Q8_0.block_bytes(), 34);
        assert_eq!(DType::Q4_0.block_bytes(), 18);
        assert_eq!(DType::Q4_1.block_bytes(), 20);
        assert_eq!(DType::Q4_K.block_bytes(), 144);
        assert_eq!(DType::Q5_K.block_bytes(), 176);
        assert_eq!(DType::Q6_K.block_bytes(), 210);
        assert_eq!(DType::Q5_0.block_bytes(), 22);
        assert_eq!(DType::Q5_1.block_bytes(), 24);
        assert_eq!(DType::IQ4_NL.block_bytes(), 18);
        assert_eq!(DType::IQ4_XS.block_bytes(), 136);
        assert_eq!(DType::IQ4_XS.block_size(), 256);
        assert_eq!(
            [DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS].map(DType::ggml_id),
            [6, 7, 20, 23]
        );
        assert_eq!(DType::MXFP4.block_bytes(), 17);
        assert_eq!(DType::MXFP4.block_size(), 32);
        assert_eq!(DType::MXFP4.ggml_id(), 39);
        assert_eq!(DType::from_ggml_id(39), Some(DType::MXFP4));
        assert_eq!(DType::MXFP4.row_bytes(2880), Ok(90 * 17));
        assert_eq!(DType::Q4_1.row_bytes(576), Ok(18 * 20));
        assert_eq!(DType::F16.row_bytes(7), Ok(14));
        assert!(matches!(
            DType::Q4_K.row_bytes(576),
            Err(KernelError::NotBlockAligned { .. })
        ));
    }

    #[test]
    fn f16_conversion_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x8001), -5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00, "tie rounds to even");
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02, "tie rounds to even");
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn f16_round_trip_all_finite_values() {
        for bits in 0..=u16::MAX {
            let value = f16_to_f32(bits);
            if value.is_nan() {
                assert!(f16_to_f32(f32_to_f16(value)).is_nan());
            } else {
                assert_eq!(f32_to_f16(value), bits, "bits {bits:#06x}");
            }
        }
    }

    #[test]
    fn e8m0_half_is_an_exact_power_of_two_for_every_byte() {
        for e in 0..=u8::MAX {
            let want = 2f64.powi(i32::from(e) - 128);
            let got = e8m0_to_f32_half(e);
            assert_eq!(f64::from(got), want, "e = {e}");
        }
        assert_eq!(e8m0_to_f32_half(0).to_bits(), 0x0020_0000);
        assert_eq!(e8m0_to_f32_half(1).to_bits(), 0x0040_0000);
        assert!(e8m0_to_f32_half(1).is_subnormal());
        assert_eq!(e8m0_to_f32_half(2), f32::MIN_POSITIVE);
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(254), 2f32.powi(126));
        assert_eq!(e8m0_to_f32_half(255).to_bits(), 254 << 23);
    }

    #[test]
    fn bf16_conversion() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f80_8000)),
            0x3f80,
            "tie to even"
        );
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f81_8000)),
            0x3f82,
            "tie to even"
        );
    }
}
